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
// only the rows that disagree, so nothing is sent to the process per entry.
//
// Full and incremental runs. Entries are append-only (migration 025: the
// database refuses to change or delete one), so what a clean run verified
// stays verified. A clean run whose every entry up to a watermark was
// committed when it read them becomes the base of the next run: the
// watermark and each account's total up to it (ledger_audit_totals) are
// kept. An incremental run then reads only the entries after the base's
// watermark: each account's balance is its base total plus those entries,
// and the per-job checks run on the jobs that have such an entry. Every
// account and every renter's held amount are still checked on each run, and
// every open hold for a job that has ended. What only a full run sees: an
// old entry changed behind the trigger's back, and a job row changed without
// a ledger movement after its hold was closed. A run that finds a discrepancy is
// not a base, so the runs after it read the same range again and keep
// reporting it until it is repaired.
//
// Which entries were committed: an entry's id is taken by an INSERT that
// holds ROW EXCLUSIVE on ledger_transfers from before it takes the id until
// its transaction ends, and the sequence hands ids out in order (CACHE 1, the
// default). So the run reads the sequence, then waits until every
// transaction holding that lock at that moment has ended (pg_locks; nobody
// is blocked): every id up to the sequence value is then committed or never
// will be, and the snapshot taken after sees them all.
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

export type AuditMode = "full" | "incremental";

export interface LedgerAuditReport {
  startedAt: Date;
  finishedAt: Date;
  ms: number;
  mode: AuditMode;
  /** Entries with a higher id were read (0: every entry). */
  fromEntryId: number;
  /** The highest entry id read, at least fromEntryId: the run covered the entries in (fromEntryId, toEntryId]. */
  toEntryId: number;
  /** The run an incremental run continues from (its watermark is fromEntryId); null for a full run. */
  baseAuditId: number | null;
  accounts: number;
  /** Entries read: all of them, or those after fromEntryId. */
  entries: number;
  /** Holds checked: all of them, or those of the jobs with an entry read (every open hold is checked for an ended job). */
  holds: number;
  /** Open holds (all of them). */
  openHolds: number;
  /** Settled holds among those checked. */
  settledJobs: number;
  /** Kept balances plus derived system balances: 0 when sound. */
  booksSumHalala: number;
  driftHalala: number;
  discrepancyCount: number;
  /** The first MAX_LISTED discrepancies (discrepancyCount has them all). */
  discrepancies: Discrepancy[];
  /** Set once recorded: the run's id. */
  auditId?: number;
  /** Set once recorded: the entry id up to which this run is the next one's base; null when it is not a base. */
  watermark?: number | null;
}

export interface AuditOptions {
  /** Read every entry even when a base run exists. */
  full?: boolean;
  /** Longest wait for the ledger writes in flight (ms); past it the run still runs but cannot become a base. */
  writersWaitMs?: number;
}

/** What a clean run leaves for the next: totals up to the watermark (recordLedgerAudit writes them). */
interface Checkpoint {
  baseAuditId: number | null;
  watermark: number;
  /** Every account's total (full run) or those of the accounts with entries in the range (incremental). */
  replace: boolean;
  totals: Map<number, number>;
}

/** What /metrics shows of the last audit (any process's). */
export interface LedgerAuditSummary {
  /**
   * When it finished, on this process's clock: its age by the database's clock (which recorded it)
   * taken from this process's now, so that an age this process computes carries no clock skew.
   */
  finishedAt: Date;
  ms: number;
  driftHalala: number;
  discrepancies: number;
}

/** Discrepancies listed in an answer; the count covers every one. */
export const MAX_LISTED = 200;
const WRITERS_WAIT_MS = 10_000;

const MATERIALIZED = new Set(["renter_available", "renter_held", "provider_earnings"]);
const SYSTEM = new Set(["platform_fees", "gateway", "adjustments"]);
const JOB_CHARGE_KINDS = ["charge_provider", "charge_platform"];
/** Advisory lock id electing the process that runs the periodic audit (migrate.ts uses 0x5ec_0001). */
const AUDIT_LOCK_ID = 0x5ec_0020;
/** Advisory lock id serialising the writes of ledger_audit_totals. */
const CHECKPOINT_LOCK_ID = 0x5ec_0021;

const checkpoints = new WeakMap<LedgerAuditReport, Checkpoint>();

function accountName(a: { id: number; kind: string; owner_id: number | null }): string {
  if (a.owner_id === null) return `account ${a.id} (${a.kind})`;
  const owner = a.kind === "provider_earnings" ? "provider" : "renter";
  return `account ${a.id} (${a.kind} of ${owner} ${a.owner_id})`;
}

/**
 * The entry id up to which every entry is committed or never will be, once
 * the transactions writing entries now have ended (undefined when they have
 * not ended within `waitMs`), and the database's time when it was read.
 */
async function committedUpTo(sql: Sql, waitMs: number): Promise<{ upTo: number | undefined; at: Date }> {
  const [{ last, at }] = await sql<{ last: number; at: Date }[]>`
    SELECT CASE WHEN is_called THEN last_value ELSE 0 END AS last, clock_timestamp() AS at FROM ledger_transfers_id_seq`;
  // Read after the sequence: whoever took an id up to `last` holds the lock until it ends.
  const writers = (
    await sql<{ vxid: string }[]>`
      SELECT DISTINCT virtualtransaction AS vxid FROM pg_locks
      WHERE locktype = 'relation' AND relation = 'ledger_transfers'::regclass AND mode = 'RowExclusiveLock' AND granted
        AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) AND pid IS DISTINCT FROM pg_backend_pid()`
  ).map((r) => r.vxid);
  const deadline = performance.now() + waitMs;
  for (let pause = 5; writers.length > 0; pause = Math.min(pause * 2, 100)) {
    const [{ running }] = await sql<{ running: number }[]>`SELECT count(*)::int AS running FROM pg_locks WHERE virtualtransaction = ANY(${writers}::text[])`;
    if (running === 0) break;
    if (performance.now() >= deadline) return { upTo: undefined, at };
    await new Promise((r) => setTimeout(r, pause));
  }
  return { upTo: Number(last), at };
}

/** Runs the checks on one snapshot: incremental when a base run exists, unless `full`. */
export async function auditLedger(sql: Sql, opts: AuditOptions = {}): Promise<LedgerAuditReport> {
  // The run's times are the database's clock (its start read with the sequence, its end that plus the
  // run's duration on this process's monotonic clock): the schedule compares them with now().
  const started = performance.now();
  const { upTo, at: startedAt } = await committedUpTo(sql, opts.writersWaitMs ?? WRITERS_WAIT_MS);
  const found: Discrepancy[] = [];
  let count = 0;
  let drift = 0;
  const add = (d: Discrepancy, counts = true) => {
    found.push(d);
    count++;
    if (counts) drift += Math.abs(d.expectedHalala - d.actualHalala);
  };
  // The per-job checks list their first rows only; their count and drift come whole from SQL.
  const list = (d: Discrepancy) => {
    if (found.length < MAX_LISTED) found.push(d);
  };

  const { figures, checkpoint } = await sql.begin("isolation level repeatable read read only", async (tx: Tx) => {
    // The base and its totals are written together (recordLedgerAudit), so one snapshot reads a matching pair.
    const [base] = await tx<{ id: number; watermark: number }[]>`SELECT id, watermark FROM ledger_audits WHERE watermark IS NOT NULL ORDER BY id DESC LIMIT 1`;
    const incremental = !opts.full && base !== undefined;
    const from = incremental ? Number(base.watermark) : 0;
    // The jobs an incremental run checks: those with an entry after the watermark. An array, so each query reads them by index.
    const inRange = () => tx`ANY(ARRAY(SELECT DISTINCT job_id FROM ledger_transfers WHERE id > ${from} AND job_id IS NOT NULL))`;
    type HoldRow = {
      id: number; job_id: string | null; hold: string; job: string | null; amount: number; cost: number | null; actual_cost: number | null;
      held_in: number; charged: number; released: number; expect_charged: number; expect_released: number;
      bad_held: boolean; bad_charged: boolean; bad_released: boolean; open_on_ended: boolean; disagrees: boolean;
      /** Over every disagreeing hold, not only those listed. */
      total_n: number; total_drift: number;
    };
    /** Over every row found, not only those listed. */
    type Totals = { total_n: number; total_drift: number };
    const [accounts, pairs, baseTotals, held, jobs, openOnEnded, unsettled, counts] = await Promise.all([
      tx<{ id: number; kind: string; owner_id: number | null; balance: number }[]>`SELECT id, kind, owner_id, balance FROM ledger_accounts ORDER BY id`,
      tx<{ d: number; c: number; total: number; upto: number | null; n: number; last: number }[]>`
        SELECT debit_account_id AS d, credit_account_id AS c, sum(amount)::bigint AS total,
               sum(amount) FILTER (WHERE id <= ${upTo ?? -1})::bigint AS upto, count(*)::bigint AS n, max(id) AS last
        FROM ledger_transfers ${incremental ? tx`WHERE id > ${from}` : tx``} GROUP BY 1, 2`,
      incremental ? tx<{ account_id: number; total: number }[]>`SELECT account_id, total FROM ledger_audit_totals` : [],
      tx<{ owner_id: number; balance: number; open: number }[]>`
        SELECT a.owner_id, a.balance, coalesce(h.open, 0)::bigint AS open
        FROM ledger_accounts a
        LEFT JOIN (SELECT renter_id, sum(amount)::bigint AS open FROM ledger_holds WHERE status = 'open' GROUP BY 1) h ON h.renter_id = a.owner_id
        WHERE a.kind = 'renter_held' AND a.balance <> coalesce(h.open, 0)
        ORDER BY a.owner_id`,
      // Every hold whose money or job disagrees with its state, each check decided here: the first
      // MAX_LISTED such holds are sent back, with the count and drift of them all; sound holds never are.
      tx<HoldRow[]>`
        WITH t AS (
          SELECT job_id,
                 coalesce(sum(amount) FILTER (WHERE kind = 'hold'), 0)::bigint AS held_in,
                 coalesce(sum(amount) FILTER (WHERE kind = ANY(${JOB_CHARGE_KINDS})), 0)::bigint AS charged,
                 coalesce(sum(amount) FILTER (WHERE kind = 'release'), 0)::bigint AS released
          FROM ledger_transfers WHERE ${incremental ? tx`job_id = ${inRange()}` : tx`job_id IS NOT NULL`} GROUP BY job_id
        ), x AS (
          SELECT h.job_id AS id, j.job_id, h.status AS hold, j.status AS job, h.amount, h.cost, j.actual_cost_halala AS actual_cost,
                 coalesce(t.held_in, 0) AS held_in, coalesce(t.charged, 0) AS charged, coalesce(t.released, 0) AS released,
                 CASE WHEN h.status = 'settled' THEN coalesce(h.cost, 0) ELSE 0 END AS expect_charged,
                 CASE WHEN h.status = 'open' THEN 0 WHEN h.status = 'settled' THEN h.amount - coalesce(h.cost, 0) ELSE h.amount END AS expect_released,
                 coalesce(j.status IN ('completed', 'failed', 'cancelled'), false) AS ended
          FROM ledger_holds h LEFT JOIN t ON t.job_id = h.job_id LEFT JOIN jobs j ON j.id = h.job_id
          ${incremental ? tx`WHERE h.job_id = ${inRange()}` : tx``}
        ), c AS (
          SELECT x.*, held_in <> amount AS bad_held, charged <> expect_charged AS bad_charged, released <> expect_released AS bad_released,
                 hold = 'open' AND ended AS open_on_ended,
                 hold = 'settled' AND (NOT ended OR actual_cost IS DISTINCT FROM cost) AS disagrees
          FROM x
        ), bad AS (
          SELECT c.*,
                 bad_held::int + bad_charged::int + bad_released::int + open_on_ended::int + disagrees::int AS n,
                 abs(amount - held_in) + abs(expect_charged - charged) + abs(expect_released - released)
                   + CASE WHEN open_on_ended THEN abs(amount) ELSE 0 END AS drift
          FROM c WHERE bad_held OR bad_charged OR bad_released OR open_on_ended OR disagrees
        )
        SELECT id, job_id, hold, job, amount, cost, actual_cost, held_in, charged, released, expect_charged, expect_released,
               bad_held, bad_charged, bad_released, open_on_ended, disagrees,
               sum(n) OVER ()::bigint AS total_n, sum(drift) OVER ()::bigint AS total_drift
        FROM bad ORDER BY id LIMIT ${MAX_LISTED}`,
      // Incremental: every other open hold whose job has ended. (Their money is unchanged since the
      // base checked it; an amount changed without an entry shows in the renter's held amount.)
      incremental
        ? tx<({ id: number; job_id: string; job: string; amount: number } & Totals)[]>`
            WITH o AS MATERIALIZED (SELECT job_id, amount FROM ledger_holds WHERE status = 'open')
            SELECT o.job_id AS id, j.job_id, j.status AS job, o.amount,
                   count(*) OVER ()::bigint AS total_n, sum(abs(o.amount)) OVER ()::bigint AS total_drift
            FROM o JOIN jobs j ON j.id = o.job_id
            WHERE j.status IN ('completed', 'failed', 'cancelled') AND NOT (o.job_id = ${inRange()})
            ORDER BY o.job_id LIMIT ${MAX_LISTED}`
        : [],
      // Charged jobs: completed ones, and those ended by the renter's fault after they ran (a cost recorded).
      tx<({ id: number; job_id: string; status: string; actual_cost: number | null } & Totals)[]>`
        SELECT j.id, j.job_id, j.status, j.actual_cost_halala AS actual_cost, count(*) OVER ()::bigint AS total_n, 0::bigint AS total_drift
        FROM jobs j
        WHERE (j.status = 'completed' OR (j.status IN ('failed', 'cancelled') AND j.actual_cost_halala > 0))
          ${incremental ? tx`AND j.id = ${inRange()}` : tx``}
          AND NOT EXISTS (SELECT 1 FROM ledger_holds h WHERE h.job_id = j.id AND h.status = 'settled')
        ORDER BY j.id LIMIT ${MAX_LISTED}`,
      tx<{ holds: number; open: number; settled: number }[]>`
        SELECT count(*)::bigint AS holds, (SELECT count(*) FROM ledger_holds WHERE status = 'open')::bigint AS open,
               count(*) FILTER (WHERE status = 'settled')::bigint AS settled
        FROM ledger_holds h ${incremental ? tx`WHERE h.job_id = ${inRange()}` : tx``}`,
    ]);

    // Each account's credits minus debits: its base total plus the entries read; and the same up to upTo (the next base).
    const derived = new Map<number, number>();
    const nextTotals = new Map<number, number>();
    for (const t of baseTotals) {
      derived.set(t.account_id, Number(t.total));
      nextTotals.set(t.account_id, Number(t.total));
    }
    let entries = 0;
    let lastId = 0;
    const move = (m: Map<number, number>, id: number, by: number) => m.set(id, (m.get(id) ?? 0) + by);
    for (const p of pairs) {
      const total = Number(p.total);
      const upto = Number(p.upto ?? 0);
      entries += Number(p.n);
      lastId = Math.max(lastId, Number(p.last));
      move(derived, p.c, total);
      move(derived, p.d, -total);
      move(nextTotals, p.c, upto);
      move(nextTotals, p.d, -upto);
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
      const released = Number(j.released);
      const expectCharged = Number(j.expect_charged);
      const expectReleased = Number(j.expect_released);
      // The hold (grown by extensions) is what its hold entries moved into held.
      if (j.bad_held) {
        list({ kind: "settlement_mismatch", subject, expectedHalala: j.amount, actualHalala: heldIn,
          message: `${subject} (hold ${j.hold}): holds ${j.amount} but its hold entries moved ${heldIn}` });
      }
      if (j.bad_charged) {
        list({ kind: "settlement_mismatch", subject, expectedHalala: expectCharged, actualHalala: charged,
          message: `${subject} (hold ${j.hold}, job ${j.job ?? "missing"}): charged ${charged}, expected ${expectCharged}` });
      }
      if (j.bad_released) {
        list({ kind: "settlement_mismatch", subject, expectedHalala: expectReleased, actualHalala: released,
          message: `${subject} (hold ${j.hold}, job ${j.job ?? "missing"}): released ${released}, expected ${expectReleased}` });
      }
      if (j.open_on_ended) {
        list({ kind: "hold_open_on_ended_job", subject, expectedHalala: 0, actualHalala: j.amount, message: `${subject} is ${j.job} but its hold of ${j.amount} is still open` });
      }
      if (j.disagrees) {
        list({ kind: "settlement_disagrees_with_job", subject, expectedHalala: j.cost ?? 0, actualHalala: j.actual_cost ?? 0,
          message: `${subject}: hold settled at ${j.cost} but the job is ${j.job ?? "missing"} with actual cost ${j.actual_cost ?? "none"}` });
      }
    }
    for (const j of openOnEnded) {
      const subject = `job ${j.id} (${j.job_id})`;
      list({ kind: "hold_open_on_ended_job", subject, expectedHalala: 0, actualHalala: j.amount, message: `${subject} is ${j.job} but its hold of ${j.amount} is still open` });
    }
    for (const j of unsettled) {
      list({ kind: "charged_without_settlement", subject: `job ${j.id} (${j.job_id})`, expectedHalala: j.actual_cost ?? 0, actualHalala: 0,
        message: `job ${j.id} (${j.job_id}) is ${j.status} with a cost of ${j.actual_cost ?? "none"} but has no settled hold` });
    }
    for (const rows of [jobs, openOnEnded, unsettled] as Totals[][]) {
      count += Number(rows[0]?.total_n ?? 0);
      drift += Number(rows[0]?.total_drift ?? 0);
    }
    const c = counts[0];
    // The next base: only from a clean run whose entries up to upTo were all committed when read.
    let checkpoint: Checkpoint | undefined;
    if (count === 0 && upTo !== undefined && upTo >= from) {
      const totals = new Map<number, number>();
      if (incremental) {
        // Only the accounts with an entry read change their total.
        for (const p of pairs) for (const id of [p.c, p.d]) totals.set(id, nextTotals.get(id) ?? 0);
      } else {
        for (const [id, total] of nextTotals) if (total !== 0) totals.set(id, total);
      }
      checkpoint = { baseAuditId: incremental ? base.id : null, watermark: upTo, replace: !incremental, totals };
    }
    return {
      checkpoint,
      figures: {
        mode: (incremental ? "incremental" : "full") as AuditMode,
        fromEntryId: from,
        toEntryId: Math.max(from, lastId),
        baseAuditId: incremental ? base.id : null,
        accounts: accounts.length,
        entries,
        holds: Number(c.holds),
        openHolds: Number(c.open),
        settledJobs: Number(c.settled),
        booksSumHalala: booksSum,
      },
    };
  });
  const elapsed = performance.now() - started;
  const ms = Math.round(elapsed);
  const report: LedgerAuditReport = {
    startedAt,
    finishedAt: new Date(startedAt.getTime() + elapsed),
    ms,
    ...figures,
    driftHalala: drift,
    discrepancyCount: count,
    discrepancies: found.slice(0, MAX_LISTED),
  };
  if (checkpoint) checkpoints.set(report, checkpoint);
  return report;
}

/**
 * Keeps a run's figures (what /metrics and the next election read). A clean
 * run becomes the next one's base when the base it started from is still the
 * latest (another run may have moved it meanwhile): its totals are written
 * with it, in this transaction. Sets the report's auditId and watermark.
 */
export async function recordLedgerAudit(db: Db, trigger: "schedule" | "admin", r: LedgerAuditReport): Promise<LedgerAuditReport> {
  const record = async (tx: Db) => {
    const cp = checkpoints.get(r);
    let watermark: number | null = null;
    if (cp) {
      await tx`SELECT pg_advisory_xact_lock(${CHECKPOINT_LOCK_ID})`;
      const [latest] = await tx<{ id: number }[]>`SELECT id FROM ledger_audits WHERE watermark IS NOT NULL ORDER BY id DESC LIMIT 1`;
      if ((latest?.id ?? null) === cp.baseAuditId || cp.replace) {
        if (cp.replace) await tx`DELETE FROM ledger_audit_totals`;
        const ids = [...cp.totals.keys()];
        await tx`
          INSERT INTO ledger_audit_totals (account_id, total)
          SELECT * FROM unnest(${ids}::bigint[], ${ids.map((id) => cp.totals.get(id)!)}::bigint[])
          ON CONFLICT (account_id) DO UPDATE SET total = EXCLUDED.total`;
        watermark = cp.watermark;
      }
    }
    const report = { ...r, startedAt: r.startedAt.toISOString(), finishedAt: r.finishedAt.toISOString(), watermark };
    const [row] = await tx<{ id: number }[]>`
      INSERT INTO ledger_audits (trigger, started_at, finished_at, ms, drift_halala, discrepancies, mode, from_entry_id, to_entry_id, watermark, report)
      VALUES (${trigger}, ${r.startedAt}, ${r.finishedAt}, ${r.ms}, ${r.driftHalala}, ${r.discrepancyCount}, ${r.mode},
              ${r.fromEntryId}, ${r.toEntryId}, ${watermark}, ${tx.json(report as never)})
      RETURNING id`;
    r.auditId = row.id;
    r.watermark = watermark;
  };
  // The pool: one transaction of its own; a transaction: its caller's.
  if ("savepoint" in db) await record(db);
  else await (db as Sql).begin(record);
  return r;
}

/** Runs the audit on demand (the admin route) and records it. */
export async function auditLedgerNow(sql: Sql, opts: AuditOptions = {}): Promise<LedgerAuditReport> {
  return recordLedgerAudit(sql, "admin", await auditLedger(sql, opts));
}

/**
 * The periodic run, at most once per `periodSeconds` across every process:
 * the process that takes the advisory lock checks when the last periodic run
 * finished and runs the audit only when it is due (others skip while it holds the lock).
 * It is a full run when no full run finished within `fullSeconds` (or when
 * there is no base yet), an incremental one otherwise.
 * Returns the report when this process ran it.
 */
export async function runScheduledLedgerAudit(sql: Sql, periodSeconds: number, fullSeconds = 86_400): Promise<LedgerAuditReport | undefined> {
  return sql.begin(async (tx) => {
    const [{ elected }] = await tx<{ elected: boolean }[]>`SELECT pg_try_advisory_xact_lock(${AUDIT_LOCK_ID}) AS elected`;
    if (!elected) return undefined;
    // 90% of the period: timers of several processes drift; a run a little early beats a skipped period.
    // Scheduled runs only: on-demand ones, however frequent, must not stand in for the schedule (nor starve its full run).
    const [last] = await tx<{ recent: boolean }[]>`
      SELECT finished_at > now() - make_interval(secs => ${periodSeconds * 0.9}) AS recent FROM ledger_audits
      WHERE trigger = 'schedule' ORDER BY id DESC LIMIT 1`;
    if (last?.recent) return undefined;
    const [{ full }] = await tx<{ full: boolean }[]>`
      SELECT NOT EXISTS (SELECT 1 FROM ledger_audits WHERE mode = 'full' AND finished_at > now() - make_interval(secs => ${fullSeconds * 0.9})) AS full`;
    const r = await auditLedger(sql, { full });
    return recordLedgerAudit(tx, "schedule", r);
  });
}

export async function latestLedgerAudit(db: Db): Promise<LedgerAuditSummary | undefined> {
  const [row] = await db<{ age_ms: number; ms: number; drift_halala: number; discrepancies: number }[]>`
    SELECT (extract(epoch FROM clock_timestamp() - finished_at) * 1000)::float8 AS age_ms, ms, drift_halala, discrepancies
    FROM ledger_audits ORDER BY id DESC LIMIT 1`;
  return row ? { finishedAt: new Date(Date.now() - row.age_ms), ms: row.ms, driftHalala: Number(row.drift_halala), discrepancies: row.discrepancies } : undefined;
}
