// A job as a child process: the task on stdin, stdout/stderr line by line
// (progress directives picked out), the result from $SVC_RESULT_FILE (or the
// printed text as {"response": ...}), and stop = SIGTERM to its whole process
// group, then SIGKILL, so no grandchild outlives the job.
import { spawn, type ChildProcess } from "node:child_process";
import fs from "node:fs";
import readline from "node:readline";
import type { JsonValue } from "@bufbuild/protobuf";
import { parseProgress, type JobHooks, type Outcome, type RunningJob } from "./types.js";

export interface ChildJobOptions {
  argv: string[];
  env: NodeJS.ProcessEnv;
  cwd: string;
  stdin: string;
  /** Where the job writes its JSON result (host path). */
  resultFile: string;
  executor: string;
  /** Extra stop step before signalling the child (e.g. `docker kill`). */
  onStop?: () => Promise<void>;
  /** Seconds between SIGTERM and SIGKILL. */
  killGraceMs?: number;
}

const MAX_KEPT_OUTPUT = 1_000_000;

/** Signals the job's whole process group (the child leads it), also after the child itself exited. */
function signalGroup(child: ChildProcess, signal: NodeJS.Signals) {
  if (child.pid === undefined) return;
  try {
    process.kill(-child.pid, signal);
  } catch {
    // No such group any more: nothing left to stop.
  }
}

export function startChildJob(opts: ChildJobOptions, hooks: JobHooks): RunningJob {
  const started = Date.now();
  fs.rmSync(opts.resultFile, { force: true });
  const child = spawn(opts.argv[0], opts.argv.slice(1), { cwd: opts.cwd, env: opts.env, stdio: ["pipe", "pipe", "pipe"], detached: true });
  let stopReason: string | undefined;
  let output = "";
  const keep = (line: string) => {
    if (output.length < MAX_KEPT_OUTPUT) output += line + "\n";
  };
  const onLine = (line: string) => {
    const p = parseProgress(line);
    if (p) hooks.progress(p.pct, p.phase);
    else {
      keep(line);
      hooks.log(line);
    }
  };
  const closed: Promise<void>[] = [];
  for (const stream of [child.stdout!, child.stderr!]) {
    const rl = readline.createInterface({ input: stream, crlfDelay: Infinity });
    rl.on("line", onLine);
    closed.push(new Promise((resolve) => rl.on("close", () => resolve())));
  }
  child.stdin!.on("error", () => {});
  child.stdin!.end(opts.stdin);

  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null; error?: Error }>((resolve) => {
    child.on("error", (error) => resolve({ code: null, signal: null, error }));
    child.on("exit", (code, signal) => resolve({ code, signal }));
  });

  const done = (async (): Promise<Outcome> => {
    const { code, signal, error } = await exited;
    // Output after exit may still be buffered; a grandchild holding the pipes must not block the result.
    await Promise.race([Promise.all(closed), new Promise((r) => setTimeout(r, 2000))]);
    signalGroup(child, "SIGKILL");
    const metrics = { duration_seconds: (Date.now() - started) / 1000, exit_code: code ?? -1, executor: opts.executor } as Record<string, JsonValue>;
    if (signal) metrics.signal = signal;
    if (stopReason) return { success: false, error: stopReason, metrics };
    if (error) return { success: false, error: `could not start the job: ${error.message}`, metrics, endReason: "provider_error" };
    if (code !== 0) {
      const tail = output.trim().split("\n").slice(-5).join("\n").slice(-1000);
      // The job's own exit status is its own doing (an executor that can fail itself, as docker can,
      // tells its own failures apart: docker.ts).
      return { success: false, error: `the job exited with status ${code ?? signal}${tail ? `: ${tail}` : ""}`, metrics, endReason: "runtime_error" };
    }
    if (fs.existsSync(opts.resultFile)) {
      try {
        return { success: true, result: JSON.parse(fs.readFileSync(opts.resultFile, "utf8")) as JsonValue, metrics };
      } catch (err) {
        return { success: false, error: `the job wrote an invalid result file: ${(err as Error).message}`, metrics, endReason: "runtime_error" };
      }
    }
    return { success: true, result: { response: output.trim() }, metrics };
  })();

  return {
    done,
    async stop(reason, killAfterMs) {
      if (stopReason) return;
      stopReason = reason;
      await opts.onStop?.().catch(() => {});
      signalGroup(child, "SIGTERM");
      const timer = setTimeout(() => signalGroup(child, "SIGKILL"), killAfterMs ?? opts.killGraceMs ?? 5000);
      await exited;
      clearTimeout(timer);
      signalGroup(child, "SIGKILL");
    },
  };
}
