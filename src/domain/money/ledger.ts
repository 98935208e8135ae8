// Area money (src/domain/money): the ledger, prices, holds and settlement,
// payments, quotas, idempotency and /v1 usage billing. It may use shared and
// notify; every movement of money in the service goes through this area.
//
// The double-entry ledger. Money moves only as balanced transfers between
// accounts, each written in the caller's transaction together with the state
// change that causes it, and each at most once (idempotency key).
//
// Balances:
// - Renter (available, held) and provider-earnings accounts keep a balance
//   column, changed only here and only together with a transfer row. The
//   debited row is locked and checked before it moves, and a CHECK
//   (balance >= 0) backs that up: an overdraft is impossible, also under
//   concurrency.
// - The system accounts (gateway, platform fees, adjustments) are touched by
//   every top-up or settlement of every renter. Updating one row for all of
//   them would serialise the whole platform on that row's lock, so their
//   balance is derived from the transfers instead (accountBalance).
//
// Jobs: hold() opens a ledger_holds row with the estimate; settle() and
// release() close it with one conditional UPDATE, so whichever of a result, a
// failure, a cancel or a timeout comes first wins and the others move nothing.
import { allInTransaction, type Db, type Tx } from "../../db/index.js";
import { apiError } from "../../errors.js";
import { splitRevenue } from "./pricing.js";
import { reportLedgerMoves } from "../shared/observe.js";

export type AccountKind = "renter_available" | "renter_held" | "provider_earnings" | "platform_fees" | "gateway" | "adjustments";

/**
 * Kinds of the transfers that charge a renter for compute, the one place for
 * the rule "what is revenue": a job's settlement (settle() below) and a /v1
 * request's per-token charge (chargeTokenUsage in usage-billing.ts). Each
 * charge is two legs, the provider's share and the platform's fee.
 */
export const CHARGE_KIND = {
  jobProvider: "charge_provider",
  jobPlatform: "charge_platform",
  v1Provider: "v1_charge_provider",
  v1Platform: "v1_charge_platform",
} as const;
/** Every leg of every charge: what renters paid (dashboard revenue, quota spend). */
export const CHARGE_KINDS: readonly string[] = Object.values(CHARGE_KIND);
/** The platform's legs: its fees from jobs and from /v1. */
export const PLATFORM_FEE_KINDS: readonly string[] = [CHARGE_KIND.jobPlatform, CHARGE_KIND.v1Platform];

/** A list of kinds as SQL text (these constants), for statements whose every plan must know them (an index range per kind). */
const kindListSql = (kinds: readonly string[]) => kinds.map((k) => `'${k.replace(/'/g, "''")}'`).join(", ");
/** CHARGE_KINDS as SQL text: what renters paid (the dashboard's and the daily figures' revenue). */
export const CHARGE_KINDS_SQL = kindListSql(CHARGE_KINDS);
/** PLATFORM_FEE_KINDS as SQL text: the platform's fees. */
export const PLATFORM_FEE_KINDS_SQL = kindListSql(PLATFORM_FEE_KINDS);

/** Accounts whose balance column is kept (and checked >= 0). */
const MATERIALIZED: readonly AccountKind[] = ["renter_available", "renter_held", "provider_earnings"];
const SYSTEM: readonly AccountKind[] = ["platform_fees", "gateway", "adjustments"];
/** MATERIALIZED as a PostgreSQL array literal, passed to the SQL ledger functions. */
const MATERIALIZED_SQL = `{${MATERIALIZED.join(",")}}`;

/** The account of a kind and owner, created when missing (SQL ledger_account, migration 009). */
export async function accountId(db: Db, kind: AccountKind, ownerId: number | null = null): Promise<number> {
  const [row] = await db<{ id: number }[]>`SELECT ledger_account(${kind}, ${ownerId}::bigint) AS id`;
  return row.id;
}

/** A renter's two accounts in one round trip (created when missing). */
async function renterAccounts(db: Db, renterId: number): Promise<{ available: number; held: number }> {
  const [row] = await db<{ available: number; held: number }[]>`
    SELECT ledger_account('renter_available', ${renterId}::bigint) AS available, ledger_account('renter_held', ${renterId}::bigint) AS held`;
  return row;
}

const insufficient = (balance: number, amount: number) => apiError(402, `insufficient balance: ${balance} halala available, ${amount} needed`);

export interface Transfer {
  from: number;
  to: number;
  amount: number;
  kind: string;
  /** Unique per movement, e.g. `hold:job:42`; a repeat is a no-op. */
  key: string;
  jobId?: number;
  paymentId?: string;
  memo?: string;
}

/**
 * Moves money once. Returns false when this key already moved (idempotent
 * repeat). Throws 402 when the debited account lacks the funds; the
 * transaction stays usable then (nothing was written).
 */
export async function transfer(tx: Tx, t: Transfer): Promise<boolean> {
  if (!Number.isSafeInteger(t.amount) || t.amount < 0) throw new Error(`invalid transfer amount ${t.amount}`);
  if (t.from === t.to) throw new Error("transfer between the same account");
  if (t.amount === 0) return true;
  // One round trip (SQL ledger_transfer, migration 009): the key row first (a concurrent
  // transfer with the same key waits on it and then does nothing), then the kept balances
  // locked in id order and the debit checked; a short debit writes nothing.
  const [r] = await tx<{ moved: boolean; short_balance: number | null }[]>`
    SELECT * FROM ledger_transfer(${t.from}::bigint, ${t.to}::bigint, ${t.amount}::bigint, ${t.kind}, ${t.key},
                                  ${t.jobId ?? null}::bigint, ${t.paymentId ?? null}, ${t.memo ?? null}, ${MATERIALIZED_SQL}::text[])`;
  if (r.short_balance !== null) throw insufficient(r.short_balance, t.amount);
  if (r.moved) reportLedgerMoves(tx, [{ kind: t.kind, amount: t.amount }]);
  return r.moved;
}

export async function openRenterAccounts(tx: Db, renterId: number): Promise<void> {
  await tx`
    INSERT INTO ledger_accounts (kind, owner_id) VALUES ('renter_available', ${renterId}), ('renter_held', ${renterId})
    ON CONFLICT DO NOTHING`;
}

export interface RenterFunds {
  available: number;
  held: number;
  /** balance_halala: available plus held. */
  balance: number;
}

export async function renterFunds(db: Db, renterId: number): Promise<RenterFunds> {
  return (await renterFundsOf(db, [renterId])).get(renterId)!;
}

/** renterFunds of several renters in one read (a page of them). */
export async function renterFundsOf(db: Db, renterIds: number[]): Promise<Map<number, RenterFunds>> {
  const rows = await db<{ owner_id: number; kind: AccountKind; balance: number }[]>`
    SELECT owner_id, kind, balance FROM ledger_accounts
    WHERE owner_id = ANY(${renterIds}::bigint[]) AND kind IN ('renter_available', 'renter_held')`;
  const funds = new Map(renterIds.map((id) => [id, { available: 0, held: 0, balance: 0 }]));
  for (const r of rows) {
    const f = funds.get(Number(r.owner_id))!;
    if (r.kind === "renter_available") f.available = r.balance;
    else f.held = r.balance;
    f.balance = f.available + f.held;
  }
  return funds;
}

/** Balance of any account: the kept column, or for system accounts the sum of their transfers. */
export async function accountBalance(db: Db, id: number): Promise<number> {
  const [row] = await db<{ balance: number }[]>`
    SELECT CASE WHEN a.kind IN ${db(MATERIALIZED)} THEN a.balance ELSE
             coalesce((SELECT sum(amount) FROM ledger_transfers WHERE credit_account_id = a.id), 0)
           - coalesce((SELECT sum(amount) FROM ledger_transfers WHERE debit_account_id = a.id), 0) END AS balance
    FROM ledger_accounts a WHERE a.id = ${id}`;
  return Number(row?.balance ?? 0);
}

/** Credits a renter from outside money (card payment, sandbox, non-production topup). */
export async function credit(tx: Tx, renterId: number, amount: number, key: string, kind = "topup", paymentId?: string): Promise<boolean> {
  return transfer(tx, {
    from: await accountId(tx, "gateway"),
    to: (await renterAccounts(tx, renterId)).available,
    amount,
    kind,
    key,
    paymentId,
  });
}

/** Reverses a credit (gateway refund); fails with 402 when the funds are already spent or held. */
export async function debit(tx: Tx, renterId: number, amount: number, key: string, kind = "refund", paymentId?: string): Promise<boolean> {
  return transfer(tx, {
    from: (await renterAccounts(tx, renterId)).available,
    to: await accountId(tx, "gateway"),
    amount,
    kind,
    key,
    paymentId,
  });
}

/**
 * Takes back up to `amount` from the renter's available funds (a refund of
 * money that may already be spent), leaving at least `keep` of them (what is
 * promised elsewhere): never overdraws, and reports how much it took.
 * Repeats of the same key take nothing and report 0.
 */
export async function debitUpTo(
  tx: Tx,
  renterId: number,
  amount: number,
  key: string,
  kind = "refund",
  paymentId?: string,
  keep = 0,
): Promise<{ debited: number; shortfall: number; moved: boolean }> {
  const { available } = await renterAccounts(tx, renterId);
  const [acct] = await tx<{ balance: number }[]>`SELECT balance FROM ledger_accounts WHERE id = ${available} FOR NO KEY UPDATE`;
  const take = Math.min(amount, Math.max(0, acct.balance - keep));
  if (take === 0) {
    const [prior] = await tx`SELECT 1 FROM ledger_transfers WHERE idempotency_key = ${key}`;
    return prior ? { debited: 0, shortfall: 0, moved: false } : { debited: 0, shortfall: amount, moved: true };
  }
  const moved = await transfer(tx, { from: available, to: await accountId(tx, "gateway"), amount: take, kind, key, paymentId });
  return moved ? { debited: take, shortfall: amount - take, moved } : { debited: 0, shortfall: 0, moved };
}

/** Admin adjustment: positive credits, negative debits (never below available). */
export async function adjust(tx: Tx, renterId: number, amount: number, key: string, memo: string): Promise<boolean> {
  const renter = (await renterAccounts(tx, renterId)).available;
  const adj = await accountId(tx, "adjustments");
  return amount >= 0
    ? transfer(tx, { from: adj, to: renter, amount, kind: "adjustment", key, memo })
    : transfer(tx, { from: renter, to: adj, amount: -amount, kind: "adjustment", key, memo });
}

export interface HoldRequest {
  renterId: number;
  jobId: number;
  amount: number;
}

export type HoldOutcome =
  | { jobId: number; opened: true }
  /** The job already had a hold (a repeat): nothing moved. */
  | { jobId: number; opened: false }
  /** Available funds were short (`available` left for it): nothing was written for this job. */
  | { jobId: number; opened: false; shortBalance: number };

/**
 * Holds jobs' estimates: for each, available -> held and the job's hold
 * opened, for any number of jobs in three statements (the submit batch holds
 * all of its jobs at once). The renters' two accounts are locked in id order
 * and read (the truth from then on: nobody else can move them), then each
 * renter's requests are judged in the order given against what is available,
 * then what passed is written in one statement. A short request or a repeat
 * (the job already has a hold) writes nothing, and the transaction stays usable.
 */
export async function holdMany(tx: Tx, requests: HoldRequest[]): Promise<HoldOutcome[]> {
  if (requests.length === 0) return [];
  const jobIds = requests.map((r) => r.jobId);
  if (new Set(jobIds).size !== requests.length) throw new Error("holdMany: a job appears twice");
  const renterIds = [...new Set(requests.map((r) => r.renterId))].sort((a, b) => a - b);
  const [accounts, existing] = await allInTransaction([
    lockRenterAccounts(tx, renterIds),
    tx<{ job_id: number }[]>`SELECT job_id FROM ledger_holds WHERE job_id = ANY(${jobIds}::bigint[])`,
  ]);
  const repeats = new Set(existing.map((e) => e.job_id));
  const outcomes: HoldOutcome[] = [];
  const accepted: AcceptedHold[] = [];
  for (const r of requests) {
    const acct = accounts.get(r.renterId)!;
    if (repeats.has(r.jobId)) outcomes.push({ jobId: r.jobId, opened: false });
    else if (acct.available < r.amount) outcomes.push({ jobId: r.jobId, opened: false, shortBalance: acct.available });
    else {
      accepted.push(takeHold(acct, r));
      outcomes.push({ jobId: r.jobId, opened: true });
    }
  }
  await writeHolds(tx, accepted);
  return outcomes;
}

/** A hold judged affordable against locked accounts (takeHold), ready for writeHolds. */
export interface AcceptedHold extends HoldRequest {
  from: number;
  to: number;
}

/** Takes a hold's amount out of a renter's locked, read accounts (the caller checked it is available). */
export function takeHold(acct: RenterAccounts, r: HoldRequest): AcceptedHold {
  if (!Number.isSafeInteger(r.amount) || r.amount <= 0) throw new Error(`invalid hold amount ${r.amount}`);
  if (acct.available < r.amount) throw new Error(`hold of job ${r.jobId}: ${r.amount} asked, ${acct.available} available`);
  acct.available -= r.amount;
  acct.held += r.amount;
  return { ...r, from: acct.availableId, to: acct.heldId };
}

/**
 * Writes judged holds in one statement: the holds opened, one transfer each
 * (available -> held), the two balances of each renter moved once. The
 * accounts must be locked by this transaction (lockRenterAccounts), and the
 * jobs must have no hold yet.
 */
export async function writeHolds(tx: Tx, accepted: AcceptedHold[]): Promise<void> {
  if (accepted.length === 0) return;
  const col = <T>(f: (a: AcceptedHold) => T) => accepted.map(f);
  await tx`
    WITH h AS (
      SELECT * FROM unnest(${col((a) => a.jobId)}::bigint[], ${col((a) => a.renterId)}::bigint[], ${col((a) => a.amount)}::bigint[],
                           ${col((a) => a.from)}::bigint[], ${col((a) => a.to)}::bigint[]) WITH ORDINALITY AS x(job_id, renter_id, amount, from_id, to_id, ord)
    ), opened AS (
      INSERT INTO ledger_holds (job_id, renter_id, amount) SELECT job_id, renter_id, amount FROM h ORDER BY ord
    ), moved AS (
      INSERT INTO ledger_transfers (debit_account_id, credit_account_id, amount, kind, idempotency_key, job_id)
      SELECT from_id, to_id, amount, 'hold', 'hold:job:' || job_id, job_id FROM h ORDER BY ord
    )
    UPDATE ledger_accounts a SET balance = a.balance + d.delta
    FROM (SELECT id, sum(delta)::bigint AS delta FROM (
            SELECT from_id AS id, -amount AS delta FROM h UNION ALL SELECT to_id, amount FROM h) m GROUP BY id) d
    WHERE a.id = d.id`;
  reportLedgerMoves(tx, [{ kind: "hold", amount: accepted.reduce((n, a) => n + a.amount, 0) }]);
}

export interface RenterAccounts {
  availableId: number;
  heldId: number;
  available: number;
  held: number;
}

/**
 * Locks renters' available and held accounts (NO KEY UPDATE, in id order, the
 * ledger's lock order) and reads them, by renter. From then on they are the
 * truth: nobody else can move them until the transaction ends. Accounts are
 * opened at registration; a renter from before that gets them here.
 */
export async function lockRenterAccounts(tx: Tx, renterIds: number[]): Promise<Map<number, RenterAccounts>> {
  const read = async () => {
    const rows = await tx<{ id: number; owner_id: number; kind: AccountKind; balance: number }[]>`
      SELECT id, owner_id, kind, balance FROM ledger_accounts
      WHERE owner_id = ANY(${renterIds}::bigint[]) AND kind IN ('renter_available', 'renter_held')
      ORDER BY id FOR NO KEY UPDATE`;
    const out = new Map<number, RenterAccounts>();
    for (const r of rows) {
      const a = out.get(r.owner_id) ?? { availableId: 0, heldId: 0, available: 0, held: 0 };
      if (r.kind === "renter_available") Object.assign(a, { availableId: r.id, available: r.balance });
      else Object.assign(a, { heldId: r.id, held: r.balance });
      out.set(r.owner_id, a);
    }
    return out;
  };
  const accounts = await read();
  const missing = renterIds.filter((id) => !accounts.get(id)?.availableId || !accounts.get(id)?.heldId);
  if (missing.length === 0) return accounts;
  for (const id of missing) await openRenterAccounts(tx, id);
  return read();
}

/**
 * Holds one job's estimate (holdMany for one). 402 when available funds are
 * short (then nothing is written and the transaction stays usable). Returns
 * false when the job already has a hold.
 */
export async function hold(tx: Tx, renterId: number, jobId: number, amount: number): Promise<boolean> {
  const [r] = await holdMany(tx, [{ renterId, jobId, amount }]);
  if ("shortBalance" in r) throw insufficient(r.shortBalance, amount);
  return r.opened;
}

interface HoldRow {
  renter_id: number;
  amount: number;
  status: "open" | "settled" | "released";
  cost: number | null;
  provider_earned: number | null;
  platform_fee: number | null;
}

/**
 * Releases a job's whole hold back to available (failure, cancel, timeout).
 * Returns false when there is no open hold (already settled or released, or
 * never held). `amount`, when given, must equal the held amount.
 */
export async function release(tx: Tx, renterId: number, jobId: number, amount?: number): Promise<boolean> {
  const [h] = await tx<HoldRow[]>`
    UPDATE ledger_holds SET status = 'released', closed_at = now()
    WHERE job_id = ${jobId} AND status = 'open' RETURNING renter_id, amount`;
  if (!h) return false;
  if (h.renter_id !== renterId) throw new Error(`hold of job ${jobId} belongs to renter ${h.renter_id}, not ${renterId}`);
  if (amount !== undefined && amount !== h.amount) throw new Error(`release of job ${jobId}: ${amount} given, ${h.amount} held`);
  const acct = await renterAccounts(tx, renterId);
  await transfer(tx, { from: acct.held, to: acct.available, amount: h.amount, kind: "release", key: `release:job:${jobId}`, jobId });
  return true;
}

export interface Settlement {
  cost: number;
  providerEarned: number;
  platformFee: number;
  /** False when this job's hold was already closed (nothing moved). */
  moved: boolean;
  /** How the hold ended: settled (now or before) or released before (then the figures are 0). */
  state: "settled" | "released";
  /** What the renter owes for refunded payments (refund-debt.ts), read as it settled; 0 when nothing moved. */
  owed: number;
}

/**
 * Settles a job: from the hold, `cost` is paid (75% provider, 25% platform)
 * and the rest of the estimate goes back to available. Once per job: a repeat
 * answers the first settlement's figures and moves nothing; after a release
 * it moves nothing and says so.
 */
/**
 * Settles a job's open hold: `cost` goes 75/25 to the provider and the
 * platform, the rest of the hold back to available. `held` must be the hold's
 * amount (the estimate, plus what was added while the job ran).
 */
export async function settle(tx: Tx, renterId: number, providerId: number, jobId: number, held: number, cost: number): Promise<Settlement> {
  if (!Number.isSafeInteger(cost) || cost < 0) throw new Error(`invalid cost ${cost}`);
  if (cost > held) throw new Error(`cost ${cost} above the ${held} held`);
  const { providerEarned, platformFee } = splitRevenue(cost);
  const [h] = await tx<HoldRow[]>`
    UPDATE ledger_holds
    SET status = 'settled', closed_at = now(), provider_id = ${providerId},
        cost = ${cost}, provider_earned = ${providerEarned}, platform_fee = ${platformFee}
    WHERE job_id = ${jobId} AND status = 'open' AND amount >= ${cost}
    RETURNING renter_id, amount`;
  if (!h) {
    const [prior] = await tx<HoldRow[]>`SELECT * FROM ledger_holds WHERE job_id = ${jobId}`;
    if (!prior) throw new Error(`job ${jobId} has no hold to settle`);
    if (prior.status === "open") throw new Error(`cost ${cost} above the ${prior.amount} held for job ${jobId}`);
    if (prior.status === "released") return { cost: 0, providerEarned: 0, platformFee: 0, moved: false, state: "released", owed: 0 };
    return { cost: prior.cost!, providerEarned: prior.provider_earned!, platformFee: prior.platform_fee!, moved: false, state: "settled", owed: 0 };
  }
  if (h.renter_id !== renterId) throw new Error(`hold of job ${jobId} belongs to renter ${h.renter_id}, not ${renterId}`);
  if (h.amount !== held) throw new Error(`settle of job ${jobId}: ${held} given as held, ${h.amount} held`);
  const acct = await renterAccounts(tx, renterId);
  const earnings = await accountId(tx, "provider_earnings", providerId);
  // Three legs touch three kept balances: lock them all first, in id order, or a
  // concurrent hold (available, then held) and this settle (held, then available) deadlock.
  await tx`SELECT id FROM ledger_accounts WHERE id IN (${acct.held}, ${acct.available}, ${earnings}) ORDER BY id FOR NO KEY UPDATE`;
  const legs: Omit<Transfer, "from" | "jobId">[] = [
    { to: earnings, amount: providerEarned, kind: CHARGE_KIND.jobProvider, key: `settle:job:${jobId}:provider` },
    { to: await accountId(tx, "platform_fees"), amount: platformFee, kind: CHARGE_KIND.jobPlatform, key: `settle:job:${jobId}:platform` },
    { to: acct.available, amount: h.amount - cost, kind: "release", key: `settle:job:${jobId}:remainder` },
  ];
  for (const leg of legs) await transfer(tx, { ...leg, from: acct.held, jobId });
  const [r] = await tx<{ owed: number }[]>`
    UPDATE renters SET total_spent_halala = total_spent_halala + ${cost} WHERE id = ${renterId} RETURNING refund_owed_halala AS owed`;
  await tx`UPDATE providers SET total_earnings_halala = total_earnings_halala + ${providerEarned}, total_jobs = total_jobs + 1 WHERE id = ${providerId}`;
  return { cost, providerEarned, platformFee, moved: true, state: "settled", owed: Number(r?.owed ?? 0) };
}

/** The open hold of a job, if any (amount held). */
/**
 * Adds `amount` from the renter's available balance to a running job's open
 * hold (the caller holds the job row and the renter's accounts, in that
 * order). `heldAfter` (the hold's new total, which only grows) keys the
 * transfer. Returns false when the hold is no longer open.
 */
export async function extendHold(tx: Tx, renterId: number, jobId: number, amount: number, heldAfter: number): Promise<boolean> {
  if (!Number.isSafeInteger(amount) || amount <= 0) throw new Error(`invalid hold extension ${amount}`);
  const [h] = await tx<{ renter_id: number; amount: number }[]>`
    UPDATE ledger_holds SET amount = amount + ${amount} WHERE job_id = ${jobId} AND status = 'open' RETURNING renter_id, amount`;
  if (!h) return false;
  if (h.renter_id !== renterId) throw new Error(`hold of job ${jobId} belongs to renter ${h.renter_id}, not ${renterId}`);
  if (h.amount !== heldAfter) throw new Error(`hold of job ${jobId} is ${h.amount} after extending, ${heldAfter} expected`);
  const acct = await renterAccounts(tx, renterId);
  const moved = await transfer(tx, { from: acct.available, to: acct.held, amount, kind: "hold", key: `hold:job:${jobId}:to:${heldAfter}`, jobId });
  if (!moved) throw new Error(`hold extension of job ${jobId} to ${heldAfter} was already written`);
  return true;
}

export async function openHold(db: Db, jobId: number): Promise<number | undefined> {
  const [h] = await db<{ amount: number }[]>`SELECT amount FROM ledger_holds WHERE job_id = ${jobId} AND status = 'open'`;
  return h?.amount;
}

/**
 * Checks the books and returns every broken rule (empty when sound):
 * kept balances equal their transfers, no kept balance is negative, all
 * balances sum to zero, each renter's held balance equals their open holds,
 * and each settled hold's charges equal its recorded cost.
 */
export async function ledgerProblems(db: Db): Promise<string[]> {
  const problems: string[] = [];
  const accounts = await db<{ id: number; kind: AccountKind; owner_id: number | null; balance: number; derived: number }[]>`
    SELECT a.id, a.kind, a.owner_id, a.balance,
           coalesce(c.total, 0) - coalesce(d.total, 0) AS derived
    FROM ledger_accounts a
    LEFT JOIN (SELECT credit_account_id AS id, sum(amount)::bigint AS total FROM ledger_transfers GROUP BY 1) c ON c.id = a.id
    LEFT JOIN (SELECT debit_account_id AS id, sum(amount)::bigint AS total FROM ledger_transfers GROUP BY 1) d ON d.id = a.id`;
  let sum = 0;
  for (const a of accounts) {
    const derived = Number(a.derived);
    sum += derived;
    if (MATERIALIZED.includes(a.kind)) {
      if (a.balance !== derived) problems.push(`account ${a.id} (${a.kind} ${a.owner_id}): balance ${a.balance} but transfers give ${derived}`);
      if (a.balance < 0) problems.push(`account ${a.id} (${a.kind} ${a.owner_id}) is negative: ${a.balance}`);
    } else if (!SYSTEM.includes(a.kind)) {
      problems.push(`account ${a.id} has unknown kind ${a.kind}`);
    }
  }
  if (sum !== 0) problems.push(`balances sum to ${sum}, not 0`);
  const held = await db<{ owner_id: number; balance: number; open: number }[]>`
    SELECT a.owner_id, a.balance, coalesce((SELECT sum(amount) FROM ledger_holds h WHERE h.renter_id = a.owner_id AND h.status = 'open'), 0)::bigint AS open
    FROM ledger_accounts a WHERE a.kind = 'renter_held'`;
  for (const h of held) {
    if (h.balance !== Number(h.open)) problems.push(`renter ${h.owner_id}: held ${h.balance} but open holds sum to ${h.open}`);
  }
  const charges = await db<{ job_id: number; cost: number | null; status: string; charged: number; released: number; amount: number }[]>`
    SELECT h.job_id, h.cost, h.status, h.amount,
           coalesce(sum(t.amount) FILTER (WHERE t.kind IN ('charge_provider', 'charge_platform')), 0)::bigint AS charged,
           coalesce(sum(t.amount) FILTER (WHERE t.kind = 'release'), 0)::bigint AS released
    FROM ledger_holds h LEFT JOIN ledger_transfers t ON t.job_id = h.job_id
    GROUP BY h.job_id, h.cost, h.status, h.amount`;
  for (const c of charges) {
    const charged = Number(c.charged);
    const released = Number(c.released);
    const expectCharged = c.status === "settled" ? c.cost! : 0;
    const expectReleased = c.status === "open" ? 0 : c.amount - expectCharged;
    if (charged !== expectCharged) problems.push(`job ${c.job_id} (${c.status}): charged ${charged}, expected ${expectCharged}`);
    if (released !== expectReleased) problems.push(`job ${c.job_id} (${c.status}): released ${released}, expected ${expectReleased}`);
  }
  return problems;
}
