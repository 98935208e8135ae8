// The live source of the job page, the only module that knows how job
// updates arrive: the WatchJob server stream (Connect over HTTP/1.1). It
// resumes from the last cursor after a drop (log lines are not sent twice),
// reports a lost connection while it retries with backoff, and reads the job
// when its status changes and once the outcome arrives (times and the cost
// breakdown are on the job, not in the events).
//
// Each open stream holds one of the browser's six HTTP/1.1 connections to the
// service, so a tab that is not shown (hidden, frozen, or put in the
// back/forward cache) closes its stream and resumes from its cursor when it is
// shown again: six job tabs in the background do not stop the console loading
// in a seventh. An answer that retrying cannot change (the job does not exist,
// it is another caller's, the key was refused) ends the watch with its message.
// A "try again later" (429: too many watches open) is shown and tried again no
// sooner than its Retry-After; a stream the service cut because this page fell
// behind its events (a 429 after events) resumes from the cursor unannounced.
import { Code, ConnectError } from "@connectrpc/connect";
import type { Job } from "../../gen/svc/v1/models_pb.js";
import type { JobAttempt, JobLogLine } from "../../gen/svc/v1/jobs_pb.js";
import { api, isConnectionLost, messageOf, retryAfterMs, signOutIfRefused } from "./api.js";

export interface LiveJob {
  job?: Job;
  attempts: JobAttempt[];
  logs: JobLogLine[];
  /** The service's error (e.g. job not found), shown in place. */
  error?: string;
  /** No answer from the service; retrying. */
  lost: boolean;
  /** The job ended and every update was read: nothing more will come. */
  done: boolean;
}

/** Answers that watching again would only repeat: the watch stops on them. */
const FINAL = new Set([Code.NotFound, Code.PermissionDenied, Code.Unauthenticated, Code.InvalidArgument]);

/** Calls `onChange` with the job's state as it changes; returns a function that stops watching. */
export function watchJob(jobId: string, onChange: (s: LiveJob) => void): () => void {
  let stopped = false;
  let state: LiveJob = { attempts: [], logs: [], lost: false, done: false };
  let cursor: string | undefined;
  /** The open stream's own abort: aborted when the tab goes out of view. */
  let conn: AbortController | undefined;
  /** Ends the current wait early (the tab was shown again, or the watch stopped). */
  let wake: (() => void) | undefined;
  let frozen = false;
  let pageHidden = false;
  const away = () => frozen || pageHidden || document.visibilityState === "hidden";

  /**
   * Log lines read and not handed on yet. A stream's lines come many to a read (a page of up to a
   * thousand): handed on one by one, each would redraw the whole log, and a long log froze the tab.
   * They are handed on once the lines read so far are taken (a task later), or with the next other event.
   */
  let unsent: JobLogLine[] = [];
  let flushTimer: ReturnType<typeof setTimeout> | undefined;
  const emit = (patch: Partial<LiveJob>) => {
    clearTimeout(flushTimer);
    flushTimer = undefined;
    state = { ...state, ...(unsent.length ? { logs: state.logs.concat(unsent) } : {}), ...patch };
    unsent = [];
    if (!stopped) onChange(state);
  };
  const addLog = (line: JobLogLine) => {
    unsent.push(line);
    flushTimer ??= setTimeout(() => emit({}), 0);
  };
  /** Waits `ms` (or until woken when not given); the tab being shown again wakes it. */
  const wait = (ms?: number) =>
    new Promise<void>((resolve) => {
      const timer = ms === undefined ? undefined : setTimeout(() => wake?.(), ms);
      wake = () => {
        clearTimeout(timer);
        wake = undefined;
        resolve();
      };
    });
  const changed = () => {
    if (away()) conn?.abort();
    else wake?.();
  };
  const onFreeze = () => ((frozen = true), changed());
  const onResume = () => ((frozen = false), changed());
  const onPageHide = () => ((pageHidden = true), changed());
  const onPageShow = () => ((pageHidden = false), changed());
  document.addEventListener("visibilitychange", changed);
  document.addEventListener("freeze", onFreeze);
  document.addEventListener("resume", onResume);
  window.addEventListener("pagehide", onPageHide);
  window.addEventListener("pageshow", onPageShow);
  const stop = () => {
    stopped = true;
    clearTimeout(flushTimer);
    conn?.abort();
    wake?.();
    document.removeEventListener("visibilitychange", changed);
    document.removeEventListener("freeze", onFreeze);
    document.removeEventListener("resume", onResume);
    window.removeEventListener("pagehide", onPageHide);
    window.removeEventListener("pageshow", onPageShow);
  };

  const follow = async () => {
    let backoff = 1000;
    while (!stopped) {
      if (away()) {
        await wait();
        continue;
      }
      const mine = (conn = new AbortController());
      /** Whether this stream brought events: a 429 after them is a cut for falling behind, not a refusal. */
      let streamed = false;
      let retryAfter = 0;
      try {
        const stream = api.jobs.watchJob({ jobId, ...(cursor ? { cursor } : {}) }, { signal: mine.signal });
        for await (const ev of stream) {
          streamed = true;
          cursor = ev.cursor || cursor;
          backoff = 1000;
          const e = ev.event;
          const job = state.job;
          switch (e.case) {
            case "snapshot":
              // A resumed stream does not repeat the log lines already shown.
              emit({ job: e.value.job, attempts: e.value.attempts, lost: false, error: undefined });
              break;
            case "status":
              if (job) {
                emit({
                  job: { ...job, status: e.value.status, queueReason: e.value.queueReason, queueReasonCode: e.value.queueReasonCode, providerId: e.value.providerId, attempt: e.value.attempt },
                });
              }
              // Status changes are few; the job read brings the fields they move (started_at, …).
              emit({ job: await api.jobs.get({ jobId }) });
              break;
            case "progress":
              if (job) emit({ job: { ...job, progressPct: e.value.progressPct, progressPhase: e.value.phase } });
              break;
            case "log":
              addLog({ $typeName: "svc.v1.JobLogLine", seq: e.value.seq, level: e.value.level, message: e.value.message, createdAt: e.value.createdAt });
              break;
            case "attempts":
              emit({ attempts: e.value.attempts });
              break;
            case "outcome":
              emit({ job: await api.jobs.get({ jobId }), done: true, lost: false });
              stop();
              return;
          }
        }
      } catch (err) {
        if (stopped) return;
        // Closed because the tab went out of view: wait to be shown, then resume from the cursor.
        if (mine.signal.aborted) {
          backoff = 1000;
          continue;
        }
        retryAfter = retryAfterMs(err);
        if (isConnectionLost(err)) emit({ lost: true });
        else if (streamed && err instanceof ConnectError && err.code === Code.ResourceExhausted) {
          // Cut for falling behind the job's events: nothing is lost, the next stream resumes at the cursor.
        } else {
          emit({ error: messageOf(err), lost: false });
          if (err instanceof ConnectError && FINAL.has(err.code)) {
            signOutIfRefused(err);
            stop();
            return;
          }
        }
      } finally {
        if (conn === mine) conn = undefined;
      }
      // Never sooner than the service asked: a refusal to wait for is not asked again at once.
      await wait(Math.max(backoff, retryAfter));
      backoff = Math.min(backoff * 2, 10_000);
    }
  };
  void follow();
  return stop;
}
