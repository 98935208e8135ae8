// `svc submit --follow`, `svc jobs watch` and `svc jobs logs -f`: a job's live
// events (WatchJob). On a terminal: the queue reason while queued, then a
// progress bar with the phase, log lines printed above it; elsewhere plain
// lines; with --json one JSON object per event (the API's JSON, as the REST
// event stream writes it). A lost connection (cut, reset, the server
// restarting, or a watch with no first event within SVC_TIMEOUT_SECONDS) is resumed from the last cursor, so no log line is lost or
// printed twice, for as long as SVC_RECONNECT_SECONDS (default 300 s) without
// an event; so is a watch the server cut because svc fell behind its events (a
// 429 after events), and its "try again later" (503, 429: too many watches open)
// after its Retry-After; a refusal of the server is not retried. At the end the result,
// its cost and where the output was written. What the server sends (a
// provider's log lines, phases, queue reasons, errors; a text result printed on
// a terminal) is printed terminalSafe: its control characters in caret notation.
import path from "node:path";
import { Code, ConnectError } from "@connectrpc/connect";
import cliProgress from "cli-progress";
import type { JobEvent, JobOutcome } from "../../gen/svc/v1/jobs_pb.js";
import { callTimeoutMs, isNoHttp2, type Clients } from "./clients.js";
import { EXIT, colour, isTty, metadataValue, out, printJsonLine, sar, statusColour, terminalSafe, writeLocalFile } from "./output.js";
import { outputFileExtension } from "../shared/image-formats.js";
import { isTerminal } from "../shared/job-status.js";

/** A field of the server's on one line (a status, a phase, a reason), terminalSafe. */
const word = (text: string) => terminalSafe(text, { singleLine: true });

export interface FollowOptions {
  json: boolean;
  /** Only log lines (svc jobs logs -f). */
  logsOnly?: boolean;
  /** Only this attempt's log lines (svc jobs logs -f --attempt N); the watch sends every attempt's. */
  attempt?: number;
  /** Where to write the output (default: <job_id>.<ext> for files, stdout for text). */
  outFile?: string;
}

/** How long a lost stream is tried again without an event: SVC_RECONNECT_SECONDS, default 5 minutes. */
export function reconnectWindowMs(env = process.env): number {
  const s = env.SVC_RECONNECT_SECONDS?.trim() ? Number(env.SVC_RECONNECT_SECONDS) : NaN;
  return Number.isFinite(s) && s >= 0 ? s * 1000 : 300_000;
}
/** Backoff between tries: 250 ms doubling up to 5 s; back to the start after any event. */
export const backoffMs = (attempt: number) => Math.min(250 * 2 ** attempt, 5_000);

/** The documented HTTP status of the server's answer (x-svc-http-status), if it sent one. */
const httpStatusOf = (err: ConnectError): number | undefined => Number(metadataValue(err.metadata, "x-svc-http-status")) || undefined;

/** How long the server asked to wait before trying again (its Retry-After, in ms); 0 when it did not say. */
export function retryAfterMs(err: ConnectError): number {
  const s = Number(metadataValue(err.metadata, "retry-after"));
  return Number.isFinite(s) && s > 0 ? s * 1000 : 0;
}

/** The codes of a call that failed before or without an answer of the server (a lost connection). */
const TRANSPORT_CODES = new Set([Code.Canceled, Code.Aborted, Code.Unavailable, Code.Unknown, Code.Internal, Code.DeadlineExceeded, Code.ResourceExhausted]);

/**
 * Whether a failed watch is resumed. When the connection was lost (cut: Canceled, "http/2
 * stream closed with error code CANCEL"; reset: Aborted, ECONNRESET; refused: Unavailable)
 * no status came back: no grpc-status and no x-svc-http-status, the header our server sets on
 * its own errors. An answer of the server is final, except "try again later": its 503 (a
 * database it cannot reach) and 429 (a rate limit, too many watches open, or a watch cut because
 * its reader fell behind the job's events), and its Unavailable while it shuts down.
 */
export function resumable(err: ConnectError): boolean {
  // What answers at the URL does not speak HTTP/2: it answers so again (see isNoHttp2).
  if (isNoHttp2(err)) return false;
  const httpStatus = httpStatusOf(err);
  if (httpStatus) return httpStatus === 503 || httpStatus === 429;
  if (err.metadata.has("grpc-status")) return err.code === Code.Unavailable;
  return TRANSPORT_CODES.has(err.code);
}

interface Display {
  status(text: string): void;
  progress(pct: number | undefined, phase: string | undefined): void;
  log(text: string): void;
  /** A note on the connection (reconnecting…): stderr, or above the bar. */
  notice(text: string): void;
  stop(complete: boolean): void;
}

function plainDisplay(): Display {
  let last = "";
  return {
    status: (t) => out(t),
    progress(pct, phase) {
      const line = `progress: ${pct === undefined ? "?" : Math.round(pct)}%${phase ? ` ${phase}` : ""}`;
      if (line !== last) out(line);
      last = line;
    },
    log: (t) => out(t),
    notice: (t) => void process.stderr.write(t + "\n"),
    stop() {},
  };
}

/** Exit codes of a process ended by a signal, as shells report them. */
export const SIGNAL_EXIT = { SIGINT: 130, SIGTERM: 143 } as const;

/**
 * While the bar is drawn (cursor hidden, line wrap off), SIGINT and SIGTERM stop it (which
 * restores the terminal) and then exit 130 or 143. Returns the function that removes the
 * handlers. Not cli-progress' gracefulExit: it stops the bar and swallows the signal.
 */
export function restoreOnSignal(stop: () => void, exit: (code: number) => void = (code) => process.exit(code)): () => void {
  const handlers = (Object.keys(SIGNAL_EXIT) as (keyof typeof SIGNAL_EXIT)[]).map((sig) => {
    const handler = () => {
      remove();
      try {
        stop();
      } finally {
        exit(SIGNAL_EXIT[sig]);
      }
    };
    process.on(sig, handler);
    return [sig, handler] as const;
  });
  const remove = () => {
    for (const [sig, handler] of handlers) process.removeListener(sig, handler);
  };
  return remove;
}

/** The bar lives on stderr's line below the logs; MultiBar.log prints above it. */
function barDisplay(): Display {
  const multi = new cliProgress.MultiBar(
    {
      format: " {bar} {percentage}% | {phase}",
      barCompleteChar: "\u2588",
      barIncompleteChar: "\u2591",
      hideCursor: true,
      clearOnComplete: false,
      stopOnComplete: false,
      stream: process.stdout,
      forceRedraw: true,
    },
    cliProgress.Presets.shades_classic,
  );
  let bar: cliProgress.SingleBar | undefined;
  let phase = "";
  let stopped = false;
  const stopBar = () => {
    if (stopped) return;
    stopped = true;
    multi.stop();
  };
  const unhook = restoreOnSignal(stopBar);
  const ensure = () => (bar ??= multi.create(100, 0, { phase }));
  return {
    status(t) {
      if (bar) multi.log(t + "\n");
      else out(t);
    },
    progress(pct, ph) {
      phase = ph ?? phase;
      const b = ensure();
      b.update(pct === undefined ? b.getProgress() * 100 : Math.round(pct), { phase });
    },
    log(t) {
      if (bar) multi.log(t + "\n");
      else out(t);
    },
    notice(t) {
      if (bar && !stopped) multi.log(t + "\n");
      else process.stderr.write(t + "\n");
    },
    stop(complete) {
      unhook();
      if (complete && !stopped) ensure().update(100, { phase: phase || "done" });
      stopBar();
    },
  };
}

export interface Saved {
  /** "stdout", or the file written. */
  where: string;
  bytes: number;
}

/**
 * Writes or prints what a completed job produced (`outputFormat`: JobOutcome.output_format:
 * png or another image format, text or json). A text result is its text, an image its bytes,
 * a JSON result the output route's JSON; to `outFile`, else an image to `<job_id>.<format>`
 * for a raster format and to `<job_id>.bin` for any other the provider named (outputFileExtension),
 * and text or JSON to stdout. `svc submit --follow`, `jobs watch` and `jobs output` all save this way.
 */
export async function saveOutput(c: Clients, jobId: string, outputFormat: string, outFile: string | undefined): Promise<Saved> {
  const image = outputFormat !== "text" && outputFormat !== "json";
  const res = await c.jobs.getOutputFormat({ jobId, format: image || outputFormat === "text" ? "raw" : "json" });
  if (!outFile && !image) {
    const text = Buffer.from(res.data).toString("utf8").replace(/\n?$/, "\n");
    // On a terminal, safe to look at; into a pipe or a file, the exact text.
    process.stdout.write(isTty() ? terminalSafe(text) : text);
    return { where: "stdout", bytes: Buffer.byteLength(text) };
  }
  const file = path.resolve(outFile ?? `${jobId}.${outputFileExtension(outputFormat)}`);
  writeLocalFile(file, res.data);
  return { where: file, bytes: res.data.length };
}

/** How many attempts an event says the job has had, and whether it says the job ended; undefined when it says neither. */
function attemptsIn(e: JobEvent): { attempts: number; ended: boolean } | undefined {
  switch (e.event.case) {
    case "snapshot": {
      const j = e.event.value.job;
      return { attempts: Math.max(j?.attempt ?? 0, e.event.value.attempts.length), ended: isTerminal(j?.status ?? "") };
    }
    case "status":
      return { attempts: e.event.value.attempt, ended: isTerminal(e.event.value.status) };
    case "attempts":
      return { attempts: e.event.value.attempts.length, ended: false };
    default:
      return undefined;
  }
}

/** Follows a job to its end; returns the exit code (0 completed, 1 failed or cancelled; 5 with --attempt for one the job never had). */
export async function follow(c: Clients, jobId: string, opts: FollowOptions): Promise<number> {
  const tty = isTty() && !opts.json;
  const display = opts.json ? undefined : tty && !opts.logsOnly ? barDisplay() : plainDisplay();
  const notice = (t: string) => (display ? display.notice(t) : void process.stderr.write(t + "\n"));
  let cursor: string | undefined;
  let outcome: JobOutcome | undefined;
  let complete = false;
  /** What the last status line said: a resumed stream's snapshot repeats it only when it changed. */
  let shown = "";
  /** The job's attempts so far, as its events tell them (--attempt: one that has not started is waited for). */
  let attempts = 0;
  let toldWaiting = false;
  const onEvent = (e: JobEvent) => {
    cursor = e.cursor;
    const seen = attemptsIn(e);
    if (seen !== undefined) {
      attempts = Math.max(attempts, seen.attempts);
      if (opts.attempt !== undefined && opts.attempt > attempts && !seen.ended && !toldWaiting) {
        toldWaiting = true;
        notice(`svc: attempt ${opts.attempt} has not started yet (the job has had ${attempts}); its lines are shown if it starts`);
      }
    }
    if (e.event.case === "log" && opts.attempt !== undefined && e.event.value.attempt !== opts.attempt) return;
    if (opts.json) {
      printJsonLine(e);
      if (e.event.case === "outcome") outcome = e.event.value;
      return;
    }
    const d = display!;
    switch (e.event.case) {
      case "snapshot": {
        const j = e.event.value.job!;
        if (opts.logsOnly) break;
        const line = `job ${word(j.jobId)} (${word(j.jobType)}): ${statusColour(j.status)}${j.queueReason ? ` — ${word(j.queueReason)}` : ""}`;
        if (line !== shown) d.status(line);
        shown = line;
        if (j.status === "running" || j.progressPct !== undefined) d.progress(j.progressPct, j.progressPhase === undefined ? undefined : word(j.progressPhase));
        break;
      }
      case "status": {
        if (opts.logsOnly) break;
        const s = e.event.value;
        d.status(`status: ${statusColour(s.status)}${s.queueReason ? ` — ${word(s.queueReason)}` : ""}${s.providerId !== undefined && s.status !== "queued" ? ` (provider ${s.providerId})` : ""}`);
        shown = "";
        if (s.status === "running") d.progress(undefined, undefined);
        break;
      }
      case "progress":
        if (!opts.logsOnly) d.progress(e.event.value.progressPct, e.event.value.phase === undefined ? undefined : word(e.event.value.phase));
        break;
      case "log": {
        const l = e.event.value;
        // A provider's daemon wrote the line: its tabs and newlines kept, nothing a terminal acts on.
        d.log(`${colour(word(l.level).padEnd(7), l.level === "error" || l.level === "critical" ? "red" : "dim")} ${terminalSafe(l.message)}`);
        break;
      }
      case "attempts":
        break;
      case "outcome":
        outcome = e.event.value;
        complete = outcome.status === "completed";
        break;
    }
  };
  const windowMs = reconnectWindowMs();
  const firstEventMs = callTimeoutMs();
  let attempt = 0;
  /** When the connection was lost (undefined while events arrive). */
  let lostAt: number | undefined;
  while (!outcome) {
    /** Whether this try got events: a 429 after them is a cut for falling behind, not a refusal. */
    let streamed = false;
    // The server's first event (the job as it is) comes at once: a watch that gets none within the
    // call deadline was taken by something that does not answer, and is tried again as a lost one.
    const stalled = new AbortController();
    const firstEventTimer = firstEventMs > 0 ? setTimeout(() => stalled.abort(), firstEventMs) : undefined;
    try {
      for await (const e of c.jobs.watchJob({ jobId, cursor }, { signal: stalled.signal })) {
        clearTimeout(firstEventTimer);
        streamed = true;
        // Any event: the connection works; a later loss starts a new count.
        if (lostAt !== undefined) notice("svc: reconnected");
        attempt = 0;
        lostAt = undefined;
        onEvent(e);
      }
      if (!outcome) throw new ConnectError("the event stream ended before the job did", Code.Unavailable);
    } catch (err) {
      // The job's end arrived before the stream failed (its close was lost): nothing is missing.
      if (outcome) break;
      const ce = stalled.signal.aborted ? new ConnectError(`no event within ${firstEventMs / 1000} s`, Code.DeadlineExceeded) : ConnectError.from(err);
      const now = Date.now();
      // Never sooner than the server's Retry-After: what it said to wait for is not asked again at once.
      const delay = Math.max(backoffMs(attempt++), retryAfterMs(ce));
      // A lost connection (or a server restarting) resumes from the last cursor; a refusal does not.
      if (!resumable(ce) || now + delay - (lostAt ?? now) > windowMs) {
        display?.stop(false);
        if (lostAt !== undefined) notice(`svc: gave up reconnecting after ${Math.round((now - lostAt) / 1000)} s`);
        throw stalled.signal.aborted ? ce : err;
      }
      // The server cut a stream that was delivering because svc fell behind its events (its output
      // went into a slow pipe, or the process was stopped): resuming from the cursor loses and repeats
      // nothing, and is not a lost connection to report.
      const fellBehind = streamed && httpStatusOf(ce) === 429;
      if (lostAt === undefined && !fellBehind) {
        lostAt = now;
        // A 429 before any event (too many watches open, a rate limit): the server asked to wait.
        const wait = httpStatusOf(ce) === 429;
        notice(wait ? `svc: the server asks to try again later (${word(ce.rawMessage)}); waiting…` : `svc: connection lost (${word(ce.rawMessage)}); reconnecting…`);
      }
      await new Promise((r) => setTimeout(r, delay));
    } finally {
      clearTimeout(firstEventTimer);
    }
  }
  display?.stop(complete);
  const o = outcome;
  const ok = o.status === "completed";
  if (opts.logsOnly) {
    // The job ended without the attempt asked for: as `jobs logs --attempt N` without -f answers (404).
    if (opts.attempt !== undefined && opts.attempt > attempts) {
      process.stderr.write(`svc: attempt ${opts.attempt} does not exist (the job has ${attempts})\n`);
      return EXIT.refused;
    }
    return ok ? EXIT.ok : EXIT.jobFailed;
  }
  let saved: Saved | undefined;
  /** Saving the output failed (a file svc cannot write, the server's refusal): said after the job's own result. */
  let unsaved: { err: unknown } | undefined;
  // With --json, stdout carries only the events: a text result goes to a file only when --out names one.
  if (ok && o.outputFormat && !(opts.json && !opts.outFile && (o.outputFormat === "text" || o.outputFormat === "json"))) {
    try {
      saved = await saveOutput(c, jobId, o.outputFormat, opts.outFile);
    } catch (err) {
      unsaved = { err };
    }
  }
  if (!opts.json) {
    const why = [o.endReason, o.fault && o.fault !== "none" ? `${o.fault} fault` : undefined].filter(Boolean).map((t) => word(t!)).join(", ");
    out(`result: ${statusColour(o.status)}${why ? ` (${why})` : ""}${o.error ? `: ${terminalSafe(o.error)}` : ""}`);
    out(`cost: ${o.costHalala} halala (${sar(o.costHalala)})${o.actualMinutes !== undefined ? `, ${o.actualMinutes} GPU minute(s)` : ""}`);
    if (saved && saved.where !== "stdout") out(`output: written to ${saved.where}`);
  }
  if (unsaved) throw unsaved.err;
  return ok ? EXIT.ok : EXIT.jobFailed;
}
