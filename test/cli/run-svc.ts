// svc as a real subprocess, the way a user runs it: the built CLI (bin/svc.js), a config folder of
// its own, and of the SVC_ variables only those a test gives (none leaks in from the environment).
import { spawn } from "node:child_process";
import path from "node:path";
import { tempDir } from "../daemon/helpers.js";

export const SVC = path.resolve("bin/svc.js");

export interface Run {
  code: number | null;
  stdout: string;
  stderr: string;
  /** Killed at RunOptions.limitMs, still running. */
  killed?: boolean;
}

const SVC_VARIABLES = ["SVC_URL", "SVC_KEY", "SVC_ADMIN_TOKEN", "SVC_PROFILE", "SVC_ROLE", "SVC_TIMEOUT_SECONDS"];

export interface RunOptions {
  /** Its config folder is `home`/config (a fresh folder when not given); the working folder unless `cwd`. */
  home?: string;
  cwd?: string;
  /** Written to its stdin, which is then closed. */
  input?: string;
  /** Set over the environment (NO_COLOR is "1" unless given). */
  env?: Record<string, string>;
  /** Killed (SIGKILL) when it has not ended this long after its start: `code` is then null and `killed` true. */
  limitMs?: number;
  /** Called with all of stderr so far each time more of it comes, while it runs. */
  onStderr?: (stderr: string) => void;
}

export function runSvc(args: string[], opts: RunOptions = {}): Promise<Run> {
  const home = opts.home ?? tempDir("svc");
  const env: NodeJS.ProcessEnv = { ...process.env, SVC_CONFIG_DIR: path.join(home, "config"), NO_COLOR: "1" };
  for (const k of SVC_VARIABLES) delete env[k];
  Object.assign(env, opts.env);
  const child = spawn(process.execPath, [SVC, ...args], { env, cwd: opts.cwd ?? home, stdio: ["pipe", "pipe", "pipe"] });
  let stdout = "";
  let stderr = "";
  child.stdout.on("data", (d) => (stdout += d));
  child.stderr.on("data", (d) => {
    stderr += d;
    opts.onStderr?.(stderr);
  });
  child.stdin.end(opts.input ?? "");
  let killed = false;
  const limit = opts.limitMs === undefined ? undefined : setTimeout(() => ((killed = true), child.kill("SIGKILL")), opts.limitMs);
  return new Promise((resolve) =>
    child.on("close", (code) => {
      clearTimeout(limit);
      resolve({ code, stdout, stderr, ...(killed ? { killed } : {}) });
    }),
  );
}
