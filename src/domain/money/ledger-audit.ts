// The ledger audit: recomputes every account's balance from its entries and
// checks the books against the rules the ledger keeps (ledger.ts):
// - each kept balance (renter available and held, provider earnings) equals
//   its credits minus its debits, and none is negative;
// - the books sum to zero (kept balances plus the system accounts' derived ones);
// - each renter's held balance equals the open holds of its jobs, and no hold
//   stays open on a job that has ended;
// - each job's hold (grown by extensions) equals what its hold entries moved;
// - each charged job (completed, or ended by the renter's fault after it ran)
//   has exactly one settlement: its hold settled, charged exactly the
//   recorded cost, the rest released, and the job row agrees; a hold released
//   charged nothing.
//
// All of it reads one snapshot (REPEATABLE READ, read only), so transfers
// committed meanwhile never show as drift. The transfers are read in one
// aggregate pass by (debit, credit) account pair and the job checks return
// only the rows that disagree, so the cost is a scan of the ledger, not a
// row per entry sent to the process.
//
// Drift is the halala by which the books are off: the sum of the absolute
// differences found (kept vs derived balances, held vs open holds, charged
// and released vs what each hold's state says).
import type { Db, Sql, Tx } from "../../db/index.js";

export type DiscrepancyKind =
  | "balance_mismatch"
  | "negative_balance"
  | "unknown_account_kind"
  | "books_unbalanced"
  | "held_mismatch"
  | "hold_open_on_ended_job"
  | "settlement_mismatch"
  | "charged_without_settlement"
  | "settlement_disagrees_with_job";

export interface Discrepancy {
  kind: DiscrepancyKind;
  /** What it is about: "account 12 (renter_available of renter 3)", "renter 3", "job 41 (job-…)". */
  subject: string;
  expectedHalala: number;
  actualHalala: number;
  message: string;
}

export interface LedgerAuditReport {
  startedAt: Date;
  finishedAt: Date;
  ms: number;
  accounts: number;
  entries: number;
  holds: number;
  openHolds: number;
  settledJobs: number;
  /** Kept balances plus derived system balances: 0 when sound. */
  booksSumHalala: number;
  driftHalala: number;
  discrepancyCount: number;
  /** The first MAX_LISTED discrepancies (discrepancyCount has them all). */
  discrepancies: Discrepancy[];
}

/** What /metrics shows of the last audit (any process's). */
export interface LedgerAuditSummary {
  finishedAt: Date;
  ms: number;
  driftHalala: number;
  discrepancies: number;
}

/** Discrepancies listed in an answer; the count covers every one. */
export const MAX_LISTED = 200;

const MATERIALIZED = new Set(["renter_available", "renter_held", "provider_earnings"]);
const SYSTEM = new Set(["platform_fees", "gateway", "adjustments"]);
const JOB_CHARGE_KINDS = ["charge_provider", "charge_platform"];
/** Advisory lock id electing the process that runs the periodic audit (migrate.ts uses 0x5ec_0001). */
const AUDIT_LOCK_ID = 0x5ec_0020;

function accountName(a: { id: number; kind: string; owner_id: number | null }): string {
  if (a.owner_id === null) return `account ${a.id} (${a.kind})`;
  const owner = a.kind === "provider_earnings" ? "provider" : "renter";
  return `account ${a.id} (${a.kind} of ${owner} ${a.owner_id})`;
}

/** Runs the checks on one snapshot. */
export async function auditLedger(sql: Sql): Promise<LedgerAuditReport> {
  const startedAt = new Date();
  const started = performance.now();
  const found: Discrepancy[] = [];
  let drift = 0;
  const add = (d: Discrepancy, counts = true) => {
    found.push(d);
    if (counts) drift += Math.abs(d.expectedHalala - d.actualHalala);
  };

  const figures = await sql.begin("isolation level repeatable read read only", async (tx: Tx) => {
    const [accounts, pairs, held, jobs, unsettled, counts] = await Promise.all([
      tx<{ id: number; kind: string; owner_id: number | null; balance: number }[]>`SELECT id, kind, owner_id, balance FROM ledger_accounts ORDER BY id`,
      tx<{ d: number; c: number; total: number; n: number }[]>`
        SELECT debit_account_id AS d, credit_account_id AS c, sum(amount)::bigint AS total, count(*)::bigint AS n
        FROM ledger_transfers GROUP BY 1, 2`,
      tx<{ owner_id: number; balance: number; open: number }[]>`
        SELECT a.owner_id, a.balance, coalesce(h.open, 0)::bigint AS open
        FROM ledger_accounts a
        LEFT JOIN (SELECT renter_id, sum(amount)::bigint AS open FROM ledger_holds WHERE status = 'open' GROUP BY 1) h ON h.renter_id = a.owner_id
        WHERE a.kind = 'renter_held' AND a.balance <> coalesce(h.open, 0)
        ORDER BY a.owner_id`,
      // Every hold whose money or job disagrees with its state; sound holds are not sent back.
      tx<{ id: number; job_id: string | null; hold: string; job: string | null; amount: number; cost: number | null; actual_cost: number | null; held_in: number; charged: number; released: number }[]>`
        WITH t AS (
          SELECT job_id,
                 coalesce(sum(amount) FILTER (WHERE kind = 'hold'), 0)::bigint AS held_in,
                 coalesce(sum(amount) FILTER (WHERE kind = ANY(${JOB_CHARGE_KINDS})), 0)::bigint AS charged,
                 coalesce(sum(amount) FILTER (WHERE kind = 'release'), 0)::bigint AS released
          FROM ledger_transfers WHERE job_id IS NOT NULL GROUP BY job_id
        ), x AS (
          SELECT h.job_id AS id, j.job_id, h.status AS hold, j.status AS job, h.amount, h.cost, j.actual_cost_halala AS actual_cost,
                 coalesce(t.held_in, 0) AS held_in, coalesce(t.charged, 0) AS charged, coalesce(t.released, 0) AS released
          FROM ledger_holds h LEFT JOIN t ON t.job_id = h.job_id LEFT JOIN jobs j ON j.id = h.job_id
        )
        SELECT * FROM x
        WHERE held_in <> amount
           OR charged <> CASE WHEN hold = 'settled' THEN coalesce(cost, 0) ELSE 0 END
           OR released <> CASE WHEN hold = 'open' THEN 0 WHEN hold = 'settled' THEN amount - coalesce(cost, 0) ELSE amount END
           OR (hold = 'open' AND job IN ('completed', 'failed', 'cancelled'))
           OR (hold = 'settled' AND (job IS NULL OR job NOT IN ('completed', 'failed', 'cancelled') OR actual_cost IS DISTINCT FROM cost))
        ORDER BY id LIMIT ${MAX_LISTED * 4}`,
      // Charged jobs: completed ones, and those ended by the renter's fault after they ran (a cost recorded).
      tx<{ id: number; job_id: string; status: string; actual_cost: number | null }[]>`
        SELECT j.id, j.job_id, j.status, j.actual_cost_halala AS actual_cost FROM jobs j
        WHERE (j.status = 'completed' OR (j.status IN ('failed', 'cancelled') AND j.actual_cost_halala > 0))
          AND NOT EXISTS (SELECT 1 FROM ledger_holds h WHERE h.job_id = j.id AND h.status = 'settled')
        ORDER BY j.id LIMIT ${MAX_LISTED}`,
      tx<{ holds: number; open: number; settled: number }[]>`
        SELECT count(*)::bigint AS holds, count(*) FILTER (WHERE status = 'open')::bigint AS open,
               count(*) FILTER (WHERE status = 'settled')::bigint AS settled FROM ledger_holds`,
    ]);

    const derived = new Map<number, number>();
    let entries = 0;
    for (const p of pairs) {
      const total = Number(p.total);
      entries += Number(p.n);
      derived.set(p.c, (derived.get(p.c) ?? 0) + total);
      derived.set(p.d, (derived.get(p.d) ?? 0) - total);
    }
    let booksSum = 0;
    for (const a of accounts) {
      const fromEntries = derived.get(a.id) ?? 0;
      if (MATERIALIZED.has(a.kind)) {
        booksSum += a.balance;
        if (a.balance !== fromEntries) {
          add({ kind: "balance_mismatch", subject: accountName(a), expectedHalala: fromEntries, actualHalala: a.balance,
            message: `${accountName(a)}: balance ${a.balance} but its entries give ${fromEntries}` });
        }
        if (a.balance < 0) {
          add({ kind: "negative_balance", subject: accountName(a), expectedHalala: 0, actualHalala: a.balance, message: `${accountName(a)} is negative: ${a.balance}` }, false);
        }
      } else {
        booksSum += fromEntries;
        if (!SYSTEM.has(a.kind)) {
          add({ kind: "unknown_account_kind", subject: accountName(a), expectedHalala: 0, actualHalala: fromEntries, message: `${accountName(a)} has an unknown kind` }, false);
        }
      }
    }
    // Entries always sum to zero, so the books are off exactly by the kept balances' drift (counted above).
    if (booksSum !== 0) {
      add({ kind: "books_unbalanced", subject: "books", expectedHalala: 0, actualHalala: booksSum, message: `the books sum to ${booksSum}, not 0` }, false);
    }
    for (const h of held) {
      add({ kind: "held_mismatch", subject: `renter ${h.owner_id}`, expectedHalala: Number(h.open), actualHalala: h.balance,
        message: `renter ${h.owner_id}: held ${h.balance} but the open holds of its jobs sum to ${h.open}` });
    }
    for (const j of jobs) {
      const subject = `job ${j.id}${j.job_id ? ` (${j.job_id})` : ""}`;
      const heldIn = Number(j.held_in);
      const charged = Number(j.charged);
      // The hold (grown by extensions) is what its hold entries moved into held.
      if (heldIn !== j.amount) {
        add({ kind: "settlement_mismatch", subject, expectedHalala: j.amount, actualHalala: heldIn,
          message: `${subject} (hold ${j.hold}): holds ${j.amount} but its hold entries moved ${heldIn}` });
      }
      const released = Number(j.released);
      const expectCharged = j.hold === "settled" ? (j.cost ?? 0) : 0;
      const expectReleased = j.hold === "open" ? 0 : j.amount - expectCharged;
      if (charged !== expectCharged) {
        add({ kind: "settlement_mismatch", subject, expectedHalala: expectCharged, actualHalala: charged,
          message: `${subject} (hold ${j.hold}, job ${j.job ?? "missing"}): charged ${charged}, expected ${expectCharged}` });
      }
      if (released !== expectReleased) {
        add({ kind: "settlement_mismatch", subject, expectedHalala: expectReleased, actualHalala: released,
          message: `${subject} (hold ${j.hold}, job ${j.job ?? "missing"}): released ${released}, expected ${expectReleased}` });
      }
      if (j.hold === "open" && j.job && ["completed", "failed", "cancelled"].includes(j.job)) {
        add({ kind: "hold_open_on_ended_job", subject, expectedHalala: 0, actualHalala: j.amount, message: `${subject} is ${j.job} but its hold of ${j.amount} is still open` });
      }
      if (j.hold === "settled" && (!j.job || !["completed", "failed", "cancelled"].includes(j.job) || j.actual_cost !== j.cost)) {
        add({ kind: "settlement_disagrees_with_job", subject, expectedHalala: j.cost ?? 0, actualHalala: j.actual_cost ?? 0,
          message: `${subject}: hold settled at ${j.cost} but the job is ${j.job ?? "missing"} with actual cost ${j.actual_cost ?? "none"}` }, false);
      }
    }
    for (const j of unsettled) {
      add({ kind: "charged_without_settlement", subject: `job ${j.id} (${j.job_id})`, expectedHalala: j.actual_cost ?? 0, actualHalala: 0,
        message: `job ${j.id} (${j.job_id}) is ${j.status} with a cost of ${j.actual_cost ?? "none"} but has no settled hold` }, false);
    }
    const c = counts[0];
    return { accounts: accounts.length, entries, holds: Number(c.holds), openHolds: Number(c.open), settledJobs: Number(c.settled), booksSumHalala: booksSum };
  });
  const ms = Math.round(performance.now() - started);
  return {
    startedAt,
    finishedAt: new Date(),
    ms,
    ...figures,
    driftHalala: drift,
    discrepancyCount: found.length,
    discrepancies: found.slice(0, MAX_LISTED),
  };
}

/** Keeps a run's figures (what /metrics and the next election read). */
export async function recordLedgerAudit(db: Db, trigger: "schedule" | "admin", r: LedgerAuditReport): Promise<void> {
  const report = { ...r, startedAt: r.startedAt.toISOString(), finishedAt: r.finishedAt.toISOString() };
  await db`
    INSERT INTO ledger_audits (trigger, started_at, finished_at, ms, drift_halala, discrepancies, report)
    VALUES (${trigger}, ${r.startedAt}, ${r.finishedAt}, ${r.ms}, ${r.driftHalala}, ${r.discrepancyCount}, ${db.json(report as never)})`;
}

/** Runs the audit on demand (the admin route) and records it. */
export async function auditLedgerNow(sql: Sql): Promise<LedgerAuditReport> {
  const r = await auditLedger(sql);
  await recordLedgerAudit(sql, "admin", r);
  return r;
}

/**
 * The periodic run, at most once per `periodSeconds` across every process:
 * the process that takes the advisory lock checks when the last run finished
 * and runs the audit only when it is due (others skip while it holds the lock).
 * Returns the report when this process ran it.
 */
export async function runScheduledLedgerAudit(sql: Sql, periodSeconds: number): Promise<LedgerAuditReport | undefined> {
  return sql.begin(async (tx) => {
    const [{ elected }] = await tx<{ elected: boolean }[]>`SELECT pg_try_advisory_xact_lock(${AUDIT_LOCK_ID}) AS elected`;
    if (!elected) return undefined;
    // 90% of the period: timers of several processes drift; a run a little early beats a skipped period.
    const [last] = await tx<{ recent: boolean }[]>`
      SELECT finished_at > now() - make_interval(secs => ${periodSeconds * 0.9}) AS recent FROM ledger_audits ORDER BY id DESC LIMIT 1`;
    if (last?.recent) return undefined;
    const r = await auditLedger(sql);
    await recordLedgerAudit(tx, "schedule", r);
    return r;
  });
}

export async function latestLedgerAudit(db: Db): Promise<LedgerAuditSummary | undefined> {
  const [row] = await db<{ finished_at: Date; ms: number; drift_halala: number; discrepancies: number }[]>`
    SELECT finished_at, ms, drift_halala, discrepancies FROM ledger_audits ORDER BY id DESC LIMIT 1`;
  return row ? { finishedAt: row.finished_at, ms: row.ms, driftHalala: Number(row.drift_halala), discrepancies: row.discrepancies } : undefined;
}
