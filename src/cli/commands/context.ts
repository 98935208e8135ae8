// What every command module is given: the global options, the profile in
// effect with its clients, --json or human output; and the option parsers and
// the list command they share.
import type { Command } from "commander";
import { clientsFor, type Clients } from "../clients.js";
import { printJson, printTable } from "../output.js";
import { resolveProfile, UsageError, withArticle, type Profile, type Role } from "../profiles.js";

export interface Globals {
  profile?: string;
  json?: boolean;
}

export interface Context {
  /** The global options (--profile, --json), as parsed. */
  globals(): Globals;
  /** The profile in effect and its clients; with `role`, refused unless the profile has that role. */
  session(role?: Role | Role[]): { c: Clients; p: Profile };
  /** Prints `value` as JSON with --json, else runs `human`. */
  show(value: unknown, human: () => void): void;
}

/** The context of the commands of `program` (its options are read when a command runs). */
export function contextOf(program: Command): Context {
  const globals = (): Globals => program.opts<Globals>();
  return {
    globals,
    session(role) {
      const p = resolveProfile(globals().profile);
      const wanted = role === undefined ? undefined : Array.isArray(role) ? role : [role];
      if (wanted && !wanted.includes(p.role)) {
        const from = process.env.SVC_ROLE ? "SVC_ROLE" : process.env.SVC_KEY ? "SVC_KEY" : process.env.SVC_ADMIN_TOKEN ? "SVC_ADMIN_TOKEN" : `profile "${p.name}"`;
        throw new UsageError(`this command is for ${withArticle(wanted.join(" or "))} profile; the credential in effect (${from}) is ${withArticle(p.role)}'s`);
      }
      return { c: clientsFor(p), p };
    },
    show: (value, human) => (globals().json ? printJson(value) : human()),
  };
}

export const int = (name: string) => (v: string) => {
  const n = Number(v);
  if (!Number.isInteger(n)) throw new UsageError(`${name} must be an integer`);
  return n;
};
export const num = (name: string) => (v: string) => {
  const n = Number(v);
  if (!Number.isFinite(n)) throw new UsageError(`${name} must be a number`);
  return n;
};

export interface ListSpec<O extends { limit: number }, R, T> {
  /** Who may list (default: any role). */
  role?: Role;
  /** --limit's default. */
  limit: number;
  fetch(c: Clients, o: O): Promise<R>;
  rows(r: R): T[];
  columns: [string, (row: T) => unknown][];
  /** A line printed under the table. */
  footer?(r: R, o: O): string;
}

/**
 * Makes `cmd` (its filter options already added) a list: adds --limit, and
 * prints the rows it fetches as a table, or the whole answer with --json.
 * Returns `cmd`, for options that come after --limit in its help.
 */
export function listCommand<O extends { limit: number }, R, T>(ctx: Context, cmd: Command, spec: ListSpec<O, R, T>): Command {
  return cmd.option("--limit <n>", "how many", int("--limit"), spec.limit).action(async (o: O) => {
    const { c } = ctx.session(spec.role);
    const r = await spec.fetch(c, o);
    ctx.show(r, () => {
      printTable(spec.rows(r), spec.columns);
      if (spec.footer) console.log(spec.footer(r, o));
    });
  });
}
