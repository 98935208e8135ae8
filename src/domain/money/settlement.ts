// How a job ends, exactly once. Every terminal path (daemon result, failure,
// renter or admin cancel, server timeout, a provider lost for good) locks the
// job row, re-checks its status under the lock and then moves money through
// the ledger in the same transaction: a result racing a timeout or a cancel
// settles once, whichever commits first; the loser sees a terminal job.
//
// Money (DESIGN §3): success pays min(rate x billable minutes, estimate),
// 75/25, and returns the rest of the hold; failure, cancel and timeout return
// the whole hold. Cancelling a running job charges nothing either: the
// renter pays only for results.
import type { Db, Tx } from "../../db/index.js";
import { notFound } from "../../errors.js";
import { release, settle } from "./ledger.js";
import { actualCostHalala, actualMinutes } from "./pricing.js";
import { notifyCancel } from "../notify/job-notices.js";
import { enqueueRenterWebhook } from "../notify/webhooks.js";
import type { JobRow } from "../shared/job-row.js";
import { issueReceipt } from "./receipts.js";

export type LockedJob = JobRow & { db_now: Date };

/** The job row, locked for this transaction, with the database clock. */
export async function lockJob(tx: Tx, jobId: string): Promise<LockedJob> {
  const [job] = await tx<LockedJob[]>`SELECT *, now() AS db_now FROM jobs WHERE job_id = ${jobId} FOR UPDATE`;
  if (!job) throw notFound("job not found");
  return job;
}

export async function lockJobById(tx: Tx, id: number): Promise<LockedJob | undefined> {
  const [job] = await tx<LockedJob[]>`SELECT *, now() AS db_now FROM jobs WHERE id = ${id} FOR UPDATE`;
  return job;
}

/**
 * Locks both of the renter's ledger accounts in id order before any transfer,
 * so a settlement (held -> ..., then held -> available) and a concurrent
 * submit of the same renter (available -> held) take them in the same order.
 * NO KEY UPDATE, the ledger's own strength: FOR UPDATE would also wait for the
 * key-share locks a concurrent transfer's row holds on these accounts.
 */
export async function lockRenterFunds(tx: Tx, renterId: number): Promise<void> {
  await tx`
    SELECT id FROM ledger_accounts WHERE owner_id = ${renterId} AND kind IN ('renter_available', 'renter_held')
    ORDER BY id FOR NO KEY UPDATE`;
}

export interface Figures {
  status: "completed" | "failed" | "cancelled";
  actualMinutes: number;
  cost: number;
  providerEarned: number;
  platformFee: number;
}

export const isActive = (status: string) => status === "queued" || status === "pending" || status === "running";

/** The figures of a job that has already ended (answered again, moving nothing). */
export function figuresOf(job: JobRow): Figures {
  return {
    status: job.status as Figures["status"],
    actualMinutes: job.actual_minutes ?? 0,
    cost: job.actual_cost_halala ?? 0,
    providerEarned: job.provider_earned_halala ?? 0,
    platformFee: job.platform_fee_halala ?? 0,
  };
}

async function webhook(tx: Tx, job: JobRow, status: string, f: Figures, error: string | null): Promise<void> {
  await enqueueRenterWebhook(tx, job.renter_id, `job.${status}`, {
    job_id: job.job_id,
    job_type: job.job_type,
    status,
    cost_halala: job.cost_halala,
    actual_cost_halala: f.cost,
    actual_minutes: f.actualMinutes,
    error,
  });
}

/** Seconds the current attempt ran, by the database clock. */
function runSeconds(job: LockedJob): number {
  const from = job.started_at ?? job.assigned_at ?? job.submitted_at;
  return Math.max(0, (new Date(job.db_now).getTime() - new Date(from).getTime()) / 1000);
}

/**
 * Completes a pending/running job (row locked, status checked by the caller):
 * settles min(rate x minutes, estimate) 75/25 and stores the result.
 */
export async function completeLocked(tx: Tx, job: LockedJob, result: unknown, metrics: unknown): Promise<Figures> {
  if (job.provider_id === null) throw new Error(`job ${job.job_id} has no provider to pay`);
  const minutes = actualMinutes(runSeconds(job));
  const cost = actualCostHalala(job.rate_halala_per_minute, minutes, job.cost_halala);
  await lockRenterFunds(tx, job.renter_id);
  const s = await settle(tx, job.renter_id, job.provider_id, job.id, job.cost_halala, cost);
  const f: Figures = { status: "completed", actualMinutes: minutes, cost: s.cost, providerEarned: s.providerEarned, platformFee: s.platformFee };
  await tx`
    UPDATE jobs SET status = 'completed', completed_at = now(), end_reason = 'result',
           result = ${tx.json((result ?? null) as never)}, metrics = ${metrics ? tx.json(metrics as never) : null},
           actual_minutes = ${f.actualMinutes}, actual_cost_halala = ${f.cost},
           provider_earned_halala = ${f.providerEarned}, platform_fee_halala = ${f.platformFee},
           progress_pct = 100, updated_at = now()
    WHERE id = ${job.id}`;
  await tx`
    UPDATE job_attempts SET status = 'completed', ended_at = now(), end_reason = 'result', cost_halala = ${f.cost},
           started_at = coalesce(started_at, ${job.started_at ?? job.assigned_at})
    WHERE job_id = ${job.id} AND attempt = ${job.attempt}`;
  await webhook(tx, job, "completed", f, null);
  await issueReceipt(tx, job.id);
  return f;
}

export type EndReason = "result" | "timeout" | "cancelled" | "provider_lost" | "rejected" | "provider_interrupted" | "not_picked_up" | "admin";

/**
 * Ends an active job (row locked, status checked by the caller) as failed or
 * cancelled: the whole hold goes back to the renter, a provider still on it
 * is told to stop.
 */
export async function endLocked(
  tx: Tx,
  job: LockedJob,
  status: "failed" | "cancelled",
  reason: EndReason,
  error: string,
  extra: { result?: unknown; metrics?: unknown } = {},
): Promise<Figures> {
  await lockRenterFunds(tx, job.renter_id);
  await release(tx, job.renter_id, job.id);
  const f: Figures = { status, actualMinutes: 0, cost: 0, providerEarned: 0, platformFee: 0 };
  await tx`
    UPDATE jobs SET status = ${status}, completed_at = now(), end_reason = ${reason}, error = ${error},
           result = ${extra.result === undefined ? null : tx.json(extra.result as never)},
           metrics = ${extra.metrics ? tx.json(extra.metrics as never) : null},
           actual_minutes = 0, actual_cost_halala = 0, provider_earned_halala = 0, platform_fee_halala = 0,
           timeout_at = NULL, updated_at = now()
    WHERE id = ${job.id}`;
  if (job.provider_id !== null) {
    await tx`
      UPDATE job_attempts SET status = ${status}, ended_at = now(), end_reason = ${reason}, error = ${error}, cost_halala = 0
      WHERE job_id = ${job.id} AND attempt = ${job.attempt}`;
    // The daemon reported this failure itself; anything else means it must stop.
    if (reason !== "result") await notifyCancel(tx, job.provider_id, job.job_id);
  }
  await webhook(tx, job, status, f, error);
  await issueReceipt(tx, job.id);
  return f;
}

/** Jobs that are past their deadline (oldest first), for the worker. */
export async function overdueJobIds(db: Db, limit: number): Promise<number[]> {
  const rows = await db<{ id: number }[]>`
    SELECT id FROM jobs WHERE status IN ('pending', 'running') AND timeout_at <= now()
    ORDER BY timeout_at LIMIT ${limit}`;
  return rows.map((r) => r.id);
}

/**
 * Fails a job that exceeded max_duration_seconds and refunds it, unless
 * something else ended it first. Returns the provider to refill, if any.
 */
export async function timeOutJob(tx: Tx, id: number): Promise<{ providerId: number } | undefined> {
  const job = await lockJobById(tx, id);
  if (!job || (job.status !== "pending" && job.status !== "running")) return undefined;
  if (job.timeout_at === null || new Date(job.timeout_at) > new Date(job.db_now)) return undefined;
  await endLocked(tx, job, "failed", "timeout", `exceeded max_duration_seconds (${job.max_duration_seconds} s)`);
  return { providerId: job.provider_id! };
}
