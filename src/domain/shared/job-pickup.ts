// A provider's daemon confirming it has a job it runs (jobs.acked_at). The
// legacy poll marks a job running before its answer has reached the daemon;
// the daemon's first report naming the job (progress, logs, endpoint-ready, a
// result, a daemon event) is the evidence that it arrived. Until then the
// job bills nothing, and after the pickup window it goes back to the queue
// (dispatch.ts releaseUnclaimed, not_picked_up). Here: the report kinds that
// are not job reports (a daemon event) confirm through this one statement.
import type { Db } from "../../db/index.js";

/** The provider named this job in a report: if it is running there unconfirmed, it is confirmed now. */
export async function confirmPickup(db: Db, providerId: number, jobId: string): Promise<void> {
  await db`
    UPDATE jobs SET acked_at = now()
    WHERE job_id = ${jobId} AND provider_id = ${providerId} AND status = 'running' AND acked_at IS NULL`;
}
