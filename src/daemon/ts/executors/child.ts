// A job as a child process: the task on stdin, stdout/stderr line by line
// (progress directives picked out; each line cut at MAX_LINE_CHARS), the
// result from $SVC_RESULT_FILE (or the printed text as {"response": ...}),
// and stop = SIGTERM to its whole process group, then SIGKILL, so no
// grandchild outlives the job. The result file is the job's to write, and a
// container writes it through its /svc-output mount: it is read only when it
// is a regular file (no symbolic link followed, no FIFO or device opened in a
// way that could block) of at most MAX_RESULT_FILE_BYTES.
import { spawn, type ChildProcess } from "node:child_process";
import fs from "node:fs";
import type { Readable } from "node:stream";
import { StringDecoder } from "node:string_decoder";
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
  /**
   * Called with the job's process group (its leader's pid) once started; what it returns is called
   * once the whole group has ended (job-processes.ts records it for a daemon killed meanwhile).
   */
  onGroup?: (pgid: number) => () => void;
}

const MAX_KEPT_OUTPUT = 1_000_000;

/**
 * The largest result file read (8 MiB): well under the stream's 16 MiB message limit (and the
 * legacy job-result body's), which the result must also fit once encoded (daemon.ts checks).
 * A larger file is the job's failure (runtime_error), not read at all. docs/daemons.md.
 */
export const MAX_RESULT_FILE_BYTES = 8 * 1024 * 1024;

/** The longest output line kept (UTF-16 units); the rest of a longer line is dropped, up to its newline. */
export const MAX_LINE_CHARS = 16_000;

/**
 * Reads a job's result file, trusting nothing about it: opened without following a symbolic link
 * and without blocking (a FIFO opens at once), then accepted only as a regular file of at most
 * `maxBytes`. `absent`: no file there (the job printed its result instead).
 */
export function readResultFile(file: string, maxBytes = MAX_RESULT_FILE_BYTES): { absent: true } | { result: JsonValue } | { error: string } {
  const flags = fs.constants.O_RDONLY | (fs.constants.O_NOFOLLOW ?? 0) | (fs.constants.O_NONBLOCK ?? 0);
  let fd: number;
  try {
    fd = fs.openSync(file, flags);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === "ENOENT") return { absent: true };
    if (code === "ELOOP" || code === "EMLINK") return { error: "the job's result file is a symbolic link; only a regular file is read" };
    return { error: `the job's result file could not be opened: ${code ?? (err as Error).message}` };
  }
  try {
    const st = fs.fstatSync(fd);
    if (!st.isFile()) return { error: `the job's result file is not a regular file (${fileKind(st)}); only a regular file is read` };
    if (st.size > maxBytes) return { error: `the job's result file is ${st.size} bytes, over the ${maxBytes}-byte limit` };
    // Read to at most one byte past the limit: the file may still grow (a process outliving the job).
    const buf = Buffer.alloc(Math.min(st.size, maxBytes) + 1);
    let got = 0;
    for (let n; got < buf.length && (n = fs.readSync(fd, buf, got, buf.length - got, got)) > 0; ) got += n;
    if (got > maxBytes) return { error: `the job's result file is over the ${maxBytes}-byte limit` };
    try {
      return { result: JSON.parse(buf.subarray(0, got).toString("utf8")) as JsonValue };
    } catch (err) {
      return { error: `the job wrote an invalid result file: ${(err as Error).message}` };
    }
  } catch (err) {
    return { error: `the job's result file could not be read: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}` };
  } finally {
    fs.closeSync(fd);
  }
}

function fileKind(st: fs.Stats): string {
  if (st.isDirectory()) return "a directory";
  if (st.isFIFO()) return "a FIFO";
  if (st.isSocket()) return "a socket";
  if (st.isCharacterDevice() || st.isBlockDevice()) return "a device";
  return "not a file";
}

/**
 * Calls onLine for each line of a stream ("\n" or "\r\n" ended; a last line without one too), each
 * cut at `maxChars`: a line longer than that is never held in memory whole. Resolves at the end.
 */
export function eachLine(stream: Readable, onLine: (line: string) => void, maxChars = MAX_LINE_CHARS): Promise<void> {
  const decoder = new StringDecoder("utf8");
  let line = "";
  // Past maxChars: the line was handed on already, the rest of it is dropped up to its newline.
  let skipping = false;
  const emit = (text: string) => onLine(text.endsWith("\r") ? text.slice(0, -1) : text);
  const take = (text: string) => {
    let from = 0;
    for (;;) {
      const nl = text.indexOf("\n", from);
      const part = text.slice(from, nl < 0 ? text.length : nl);
      if (!skipping) {
        line += part;
        if (line.length > maxChars) {
          emit(line.slice(0, maxChars));
          line = "";
          skipping = true;
        }
      }
      if (nl < 0) return;
      if (!skipping) emit(line);
      line = "";
      skipping = false;
      from = nl + 1;
    }
  };
  return new Promise((resolve) => {
    stream.on("data", (chunk: Buffer) => take(decoder.write(chunk)));
    const end = () => {
      take(decoder.end());
      if (!skipping && line.length > 0) emit(line);
      line = "";
      resolve();
    };
    stream.on("end", end);
    stream.on("close", end);
    stream.on("error", end);
  });
}

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
  const groupEnded = child.pid === undefined ? undefined : opts.onGroup?.(child.pid);
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
  const closed = [child.stdout!, child.stderr!].map((stream) => eachLine(stream, onLine));
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
    groupEnded?.();
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
    const file = readResultFile(opts.resultFile);
    if ("error" in file) return { success: false, error: file.error, metrics, endReason: "runtime_error" };
    if ("result" in file) return { success: true, result: file.result, metrics };
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
