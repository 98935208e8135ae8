// Cancel (renter or admin) and admin re-queue: each one transaction with the
// job row locked, then the freed provider is refilled at once.
import type { Sql } from "../../db/index.js";
import { conflict, forbidden } from "../../errors.js";
import { recordAudit } from "../shared/audit.js";
import { dispatchForProvider, placeJobs, requeueLocked } from "../dispatch/dispatch.js";
import type { JobRow } from "../shared/job-row.js";
import { endLocked, isActive, lockJob } from "../money/settlement.js";
import { refreshReputation } from "../providers/reputation.js";
import { endpointHealthOf, judgeEndpointHealth } from "../shared/job-end.js";

/** Who cancels; an admin's client IP goes into the audit entry like every admin action's. */
export type Canceller = { role: "renter"; renterId: number } | { role: "admin"; actor: string; ip?: string };

export interface CancelOutcome {
  job: JobRow;
  refunded: number;
  charged: number;
}

/**
 * Cancels a queued, pending or running job; a provider on it is told to stop.
 * The renter's cancel is the renter's fault: a running job pays the GPU time
 * it used (75/25, within the hold, grown first when short: settlement.ts coverRun) and the rest of the hold goes back; one
 * that had not started yet, or a serving job that never reported its endpoint
 * (job-end.ts servedNothing: it served nothing), gets the whole hold back. An
 * admin's cancel is the platform's: the whole hold goes back. A renter's
 * cancel of a serving job whose endpoint had been failing the server's health
 * probe for longer than the grace is the provider's failure instead
 * (provider_error, job-end.ts judgeEndpointHealth): the whole hold goes back,
 * the provider earns nothing and is docked. 409 for a job that already ended,
 * moving nothing.
 */
export async function cancelJob(sql: Sql, jobId: string, by: Canceller, reason?: string): Promise<CancelOutcome> {
  const { id, providerId, refunded, charged, providerFault } = await sql.begin(async (tx) => {
    const job = await lockJob(tx, jobId);
    if (by.role === "renter" && job.renter_id !== by.renterId) throw forbidden("this job belongs to another renter");
    if (!isActive(job.status)) throw conflict(`job is already ${job.status}`);
    const who = by.role === "admin" ? "admin" : "renter";
    const error = `cancelled by ${who}${reason ? `: ${reason}` : ""}`;
    // A serving job whose endpoint had been failing the health probe for longer than the grace
    // (job-end.ts judgeEndpointHealth) served nothing: the provider's failure, nothing charged.
    // Cancelled all the same (what the renter asked for): not re-queued. An admin's cancel is
    // the platform's and charges nothing either way.
    const dead = by.role === "renter" && job.status === "running" && job.provider_id !== null ? judgeEndpointHealth(job.job_type, endpointHealthOf(job)) : undefined;
    const f = await endLocked(
      tx,
      job,
      "cancelled",
      dead
        ? { reason: dead.reason, error: `${error}; provider ${job.provider_id} had failed the job: ${dead.error}` }
        : { reason: by.role === "admin" ? "admin_cancelled" : "renter_cancelled", error },
    );
    if (by.role === "admin") {
      await recordAudit(tx, by.actor, "job.cancel", "job", jobId, { status: job.status, reason: reason ?? null, ip: by.ip ?? null });
    }
    return { id: job.id, providerId: job.provider_id, refunded: f.released ?? 0, charged: f.cost, providerFault: dead !== undefined };
  });
  if (providerFault && providerId !== null) await refreshReputation(sql, [providerId]);
  if (providerId !== null) await dispatchForProvider(sql, providerId);
  const [job] = await sql<JobRow[]>`SELECT * FROM jobs WHERE id = ${id}`;
  return { job, refunded, charged };
}

/** Admin: end the current attempt of a pending/running job and queue it again (beyond the retry limit). */
export async function requeueJob(sql: Sql, jobId: string, actor: string, reason?: string, ip?: string): Promise<JobRow> {
  const { id, from } = await sql.begin(async (tx) => {
    const job = await lockJob(tx, jobId);
    if (job.status !== "pending" && job.status !== "running") throw conflict(`only a pending or running job can be re-queued (job is ${job.status})`);
    await requeueLocked(tx, job, "admin_requeued", reason ? `re-queued by admin: ${reason}` : "re-queued by admin");
    await recordAudit(tx, actor, "job.requeue", "job", jobId, {
      from_provider: job.provider_id,
      attempt: job.attempt,
      reason: reason ?? null,
      ip: ip ?? null,
    });
    return { id: job.id, from: job.provider_id! };
  });
  await placeJobs(sql, [id]);
  await dispatchForProvider(sql, from);
  const [row] = await sql<JobRow[]>`SELECT * FROM jobs WHERE id = ${id}`;
  return row;
}
