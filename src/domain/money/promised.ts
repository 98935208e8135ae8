// What of a renter's available funds is promised already, and so not free to
// hold, reserve or take: the price caps of its /v1 requests in flight
// (usage-billing.ts) and what it owes for refunded payments (refund-debt.ts).
import type { Db } from "../../db/index.js";

/** What a renter's available funds are promised to already, and not free to hold or take. */
export interface Promised {
  /** Price caps of its /v1 requests in flight (charged from available funds when they end). */
  v1: number;
  /** What it owes for gateway refunds of money it had held or reserved (refund-debt.ts). */
  owed: number;
}

/** What of a renter's available funds is free to hold or reserve: what nothing is promised to yet. */
export const freeOf = (available: number, p: Promised): number => available - p.v1 - p.owed;

/**
 * What the renters' available funds are promised to: open, unexpired /v1 reservations and refund
 * debt, by renter; and whether the account is suspended (read under the renter's reservation lock,
 * which a suspension takes too: the status a submit holding that lock goes by).
 */
export async function reservedMany(db: Db, renterIds: number[]): Promise<Map<number, Promised & { suspended: boolean }>> {
  const rows = await db<{ renter_id: number; reserved: number; owed: number; suspended: boolean }[]>`
    SELECT r.id AS renter_id, r.refund_owed_halala AS owed, r.status = 'suspended' AS suspended,
           coalesce((SELECT sum(u.reserved_halala) FROM v1_usage u WHERE u.renter_id = r.id AND u.state = 'open' AND u.expires_at > now()), 0)::bigint AS reserved
    FROM renters r WHERE r.id = ANY(${renterIds}::bigint[])`;
  return new Map(rows.map((r) => [Number(r.renter_id), { v1: Number(r.reserved), owed: Number(r.owed), suspended: r.suspended }]));
}
