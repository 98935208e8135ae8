// What a renter owes for gateway refunds of money it had already held or
// reserved when the refund came (renters.refund_owed_halala, migration 054).
// A refund takes what is free at once (payments.ts); the rest is owed. Every
// spend check counts the debt as reserved (usage-billing.ts reservedMany), so
// refunded money cannot be spent, and it is taken back to the gateway as it
// comes free: after a job's hold is released or settled, and after a payment
// is credited. Taking it moves available funds and the debt down together, so
// what a renter can spend is the same before and after (no reservation lock
// needed), and what /v1 requests in flight reserved is left to them.
import crypto from "node:crypto";
import type { Tx } from "../../db/index.js";
import { debitUpTo } from "./ledger.js";
import { reservedMany } from "./promised.js";

/** Adds to what the renter owes (a refund's shortfall). */
export async function oweRefund(tx: Tx, renterId: number, amount: number): Promise<void> {
  if (amount > 0) await tx`UPDATE renters SET refund_owed_halala = refund_owed_halala + ${amount} WHERE id = ${renterId}`;
}

/**
 * Takes what the renter owes from its free available funds (those no /v1 request reserved), up to
 * the debt, back to the gateway. The caller holds the renter's accounts locked. Returns what it took.
 */
export async function collectRefundDebt(tx: Tx, renterId: number): Promise<number> {
  const promised = (await reservedMany(tx, [renterId])).get(renterId);
  const owed = promised?.owed ?? 0;
  if (owed <= 0) return 0;
  const keep = promised!.v1;
  const taken = await debitUpTo(tx, renterId, owed, `refund-debt:renter:${renterId}:${crypto.randomUUID()}`, "refund", undefined, keep);
  if (taken.debited > 0) await tx`UPDATE renters SET refund_owed_halala = refund_owed_halala - ${taken.debited} WHERE id = ${renterId}`;
  return taken.debited;
}
