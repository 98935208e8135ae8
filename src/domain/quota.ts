// Renter quotas at submit: jobs per UTC day and spend per UTC month.
import type { Tx } from "../db/index.js";
import { apiError } from "../http/errors.js";
import { CHARGE_KINDS } from "./ledger.js";
import { DEFAULT_QUOTA } from "./renters.js";

export interface QuotaUsage {
  dailyJobsLimit: number;
  jobsToday: number;
  monthlySpendLimitHalala: number;
  /** Settled this UTC month plus every open hold. */
  spentAndHeldHalala: number;
}

/** Current usage against the renter's quota (inside the submit transaction). */
export async function quotaUsage(tx: Tx, renterId: number): Promise<QuotaUsage> {
  // One round trip (SQL renter_quota_usage, migration 009): the quota row is
  // locked first, which serialises one renter's submits, and the usage is read
  // after the lock is held, so two racing submits cannot both pass the last free slot.
  const [u] = await tx<{ daily_jobs_limit: number | null; monthly_spend_limit_halala: number | null; jobs_today: number; settled: number; held: number }[]>`
    SELECT * FROM renter_quota_usage(${renterId}::bigint, ${`{${CHARGE_KINDS.join(",")}}`}::text[])`;
  return {
    dailyJobsLimit: u.daily_jobs_limit ?? DEFAULT_QUOTA.dailyJobsLimit,
    jobsToday: u.jobs_today,
    monthlySpendLimitHalala: u.monthly_spend_limit_halala ?? DEFAULT_QUOTA.monthlySpendLimitHalala,
    spentAndHeldHalala: u.settled + u.held,
  };
}

/**
 * 429 when one more job (holding `estimate`) would exceed the renter's daily
 * job count or monthly spend (settled this UTC month + held). Call it in the
 * submit transaction, before the job row is inserted.
 */
export async function checkSubmitQuota(tx: Tx, renterId: number, estimate: number): Promise<void> {
  const u = await quotaUsage(tx, renterId);
  if (u.jobsToday + 1 > u.dailyJobsLimit) {
    throw apiError(429, `renter quota exceeded: daily_jobs_limit is ${u.dailyJobsLimit} jobs per UTC day and ${u.jobsToday} were submitted today`);
  }
  if (u.spentAndHeldHalala + estimate > u.monthlySpendLimitHalala) {
    throw apiError(
      429,
      `renter quota exceeded: monthly_spend_limit_halala is ${u.monthlySpendLimitHalala}; ` +
        `${u.spentAndHeldHalala} halala spent or held this UTC month and this job would hold ${estimate} more`,
    );
  }
}
