// Ledger audit benchmark: how long the audit (src/domain/money/ledger-audit.ts)
// takes on a large, sound ledger, full and incremental, in the same run.
//
//   npm run bench:ledger-audit [-- --entries 1000000 --runs 3 --settlements 1000]
//
// - Database: a fresh database on DATABASE_URL when set (dropped afterwards),
//   otherwise a real embedded PostgreSQL in .data/bench-pg; migrated.
// - Books: written in set-based SQL in the shape the service writes them:
//   10,000 renters topped up, 1,000 providers, and jobs each with a hold
//   (available -> held) and a settlement (provider's share, platform fee, the
//   rest released), until the ledger holds --entries transfers; kept balances
//   then set from the transfers. 1% of the jobs are still running (open holds).
// - Then VACUUM ANALYZE (what autovacuum does to such a table) and --runs
//   full audits, each recorded (the last one is the base of the next
//   incremental run); then --runs times: --settlements more jobs settled
//   (4 entries each, written the same way) and an incremental audit, also
//   recorded. Each must find 0 drift and read only the new entries.
// The last line printed is one JSON object with the figures.
import os from "node:os";
import { parseArgs } from "node:util";
import { migrate } from "../src/db/migrate.js";
import type { Sql } from "../src/db/index.js";
import { auditLedgerNow, type LedgerAuditReport } from "../src/domain/money/ledger-audit.js";
import { benchDatabase, machine, noter } from "./lib.js";

const { values: args } = parseArgs({
  options: {
    entries: { type: "string", default: "1000000" },
    runs: { type: "string", default: "3" },
    settlements: { type: "string", default: "1000" },
  },
});
const ENTRIES = Number(args.entries);
const RUNS = Number(args.runs);
const SETTLEMENTS = Number(args.settlements);
const RENTERS = 10_000;
const PROVIDERS = 1_000;
const TOPUPS_PER_RENTER = 5;
/** Entries per settled job: hold, provider's share, platform fee, released rest. */
const PER_JOB = 4;

const note = noter("bench");

async function main() {
  const db = await benchDatabase("svc_bench_audit", note);
  const sql = db.sql;
  try {
    await migrate(sql);
    const jobs = Math.max(1, Math.floor((ENTRIES - RENTERS * TOPUPS_PER_RENTER) / PER_JOB));
    const open = Math.floor(jobs / 100);
    note(`seeding ${RENTERS} renters, ${PROVIDERS} providers, ${jobs} jobs (${open} running)`);
    const seeded = performance.now();
    await sql.begin(async (tx) => {
      // Seeding only: skip the job-watch triggers (no listener, and 250,000 notices would only cost time).
      await tx`SET LOCAL session_replication_role = replica`;
      await tx`INSERT INTO renters (name, email) SELECT 'Renter ' || g, 'r' || g || '@bench.example' FROM generate_series(1, ${RENTERS}) g`;
      await tx`INSERT INTO providers (name, email, gpu_model, os, approval_status, status) SELECT 'Rig ' || g, 'p' || g || '@bench.example', 'RTX 4090', 'linux', 'approved', 'online' FROM generate_series(1, ${PROVIDERS}) g`;
      await tx`
        INSERT INTO ledger_accounts (kind, owner_id)
        SELECT k, r.id FROM renters r, unnest(ARRAY['renter_available', 'renter_held']) k
        UNION ALL SELECT 'provider_earnings', p.id FROM providers p`;
      // Jobs: rate 20/min, 5 minutes held (100), 3 minutes used (60 = 45 + 15), 40 released.
      await tx`
        INSERT INTO jobs (job_id, renter_id, provider_id, job_type, status, duration_minutes, max_duration_seconds,
                          rate_halala_per_minute, cost_halala, actual_cost_halala, provider_earned_halala, platform_fee_halala, actual_minutes)
        SELECT 'bench-' || g, 1 + g % ${RENTERS}, 1 + g % ${PROVIDERS}, 'llm-inference',
               CASE WHEN g <= ${open} THEN 'running' ELSE 'completed' END, 5, 300, 20, 100,
               CASE WHEN g <= ${open} THEN NULL ELSE 60 END, CASE WHEN g <= ${open} THEN NULL ELSE 45 END, CASE WHEN g <= ${open} THEN NULL ELSE 15 END,
               CASE WHEN g <= ${open} THEN NULL ELSE 3 END
        FROM generate_series(1, ${jobs}) g`;
      await tx`
        INSERT INTO ledger_holds (job_id, renter_id, amount, status, provider_id, cost, provider_earned, platform_fee, closed_at)
        SELECT id, renter_id, 100, CASE WHEN status = 'running' THEN 'open' ELSE 'settled' END, provider_id,
               CASE WHEN status = 'running' THEN NULL ELSE 60 END, CASE WHEN status = 'running' THEN NULL ELSE 45 END,
               CASE WHEN status = 'running' THEN NULL ELSE 15 END, CASE WHEN status = 'running' THEN NULL ELSE now() END
        FROM jobs`;
      // Fresh tables have no statistics: without them the joins below are planned as nested loops.
      await tx`ANALYZE renters, providers, ledger_accounts, jobs`;
      await tx`
        WITH acc AS (
          SELECT (SELECT id FROM ledger_accounts WHERE kind = 'gateway') AS gateway,
                 (SELECT id FROM ledger_accounts WHERE kind = 'platform_fees') AS fees
        ), ra AS (
          SELECT owner_id AS renter_id, max(id) FILTER (WHERE kind = 'renter_available') AS available, max(id) FILTER (WHERE kind = 'renter_held') AS held
          FROM ledger_accounts WHERE kind IN ('renter_available', 'renter_held') GROUP BY owner_id
        ), pa AS (SELECT owner_id AS provider_id, id AS earnings FROM ledger_accounts WHERE kind = 'provider_earnings')
        INSERT INTO ledger_transfers (debit_account_id, credit_account_id, amount, kind, idempotency_key, job_id)
        SELECT acc.gateway, ra.available, 10000, 'topup', 'topup:' || ra.renter_id || ':' || n, NULL::bigint
          FROM ra, acc, generate_series(1, ${TOPUPS_PER_RENTER}) n
        UNION ALL
        SELECT ra.available, ra.held, 100, 'hold', 'hold:job:' || j.id, j.id FROM jobs j JOIN ra ON ra.renter_id = j.renter_id
        UNION ALL
        SELECT ra.held, pa.earnings, 45, 'charge_provider', 'settle:job:' || j.id || ':provider', j.id
          FROM jobs j JOIN ra ON ra.renter_id = j.renter_id JOIN pa ON pa.provider_id = j.provider_id WHERE j.status = 'completed'
        UNION ALL
        SELECT ra.held, acc.fees, 15, 'charge_platform', 'settle:job:' || j.id || ':platform', j.id
          FROM jobs j JOIN ra ON ra.renter_id = j.renter_id, acc WHERE j.status = 'completed'
        UNION ALL
        SELECT ra.held, ra.available, 40, 'release', 'settle:job:' || j.id || ':remainder', j.id
          FROM jobs j JOIN ra ON ra.renter_id = j.renter_id WHERE j.status = 'completed'`;
      await tx`
        UPDATE ledger_accounts a SET balance = d.balance
        FROM (SELECT id, sum(delta)::bigint AS balance FROM (
                SELECT credit_account_id AS id, amount AS delta FROM ledger_transfers
                UNION ALL SELECT debit_account_id, -amount FROM ledger_transfers) m GROUP BY id) d
        WHERE a.id = d.id AND a.kind IN ('renter_available', 'renter_held', 'provider_earnings')`;
    });
    await sql.unsafe("VACUUM ANALYZE ledger_transfers, ledger_accounts, ledger_holds, jobs");
    const [{ n }] = await sql<{ n: number }[]>`SELECT count(*)::bigint AS n FROM ledger_transfers`;
    const [{ size }] = await sql<{ size: string }[]>`SELECT pg_size_pretty(pg_total_relation_size('ledger_transfers')) AS size`;
    note(`seeded ${n} ledger entries (${size} with indexes) in ${Math.round(performance.now() - seeded)} ms`);

    const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
    const sound = (r: LedgerAuditReport) => {
      if (r.driftHalala !== 0 || r.discrepancyCount !== 0) throw new Error(`a sound ledger was found off: ${JSON.stringify(r.discrepancies.slice(0, 3))}`);
    };
    // Full runs: each reads every entry and, being clean, writes every account's total as the next base.
    const full: { ms: number; recordedMs: number }[] = [];
    let last: LedgerAuditReport | undefined;
    for (let i = 0; i < RUNS; i++) {
      const t0 = performance.now();
      last = await auditLedgerNow(sql, { full: true });
      const recordedMs = Math.round(performance.now() - t0);
      sound(last);
      full.push({ ms: last.ms, recordedMs });
      note(`full audit ${i + 1}: ${last.ms} ms (${recordedMs} ms recorded), ${last.entries} entries, watermark ${last.watermark}`);
    }
    const fullLast = last!;
    // Incremental runs, each after SETTLEMENTS more settled jobs.
    const incremental: { ms: number; recordedMs: number; entries: number; holds: number }[] = [];
    for (let i = 0; i < RUNS; i++) {
      const added = await settleMore(sql, SETTLEMENTS);
      const t0 = performance.now();
      const r = await auditLedgerNow(sql);
      const recordedMs = Math.round(performance.now() - t0);
      sound(r);
      if (r.mode !== "incremental" || r.entries !== added) throw new Error(`expected an incremental run over ${added} entries, got ${r.mode} over ${r.entries}`);
      incremental.push({ ms: r.ms, recordedMs, entries: r.entries, holds: r.holds });
      note(`incremental audit ${i + 1}: ${r.ms} ms (${recordedMs} ms recorded), entries (${r.fromEntryId}, ${r.toEntryId}]: ${r.entries}, ${r.holds} holds checked`);
    }
    console.log(
      JSON.stringify({
        entries: Number(n),
        accounts: fullLast.accounts,
        jobs,
        open_holds: fullLast.openHolds,
        ledger_size: size,
        full_ms: full.map((f) => f.ms),
        full_ms_median: median(full.map((f) => f.ms)),
        full_recorded_ms: full.map((f) => f.recordedMs),
        settlements_between: SETTLEMENTS,
        incremental_entries: incremental[0]?.entries,
        incremental_holds_checked: incremental[0]?.holds,
        incremental_ms: incremental.map((f) => f.ms),
        incremental_ms_median: median(incremental.map((f) => f.ms)),
        incremental_recorded_ms: incremental.map((f) => f.recordedMs),
        drift_halala: 0,
        load_average: os.loadavg().map((l) => Math.round(l * 100) / 100),
        database: db.kind,
        machine: machine(),
      }),
    );
  } finally {
    await db.close();
  }
}

/**
 * Settles `count` more jobs the way the seed wrote them (hold, provider's
 * share, platform fee, released rest) and moves the kept balances by the new
 * entries. Returns the entries written.
 */
async function settleMore(sql: Sql, count: number): Promise<number> {
  return sql.begin(async (tx) => {
    await tx`SET LOCAL session_replication_role = replica`;
    const [{ from }] = await tx<{ from: number }[]>`SELECT coalesce(max(id), 0) AS from FROM ledger_transfers`;
    const [{ first }] = await tx<{ first: number }[]>`SELECT coalesce(max(id), 0) + 1 AS first FROM jobs`;
    await tx`
      INSERT INTO jobs (job_id, renter_id, provider_id, job_type, status, duration_minutes, max_duration_seconds,
                        rate_halala_per_minute, cost_halala, actual_cost_halala, provider_earned_halala, platform_fee_halala, actual_minutes)
      SELECT 'bench-more-' || g, 1 + g % ${RENTERS}, 1 + g % ${PROVIDERS}, 'llm-inference', 'completed', 5, 300, 20, 100, 60, 45, 15, 3
      FROM generate_series(${first}::bigint, ${first + count - 1}::bigint) g`;
    await tx`
      INSERT INTO ledger_holds (job_id, renter_id, amount, status, provider_id, cost, provider_earned, platform_fee, closed_at)
      SELECT id, renter_id, 100, 'settled', provider_id, 60, 45, 15, now() FROM jobs WHERE id >= ${first}`;
    await tx`
      WITH fees AS (SELECT id FROM ledger_accounts WHERE kind = 'platform_fees'),
      j AS (
        SELECT j.id, ra.id AS available, rh.id AS held, pe.id AS earnings FROM jobs j
        JOIN ledger_accounts ra ON ra.kind = 'renter_available' AND ra.owner_id = j.renter_id
        JOIN ledger_accounts rh ON rh.kind = 'renter_held' AND rh.owner_id = j.renter_id
        JOIN ledger_accounts pe ON pe.kind = 'provider_earnings' AND pe.owner_id = j.provider_id
        WHERE j.id >= ${first}
      )
      INSERT INTO ledger_transfers (debit_account_id, credit_account_id, amount, kind, idempotency_key, job_id)
      SELECT d, c, amount, kind, key, id FROM (
        SELECT j.id, 1 AS leg, j.available AS d, j.held AS c, 100 AS amount, 'hold' AS kind, 'hold:job:' || j.id AS key FROM j
        UNION ALL SELECT j.id, 2, j.held, j.earnings, 45, 'charge_provider', 'settle:job:' || j.id || ':provider' FROM j
        UNION ALL SELECT j.id, 3, j.held, fees.id, 15, 'charge_platform', 'settle:job:' || j.id || ':platform' FROM j, fees
        UNION ALL SELECT j.id, 4, j.held, j.available, 40, 'release', 'settle:job:' || j.id || ':remainder' FROM j
      ) legs ORDER BY id, leg`;
    await tx`
      UPDATE ledger_accounts a SET balance = a.balance + d.delta
      FROM (SELECT id, sum(delta)::bigint AS delta FROM (
              SELECT credit_account_id AS id, amount AS delta FROM ledger_transfers WHERE id > ${from}
              UNION ALL SELECT debit_account_id, -amount FROM ledger_transfers WHERE id > ${from}) m GROUP BY id) d
      WHERE a.id = d.id AND a.kind IN ('renter_available', 'renter_held', 'provider_earnings')`;
    const [{ written }] = await tx<{ written: number }[]>`SELECT count(*)::int AS written FROM ledger_transfers WHERE id > ${from}`;
    return written;
  });
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
