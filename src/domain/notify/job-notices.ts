// Area notify (src/domain/notify): what the domain tells the outside world —
// job notices to daemons over LISTEN/NOTIFY and renters' webhooks through the
// outbox. It may use shared only, so that money and dispatch can notify.
//
// Cross-process job signals (LISTEN/NOTIFY), sent inside the transaction that
// makes the change, so a listener only hears of committed assignments/cancels.
// Cancel payload: {"provider_id": N, "job_id": "job-..."}. An assignment also
// carries what the daemon is sent (`job`), so the stream pushes it without
// reading the row again; a job too large for a notice (NOTIFY payloads stop
// at 8000 bytes) goes without, and the stream reads it.
import type { Db, Tx } from "../../db/index.js";
import type { JobRow } from "../shared/job-row.js";

export const ASSIGNED_CHANNEL = "svc_job_assigned";
export const CANCEL_CHANNEL = "svc_job_cancel";
/** Below PostgreSQL's 8000-byte payload limit, with room to spare. */
const MAX_NOTICE_BYTES = 7900;

/** The columns of a job that a daemon is sent on assignment (job-reports.ts assignedJobMessage). */
export type AssignedJob = Pick<
  JobRow,
  "id" | "job_id" | "job_type" | "task_spec" | "task_spec_hmac" | "gpu_requirements" | "duration_minutes" | "max_duration_seconds" | "attempt"
>;

export interface JobSignal {
  provider_id: number;
  job_id: string;
  /** Assignments only, when it fitted in the notice. */
  job?: AssignedJob;
}

/**
 * `pg_notify` of an assignment, as a SQL expression over a provider id
 * expression and the alias of the assigned job's row (both in scope where it
 * is used, e.g. dispatch.ts fill()).
 */
export function assignedNoticeSql(db: Db, providerId: ReturnType<Db>, job: string) {
  const j = db(job);
  return db`pg_notify(${ASSIGNED_CHANNEL}, (
    SELECT CASE WHEN octet_length(n.full) <= ${MAX_NOTICE_BYTES} THEN n.full ELSE n.bare END FROM (SELECT
      json_build_object('provider_id', ${providerId}, 'job_id', ${j}.job_id, 'job', json_build_object(
        'id', ${j}.id, 'job_id', ${j}.job_id, 'job_type', ${j}.job_type, 'task_spec', ${j}.task_spec,
        'task_spec_hmac', ${j}.task_spec_hmac, 'gpu_requirements', ${j}.gpu_requirements,
        'duration_minutes', ${j}.duration_minutes, 'max_duration_seconds', ${j}.max_duration_seconds, 'attempt', ${j}.attempt))::text AS full,
      json_build_object('provider_id', ${providerId}, 'job_id', ${j}.job_id)::text AS bare) n))`;
}

/** The provider must stop this job (cancelled, timed out, re-queued away from it). */
export async function notifyCancel(tx: Tx, providerId: number, jobId: string): Promise<void> {
  await tx`SELECT pg_notify(${CANCEL_CHANNEL}, ${JSON.stringify({ provider_id: providerId, job_id: jobId } satisfies JobSignal)})`;
}
