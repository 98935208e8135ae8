// What a renter can still be charged for its running jobs beyond what they
// hold: its available balance less what its /v1 requests in flight reserved
// and what it owes for refunds (promised.ts), and within its monthly spend
// limit (which counts holds, as a submit's check does). Read under the locks
// every writer of the renter's money takes, in their order: its reservations,
// then its accounts. Both a running job's hold growth (hold-extension.ts) and
// a settlement whose run outgrew its hold (settlement.ts) read it here.
import type { Tx } from "../../db/index.js";
import { lockRenterAccounts, renterFunds } from "./ledger.js";
import { freeOf } from "./promised.js";
import { monthlyHeadroom, quotaUsage, withReserved, type QuotaUsage } from "./quota.js";
import { lockedReserved } from "./usage-billing.js";

export interface Headroom {
  /** Halala free to spend (never below 0). */
  funds: number;
  /** Halala left under the monthly spend limit (never below 0). */
  limit: number;
  usage: QuotaUsage;
}

/** Locks the renter's reservations and accounts (in that order) and reads its headroom. */
export async function lockedHeadroom(tx: Tx, renterId: number): Promise<Headroom> {
  const promised = await lockedReserved(tx, renterId);
  await lockRenterAccounts(tx, [renterId]);
  const { available } = await renterFunds(tx, renterId);
  const usage = withReserved(await quotaUsage(tx, renterId), promised.v1);
  return { funds: Math.max(0, freeOf(available, promised)), limit: Math.max(0, monthlyHeadroom(usage)), usage };
}
