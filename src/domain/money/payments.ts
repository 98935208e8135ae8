// Card payments: amounts, payment rows, and the gateway events that move
// them (paid credits once, failed records, refunded debits through the
// ledger, voided takes back the whole payment). Statuses: initiated -> paid |
// failed; failed -> paid (a later successful attempt on the same checkout);
// paid -> refunded. A void is a full refund of a credited payment (paid ->
// refunded), and marks one never credited failed (initiated -> failed, with
// voided_at: a paid or refunded event arriving for it late then credits nothing).
import crypto from "node:crypto";
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { PaymentSchema } from "../../../gen/svc/v1/models_pb.js";
import type { Db, Tx } from "../../db/index.js";
import { badRequest } from "../../errors.js";
import { recordAudit } from "../shared/audit.js";
import { credit, debitUpTo } from "./ledger.js";
import { collectRefundDebt, oweRefund } from "./refund-debt.js";
import { lockedReserved } from "./usage-billing.js";
import { halalaToSar } from "./pricing.js";
import { countedFor, iso } from "../shared/validate.js";

export const PAYMENT_SOURCES = ["creditcard", "mada", "applepay", "sandbox"] as const;
export type PaymentSource = (typeof PAYMENT_SOURCES)[number];
export const CARD_SOURCES: readonly PaymentSource[] = ["creditcard", "mada", "applepay"];
export const PAYMENT_STATUSES = ["initiated", "paid", "failed", "refunded"] as const;

/** Largest single top-up: 100,000 SAR. */
export const MAX_TOPUP_HALALA = 10_000_000;

/**
 * The amount of a top-up request: `amount_halala` (integer) or `amount_sar`
 * (a number with at most two decimals), exactly one of them.
 */
export function topupAmount(amountHalala: bigint | undefined, amountSar: number | undefined, minHalala = 1): number {
  if ((amountHalala === undefined) === (amountSar === undefined)) {
    throw badRequest("give exactly one of amount_halala or amount_sar");
  }
  let halala: number;
  if (amountHalala !== undefined) {
    halala = Number(amountHalala);
    if (halala < minHalala || halala > MAX_TOPUP_HALALA) {
      throw badRequest(`amount_halala must be an integer between ${minHalala} and ${MAX_TOPUP_HALALA}`);
    }
  } else {
    const sar = amountSar!;
    const scaled = Math.round(sar * 100);
    if (!Number.isFinite(sar) || Math.abs(sar * 100 - scaled) > 1e-6) {
      throw badRequest("amount_sar must be a number with at most two decimals (a whole number of halala)");
    }
    if (scaled < minHalala || scaled > MAX_TOPUP_HALALA) {
      throw badRequest(`amount_sar must be between ${halalaToSar(minHalala)} and ${halalaToSar(MAX_TOPUP_HALALA)}`);
    }
    halala = scaled;
  }
  return halala;
}

export interface PaymentRow {
  id: number;
  payment_id: string;
  renter_id: number;
  amount_halala: number;
  currency: string;
  status: (typeof PAYMENT_STATUSES)[number];
  source_type: PaymentSource;
  description: string;
  gateway_id: string | null;
  checkout_url: string | null;
  refunded_halala: number;
  refund_shortfall_halala: number;
  failure_reason: string | null;
  /** Set when the gateway voided the payment before it was credited. */
  voided_at: Date | null;
  created_at: Date;
  confirmed_at: Date | null;
}

export function newPaymentId(): string {
  return "pay_" + crypto.randomBytes(12).toString("hex");
}

export function paymentMessage(p: PaymentRow): MessageInitShape<typeof PaymentSchema> {
  // What the gateway gave back: what the ledger took at once and what the renter owes for it (refund-debt.ts).
  const refunded = Number(p.refunded_halala) + Number(p.refund_shortfall_halala);
  return {
    paymentId: p.payment_id,
    amountSar: halalaToSar(p.amount_halala),
    amountHalala: BigInt(p.amount_halala),
    status: p.status,
    sourceType: p.source_type,
    description: p.description,
    createdAt: iso(p.created_at)!,
    confirmedAt: iso(p.confirmed_at),
    checkoutUrl: p.status === "initiated" ? (p.checkout_url ?? undefined) : undefined,
    renterId: BigInt(p.renter_id),
    ...(refunded > 0 ? { refundedHalala: BigInt(refunded) } : {}),
  };
}

export async function insertPayment(
  tx: Tx,
  p: { paymentId: string; renterId: number; amountHalala: number; source: PaymentSource; description: string; gatewayId?: string; checkoutUrl: string },
): Promise<PaymentRow> {
  const [row] = await tx<PaymentRow[]>`
    INSERT INTO payments (payment_id, renter_id, amount_halala, source_type, description, gateway_id, checkout_url)
    VALUES (${p.paymentId}, ${p.renterId}, ${p.amountHalala}, ${p.source}, ${p.description}, ${p.gatewayId ?? null}, ${p.checkoutUrl})
    RETURNING *`;
  return row;
}

export async function paymentById(db: Db, paymentId: string): Promise<PaymentRow | undefined> {
  const [row] = await db<PaymentRow[]>`SELECT * FROM payments WHERE payment_id = ${paymentId}`;
  return row;
}

/** Newest first; filters by renter and status when given. The total counts up to LIST_COUNTED, or one past the page. */
export async function listPayments(
  db: Db,
  f: { renterId?: number; status?: string; limit: number; offset: number },
): Promise<{ payments: PaymentRow[]; total: number }> {
  const where = db`WHERE true
    ${f.renterId !== undefined ? db`AND renter_id = ${f.renterId}` : db``}
    ${f.status !== undefined ? db`AND status = ${f.status}` : db``}`;
  const [payments, [count]] = await Promise.all([
    db<PaymentRow[]>`SELECT * FROM payments ${where} ORDER BY created_at DESC, id DESC LIMIT ${f.limit} OFFSET ${f.offset}`,
    db<{ n: number }[]>`SELECT count(*)::bigint AS n FROM (SELECT 1 FROM payments ${where} LIMIT ${countedFor(f)}) c`,
  ]);
  return { payments, total: Number(count.n) };
}

// ---- gateway events --------------------------------------------------------

export type GatewayEventKind = "paid" | "failed" | "refunded" | "voided";

export interface GatewayEvent {
  kind: GatewayEventKind | undefined;
  /** The gateway's name for the event, as sent. */
  type: string;
  eventId?: string;
  /** Our payment id (metadata.payment_id) and/or the gateway's invoice/payment ids. */
  paymentId?: string;
  gatewayIds: string[];
  amount?: number;
  currency?: string;
  refunded?: number;
  /** `amount` or `refunded` as sent when it is no whole, non-negative number of halala (what it says, for the note). */
  unreadable?: { amount?: string; refunded?: string };
  reason?: string;
}

/** Lowercase hex HMAC-SHA256 of the raw body, compared in constant time. */
export function verifySignature(secret: string, raw: Uint8Array, signature: string): boolean {
  const expected = crypto.createHmac("sha256", secret).update(raw).digest();
  const given = /^[0-9a-f]{64}$/.test(signature.trim()) ? Buffer.from(signature.trim(), "hex") : undefined;
  return given !== undefined && crypto.timingSafeEqual(expected, given);
}

const str = (v: unknown): string | undefined => (typeof v === "string" && v !== "" ? v : undefined);

/**
 * A gateway's amount in halala: a whole, non-negative JSON number, or a string of its digits (as 64-bit
 * integers are often written in JSON, and as this service reads its own int64 fields). Absent (or null):
 * undefined. Anything else (a fraction, a negative, other text) is `unreadable`: no amount is guessed.
 */
function halalaOf(v: unknown): number | undefined | "unreadable" {
  if (v === undefined || v === null) return undefined;
  if (typeof v === "number" && Number.isSafeInteger(v) && v >= 0) return v;
  if (typeof v === "string" && /^\d{1,15}$/.test(v.trim())) return Number(v.trim());
  return "unreadable";
}

/**
 * Reads a Moyasar-style event: `{id, type: "payment_paid" | "payment_failed" |
 * "payment_refunded" | "payment_voided", data: {id, invoice_id, status, amount, currency,
 * refunded, message, metadata: {payment_id}}}`. `type` may also be the bare
 * kind, and `data.status` stands in when `type` is absent.
 */
export function parseGatewayEvent(body: unknown): GatewayEvent {
  if (typeof body !== "object" || body === null || Array.isArray(body)) throw badRequest("webhook body must be a JSON object");
  const b = body as Record<string, unknown>;
  const data = (typeof b.data === "object" && b.data !== null ? b.data : {}) as Record<string, unknown>;
  const metadata = (typeof data.metadata === "object" && data.metadata !== null ? data.metadata : {}) as Record<string, unknown>;
  const type = str(b.type) ?? str(data.status) ?? "";
  const bare = type.replace(/^(payment|invoice)[._]/, "");
  const kind = (["paid", "failed", "refunded", "voided"] as const).find((k) => k === bare);
  const amount = halalaOf(data.amount);
  const refunded = halalaOf(data.refunded);
  const says = (name: string, sent: unknown) => `${name} ${String(JSON.stringify(sent)).slice(0, 40)} is not a whole number of halala`;
  const unreadable = {
    ...(amount === "unreadable" ? { amount: says("amount", data.amount) } : {}),
    ...(refunded === "unreadable" ? { refunded: says("refunded", data.refunded) } : {}),
  };
  return {
    kind,
    type,
    eventId: str(b.id),
    paymentId: str(metadata.payment_id) ?? str(b.payment_id),
    gatewayIds: [str(data.invoice_id), str(data.id)].filter((x): x is string => x !== undefined),
    amount: amount === "unreadable" ? undefined : amount,
    currency: str(data.currency),
    refunded: refunded === "unreadable" ? undefined : refunded,
    ...(Object.keys(unreadable).length > 0 ? { unreadable } : {}),
    reason: str(data.message) ?? str(data.reason),
  };
}

export type EventOutcome = "credited" | "failed" | "refunded" | "ignored" | "duplicate";

async function findForEvent(tx: Tx, ev: GatewayEvent): Promise<PaymentRow | undefined> {
  if (ev.paymentId) {
    const [p] = await tx<PaymentRow[]>`SELECT * FROM payments WHERE payment_id = ${ev.paymentId} FOR NO KEY UPDATE`;
    if (p) return p;
  }
  if (ev.gatewayIds.length === 0) return undefined;
  const [p] = await tx<PaymentRow[]>`SELECT * FROM payments WHERE gateway_id IN ${tx(ev.gatewayIds)} FOR NO KEY UPDATE`;
  return p;
}

/**
 * Applies a verified gateway event in one transaction. A payment is credited
 * at most once (the ledger key `payment:<id>:credit` backs the status check);
 * unknown payments and events that do not fit the payment's state change
 * nothing. A refund takes back what is still available and not reserved by
 * the renter's /v1 requests in flight (they are charged from it when they
 * end, and their providers paid); a part already spent, held or reserved is
 * recorded as `refund_shortfall_halala` and in the audit log, and owed by the
 * renter (refund-debt.ts): taken as its held or reserved funds come free (the
 * ledger never goes negative). A void is a refund of the whole payment
 * (whatever `refunded` says); of a payment never credited, it marks it
 * failed and moves nothing.
 */
export async function applyGatewayEvent(tx: Tx, ev: GatewayEvent, raw: unknown): Promise<{ outcome: EventOutcome; payment?: PaymentRow; note?: string }> {
  const p = await findForEvent(tx, ev);
  const result = await decide(tx, p, ev);
  await tx`
    INSERT INTO payment_events (payment_id, event_id, event_type, outcome, payload)
    VALUES (${p?.payment_id ?? null}, ${ev.eventId ?? null}, ${ev.type || "unknown"}, ${result.note ? `${result.outcome}: ${result.note}` : result.outcome}, ${tx.json(raw as never)})`;
  return result;
}

/** Why an event's amount or currency does not fit the payment (the amount is audited), or undefined. */
async function mismatchOf(tx: Tx, p: PaymentRow, ev: GatewayEvent): Promise<string | undefined> {
  if (ev.amount !== undefined && ev.amount !== p.amount_halala) {
    await recordAudit(tx, "gateway", "payment.amount_mismatch", "payment", p.payment_id, { expected: p.amount_halala, reported: ev.amount });
    return `amount ${ev.amount} does not match ${p.amount_halala}`;
  }
  if (ev.currency !== undefined && ev.currency.toUpperCase() !== p.currency) return `currency ${ev.currency} is not ${p.currency}`;
  return undefined;
}

/** Credits a payment's amount to its renter once (the ledger key backs it) and marks it paid. */
async function creditPaid(tx: Tx, p: PaymentRow): Promise<PaymentRow> {
  await credit(tx, p.renter_id, p.amount_halala, `payment:${p.payment_id}:credit`, "payment", p.payment_id);
  // A renter that owes for refunded payments pays that first.
  await collectRefundDebt(tx, p.renter_id);
  const [row] = await tx<PaymentRow[]>`
    UPDATE payments SET status = 'paid', confirmed_at = now(), failure_reason = NULL, updated_at = now()
    WHERE id = ${p.id} RETURNING *`;
  return row;
}

async function decide(tx: Tx, p: PaymentRow | undefined, ev: GatewayEvent): Promise<{ outcome: EventOutcome; payment?: PaymentRow; note?: string }> {
  if (!p) return { outcome: "ignored", note: "unknown payment" };
  if (!ev.kind) return { outcome: "ignored", payment: p, note: `event type '${ev.type}' not handled` };
  // What the gateway says it took (paid, or a refund that credits first) or gave back (a refund's running
  // total) cannot be read: no amount is assumed for it (the payment's whole amount credited, or taken back).
  // A failed event moves nothing, and a void takes back the whole payment whatever it says.
  const unread = ev.kind === "paid" ? ev.unreadable?.amount : ev.kind === "refunded" ? [ev.unreadable?.amount, ev.unreadable?.refunded].filter(Boolean).join("; ") : undefined;
  if (unread) {
    await recordAudit(tx, "gateway", "payment.unreadable_amount", "payment", p.payment_id, { problem: unread, event_id: ev.eventId ?? null });
    return { outcome: "ignored", payment: p, note: unread };
  }
  switch (ev.kind) {
    case "paid": {
      if (p.status === "paid" || p.status === "refunded") return { outcome: "duplicate", payment: p };
      if (p.voided_at) {
        // The gateway voided this payment before we credited it: the card holder has the money back.
        await recordAudit(tx, "gateway", "payment.paid_after_void", "payment", p.payment_id, { amount: ev.amount ?? null, event_id: ev.eventId ?? null });
        return { outcome: "ignored", payment: p, note: "payment was voided" };
      }
      const mismatch = await mismatchOf(tx, p, ev);
      if (mismatch) return { outcome: "ignored", payment: p, note: mismatch };
      return { outcome: "credited", payment: await creditPaid(tx, p) };
    }
    case "failed": {
      if (p.status !== "initiated") return { outcome: p.status === "failed" ? "duplicate" : "ignored", payment: p };
      const [row] = await tx<PaymentRow[]>`
        UPDATE payments SET status = 'failed', failure_reason = ${ev.reason?.slice(0, 500) ?? null}, updated_at = now()
        WHERE id = ${p.id} RETURNING *`;
      return { outcome: "failed", payment: row };
    }
    case "voided": {
      if (p.status === "initiated" || p.status === "failed") {
        // Never credited: nothing to take back. Marked so that a late paid event credits nothing.
        if (p.voided_at) return { outcome: "duplicate", payment: p };
        const [row] = await tx<PaymentRow[]>`
          UPDATE payments SET status = 'failed', voided_at = now(),
                 failure_reason = ${`voided at the gateway${ev.reason ? `: ${ev.reason}` : ""}`.slice(0, 500)}, updated_at = now()
          WHERE id = ${p.id} RETURNING *`;
        return { outcome: "failed", payment: row };
      }
      // Credited: the whole payment goes back, as a full refund (what an earlier partial refund took is not taken twice).
      return refund(tx, p, p.amount_halala);
    }
    case "refunded": {
      if (p.voided_at) {
        // Voided before it was credited: the void gave the card holder the whole payment back, so a
        // refund of it (delivered after the void) has nothing to take, and must not credit it first.
        await recordAudit(tx, "gateway", "payment.refund_after_void", "payment", p.payment_id, { refunded: ev.refunded ?? null, event_id: ev.eventId ?? null });
        return { outcome: "ignored", payment: p, note: "payment was voided" };
      }
      // A running total of nothing takes nothing back (without one, the whole payment is meant).
      if (ev.refunded === 0) return { outcome: "ignored", payment: p, note: "refunded total is 0" };
      if (p.status !== "paid" && p.status !== "refunded") {
        // A refund proves the payment was made: its paid event is late, or was lost (answered 5xx and
        // not sent again). Credited here, the refund then takes it back, and the paid event, when it
        // comes, is a duplicate; ignored, that paid event would credit money already returned.
        const mismatch = await mismatchOf(tx, p, ev);
        if (mismatch) return { outcome: "ignored", payment: p, note: mismatch };
        p = await creditPaid(tx, p);
      }
      // `refunded` is the gateway's running total: a second partial refund takes only the difference.
      return refund(tx, p, Math.min(p.amount_halala, ev.refunded ?? p.amount_halala));
    }
  }
}

/**
 * Takes back what a credited payment's refunds total (`total`, the gateway's
 * running total) has not yet taken: from what is available and not reserved
 * by /v1 requests in flight, the rest owed (refund-debt.ts).
 */
async function refund(tx: Tx, p: PaymentRow, total: number): Promise<{ outcome: EventOutcome; payment?: PaymentRow; note?: string }> {
  const already = p.refunded_halala + p.refund_shortfall_halala;
  if (total <= already) return { outcome: "duplicate", payment: p };
  const amount = total - already;
  // What /v1 requests in flight reserved is left to them; the rest of the refund is owed (refund-debt.ts).
  const reserved = await lockedReserved(tx, p.renter_id);
  const taken = await debitUpTo(tx, p.renter_id, amount, `payment:${p.payment_id}:refund:${total}`, "refund", p.payment_id, reserved.v1);
  await oweRefund(tx, p.renter_id, taken.shortfall);
  const [row] = await tx<PaymentRow[]>`
    UPDATE payments SET status = 'refunded', refunded_halala = refunded_halala + ${taken.debited},
           refund_shortfall_halala = refund_shortfall_halala + ${taken.shortfall}, updated_at = now()
    WHERE id = ${p.id} RETURNING *`;
  if (taken.shortfall > 0) {
    await recordAudit(tx, "gateway", "payment.refund_shortfall", "renter", p.renter_id, {
      payment_id: p.payment_id,
      refunded_halala: amount,
      debited_halala: taken.debited,
      shortfall_halala: taken.shortfall,
    });
  }
  return {
    outcome: "refunded",
    payment: row,
    note: taken.shortfall > 0 ? `shortfall ${taken.shortfall} halala held, reserved or spent: owed by the renter, taken as its funds come free` : undefined,
  };
}
