// Running a short command to completion (nvidia-smi, docker kill/inspect).
import { spawn } from "node:child_process";

export interface CommandResult {
  /** Exit code; null when killed by the timeout or never started. */
  code: number | null;
  stdout: string;
  stderr: string;
  /** The executable was not found. */
  missing: boolean;
}

/**
 * The variables the daemon reads its own secrets from (cli.ts): the provider key and the HMAC
 * secret, or the files that hold them. No program it starts needs them (a job's runner, the
 * benchmark, docker, nvidia-smi), and a job's runner is the renter's code at one remove: none of
 * them gets them, nor is told where they are kept.
 */
export const DAEMON_SECRET_ENV: readonly string[] = ["SVC_API_KEY", "SVC_PROVIDER_KEY", "SVC_HMAC_SECRET", "SVC_KEY_FILE", "SVC_HMAC_SECRET_FILE"];

/** The daemon's secrets themselves (withholdSecrets): a variable holding one under another name is left out too. */
const heldSecrets = new Set<string>();

/**
 * Leaves every variable that holds one of these values (the provider key, the HMAC secret) out of
 * what childEnv gives: a service's own copy under a name of its own (an Environment= line, a
 * wrapper's export) is not a job's either. Values shorter than 8 characters are not secrets.
 */
export function withholdSecrets(...values: (string | undefined)[]): void {
  for (const v of values) if (v && v.length >= 8) heldSecrets.add(v);
}

/** The environment of a program the daemon starts: the daemon's own, less its secrets. */
export function childEnv(base: NodeJS.ProcessEnv = process.env): NodeJS.ProcessEnv {
  const env = { ...base };
  for (const name of DAEMON_SECRET_ENV) delete env[name];
  for (const [name, value] of Object.entries(env)) if (value && [...heldSecrets].some((s) => value.includes(s))) delete env[name];
  return env;
}

/** `signal`: kills the command when aborted (the daemon is stopping), so it does not hold the process. */
export function runCommand(cmd: string, args: string[], opts: { timeoutMs?: number; env?: NodeJS.ProcessEnv; signal?: AbortSignal } = {}): Promise<CommandResult> {
  return new Promise((resolve) => {
    let stdout = "";
    let stderr = "";
    let child;
    try {
      child = spawn(cmd, args, { env: opts.env ?? childEnv(), stdio: ["ignore", "pipe", "pipe"], timeout: opts.timeoutMs, signal: opts.signal });
    } catch {
      resolve({ code: null, stdout, stderr, missing: true });
      return;
    }
    child.stdout.on("data", (d) => (stdout += d));
    child.stderr.on("data", (d) => (stderr += d));
    child.on("error", (err: NodeJS.ErrnoException) => resolve({ code: null, stdout, stderr: stderr || err.message, missing: err.code === "ENOENT" }));
    child.on("close", (code) => resolve({ code, stdout, stderr, missing: false }));
  });
}
