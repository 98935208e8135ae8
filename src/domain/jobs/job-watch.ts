// What a watcher of a job is shown (WatchJob, GET /api/jobs/{id}/events):
// one read of a job's state, attempts and new log lines, and the events made
// from it. The fan-out to watchers lives in workers/job-watch.ts; the
// notices that trigger a read come from triggers (migration 019).
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { JobAttemptSchema, JobEventSchema } from "../../../gen/svc/v1/jobs_pb.js";
import type { Db } from "../../db/index.js";
import { badRequest } from "../../errors.js";
import { explainQueue, type QueueReason } from "../dispatch/dispatch.js";
import type { JobRow } from "../shared/job-row.js";
import { isTerminal } from "../../shared/job-status.js";
import { iso } from "../shared/validate.js";
import { attemptMessage, jobMessageFor, type JobReader } from "./jobs.js";
import { IMAGE_RESULT_JOB_TYPES } from "./task-spec.js";

export type JobEventInit = MessageInitShape<typeof JobEventSchema>;
type AttemptInit = MessageInitShape<typeof JobAttemptSchema>;

/** The notice channel the triggers of migration 019 send on; the payload is the job's internal id. */
export const JOB_WATCH_CHANNEL = "svc_job_watch";
/** Log lines read per round: a job with more is read in several, each delivered before the next. */
export const WATCH_LOG_PAGE = 1000;
/**
 * Characters of log messages read per round, likewise (a page holds at least one line, and ends
 * with the line that reaches this): lines are up to 16,384 characters, so a page of 1,000 could
 * be 16 M characters for each watcher to hold while it is sent.
 */
export const WATCH_LOG_PAGE_CHARS = 1024 * 1024;

/** Whether a read's lines are a whole page (more may follow at once): by count or by characters. */
export const isFullPage = (logs: { message: string }[]): boolean =>
  logs.length >= WATCH_LOG_PAGE || logs.reduce((n, l) => n + l.message.length, 0) >= WATCH_LOG_PAGE_CHARS;

export interface WatchLogLine {
  id: number;
  attempt: number;
  level: string;
  message: string;
  created_at: string;
}

export interface WatchAttempt {
  attempt: number;
  provider_id: number | null;
  status: string;
  assigned_at: string | null;
  started_at: string | null;
  ended_at: string | null;
  end_reason: string | null;
  fault: string | null;
  cost_halala: number | null;
  error: string | null;
}

/** The job without its large JSON columns (the result may be megabytes of PNG). */
export type WatchedJob = Omit<JobRow, "result" | "task_spec" | "params" | "metrics" | "container_spec"> & {
  /** png (or another image format), text, json; null without a result. */
  output_format: string | null;
  /** The database's now() when read: a running job's cost so far counts by it (jobs.ts DbNow). */
  db_now: Date;
};

export interface JobChanges {
  job: WatchedJob;
  attempts: WatchAttempt[];
  /** Lines with id > the cursor asked for, at most a page (WATCH_LOG_PAGE, WATCH_LOG_PAGE_CHARS), in order. */
  logs: WatchLogLine[];
  /** Set while queued. */
  queue?: QueueReason;
}

/**
 * One read: the job, its attempts and its log lines after `afterLogId`, in
 * one statement, so they come from one snapshot: a terminal job read here
 * comes with every line stored before it ended. Undefined: no such job.
 */
export async function readJobChanges(db: Db, id: number, afterLogId: number): Promise<JobChanges | undefined> {
  const [row] = await db<(WatchedJob & { attempts_json: WatchAttempt[]; logs_json: WatchLogLine[] })[]>`
    SELECT j.id, j.job_id, j.renter_id, j.provider_id, j.requested_provider_id, j.job_type, j.status, j.priority,
           j.duration_minutes, j.max_duration_seconds, j.rate_halala_per_minute, j.cost_halala, j.actual_cost_halala,
           j.provider_earned_halala, j.platform_fee_halala, j.gpu_requirements, j.task_spec_hmac, j.model, j.pricing_class,
           j.checkpoint_enabled, j.prewarm_requested, j.template_id, j.attempt, j.submitted_at, j.assigned_at, j.started_at,
           j.completed_at, j.timeout_at, j.error, j.progress_pct, j.progress_phase, j.endpoint_url, j.end_reason, j.fault, j.actual_minutes,
           j.held_halala, j.acked_at, j.endpoint_failing_since, j.endpoint_failed_at, now() AS db_now,
           CASE WHEN j.result IS NULL OR jsonb_typeof(j.result) = 'null' THEN NULL
                WHEN jsonb_typeof(j.result) = 'string' THEN CASE WHEN j.job_type = ANY(${IMAGE_RESULT_JOB_TYPES}::text[]) THEN 'png' ELSE 'text' END
                WHEN jsonb_typeof(j.result) = 'object' AND jsonb_typeof(j.result -> 'data') = 'string'
                  THEN CASE WHEN coalesce(j.result ->> 'format', '') ~ '^[a-z0-9]{1,10}$' THEN j.result ->> 'format' ELSE 'png' END
                WHEN jsonb_typeof(j.result) = 'object' AND jsonb_typeof(j.result -> 'response') = 'string' THEN 'text'
                ELSE 'json' END AS output_format,
           coalesce((SELECT json_agg(a ORDER BY a.attempt) FROM (
             SELECT attempt, provider_id, status, assigned_at, started_at, ended_at, end_reason, fault, cost_halala, error
             FROM job_attempts WHERE job_id = j.id) a), '[]') AS attempts_json,
           coalesce((SELECT json_agg(l ORDER BY l.id) FROM (
             SELECT id, attempt, level, message, created_at FROM (
               SELECT p.*, sum(length(p.message)) OVER (ORDER BY p.id) - length(p.message) AS chars_before FROM (
                 SELECT id, attempt, level, message, created_at FROM job_logs
                 WHERE job_id = j.id AND id > ${afterLogId} ORDER BY id LIMIT ${WATCH_LOG_PAGE}) p) c
             WHERE c.chars_before < ${WATCH_LOG_PAGE_CHARS}) l), '[]') AS logs_json
    FROM jobs j WHERE j.id = ${id}`;
  if (!row) return undefined;
  const { attempts_json, logs_json, ...job } = row;
  const changes: JobChanges = { job, attempts: attempts_json, logs: logs_json };
  if (job.status === "queued") changes.queue = await explainQueue(db, job as unknown as JobRow);
  return changes;
}

/** Log lines are all the cursor counts: an event's cursor is the seq of the last line sent before it. */
export function parseCursor(cursor: string | undefined): number {
  const text = cursor?.trim();
  if (!text) return 0;
  if (!/^\d{1,15}$/.test(text)) throw badRequest("cursor (Last-Event-ID) must be the id of an event this stream sent");
  return Number(text);
}

const big = (n: number | null | undefined) => (n === null || n === undefined ? undefined : BigInt(n));

/** The parts of a read that make events, in a form compared by value between reads. */
export interface WatchState {
  status: { status: string; queueReason?: string; queueReasonCode?: string; providerId?: bigint; attempt: number };
  progress: { progressPct?: number; phase?: string };
  attempts: AttemptInit[];
  statusKey: string;
  progressKey: string;
  attemptsKey: string;
  terminal: boolean;
}

const keyOf = (v: unknown) => JSON.stringify(v, (_k, x) => (typeof x === "bigint" ? x.toString() : x));

export function watchState(c: JobChanges): WatchState {
  const status = {
    status: c.job.status,
    queueReason: c.queue?.reason,
    queueReasonCode: c.queue?.code,
    providerId: big(c.job.provider_id),
    attempt: c.job.attempt,
  };
  const progress = { progressPct: c.job.progress_pct ?? undefined, phase: c.job.progress_phase ?? undefined };
  const attempts = c.attempts.map(attemptMessage);
  return {
    status,
    progress,
    attempts,
    statusKey: keyOf(status),
    progressKey: keyOf(progress),
    attemptsKey: keyOf(attempts),
    terminal: isTerminal(c.job.status),
  };
}

/** The first event of a stream: the job as Get answers it (jobView), for this reader. */
export function snapshotEvent(c: JobChanges, state: WatchState, reader: JobReader, cursor: number): JobEventInit {
  const view = jobMessageFor(c.job as unknown as JobRow, reader);
  if (c.queue) {
    view.queueReason = c.queue.reason;
    view.queueReasonCode = c.queue.code;
  }
  return { cursor: String(cursor), event: { case: "snapshot", value: { job: view, attempts: state.attempts } } };
}

/** Events for what changed between two reads. */
export function changeEvents(prev: WatchState, next: WatchState, cursor: number): JobEventInit[] {
  const out: JobEventInit[] = [];
  const c = String(cursor);
  if (prev.statusKey !== next.statusKey) out.push({ cursor: c, event: { case: "status", value: next.status } });
  if (prev.attemptsKey !== next.attemptsKey) out.push({ cursor: c, event: { case: "attempts", value: { attempts: next.attempts } } });
  if (prev.progressKey !== next.progressKey) out.push({ cursor: c, event: { case: "progress", value: next.progress } });
  return out;
}

export function logEvent(l: WatchLogLine): JobEventInit {
  return {
    cursor: String(l.id),
    event: { case: "log", value: { seq: BigInt(l.id), attempt: l.attempt, level: l.level, message: l.message, createdAt: iso(l.created_at)! } },
  };
}

/** The last event: how the job ended, what it cost, where its output is. */
export function outcomeEvent(c: JobChanges, cursor: number): JobEventInit {
  const j = c.job;
  const hasOutput = j.status === "completed" && j.output_format !== null;
  return {
    cursor: String(cursor),
    event: {
      case: "outcome",
      value: {
        status: j.status,
        endReason: j.end_reason ?? undefined,
        fault: j.fault ?? undefined,
        costHalala: BigInt(j.actual_cost_halala ?? 0),
        actualMinutes: big(j.actual_minutes),
        error: j.error ?? undefined,
        outputPath: hasOutput ? `/api/jobs/${encodeURIComponent(j.job_id)}/output` : undefined,
        outputFormat: hasOutput ? j.output_format! : undefined,
      },
    },
  };
}
