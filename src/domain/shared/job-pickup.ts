// A provider's daemon confirming it has a job it runs (jobs.acked_at). The
// legacy poll marks a job running before its answer has reached the daemon;
// the daemon's first report naming the job (progress, logs, endpoint-ready, a
// result, a daemon event) is the evidence that it arrived. Until then the
// job bills nothing, and after the pickup window it goes back to the queue
// (dispatch.ts releaseUnclaimed, not_picked_up). Here: the report kinds that
// are not job reports (a daemon event) confirm through this one statement.
import type { Db } from "../../db/index.js";

/**
 * The provider named this job in a report: if it is running there unconfirmed, it is confirmed now.
 * One it said it was preparing since its poll (job-reports.ts markJobPreparing: its image pulled)
 * starts now: its run, billed time and max-duration clock, as a stream daemon's job at its accept.
 */
export async function confirmPickup(db: Db, providerId: number, jobId: string): Promise<void> {
  await db`
    WITH polled AS (
      SELECT id, attempt, preparing_at IS NOT NULL AS prepared FROM jobs
      WHERE job_id = ${jobId} AND provider_id = ${providerId} AND status = 'running' AND acked_at IS NULL
      FOR UPDATE
    ), confirmed AS (
      UPDATE jobs j SET acked_at = now(),
             started_at = CASE WHEN p.prepared THEN now() ELSE j.started_at END,
             timeout_at = CASE WHEN p.prepared THEN now() + make_interval(secs => j.max_duration_seconds) ELSE j.timeout_at END,
             progress_phase = CASE WHEN p.prepared THEN NULL ELSE j.progress_phase END,
             preparing_at = NULL
      FROM polled p WHERE j.id = p.id
      RETURNING j.id, p.attempt, p.prepared
    )
    UPDATE job_attempts a SET started_at = now() FROM confirmed c WHERE c.prepared AND a.job_id = c.id AND a.attempt = c.attempt`;
}
