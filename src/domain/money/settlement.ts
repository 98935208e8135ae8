// How a job ends, exactly once. Every terminal path (daemon result, failure,
// renter or admin cancel, server timeout, a provider lost for good) locks the
// job row, re-checks its status under the lock and then moves money through
// the ledger in the same transaction: a result racing a timeout or a cancel
// settles once, whichever commits first; the loser sees a terminal job.
//
// Money follows the end reason's fault (src/domain/shared/job-end.ts, DESIGN §3):
// - completed, and the renter's fault once the job ran (its own code or input
//   failed, cancelled while running, out of time): the renter pays the GPU
//   time used, rate x billable minutes within the hold, split 75/25; the rest
//   of the hold goes back;
// - nothing ran yet, the provider's fault (when the job is not re-queued:
//   dispatch.ts), the platform's, and an unattributed failure: the whole hold
//   goes back; so does every end of a serving job that never reported its
//   endpoint (job-end.ts servedNothing: it served nothing).
import type { Db, Tx } from "../../db/index.js";
import { notFound } from "../../errors.js";
import { extendHold, openHold, release, settle } from "./ledger.js";
import { lockedHeadroom } from "./headroom.js";
import { actualCostHalala, billableMinutes } from "./pricing.js";
import { collectRefundDebt } from "./refund-debt.js";
import { notifyCancel } from "../notify/job-notices.js";
import { deadAtEnd, faultOf, servedNothing, type EndReason, type Fault } from "../shared/job-end.js";
import { enqueueRenterWebhook } from "../notify/webhooks.js";
import type { JobRow } from "../shared/job-row.js";
import { reportJobSettled } from "../shared/observe.js";
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
  /** queued: a provider's failure sent the job back to the queue (a new attempt). */
  status: "completed" | "failed" | "cancelled" | "queued";
  endReason: EndReason;
  fault: Fault;
  actualMinutes: number;
  cost: number;
  providerEarned: number;
  platformFee: number;
  /** What went back from the hold to the renter's available funds (set when this call ended the job). */
  released?: number;
}

export const isActive = (status: string) => status === "queued" || status === "pending" || status === "running";

/** The figures of a job that has already ended (answered again, moving nothing). */
export function figuresOf(job: JobRow): Figures {
  return {
    status: job.status as Figures["status"],
    endReason: (job.end_reason ?? "completed") as EndReason,
    fault: (job.fault ?? "none") as Fault,
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
    end_reason: f.endReason,
    fault: f.fault,
    error,
  });
}

/** Seconds the current attempt ran, by the database clock. */
/** The job's open hold (its amount as the ledger keeps it; the estimate when it never grew). */
async function heldFor(tx: Tx, job: LockedJob): Promise<number> {
  return (await openHold(tx, job.id)) ?? job.cost_halala;
}

/**
 * A run billed for more minutes than its hold pays for (it ended before the sweep grew the hold:
 * a hold under one minute, duration_minutes 0.01, or a sweep running late) has its hold grown to
 * the run's cost first, as far as the renter's headroom goes (headroom.ts, the sweep's rule), so
 * the provider is paid for the minutes it ran. Locks the renter's reservations, then its accounts,
 * as the sweep does; only when the hold falls short.
 */
async function coverRun(tx: Tx, job: LockedJob, minutes: number): Promise<void> {
  const cost = job.rate_halala_per_minute * minutes;
  if (cost <= (job.held_halala ?? job.cost_halala)) return;
  const { funds, limit } = await lockedHeadroom(tx, job.renter_id);
  const held = await openHold(tx, job.id);
  if (held === undefined) return;
  const amount = Math.min(cost - held, funds, limit);
  if (amount <= 0) return;
  await extendHold(tx, job.renter_id, job.id, amount, held + amount);
  await tx`UPDATE jobs SET held_halala = ${held + amount}, updated_at = now() WHERE id = ${job.id}`;
}

export function runSeconds(job: LockedJob): number {
  const from = job.started_at ?? job.assigned_at ?? job.submitted_at;
  return Math.max(0, (new Date(job.db_now).getTime() - new Date(from).getTime()) / 1000);
}

/**
 * Completes a pending/running job (row locked, status checked by the caller):
 * settles the time used, rate x billable minutes within the hold (the
 * estimate, grown while the job ran: hold-extension.ts), 75/25, and stores the result.
 * A serving job that never reported its endpoint is not the caller's to
 * complete (job-end.ts judgeServed: the provider's failure).
 */
export async function completeLocked(tx: Tx, job: LockedJob, result: unknown, metrics: unknown): Promise<Figures> {
  if (job.provider_id === null) throw new Error(`job ${job.job_id} has no provider to pay`);
  if (servedNothing(job) || deadAtEnd(job)) throw new Error(`job ${job.job_id} served nothing to bill (job-end.ts judgeServed)`);
  const minutes = billableMinutes(runSeconds(job), job.max_duration_seconds);
  await coverRun(tx, job, minutes);
  await lockRenterFunds(tx, job.renter_id);
  const held = await heldFor(tx, job);
  const cost = actualCostHalala(job.rate_halala_per_minute, minutes, held);
  const s = await settle(tx, job.renter_id, job.provider_id, job.id, held, cost);
  if (s.owed > 0) await collectRefundDebt(tx, job.renter_id);
  const f: Figures = { status: "completed", endReason: "completed", fault: "none", actualMinutes: minutes, cost: s.cost, providerEarned: s.providerEarned, platformFee: s.platformFee };
  await tx`
    UPDATE jobs SET status = 'completed', completed_at = now(), end_reason = 'completed', fault = 'none',
           result = ${tx.json((result ?? null) as never)}, metrics = ${metrics ? tx.json(metrics as never) : null},
           actual_minutes = ${f.actualMinutes}, actual_cost_halala = ${f.cost},
           provider_earned_halala = ${f.providerEarned}, platform_fee_halala = ${f.platformFee},
           progress_pct = 100, updated_at = now()
    WHERE id = ${job.id}`;
  await tx`
    UPDATE job_attempts SET status = 'completed', ended_at = now(), end_reason = 'completed', fault = 'none', cost_halala = ${f.cost},
           started_at = coalesce(started_at, ${job.started_at ?? job.assigned_at})
    WHERE job_id = ${job.id} AND attempt = ${job.attempt}`;
  await webhook(tx, job, "completed", f, null);
  await issueReceipt(tx, job.id);
  reportJobSettled(tx, "completed", "completed");
  return f;
}

export interface EndOptions {
  reason: EndReason;
  /** Defaults to the reason's own fault; a failure report that names no one passes "unattributed". */
  fault?: Fault;
  error: string;
  result?: unknown;
  metrics?: unknown;
  /** The daemon reported this end itself: it needs no cancel notice. */
  reported?: boolean;
}

/**
 * Whether an end bills the renter for the time used: the renter's fault, after
 * the job started running and its provider confirmed it had it (a polled job
 * whose daemon never reported may never have reached it: acked_at), and not
 * a serving job that never reported its endpoint or whose endpoint was dead
 * when it ended (job-end.ts servedNothing, deadAtEnd: its time served nothing,
 * so a cancel, a stop for funds or a failure of the renter's charges none of it).
 */
export const billsTimeUsed = (
  job: Pick<LockedJob, "status" | "started_at" | "provider_id" | "acked_at" | "job_type" | "endpoint_url" | "endpoint_failing_since" | "endpoint_failed_at" | "db_now">,
  fault: Fault,
): boolean =>
  fault === "renter" && job.status === "running" && job.started_at !== null && job.acked_at !== null && job.provider_id !== null &&
  !servedNothing(job) && !deadAtEnd(job);

/**
 * Ends an active job (row locked, status checked by the caller) as failed or
 * cancelled. The renter's fault after it ran: the time used is paid 75/25
 * (within the hold) and the rest released; otherwise the whole hold goes back.
 * A provider still on it is told to stop.
 */
export async function endLocked(tx: Tx, job: LockedJob, status: "failed" | "cancelled", o: EndOptions): Promise<Figures> {
  const fault = o.fault ?? faultOf(o.reason);
  const bills = billsTimeUsed(job, fault);
  if (bills) await coverRun(tx, job, billableMinutes(runSeconds(job), job.max_duration_seconds));
  await lockRenterFunds(tx, job.renter_id);
  const held = (await openHold(tx, job.id)) ?? 0;
  let f: Figures = { status, endReason: o.reason, fault, actualMinutes: 0, cost: 0, providerEarned: 0, platformFee: 0, released: held };
  if (bills) {
    const minutes = billableMinutes(runSeconds(job), job.max_duration_seconds);
    const s = await settle(tx, job.renter_id, job.provider_id!, job.id, held, actualCostHalala(job.rate_halala_per_minute, minutes, held));
    if (s.owed > 0) await collectRefundDebt(tx, job.renter_id);
    f = { ...f, actualMinutes: minutes, cost: s.cost, providerEarned: s.providerEarned, platformFee: s.platformFee, released: held - s.cost };
  } else if (await release(tx, job.renter_id, job.id)) {
    // The hold is free again: what the renter owes for refunded payments is taken from it first.
    await collectRefundDebt(tx, job.renter_id);
  }
  await tx`
    UPDATE jobs SET status = ${status}, completed_at = now(), end_reason = ${o.reason}, fault = ${fault}, error = ${o.error},
           result = ${o.result === undefined ? null : tx.json(o.result as never)},
           metrics = ${o.metrics ? tx.json(o.metrics as never) : null},
           actual_minutes = ${f.actualMinutes}, actual_cost_halala = ${f.cost},
           provider_earned_halala = ${f.providerEarned}, platform_fee_halala = ${f.platformFee},
           timeout_at = NULL, updated_at = now()
    WHERE id = ${job.id}`;
  if (job.provider_id !== null) {
    await tx`
      UPDATE job_attempts SET status = ${status}, ended_at = now(), end_reason = ${o.reason}, fault = ${fault}, error = ${o.error},
             cost_halala = ${f.cost}
      WHERE job_id = ${job.id} AND attempt = ${job.attempt}`;
    if (!o.reported) await notifyCancel(tx, job.provider_id, job.job_id);
  }
  await webhook(tx, job, status, f, o.error);
  await issueReceipt(tx, job.id);
  reportJobSettled(tx, status, o.reason);
  return f;
}

/**
 * Running jobs past their deadline (oldest first), for the worker (which ends
 * them: dispatch.ts timeOutJob).
 * max_duration_seconds limits how long a job runs: a job still pending, or
 * running unconfirmed (polled, its daemon never reported: the answer may have
 * been lost), is the pickup window's to re-queue (dispatch's
 * releaseUnclaimed, not_picked_up), not the renter's timeout.
 */
export async function overdueJobIds(db: Db, limit: number): Promise<number[]> {
  const rows = await db<{ id: number }[]>`
    SELECT id FROM jobs WHERE status = 'running' AND timeout_at <= now() AND acked_at IS NOT NULL
    ORDER BY timeout_at LIMIT ${limit}`;
  return rows.map((r) => r.id);
}
