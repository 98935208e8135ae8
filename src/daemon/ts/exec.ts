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

/** `signal`: kills the command when aborted (the daemon is stopping), so it does not hold the process. */
export function runCommand(cmd: string, args: string[], opts: { timeoutMs?: number; env?: NodeJS.ProcessEnv; signal?: AbortSignal } = {}): Promise<CommandResult> {
  return new Promise((resolve) => {
    let stdout = "";
    let stderr = "";
    let child;
    try {
      child = spawn(cmd, args, { env: opts.env ?? process.env, stdio: ["ignore", "pipe", "pipe"], timeout: opts.timeoutMs, signal: opts.signal });
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
