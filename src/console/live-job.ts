// The live source of the job page, the only module that knows how job
// updates arrive. It polls GetJob every 2 s until the job ends, and reads the
// logs while the job runs or changes and the attempts when its status or
// attempt changes, so an open page stays well inside the per-IP rate limit.
// A lost connection is retried with backoff.
import type { Job } from "../../gen/svc/v1/models_pb.js";
import type { JobAttempt, JobLogLine } from "../../gen/svc/v1/jobs_pb.js";
import { api, isConnectionLost, messageOf } from "./api.js";
import { TERMINAL } from "./format.js";

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

const POLL_MS = 2000;

/** Calls `onChange` with the job's state as it changes; returns a function that stops watching. */
export function watchJob(jobId: string, onChange: (s: LiveJob) => void): () => void {
  let stopped = false;
  let timer: ReturnType<typeof setTimeout> | undefined;
  let state: LiveJob = { attempts: [], logs: [], lost: false, done: false };
  let backoff = POLL_MS;
  const emit = (patch: Partial<LiveJob>) => {
    state = { ...state, ...patch };
    if (!stopped) onChange(state);
  };
  const poll = async () => {
    try {
      const job = await api.jobs.get({ jobId });
      const was = state.job;
      const moved = !was || was.status !== job.status || was.attempt !== job.attempt;
      const changed = moved || was.progressPct !== job.progressPct || was.progressPhase !== job.progressPhase;
      const [history, logs] = await Promise.all([
        moved ? api.jobs.getHistory({ jobId }) : undefined,
        changed || job.status === "running" ? api.jobs.getLogs({ jobId }) : undefined,
      ]);
      backoff = POLL_MS;
      const done = TERMINAL.has(job.status);
      emit({ job, attempts: history?.attempts ?? state.attempts, logs: logs?.logs ?? state.logs, error: undefined, lost: false, done });
      if (!done && !stopped) timer = setTimeout(poll, POLL_MS);
    } catch (err) {
      if (stopped) return;
      const lost = isConnectionLost(err);
      emit(lost ? { lost: true } : { error: messageOf(err), lost: false });
      timer = setTimeout(poll, backoff);
      if (lost) backoff = Math.min(backoff * 2, 10_000);
    }
  };
  void poll();
  return () => {
    stopped = true;
    if (timer) clearTimeout(timer);
  };
}
