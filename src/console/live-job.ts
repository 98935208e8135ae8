// The live source of the job page, the only module that knows how job
// updates arrive: the WatchJob server stream (Connect over HTTP/1.1). It
// resumes from the last cursor after a drop (log lines are not sent twice),
// reports a lost connection while it retries with backoff, and reads the job
// when its status changes and once the outcome arrives (times and the cost
// breakdown are on the job, not in the events).
import type { Job } from "../../gen/svc/v1/models_pb.js";
import type { JobAttempt, JobLogLine } from "../../gen/svc/v1/jobs_pb.js";
import { api, isConnectionLost, messageOf } from "./api.js";

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

/** Calls `onChange` with the job's state as it changes; returns a function that stops watching. */
export function watchJob(jobId: string, onChange: (s: LiveJob) => void): () => void {
  const abort = new AbortController();
  let state: LiveJob = { attempts: [], logs: [], lost: false, done: false };
  let cursor: string | undefined;
  const emit = (patch: Partial<LiveJob>) => {
    state = { ...state, ...patch };
    if (!abort.signal.aborted) onChange(state);
  };
  const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

  const follow = async () => {
    let backoff = 1000;
    while (!abort.signal.aborted) {
      try {
        const stream = api.jobs.watchJob({ jobId, ...(cursor ? { cursor } : {}) }, { signal: abort.signal });
        for await (const ev of stream) {
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
              emit({ logs: [...state.logs, { $typeName: "svc.v1.JobLogLine", seq: e.value.seq, level: e.value.level, message: e.value.message, createdAt: e.value.createdAt }] });
              break;
            case "attempts":
              emit({ attempts: e.value.attempts });
              break;
            case "outcome":
              emit({ job: await api.jobs.get({ jobId }), done: true, lost: false });
              return;
          }
        }
      } catch (err) {
        if (abort.signal.aborted) return;
        if (isConnectionLost(err)) emit({ lost: true });
        else emit({ error: messageOf(err), lost: false });
      }
      await sleep(backoff);
      backoff = Math.min(backoff * 2, 10_000);
    }
  };
  void follow();
  return () => abort.abort();
}
