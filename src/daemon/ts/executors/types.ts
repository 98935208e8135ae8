// The one interface every executor implements: start a job, stream its
// output line by line, report progress, stop it on demand, and end with one
// outcome (result or error, plus metrics).
import type { JsonObject, JsonValue } from "@bufbuild/protobuf";

export interface JobSpec {
  jobId: string;
  jobType: string;
  taskSpec: JsonObject;
  maxDurationSeconds: number;
  /**
   * The host's GPUs (nvidia-smi indices) this job may use: the daemon hands each running job one
   * of its own. None: the job sees no GPU.
   */
  gpus?: number[];
}

export interface JobHooks {
  log(line: string): void;
  progress(pct: number | undefined, phase: string | undefined): void;
  /** Serving jobs: where the endpoint listens, and the secret it requires (Bearer), when it requires one. */
  endpointReady?(url: string, apiKey?: string): void;
}

export interface Outcome {
  success: boolean;
  result?: JsonValue;
  error?: string;
  metrics: JsonObject;
  /**
   * A failure's end reason as the server's protocol names it: runtime_error (the job's own
   * code, image or input failed: the renter's fault), provider_error (this machine could not
   * run it: the provider's), timeout (its max_duration_seconds ran out).
   */
  endReason?: "runtime_error" | "provider_error" | "timeout";
}

export interface RunningJob {
  /** Settles once, when the job ended (by itself or stopped). */
  done: Promise<Outcome>;
  /**
   * Stops the job (cancel, max duration, shutdown); `done` then settles with this reason as the error.
   * `killAfterMs`: how long the job may take to exit after SIGTERM before it is killed (the executor's own default otherwise).
   */
  stop(reason: string, killAfterMs?: number): Promise<void>;
}

/** What an executor's preparation of a job is given (Executor.prepare). */
export interface PrepareOptions {
  /** When the daemon stops waiting (epoch ms): the job is then handed back. */
  deadline: number;
  /** Aborted when the job is cancelled or the daemon stops: nothing to wait for any more. */
  signal: AbortSignal;
  /** Aborted when the daemon stops: work shared beyond this job (a pull) is ended too. */
  stop: AbortSignal;
  log(line: string): void;
  /**
   * Says the job waits for something that takes a while (`detail`: what, for the renter): the
   * daemon tells the server from then on, so that the job is not taken back as never picked up.
   */
  preparing(detail: string): void;
}

export interface Executor {
  readonly name: string;
  /**
   * Makes this machine ready for the job before it is accepted (the docker executor pulls a missing
   * image), so that none of it is the job's run time. Resolves to why it could not (this machine's
   * failure), or undefined.
   */
  prepare?(job: JobSpec, opts: PrepareOptions): Promise<string | undefined>;
  start(job: JobSpec, hooks: JobHooks): RunningJob;
}

/** Directive a job prints to report progress: "SVC_PROGRESS <pct> [phase words]". */
export const PROGRESS_PREFIX = "SVC_PROGRESS";

export function parseProgress(line: string): { pct: number | undefined; phase: string | undefined } | undefined {
  if (!line.startsWith(`${PROGRESS_PREFIX} `)) return undefined;
  const rest = line.slice(PROGRESS_PREFIX.length + 1).trim();
  const [first, ...words] = rest.split(/\s+/);
  const n = Number(first);
  if (first === "" || !Number.isFinite(n)) return undefined;
  return { pct: Math.max(0, Math.min(100, n)), phase: words.join(" ") || undefined };
}
