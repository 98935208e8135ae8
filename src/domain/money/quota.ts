// Renter quotas at submit: jobs per UTC day and spend per UTC month.
import type { Tx } from "../../db/index.js";
import { apiError } from "../../errors.js";

/** A new renter's quota, until an admin sets another. */
export const DEFAULT_QUOTA = { dailyJobsLimit: 500, monthlySpendLimitHalala: 10_000_000 } as const;

export interface QuotaUsage {
  dailyJobsLimit: number;
  jobsToday: number;
  monthlySpendLimitHalala: number;
  /**
   * Settled this UTC month plus every open hold; the callers that hold the renter's
   * reservation lock add what /v1 requests in flight reserved (withReserved).
   */
  spentAndHeldHalala: number;
  /**
   * The database's now() the usage was read at: the clock that decided which UTC month (and day)
   * it counts, so the time until the limit frees up is measured from it (msUntilNextUtcMonth).
   */
  dbNow: Date;
}

/** The usage with the renter's /v1 reservations in flight counted: they will be spent or released. */
export const withReserved = (u: QuotaUsage, reserved: number): QuotaUsage => ({ ...u, spentAndHeldHalala: u.spentAndHeldHalala + reserved });

/** What the renter may still spend or hold this UTC month (never below 0). */
export const monthlyHeadroom = (u: QuotaUsage): number => Math.max(0, u.monthlySpendLimitHalala - u.spentAndHeldHalala);

/**
 * Milliseconds from `now` until the next UTC month starts, when the monthly spend limit frees up
 * again. Give it the database's time (QuotaUsage.dbNow), the clock that counts the month.
 */
export function msUntilNextUtcMonth(now = new Date()): number {
  return Date.UTC(now.getUTCFullYear(), now.getUTCMonth() + 1, 1) - now.getTime();
}

/**
 * Current usage against each renter's quota, in one statement. Call it in the
 * submit transaction after the renters' ledger accounts are locked (in an
 * earlier statement: under READ COMMITTED each statement reads what was
 * committed when it started), so that two racing submits of one renter cannot
 * both pass the last free slot. What is held is the renter_held balance,
 * which the ledger keeps equal to the renter's open holds.
 */
export async function quotaUsageMany(tx: Tx, renterIds: number[]): Promise<Map<number, QuotaUsage>> {
  // Set-based: one pass per table for all renters. Both usages come from counters kept
  // by triggers, so their cost does not grow with the renter's history: this month's
  // charges from renter_monthly_spend (migration 030), today's jobs from
  // renter_daily_jobs (migration 015).
  const rows = await tx<
    { renter_id: number; daily_jobs_limit: number | null; monthly_spend_limit_halala: number | null; jobs_today: number; settled: number; held: number; db_now: Date }[]
  >`
    WITH acc AS (
      SELECT id, owner_id, kind, balance FROM ledger_accounts
      WHERE owner_id = ANY(${renterIds}::bigint[]) AND kind IN ('renter_available', 'renter_held')
    ), charges AS (
      -- Kept per renter and UTC month by triggers on ledger_transfers (migration 030).
      SELECT renter_id AS owner_id, spent_halala AS settled FROM renter_monthly_spend
      WHERE renter_id = ANY(${renterIds}::bigint[]) AND month = date_trunc('month', now() AT TIME ZONE 'UTC')::date
    ), today AS (
      -- Kept per renter and UTC day by a trigger on jobs (migration 015).
      SELECT renter_id, jobs AS n FROM renter_daily_jobs
      WHERE renter_id = ANY(${renterIds}::bigint[]) AND day = (now() AT TIME ZONE 'UTC')::date
    )
    SELECT r.id AS renter_id, q.daily_jobs_limit, q.monthly_spend_limit_halala,
           coalesce(today.n, 0) AS jobs_today, coalesce(charges.settled, 0) AS settled,
           coalesce((SELECT balance FROM acc WHERE acc.owner_id = r.id AND acc.kind = 'renter_held'), 0) AS held,
           now() AS db_now
    FROM unnest(${renterIds}::bigint[]) AS r(id)
    LEFT JOIN renter_quota q ON q.renter_id = r.id
    LEFT JOIN charges ON charges.owner_id = r.id
    LEFT JOIN today ON today.renter_id = r.id`;
  return new Map(
    rows.map((u) => [
      u.renter_id,
      {
        dailyJobsLimit: u.daily_jobs_limit ?? DEFAULT_QUOTA.dailyJobsLimit,
        jobsToday: Number(u.jobs_today),
        monthlySpendLimitHalala: u.monthly_spend_limit_halala ?? DEFAULT_QUOTA.monthlySpendLimitHalala,
        spentAndHeldHalala: Number(u.settled) + Number(u.held),
        dbNow: u.db_now,
      },
    ]),
  );
}

export async function quotaUsage(tx: Tx, renterId: number): Promise<QuotaUsage> {
  return (await quotaUsageMany(tx, [renterId])).get(renterId)!;
}

/**
 * Why one more job (holding `estimate`) would exceed the renter's daily job
 * count or monthly spend (settled this UTC month + held), or null when it fits.
 */
export function quotaRefusal(u: QuotaUsage, estimate: number): string | null {
  if (u.jobsToday + 1 > u.dailyJobsLimit) {
    return `renter quota exceeded: daily_jobs_limit is ${u.dailyJobsLimit} jobs per UTC day and ${u.jobsToday} were submitted today`;
  }
  if (estimate > monthlyHeadroom(u)) return monthlyRefusal(u, `this job would hold ${estimate} more`);
  return null;
}

/** The monthly spend limit's refusal, `what` saying what was asked. */
export function monthlyRefusal(u: QuotaUsage, what: string): string {
  return (
    `renter quota exceeded: monthly_spend_limit_halala is ${u.monthlySpendLimitHalala}; ` +
    `${u.spentAndHeldHalala} halala spent, held or reserved this UTC month and ${what}`
  );
}

/** 429 when one more job would exceed the renter's quota (quotaRefusal). */
export async function checkSubmitQuota(tx: Tx, renterId: number, estimate: number): Promise<void> {
  const refusal = quotaRefusal(await quotaUsage(tx, renterId), estimate);
  if (refusal) throw apiError(429, refusal);
}
