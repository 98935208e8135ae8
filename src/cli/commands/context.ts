// What every command module is given: the global options, the profile in
// effect with its clients, --json or human output; and the option parsers and
// the list command they share.
import type { Command } from "commander";
import { clientsFor, type Clients } from "../clients.js";
import { out, printJson, printTable } from "../output.js";
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

/** The range of each protobuf integer type an option is sent as; int64 within what a JS number holds exactly. */
const INT_RANGES = {
  int32: [-(2 ** 31), 2 ** 31 - 1],
  uint32: [0, 2 ** 32 - 1],
  int64: [Number.MIN_SAFE_INTEGER, Number.MAX_SAFE_INTEGER],
} as const;
export type IntType = keyof typeof INT_RANGES;

/**
 * The parser of an integer option sent as a protobuf `type` (default int32): a value out of its range
 * is a usage error here, not a request that fails to serialise.
 */
export const int =
  (name: string, type: IntType = "int32") =>
  (v: string) => {
    const n = /^\s*[-+]?\d+\s*$/.test(v) ? Number(v) : NaN;
    if (!Number.isInteger(n)) throw new UsageError(`${name} must be an integer`);
    const [min, max] = INT_RANGES[type];
    if (n < min || n > max) throw new UsageError(`${name} must be an integer from ${min} to ${max}`);
    return n;
  };
export const num = (name: string) => (v: string) => {
  const n = Number(v);
  if (!Number.isFinite(n)) throw new UsageError(`${name} must be a number`);
  return n;
};

export interface ListSpec<O extends Paging, R extends { total?: bigint }, T> {
  /** Who may list (default: any role). */
  role?: Role;
  /** --limit's default. */
  limit: number;
  fetch(c: Clients, o: O): Promise<R>;
  rows(r: R): T[];
  columns: [string, (row: T) => unknown][];
  /**
   * A list with a cursor option (`--before`): the option's value that reads the page after these
   * rows. Its next pages are then offered by cursor, which reaches past the server's largest offset.
   */
  cursor?: { option: string; after(rows: T[]): string | undefined };
}

export interface Paging {
  limit: number;
  offset: number;
}

/**
 * "21-25 of 25", "1-20 of 25 (--offset 20 for more)": which rows of how many were printed. With a
 * cursor (`next`: "--before job-…"), the next page is offered by it; after a cursor (`from`) the
 * rows' place in the total is not known: "20 of 30,000, after job-… (--before job-… for more)".
 */
export function pageLine(shown: number, total: number, offset: number, cursor?: { from?: string; next?: string; limit: number }): string {
  if (cursor?.from !== undefined) {
    if (shown === 0) return `none after ${cursor.from}`;
    return `${shown} of ${total}, after ${cursor.from}${shown === cursor.limit && cursor.next ? ` (${cursor.next} for more)` : ""}`;
  }
  if (shown === 0) return `none of ${total}${offset > 0 ? ` (past --offset ${offset})` : ""}`;
  const last = offset + shown;
  const more = cursor?.next ?? `--offset ${last}`;
  return `${offset + 1}-${last} of ${total}${last < total ? ` (${more} for more)` : ""}`;
}

/**
 * Makes `cmd` (its filter options already added) a list: adds --limit and --offset, and prints
 * the rows it fetches as a table with which of how many they are when the server counts them
 * (its `total`), or the whole answer with --json (total, limit and offset with the rows).
 * Returns `cmd`, for options that come after them in its help.
 */
export function listCommand<O extends Paging, R extends { total?: bigint }, T>(ctx: Context, cmd: Command, spec: ListSpec<O, R, T>): Command {
  return cmd
    .option("--limit <n>", "how many", int("--limit"), spec.limit)
    .option("--offset <n>", "skip this many (the next page)", int("--offset"), 0)
    .action(async (o: O) => {
      const { c } = ctx.session(spec.role);
      const r = await spec.fetch(c, o);
      ctx.show(r, () => {
        const rows = spec.rows(r);
        printTable(rows, spec.columns);
        const after = spec.cursor?.after(rows);
        const cursor = spec.cursor && {
          from: (o as { before?: string }).before,
          next: after === undefined ? undefined : `${spec.cursor.option} ${after}`,
          limit: o.limit,
        };
        if (r.total !== undefined && r.total > 0n) out(pageLine(rows.length, Number(r.total), o.offset, cursor));
      });
    });
}
