// Cancel (renter or admin; the jobs an admin stops with a renter's suspension
// follow the same rule) and admin re-queue: each one transaction with the job
// row locked, then the freed provider is refilled at once.
import type { Sql, Tx } from "../../db/index.js";
import { conflict, forbidden } from "../../errors.js";
import { recordAudit } from "../shared/audit.js";
import { dispatchForProvider, placeJobs, requeueLocked } from "../dispatch/dispatch.js";
import type { JobRow } from "../shared/job-row.js";
import { endLocked, isActive, lockJob, type LockedJob } from "../money/settlement.js";
import { refreshReputation } from "../providers/reputation.js";
import { endpointHealthOf, faultOf, judgeEndpointHealth } from "../shared/job-end.js";

/** Who cancels; an admin's client IP goes into the audit entry like every admin action's. */
export type Canceller = { role: "renter"; renterId: number } | { role: "admin"; actor: string; ip?: string };

export interface CancelOutcome {
  job: JobRow;
  refunded: number;
  charged: number;
}

/** The end reasons of a cancel: whose decision it was (job-end.ts END_REASONS), which the money follows. */
export type CancelReason = "renter_cancelled" | "admin_cancelled" | "renter_suspended";

/** What one cancel did, for the caller's answer and for afterCancels once committed. */
export interface CancelEnd {
  id: number;
  providerId: number | null;
  refunded: number;
  charged: number;
  /** The provider had failed the job (a serving job's dead endpoint): its reliability is refreshed. */
  providerFault: boolean;
}

/**
 * Cancels a queued, pending or running job (row locked, status checked by the
 * caller); a provider on it is told to stop. The renter's cancel, and its
 * account's suspension with stop_jobs, are the renter's fault: a running job
 * pays the GPU time it used (75/25, within the hold, grown first when short:
 * settlement.ts coverRun) and the rest of the hold goes back; one that had not
 * started yet, or a serving job that never reported its endpoint (job-end.ts
 * servedNothing: it served nothing), gets the whole hold back. An admin's
 * cancel is the platform's: the whole hold goes back. A renter-fault cancel of
 * a serving job whose endpoint had been failing the server's health probe for
 * longer than the grace is the provider's failure instead (provider_error,
 * job-end.ts judgeEndpointHealth): the whole hold goes back, the provider
 * earns nothing and is docked.
 */
export async function cancelLocked(tx: Tx, job: LockedJob, reason: CancelReason, error: string): Promise<CancelEnd> {
  // A serving job whose endpoint had been failing the health probe for longer than the grace
  // (job-end.ts judgeEndpointHealth) served nothing: the provider's failure, nothing charged.
  // Cancelled all the same (what was asked for): not re-queued. An admin's cancel is
  // the platform's and charges nothing either way.
  const dead = faultOf(reason) === "renter" && job.status === "running" && job.provider_id !== null ? judgeEndpointHealth(job.job_type, endpointHealthOf(job)) : undefined;
  const f = await endLocked(
    tx,
    job,
    "cancelled",
    dead ? { reason: dead.reason, error: `${error}; provider ${job.provider_id} had failed the job: ${dead.error}` } : { reason, error },
  );
  return { id: job.id, providerId: job.provider_id, refunded: f.released ?? 0, charged: f.cost, providerFault: dead !== undefined };
}

/** Once cancels committed: providers that had failed a job are re-rated, and every provider freed is refilled at once. */
export async function afterCancels(sql: Sql, ends: CancelEnd[]): Promise<void> {
  const faulted = [...new Set(ends.filter((e) => e.providerFault && e.providerId !== null).map((e) => e.providerId!))];
  if (faulted.length > 0) await refreshReputation(sql, faulted);
  for (const providerId of new Set(ends.flatMap((e) => (e.providerId === null ? [] : [e.providerId])))) await dispatchForProvider(sql, providerId);
}

/** Cancels one job (cancelLocked) for its renter or an admin. 409 for a job that already ended, moving nothing. */
export async function cancelJob(sql: Sql, jobId: string, by: Canceller, reason?: string): Promise<CancelOutcome> {
  const end = await sql.begin(async (tx) => {
    const job = await lockJob(tx, jobId);
    if (by.role === "renter" && job.renter_id !== by.renterId) throw forbidden("this job belongs to another renter");
    if (!isActive(job.status)) throw conflict(`job is already ${job.status}`);
    const who = by.role === "admin" ? "admin" : "renter";
    const e = await cancelLocked(tx, job, by.role === "admin" ? "admin_cancelled" : "renter_cancelled", `cancelled by ${who}${reason ? `: ${reason}` : ""}`);
    if (by.role === "admin") {
      await recordAudit(tx, by.actor, "job.cancel", "job", jobId, { status: job.status, reason: reason ?? null, ip: by.ip ?? null });
    }
    return e;
  });
  await afterCancels(sql, [end]);
  const [job] = await sql<JobRow[]>`SELECT * FROM jobs WHERE id = ${end.id}`;
  return { job, refunded: end.refunded, charged: end.charged };
}

/**
 * A renter's active jobs (queued, pending, running), locked in id order, with the database clock:
 * the order every path locks job rows in, before the renter's reservations and accounts.
 */
export function lockActiveJobsOf(tx: Tx, renterId: number) {
  return tx<LockedJob[]>`
    SELECT *, now() AS db_now FROM jobs WHERE renter_id = ${renterId} AND status IN ('queued', 'pending', 'running')
    ORDER BY id FOR UPDATE`;
}

/** Admin: end the current attempt of a pending/running job and queue it again, spending none of its attempts (ATTEMPT_FREE_REASONS). */
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
