// svc login and svc whoami: save a profile (the key checked with the server
// first), and say which one is in effect.
import readline from "node:readline";
import { Writable } from "node:stream";
import { Option, type Command } from "commander";
import { clientsFor } from "../clients.js";
import { SIGNAL_EXIT } from "../follow.js";
import { Exit, out, printFields } from "../output.js";
import { ROLES, checkBaseUrl, maskSecret, resolveProfile, roleOfKey, saveProfile, UsageError, type Profile, type Role } from "../profiles.js";
import type { Context } from "./context.js";

/** Reads a secret: piped stdin, else a prompt that does not echo it. Never from argv. */
async function readSecret(prompt: string): Promise<string> {
  if (!process.stdin.isTTY) {
    let data = "";
    for await (const chunk of process.stdin) data += chunk;
    return data.trim();
  }
  let muted = false;
  const output = new Writable({
    write(chunk, _enc, cb) {
      if (!muted) process.stderr.write(chunk);
      cb();
    },
  });
  const rl = readline.createInterface({ input: process.stdin, output, terminal: true });
  return new Promise((resolve, reject) => {
    let settled = false;
    const settle = (then: () => void) => {
      if (settled) return;
      settled = true;
      rl.close();
      process.stderr.write("\n");
      then();
    };
    rl.question(prompt, (answer) => settle(() => resolve(answer.trim())));
    // The terminal is raw while reading: Ctrl-C reaches readline, not the process, and with no
    // listener readline only pauses, leaving this promise (and svc) hanging. Exit as Ctrl-C does.
    rl.on("SIGINT", () => settle(() => reject(new Exit(SIGNAL_EXIT.SIGINT))));
    // Ctrl-D on an empty line closes the input: no key given.
    rl.on("close", () => settle(() => resolve("")));
    muted = true;
  });
}

export function addProfileCommands(program: Command, ctx: Context): void {
  const { globals: g, show } = ctx;
  program
    .command("login")
    .description("save a profile: the key (or admin token) is read from stdin or a prompt, never from arguments; SVC_KEY (or SVC_ADMIN_TOKEN) only when neither gives one")
    .requiredOption("--url <url>", "server base URL, e.g. http://localhost:8080")
    .addOption(new Option("--role <role>", "renter, provider or admin (default: from the key's prefix)").choices([...ROLES]))
    .option("--name <profile>", "profile name (default: --profile, else \"default\")")
    .action(async (o: { url: string; role?: Role; name?: string }) => {
      const url = checkBaseUrl(o.url, "--url");
      // What stdin or the prompt gives wins; the environment stands in only when they give nothing.
      const envName = o.role === "admin" ? "SVC_ADMIN_TOKEN" : process.env.SVC_KEY ? "SVC_KEY" : o.role ? undefined : "SVC_ADMIN_TOKEN";
      const envSecret = envName ? process.env[envName] || undefined : undefined;
      const given = await readSecret(`${o.role === "admin" ? "Admin token" : "API key"}${envSecret ? ` (Enter: use ${envName})` : ""}: `);
      const secret = given || envSecret;
      if (!secret) throw new UsageError("no key given (pipe it on stdin, type it at the prompt, or set SVC_KEY)");
      const role = o.role ?? roleOfKey(secret) ?? "admin";
      const p: Profile = { url, role, secret };
      const c = clientsFor(p);
      // Checked before it is saved: a bad key is refused here, with the server's answer.
      let who: string;
      // The `me` reads answer 404 for a key of no account (the spec's table); a list answers 401 "invalid API key".
      if (role !== "admin") await c.jobs.list({ limit: 1 });
      if (role === "renter") {
        const me = await c.renters.getMe({});
        who = `renter ${me.renter?.id} (${me.renter?.email})`;
      } else if (role === "provider") {
        const me = await c.providers.getMe({});
        who = `provider ${me.provider?.provider?.id} (${me.provider?.provider?.name})`;
      } else {
        await c.admin.getDashboard({});
        who = "admin";
      }
      const name = o.name ?? g().profile ?? "default";
      const file = saveProfile(name, p);
      show({ profile: name, url: p.url, role, key: maskSecret(secret), file }, () => out(`logged in as ${who} on ${p.url}: profile "${name}" saved in ${file} (key ${maskSecret(secret)})`));
    });

  program
    .command("whoami")
    .description("the profile in effect (the key masked)")
    .action(() => {
      const p = resolveProfile(g().profile);
      show({ profile: p.name, url: p.url, role: p.role, key: maskSecret(p.secret) }, () =>
        printFields([["profile", p.name], ["url", p.url], ["role", p.role], ["key", maskSecret(p.secret)]]),
      );
    });
}
