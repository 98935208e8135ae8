// Ledger audit benchmark: how long the audit (src/domain/money/ledger-audit.ts)
// takes on a large, sound ledger.
//
//   npm run bench:ledger-audit [-- --entries 1000000 --runs 3]
//
// - Database: a fresh database on DATABASE_URL when set (dropped afterwards),
//   otherwise a real embedded PostgreSQL in .data/bench-pg; migrated.
// - Books: written in set-based SQL in the shape the service writes them:
//   10,000 renters topped up, 1,000 providers, and jobs each with a hold
//   (available -> held) and a settlement (provider's share, platform fee, the
//   rest released), until the ledger holds --entries transfers; kept balances
//   then set from the transfers. 1% of the jobs are still running (open holds).
// - Then VACUUM ANALYZE (what autovacuum does to such a table) and --runs
//   audits; each must find 0 drift.
// The last line printed is one JSON object with the figures.
import { parseArgs } from "node:util";
import { migrate } from "../src/db/migrate.js";
import { auditLedger } from "../src/domain/money/ledger-audit.js";
import { benchDatabase, machine, noter } from "./lib.js";

const { values: args } = parseArgs({
  options: {
    entries: { type: "string", default: "1000000" },
    runs: { type: "string", default: "3" },
  },
});
const ENTRIES = Number(args.entries);
const RUNS = Number(args.runs);
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

    const times: number[] = [];
    let last;
    for (let i = 0; i < RUNS; i++) {
      last = await auditLedger(sql);
      times.push(last.ms);
      note(`audit ${i + 1}: ${last.ms} ms, ${last.entries} entries, drift ${last.driftHalala}, ${last.discrepancyCount} discrepancies`);
      if (last.driftHalala !== 0 || last.discrepancyCount !== 0) throw new Error(`a sound ledger was found off: ${JSON.stringify(last.discrepancies.slice(0, 3))}`);
    }
    const sorted = [...times].sort((a, b) => a - b);
    console.log(
      JSON.stringify({
        entries: Number(n),
        accounts: last!.accounts,
        jobs,
        open_holds: last!.openHolds,
        ledger_size: size,
        audit_ms: times,
        audit_ms_median: sorted[Math.floor(sorted.length / 2)],
        drift_halala: last!.driftHalala,
        database: db.kind,
        machine: machine(),
      }),
    );
  } finally {
    await db.close();
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
