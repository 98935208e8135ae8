// Area admin (src/domain/admin): the operator's reads and actions and the
// dashboard. It sits on top and may use every other area; none imports it.
//
// The operator's reads and account actions: renter, job and audit lists with
// filters and paging, renter suspension and quotas. Each action is written
// with its audit record in the caller's transaction.
import type { Db, Sql, Tx } from "../../db/index.js";
import { badRequest, conflict, notFound } from "../../errors.js";
import { accountKeysChanged } from "../accounts/invalidation.js";
import { JOB_SUMMARY_COLUMNS, type JobSummaryRow } from "../shared/job-row.js";
import { JOB_TYPES } from "../money/pricing.js";
import { adjust, lockRenterAccounts, renterFunds } from "../money/ledger.js";
import { lockedReserved, lockReservations } from "../money/usage-billing.js";
import { collectRefundDebt } from "../money/refund-debt.js";
import { renterById, type RenterRow } from "../accounts/renters.js";
import { placeJobs } from "../dispatch/dispatch.js";
import { cancelLocked, lockActiveJobsOf, type CancelEnd } from "../jobs/job-control.js";
import { lockRenterFunds } from "../money/settlement.js";
import { jobCountSql } from "../shared/job-counts.js";
import { checkEnum, checkRange, countedFor } from "../shared/validate.js";

export const RENTER_STATUSES = ["active", "suspended"] as const;
export const JOB_STATUSES = ["queued", "pending", "running", "completed", "failed", "cancelled"] as const;

export interface Paged<T> {
  rows: T[];
  total: number;
}

/** `q` as a case-insensitive substring pattern, with LIKE's own characters escaped. */
export function likePattern(q: string): string {
  return `%${q.replace(/[\\%_]/g, (c) => `\\${c}`)}%`;
}

/** An id from a path or filter: a positive integer. */
export function checkId(value: bigint | number | undefined, field: string): number {
  const n = Number(value);
  if (!Number.isSafeInteger(n) || n < 1) throw badRequest(`${field} must be a positive integer`);
  return n;
}

export async function listRenters(
  db: Db,
  f: { status?: string; q?: string; limit: number; offset: number },
): Promise<Paged<RenterRow>> {
  const status = f.status === undefined ? undefined : checkEnum(f.status, RENTER_STATUSES, "status");
  const q = f.q?.trim() ? likePattern(f.q.trim().slice(0, 200)) : undefined;
  const where = () => db`
    WHERE true
      ${status ? db`AND status = ${status}` : db``}
      ${q ? db`AND (name ILIKE ${q} OR email ILIKE ${q} OR coalesce(organization, '') ILIKE ${q})` : db``}`;
  const [rows, [c]] = await Promise.all([
    db<RenterRow[]>`SELECT * FROM renters ${where()} ORDER BY id DESC LIMIT ${f.limit} OFFSET ${f.offset}`,
    db<{ n: number }[]>`SELECT count(*)::bigint AS n FROM (SELECT 1 FROM renters ${where()} LIMIT ${countedFor(f)}) c`,
  ]);
  return { rows, total: c.n };
}

export interface RenterStatusChange {
  row: RenterRow;
  changed: boolean;
  /** The active jobs stop_jobs cancelled (afterCancels once committed). */
  stopped: CancelEnd[];
  /** The same jobs by job_id, with the status each was cancelled from (their audit entries). */
  stoppedJobs: { jobId: string; status: string }[];
}

/**
 * Sets a renter's status; answers the row, whether it changed, and the jobs
 * `stopJobs` cancelled (a suspension only; the renter's fault, as its own
 * cancel: job-control.ts cancelLocked). A suspended renter's queued jobs stay
 * queued with their holds and are given to no provider (dispatch.ts
 * renterActiveSql); its running jobs run on unless stopped.
 *
 * A suspension takes the renter's reservation lock, which every submit of the
 * renter holds from its first statement to its commit and reads the status
 * under (submit.ts): a submit under way commits first, and one after sees the
 * suspension and is refused. Its row is locked FOR UPDATE, against the KEY
 * SHARE lock an assignment of the renter's queued job holds on it: one under
 * way commits first, one after sees the suspension. Locks in the order every
 * path takes them: the jobs stopped, the reservations, the accounts, the row.
 */
export async function setRenterStatus(
  tx: Tx,
  id: number,
  status: (typeof RENTER_STATUSES)[number],
  opts: { stopJobs?: boolean } = {},
): Promise<RenterStatusChange> {
  const suspending = status === "suspended";
  if (opts.stopJobs && !suspending) throw badRequest("stop_jobs is for a suspension only");
  if (opts.stopJobs) await lockActiveJobsOf(tx, id);
  if (suspending) await lockReservations(tx, [id]);
  if (opts.stopJobs) await lockRenterFunds(tx, id);
  // Unsuspending, NO KEY UPDATE: the status is not a key, so submits inserting jobs for this renter
  // (foreign key share locks) are not held up.
  const [before] = await tx<RenterRow[]>`SELECT * FROM renters WHERE id = ${id} ${suspending ? tx`FOR UPDATE` : tx`FOR NO KEY UPDATE`}`;
  if (!before) throw notFound("renter not found");
  const changed = before.status !== status;
  let row = before;
  if (changed) {
    [row] = await tx<RenterRow[]>`UPDATE renters SET status = ${status} WHERE id = ${id} RETURNING *`;
    // Cached key owners carry the suspension: forget them here and, at commit, everywhere.
    await accountKeysChanged(tx, "renter", id);
  }
  const stopped: CancelEnd[] = [];
  const stoppedJobs: { jobId: string; status: string }[] = [];
  if (opts.stopJobs) {
    // Read again: it holds the jobs that submits committed while this waited for the reservation lock.
    for (const job of await lockActiveJobsOf(tx, id)) {
      stoppedJobs.push({ jobId: job.job_id, status: job.status });
      stopped.push(await cancelLocked(tx, job, "renter_suspended", "cancelled by admin: the account was suspended"));
    }
    // Its spending as the charges left it.
    if (stopped.length > 0) row = await renterById(tx, id);
  }
  return { row, changed, stopped, stoppedJobs };
}

/** How many of an unsuspended renter's queued jobs are offered to providers at once; refills and the job sweep reach the rest. */
const REINSTATED_OFFERED = 100;

/** Offers an unsuspended renter's queued jobs (the first REINSTATED_OFFERED, in dispatch order) to providers, once committed. */
export async function offerQueuedJobsOf(sql: Sql, renterId: number): Promise<void> {
  const rows = await sql<{ id: number }[]>`
    SELECT id FROM jobs WHERE renter_id = ${renterId} AND status = 'queued' ORDER BY priority, submitted_at, id LIMIT ${REINSTATED_OFFERED}`;
  await placeJobs(sql, rows.map((r) => r.id));
}

export const QUOTA_MAX = 1_000_000_000_000;

export interface Quota {
  dailyJobsLimit: number;
  monthlySpendLimitHalala: number;
}

/**
 * Sets a renter's quota; an omitted limit keeps its value (or the default).
 * Answers the quota it replaced and the new one, read under the quota row's
 * lock: concurrent changes apply one after the other, and each one's `before`
 * is what the one before it left (its audit entry's).
 */
export async function setQuota(
  tx: Tx,
  renterId: number,
  input: { dailyJobsLimit?: number; monthlySpendLimitHalala?: number },
  defaults: Quota,
): Promise<{ before: Quota; after: Quota }> {
  if (input.dailyJobsLimit === undefined && input.monthlySpendLimitHalala === undefined) {
    throw badRequest("give daily_jobs_limit, monthly_spend_limit_halala or both");
  }
  if (input.dailyJobsLimit !== undefined) checkRange(input.dailyJobsLimit, 0, QUOTA_MAX, "daily_jobs_limit", true);
  if (input.monthlySpendLimitHalala !== undefined) {
    checkRange(input.monthlySpendLimitHalala, 0, QUOTA_MAX, "monthly_spend_limit_halala", true);
  }
  // No lock on the renter row: a submit writes it (total_jobs) while holding the renter's ledger
  // accounts, and only reads the quota row, so the quota row's own lock is all this needs.
  const [renter] = await tx`SELECT id FROM renters WHERE id = ${renterId}`;
  if (!renter) throw notFound("renter not found");
  // A renter without a row gets the defaults' (a concurrent change waits on this insert, then finds
  // that row), then the row is locked and read: the quota this change replaces.
  await tx`
    INSERT INTO renter_quota (renter_id, daily_jobs_limit, monthly_spend_limit_halala)
    VALUES (${renterId}, ${defaults.dailyJobsLimit}, ${defaults.monthlySpendLimitHalala})
    ON CONFLICT (renter_id) DO NOTHING`;
  const [b] = await tx<{ daily_jobs_limit: number; monthly_spend_limit_halala: number }[]>`
    SELECT daily_jobs_limit, monthly_spend_limit_halala FROM renter_quota WHERE renter_id = ${renterId} FOR NO KEY UPDATE`;
  const [q] = await tx<{ daily_jobs_limit: number; monthly_spend_limit_halala: number }[]>`
    UPDATE renter_quota SET
      daily_jobs_limit = ${input.dailyJobsLimit ?? b.daily_jobs_limit},
      monthly_spend_limit_halala = ${input.monthlySpendLimitHalala ?? b.monthly_spend_limit_halala},
      updated_at = now()
    WHERE renter_id = ${renterId}
    RETURNING daily_jobs_limit, monthly_spend_limit_halala`;
  return {
    before: { dailyJobsLimit: Number(b.daily_jobs_limit), monthlySpendLimitHalala: Number(b.monthly_spend_limit_halala) },
    after: { dailyJobsLimit: Number(q.daily_jobs_limit), monthlySpendLimitHalala: Number(q.monthly_spend_limit_halala) },
  };
}

export async function listJobs(
  db: Db,
  f: { status?: string; renterId?: number; providerId?: number; jobType?: string; limit: number; offset: number },
): Promise<Paged<JobSummaryRow>> {
  const status = f.status === undefined ? undefined : checkEnum(f.status, JOB_STATUSES, "status");
  const jobType = f.jobType === undefined ? undefined : checkEnum(f.jobType, JOB_TYPES, "job_type");
  const where = () => db`
    WHERE true
      ${status ? db`AND status = ${status}` : db``}
      ${f.renterId ? db`AND renter_id = ${f.renterId}` : db``}
      ${f.providerId ? db`AND provider_id = ${f.providerId}` : db``}
      ${jobType ? db`AND job_type = ${jobType}` : db``}`;
  // The total comes from the ended jobs' counters (jobCountSql), not from counting every matching job
  // of the history; by renter and provider at once it is counted (that provider's jobs of the renter),
  // up to LIST_COUNTED or one past the page.
  const total =
    f.providerId && f.renterId
      ? db`(SELECT count(*) FROM (SELECT 1 FROM jobs ${where()} LIMIT ${countedFor(f)}) c)`
      : jobCountSql(db, { renterId: f.renterId || undefined, providerId: f.providerId || undefined, status, jobType });
  const [rows, [c]] = await Promise.all([
    // now() beside the rows: a running job's cost so far is counted by the database's clock (jobs.ts DbNow).
    db<JobSummaryRow[]>`SELECT ${db(JOB_SUMMARY_COLUMNS)}, now() AS db_now FROM jobs ${where()} ORDER BY submitted_at DESC, id DESC LIMIT ${f.limit} OFFSET ${f.offset}`,
    db<{ n: number }[]>`SELECT ${total} AS n`,
  ]);
  return { rows, total: c.n };
}

export interface AuditRow {
  id: number;
  actor: string;
  action: string;
  target_type: string;
  target_id: string;
  details: Record<string, unknown>;
  created_at: Date;
}

export async function listAudit(
  db: Db,
  f: { action?: string; targetType?: string; targetId?: string; limit: number; offset: number },
): Promise<Paged<AuditRow>> {
  const where = () => db`
    WHERE true
      ${f.action ? db`AND action = ${f.action}` : db``}
      ${f.targetType ? db`AND target_type = ${f.targetType}` : db``}
      ${f.targetId ? db`AND target_id = ${f.targetId}` : db``}`;
  const [rows, [c]] = await Promise.all([
    db<AuditRow[]>`SELECT * FROM audit_log ${where()} ORDER BY id DESC LIMIT ${f.limit} OFFSET ${f.offset}`,
    db<{ n: number }[]>`SELECT count(*)::bigint AS n FROM (SELECT 1 FROM audit_log ${where()} LIMIT ${countedFor(f)}) c`,
  ]);
  return { rows, total: c.n };
}

/** What an adjustment did to the renter's available balance (its audit entry's). */
export interface Adjustment {
  availableBefore: number;
  availableAfter: number;
  /** What of a credit went to the renter's debt for refunded payments (refund-debt.ts). */
  refundDebtPaid: number;
}

/**
 * An admin's adjustment of a renter's available balance: positive credits,
 * negative debits, never below zero nor into what the renter's /v1 requests in
 * flight reserved (they are charged from it when they end; a debit taking it
 * would leave their provider unpaid for tokens it served). The renter's
 * accounts are locked before they are read: concurrent adjustments apply one
 * after the other, each seeing what the one before it left.
 */
export async function adjustRenterBalance(tx: Tx, renterId: number, amount: number, key: string, reason: string): Promise<Adjustment> {
  // The reservations before the accounts: the order every path takes them in.
  const reserved = amount < 0 ? (await lockedReserved(tx, renterId)).v1 : 0;
  const available = (await lockRenterAccounts(tx, [renterId])).get(renterId)!.available;
  if (amount < 0) {
    if (available < -amount) throw badRequest(`amount_halala would take the available balance below zero (available ${available} halala)`);
    if (available - reserved < -amount) {
      throw conflict(
        `amount_halala would take funds that /v1 requests in flight reserved (available ${available} halala, ${reserved} reserved); ` +
          "retry when they end, or debit less",
      );
    }
  }
  await adjust(tx, renterId, amount, key, reason);
  // A credit pays what the renter owes for refunded payments first, as a top-up does.
  const refundDebtPaid = amount > 0 ? await collectRefundDebt(tx, renterId) : 0;
  return { availableBefore: available, availableAfter: (await renterFunds(tx, renterId)).available, refundDebtPaid };
}
