// Billing of /v1 chat completions by token.
//
// A request first reserves its price cap (prompt bound + max_tokens at the
// model's rate) in `v1_usage`, against the available balance minus the other
// open reservations, one reservation of a renter at a time (an advisory lock):
// concurrent requests cannot together promise more than the renter has, and a
// job submit, under the same lock, holds only what they leave free. No
// money moves then, so that transaction commits without waiting for the disk
// (a reservation lost in a crash is harmless) and takes no ledger lock, unless
// it releases the renter's expired reservations while it owes for refunded
// payments: that debt is then paid from what they held, as on any release. When
// the response is done, `chargeTokenUsage` moves the actual cost (never above
// the cap, never above the available balance) from the renter to the serving
// provider and the platform with the 75/25 split, once per request. The tokens
// billed are the upstream's usage within what the gateway forwarded and
// delivered (token-pricing.ts); what it reported beyond that is kept on the row.
//
// Sub-halala accrual. A request's exact cost is micro-halala (cost_micro on its
// row); the ledger moves whole halala. The renter is charged the whole halala
// of its carry plus the cost (within the cap and the balance) and carries the
// rest (below one halala) to its next request; the provider earns the whole
// halala of its carry plus 75 % of that charge (providerShareMicro) and carries
// the rest, and the platform gets what the provider does not. So over many
// small requests the renter pays their exact total rounded down once, and the
// provider 75 % of it, rather than 1 halala a request, all to the platform. The
// carries (v1_accruals, migration 045) are what a renter owes and a provider is
// owed below one halala: not ledger entries, so the books stay whole and balanced.
import type { Db, Sql, Tx } from "../../db/index.js";
import { apiError, paymentRequired } from "../../errors.js";
import { accountId, CHARGE_KIND, lockRenterAccounts, transfer } from "./ledger.js";
import { MICRO_PER_HALALA, providerShareMicro } from "./pricing.js";
import { monthlyHeadroom, monthlyRefusal, msUntilNextUtcMonth, quotaUsage, withReserved, type QuotaUsage } from "./quota.js";
import { freeOf, reservedMany, type Promised } from "./promised.js";
import { collectRefundDebt } from "./refund-debt.js";
import { affordableCompletionTokens, DEFAULT_MAX_COMPLETION_TOKENS, tokenCostHalala, type TokenRate } from "./token-pricing.js";

export interface ReserveInput {
  requestId: string;
  renterId: number;
  model: string;
  stream: boolean;
  rate: TokenRate;
  /** Upper bound of the prompt's tokens. */
  promptTokens: number;
  /** max_tokens the client asked for; when absent the gateway sets one the balance pays for (on a paid endpoint). */
  maxTokens?: number;
  /** n: completions per request. */
  choices: number;
  /** The reservation stops counting this long after it was made (past the gateway's time limit for the request). */
  ttlSeconds: number;
  /** Served by the renter's own serving job, which it pays for by the minute: nothing is reserved or charged. */
  free?: boolean;
}

export interface Reservation {
  reserved: number;
  /**
   * The completion-token limit the upstream is asked to respect. None on the renter's own endpoint
   * when the request names none: nothing is reserved there, so the model's own limit applies.
   */
  maxTokens?: number;
}

/**
 * 429 (a billing refusal, not to be retried before the limit frees up at the next UTC month). The
 * wait is the database's, read with the usage: its clock decides which month the spend counts in.
 */
function spendLimitReached(usage: QuotaUsage, what: string) {
  const seconds = Math.max(1, Math.ceil(msUntilNextUtcMonth(usage.dbNow) / 1000));
  return apiError(429, monthlyRefusal(usage, what), { "retry-after": String(seconds) });
}

/** Advisory-lock namespace of /v1 reservations (two-key form: the renter id is the second key). */
const RESERVE_LOCK_NS = 0x7631;

/** Reserves a request's price cap; 402 when the renter's free balance cannot pay for it. */
export async function reserveTokenBudget(tx: Tx, r: ReserveInput): Promise<Reservation> {
  await tx`SET LOCAL synchronous_commit TO off`;
  if (r.free) {
    // The row still records the request and, once settled, its tokens (at no cost).
    await tx`
      INSERT INTO v1_usage (request_id, renter_id, model, stream, reserved_halala, expires_at)
      VALUES (${r.requestId}, ${r.renterId}, ${r.model}, ${r.stream}, 0, now() + make_interval(secs => ${r.ttlSeconds}))`;
    return { reserved: 0, maxTokens: r.maxTokens };
  }
  await tx`SELECT pg_advisory_xact_lock(${RESERVE_LOCK_NS}, ${r.renterId % 2147483647}::int)`;
  const [swept] = await tx<{ owed: number }[]>`
    WITH ended AS (
      UPDATE v1_usage SET state = 'released', ended_at = now()
      WHERE renter_id = ${r.renterId} AND state = 'open' AND expires_at <= now() RETURNING 1)
    SELECT refund_owed_halala AS owed FROM renters WHERE id = ${r.renterId} AND EXISTS (SELECT 1 FROM ended)`;
  if (swept && Number(swept.owed) > 0) {
    // What the released reservations held is free: it pays a refund's debt first, as releaseTokenBudget
    // has it. Money moves, so this commit waits for the disk; the accounts are locked after the
    // reservation lock, the order submits and lockedHeadroom take them in.
    await tx`SET LOCAL synchronous_commit TO on`;
    await lockRenterAccounts(tx, [r.renterId]);
    await collectRefundDebt(tx, r.renterId);
  }
  // One statement, one snapshot: a charge committing meanwhile is seen in both figures or in neither.
  const [row] = await tx<{ balance: number | null; reserved: number; owed: number }[]>`
    SELECT (SELECT balance FROM ledger_accounts WHERE kind = 'renter_available' AND coalesce(owner_id, 0) = ${r.renterId}) AS balance,
           (SELECT coalesce(sum(reserved_halala), 0) FROM v1_usage WHERE renter_id = ${r.renterId} AND state = 'open')::bigint AS reserved,
           (SELECT refund_owed_halala FROM renters WHERE id = ${r.renterId}) AS owed`;
  const balance = row.balance ?? 0;
  const reserved = Number(row.reserved);
  const owed = Number(row.owed ?? 0);
  if (balance <= 0) throw paymentRequired("insufficient balance: your available balance is 0 halala; top up to use /v1");
  const free = freeOf(balance, { v1: reserved, owed });
  // The monthly spend limit counts what requests in flight reserved, as job submits do.
  const usage = withReserved(await quotaUsage(tx, r.renterId), reserved);
  const headroom = monthlyHeadroom(usage);
  let maxTokens = r.maxTokens;
  if (maxTokens === undefined) {
    const affordable = affordableCompletionTokens(r.rate, free, r.promptTokens, r.choices);
    if (affordable < 1) {
      throw paymentRequired(`insufficient balance: ${Math.max(free, 0)} halala free (${balance} available, ${promisedText(reserved, owed)}) does not cover this prompt`);
    }
    const withinLimit = affordableCompletionTokens(r.rate, headroom, r.promptTokens, r.choices);
    if (withinLimit < 1) throw spendLimitReached(usage, "this prompt would cost more than what is left");
    maxTokens = Math.min(DEFAULT_MAX_COMPLETION_TOKENS, affordable, withinLimit);
  }
  const cap = tokenCostHalala(r.rate, r.promptTokens, maxTokens * r.choices);
  if (cap > free) {
    throw paymentRequired(
      `insufficient balance: this request may cost up to ${cap} halala (max_tokens ${maxTokens}) but ${Math.max(free, 0)} halala is free ` +
        `(${balance} available, ${promisedText(reserved, owed)}); lower max_tokens or top up`,
    );
  }
  if (cap > headroom) throw spendLimitReached(usage, `this request may cost up to ${cap} halala (max_tokens ${maxTokens}); lower max_tokens`);
  await tx`
    INSERT INTO v1_usage (request_id, renter_id, model, stream, reserved_halala, expires_at)
    VALUES (${r.requestId}, ${r.renterId}, ${r.model}, ${r.stream}, ${cap}, now() + make_interval(secs => ${r.ttlSeconds}))`;
  return { reserved: cap, maxTokens };
}

/**
 * Takes the renters' reservation locks (reserveTokenBudget's), in the order given: a job submit
 * does, before it reads the reservations (reservedMany, a later statement) and holds funds, so that
 * no request reserves meanwhile what the job is about to hold.
 */
export function lockReservations(tx: Tx, renterIds: number[]) {
  return tx`SELECT count(pg_advisory_xact_lock(${RESERVE_LOCK_NS}, (r % 2147483647)::int)) FROM unnest(${renterIds}::bigint[]) AS r`;
}

const promisedText = (reserved: number, owed: number) =>
  `${reserved} reserved by requests in flight${owed > 0 ? `, ${owed} owed for refunded payments` : ""}`;

/**
 * What one renter's available funds are promised to, with its reservation lock taken first (as
 * reserveTokenBudget and submits take it): what anything else moving the renter's available funds
 * (a hold growing, a refund, an admin debit) must leave.
 */
export async function lockedReserved(tx: Tx, renterId: number): Promise<Promised> {
  await lockReservations(tx, [renterId]);
  return (await reservedMany(tx, [renterId])).get(renterId) ?? { v1: 0, owed: 0 };
}

/**
 * Ends an open reservation without a charge (nothing was delivered). False when already ended.
 * What it reserved is free again: a renter that owes for refunded payments pays from it first.
 */
export async function releaseTokenBudget(sql: Sql, requestId: string): Promise<boolean> {
  const [ended] = await sql<{ renter_id: number; owed: number }[]>`
    WITH ended AS (UPDATE v1_usage SET state = 'released', ended_at = now() WHERE request_id = ${requestId} AND state = 'open' RETURNING renter_id)
    SELECT ended.renter_id, r.refund_owed_halala AS owed FROM ended LEFT JOIN renters r ON r.id = ended.renter_id`;
  if (!ended) return false;
  if (Number(ended.owed) > 0) {
    const renterId = Number(ended.renter_id);
    // Its accounts first, as every other collector holds them: two collectors of one debt then read it one after the other.
    await sql.begin(async (tx) => {
      await lockRenterAccounts(tx, [renterId]);
      await collectRefundDebt(tx, renterId);
    });
  }
  return true;
}

/**
 * Releases /v1 reservations past their expires_at whose request never ended (its process died
 * between reserving and settling), as releaseTokenBudget does, debt collection included: the
 * spend checks stopped counting them then; the row and the renter's usage now say so too.
 */
export async function releaseExpiredReservations(sql: Sql, limit = 200): Promise<number> {
  const expired = await sql<{ request_id: string }[]>`
    SELECT request_id FROM v1_usage WHERE state = 'open' AND expires_at <= now() ORDER BY expires_at LIMIT ${limit}`;
  let released = 0;
  for (const r of expired) if (await releaseTokenBudget(sql, r.request_id)) released++;
  return released;
}

export interface UsageDetail {
  /** Tokens billed (within the bounds of what was forwarded and delivered). */
  promptTokens: number;
  completionTokens: number;
  /** The tokens were counted by the gateway (the upstream sent no usage). */
  estimated?: boolean;
  /** What the upstream reported, when it reported usage; beyond the billed figures it is recorded as overstated. */
  reported?: { promptTokens: number; completionTokens: number };
  /** The vllm_serve job that served the request. */
  jobId?: number;
}

export interface UsageCharge {
  /** Halala taken from the renter: the whole halala of its carry plus costMicro, within the cap and the balance. */
  charged: number;
  /** What the request cost exactly, in micro-halala (null for a request settled before it was recorded). */
  costMicro: bigint | null;
  providerEarned: number;
  platformFee: number;
  /** Whole halala due (carry included) beyond the price cap or the available balance (not charged). */
  shortfall: number;
  /** False when this request was already settled or released (nothing moved). */
  moved: boolean;
}

/** The most a request may cost: its whole halala stay a safe integer (a larger cost is refused, as before). */
const MAX_COST_MICRO = BigInt(Number.MAX_SAFE_INTEGER - 1) * BigInt(MICRO_PER_HALALA);

/**
 * Charges a request's token cost (`costMicro`, micro-halala: tokenCostMicro) once.
 * The renter's carry plus the cost gives `whole` halala and a new carry below
 * one halala; min(whole, reserved cap, available balance) moves from the renter's
 * available funds, the provider earning the whole halala of its carry plus 75 %
 * of it and the platform the rest. A repeat answers the first figures and
 * touches no carry.
 *
 * Lock order: the request's row, the renter's available funds, the renter's
 * carry, the provider's carry, the provider's earnings (its balance row, in the
 * transfer), the renters and providers rows. Only this function takes the
 * carries, always after the renter's funds, so two charges of one renter take
 * them one after the other, and a provider's carry like its earnings account.
 */
export async function chargeTokenUsage(
  tx: Tx,
  renterId: number,
  providerId: number,
  requestId: string,
  costMicro: bigint,
  usage: UsageDetail = { promptTokens: 0, completionTokens: 0 },
): Promise<UsageCharge> {
  if (typeof costMicro !== "bigint" || costMicro < 0n || costMicro > MAX_COST_MICRO) throw new Error(`invalid cost ${costMicro} micro-halala`);
  const r = usage.reported;
  // Reported beyond what is billed: recorded against the provider (its reliability counts such requests).
  const overstated = r ? Math.max(0, r.promptTokens - usage.promptTokens) + Math.max(0, r.completionTokens - usage.completionTokens) : 0;
  // The request's row first (once-only), the accounts next, the renter's balance lock as late as possible.
  const [open] = await tx<{ reserved_halala: number }[]>`
    UPDATE v1_usage
    SET state = 'settled', ended_at = now(), provider_id = ${providerId}, job_id = ${usage.jobId ?? null},
        prompt_tokens = ${usage.promptTokens}, completion_tokens = ${usage.completionTokens}, usage_estimated = ${usage.estimated ?? false},
        reported_prompt_tokens = ${r?.promptTokens ?? null}, reported_completion_tokens = ${r?.completionTokens ?? null},
        overstated_tokens = ${overstated}
    WHERE request_id = ${requestId} AND renter_id = ${renterId} AND state = 'open'
    RETURNING reserved_halala`;
  if (!open) {
    const [prior] = await tx<
      { cost_halala: number; cost_micro: string | null; provider_earned_halala: number; platform_fee_halala: number; shortfall_halala: number }[]
    >`SELECT cost_halala, cost_micro::text, provider_earned_halala, platform_fee_halala, shortfall_halala FROM v1_usage WHERE request_id = ${requestId}`;
    if (!prior) throw new Error(`no reservation for request ${requestId}`);
    return {
      charged: prior.cost_halala,
      costMicro: prior.cost_micro === null ? null : BigInt(prior.cost_micro),
      providerEarned: prior.provider_earned_halala,
      platformFee: prior.platform_fee_halala,
      shortfall: prior.shortfall_halala,
      moved: false,
    };
  }
  const [availableId, earningsId, feesId] = await Promise.all([
    accountId(tx, "renter_available", renterId),
    accountId(tx, "provider_earnings", providerId),
    accountId(tx, "platform_fees"),
  ]);
  // Sent together, run in order: the renter's funds locked, then its carry.
  const [[{ balance }], [renterCarry]] = await Promise.all([
    tx<{ balance: number }[]>`SELECT balance FROM ledger_accounts WHERE id = ${availableId} FOR NO KEY UPDATE`,
    tx<{ whole: number }[]>`SELECT whole FROM v1_accrue('renter', ${renterId}, ${costMicro.toString()}::numeric)`,
  ]);
  // The whole halala due, capped by the reservation (which bounds it for tokens within the cap:
  // tokenCostHalala) and the balance; the carry keeps what is below one halala either way.
  const due = renterCarry.whole;
  const charged = Math.min(due, open.reserved_halala, balance);
  // Most requests at list rates cost well under a halala: nothing moves, the provider's carry is left alone.
  let providerEarned = 0;
  if (charged > 0) {
    const [p] = await tx<{ whole: number }[]>`SELECT whole FROM v1_accrue('provider', ${providerId}, ${providerShareMicro(charged).toString()}::numeric)`;
    providerEarned = p.whole; // < 75 % of charged + 1, so at most charged
  }
  const platformFee = charged - providerEarned;
  const memo = `v1 ${requestId}`;
  // The platform's account keeps no balance row (no lock); the provider's does, and every request to
  // its endpoint moves it, so it is taken last and held only until the commit.
  await transfer(tx, { from: availableId, to: feesId, amount: platformFee, kind: CHARGE_KIND.v1Platform, key: `v1:${requestId}:platform`, memo });
  await transfer(tx, { from: availableId, to: earningsId, amount: providerEarned, kind: CHARGE_KIND.v1Provider, key: `v1:${requestId}:provider`, memo });
  const shortfall = due - charged;
  // Independent rows: sent together (postgres.js pipelines them on the transaction's connection).
  const [, [{ owed }]] = await Promise.all([
    tx`UPDATE v1_usage SET cost_halala = ${charged}, cost_micro = ${costMicro.toString()}::numeric, shortfall_halala = ${shortfall},
         provider_earned_halala = ${providerEarned}, platform_fee_halala = ${platformFee}
       WHERE request_id = ${requestId}`,
    tx<{ owed: number }[]>`UPDATE renters SET total_spent_halala = total_spent_halala + ${charged} WHERE id = ${renterId} RETURNING refund_owed_halala AS owed`,
    // An overstatement makes the provider's reliability due now (its next heartbeat recomputes it).
    overstated > 0
      ? tx`UPDATE providers SET total_earnings_halala = total_earnings_halala + ${providerEarned}, reputation_at = NULL WHERE id = ${providerId}`
      : tx`UPDATE providers SET total_earnings_halala = total_earnings_halala + ${providerEarned} WHERE id = ${providerId}`,
  ]);
  // What the request reserved and did not cost is free again: a refund's debt is paid from it first.
  if (Number(owed) > 0) await collectRefundDebt(tx, renterId);
  return { charged, costMicro, providerEarned, platformFee, shortfall, moved: true };
}

export interface UsageTotals {
  requests: number;
  promptTokens: number;
  completionTokens: number;
  /** What was charged, in whole halala. */
  costHalala: number;
  inFlight: number;
  reservedHalala: number;
  /** What the renter's requests cost beyond what was charged, below one halala (its carry): charged once it reaches one. */
  accruedMicro: number;
}

export interface ModelUsage extends Omit<UsageTotals, "inFlight" | "reservedHalala" | "accruedMicro"> {
  model: string;
}

/** A renter's running /v1 totals (settled requests), overall and by model, plus what is in flight. */
export async function usageTotals(db: Db, renterId: number): Promise<{ total: UsageTotals; byModel: ModelUsage[] }> {
  const rows = await db<{ model: string; requests: number; prompt: number; completion: number; cost: number }[]>`
    SELECT model, count(*)::bigint AS requests, sum(prompt_tokens)::bigint AS prompt,
           sum(completion_tokens)::bigint AS completion, sum(cost_halala)::bigint AS cost
    FROM v1_usage WHERE renter_id = ${renterId} AND state = 'settled'
    GROUP BY model ORDER BY model`;
  const [open] = await db<{ n: number; reserved: number; accrued: number }[]>`
    SELECT count(*)::bigint AS n, coalesce(sum(reserved_halala), 0)::bigint AS reserved,
           coalesce((SELECT micro FROM v1_accruals WHERE owner_kind = 'renter' AND owner_id = ${renterId}), 0)::bigint AS accrued
    FROM v1_usage WHERE renter_id = ${renterId} AND state = 'open' AND expires_at > now()`;
  const byModel = rows.map((r) => ({
    model: r.model,
    requests: Number(r.requests),
    promptTokens: Number(r.prompt),
    completionTokens: Number(r.completion),
    costHalala: Number(r.cost),
  }));
  const sum = (f: (m: ModelUsage) => number) => byModel.reduce((a, m) => a + f(m), 0);
  return {
    total: {
      requests: sum((m) => m.requests),
      promptTokens: sum((m) => m.promptTokens),
      completionTokens: sum((m) => m.completionTokens),
      costHalala: sum((m) => m.costHalala),
      inFlight: Number(open.n),
      reservedHalala: Number(open.reserved),
      accruedMicro: Number(open.accrued),
    },
    byModel,
  };
}
