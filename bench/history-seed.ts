// Seeds a marketplace's history in set-based SQL (INSERT … SELECT over
// generate_series), in the shape the service writes it: renters with their
// ledger accounts, quotas and top-ups; providers; and `jobs` ended jobs spread
// over `days` of submit times, each with its attempts, its hold and the
// ledger entries its end moved (the hold, the settlement's provider share,
// platform fee and released rest, or the whole hold released), the kept
// balances and the counters (renter_daily_jobs, the ended jobs' counters,
// totals) set to match. The ledger audit finds these books sound.
//
// Who ran what: renter 1 submitted 10% of all jobs (1,000,000 of 10,000,000),
// renters 2-5 1% each, the rest spread evenly over the other renters;
// providers 1-10 ran 1% each, the rest spread over the other providers.
// How jobs ended (by a hash of the id): 85% completed, 4% failed by the
// renter's code after running (billed), 1% completed on a second attempt
// after a provider never picked them up, 1% failed after three providers
// went silent (released), 7% cancelled by their renter while queued
// (released), 2% cancelled while running (billed). 2% of the completed jobs
// grew their hold once while running.
//
// Secondary indexes of the big tables are dropped while rows go in and built
// again afterwards (the same definitions, read from the catalog), and
// triggers are off for the seeding transaction (session_replication_role):
// what they keep is written here directly.
import type { Sql, Tx } from "../src/db/index.js";
import { validateParams } from "../src/domain/jobs/job-schemas.js";
import { buildTaskSpec, modelOf, normalizeContainerSpec } from "../src/domain/jobs/task-spec.js";
import { RATE_HALALA_PER_MINUTE, type JobType } from "../src/domain/money/pricing.js";

export interface SeedShape {
  jobs: number;
  renters: number;
  providers: number;
  /** Submit times spread evenly over this many days, ending an hour ago. */
  days: number;
}

/** Renters the bench acts as: the heavy one and light ones (they get API keys and large quotas). */
export const HEAVY_RENTER = 1;
export const LIGHT_RENTERS = Array.from({ length: 50 }, (_, i) => 101 + i);
/** Providers the bench brings online (they ran 1% of the history each). */
export const LIVE_PROVIDERS = Array.from({ length: 4 }, (_, i) => 1 + i);
/** What every renter has available after its history. */
export const FINAL_AVAILABLE_HALALA = 100_000_000;

export const renterKey = (id: number) => `svc-renter-history-bench-${id}`;
export const providerKey = (id: number) => `svc-provider-history-bench-${id}`;

const JOB_TYPES: JobType[] = ["benchmark", "llm-inference", "image_generation", "training"];
const SAMPLE_PARAMS: Partial<Record<JobType, Record<string, unknown>>> = {
  "llm-inference": { prompt: "Summarise the quarterly report in three bullet points", max_tokens: 256 },
  image_generation: { prompt: "a lighthouse at dusk, oil painting" },
};
const DURATIONS = [1, 2, 5, 10, 30];
const GPU = { model: "NVIDIA H100 80GB HBM3", count: 1, vram_mib: 81559, driver_version: "550.54.15", uuids: ["GPU-0"] };

/** The big tables whose secondary indexes are rebuilt after the rows are in. */
const BULK_TABLES = ["jobs", "job_attempts", "ledger_holds", "ledger_transfers"];

/** Per job type: what submit would have written (params, container spec, task spec with a JOB placeholder). */
async function jobTypeRows(sql: Sql) {
  const rows = [];
  for (const [i, t] of JOB_TYPES.entries()) {
    const params = validateParams(t, SAMPLE_PARAMS[t], { defaultImage: true });
    const containerSpec = await normalizeContainerSpec(sql, t, undefined);
    const model = modelOf(t, params);
    const taskSpec = buildTaskSpec({
      jobId: "JOB", jobType: t, params, containerSpec, gpuRequirements: null, maxDurationSeconds: 3600,
      workspaceVolumeName: "svc-ws-JOB", checkpointEnabled: false, model,
    });
    rows.push({ i, t, rate: RATE_HALALA_PER_MINUTE[t], params, containerSpec, taskSpec, model, pricingClass: containerSpec.pricing_class as string });
  }
  return rows;
}

async function dropSecondaryIndexes(tx: Tx): Promise<string[]> {
  const indexes = await tx<{ name: string; def: string }[]>`
    SELECT i.indexrelid::regclass::text AS name, pg_get_indexdef(i.indexrelid) AS def
    FROM pg_index i
    WHERE i.indrelid = ANY(${BULK_TABLES}::regclass[]) AND NOT i.indisprimary
      AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid)`;
  const uniques = await tx<{ tbl: string; name: string; def: string }[]>`
    SELECT conrelid::regclass::text AS tbl, conname AS name, pg_get_constraintdef(oid) AS def
    FROM pg_constraint WHERE conrelid = ANY(${BULK_TABLES}::regclass[]) AND contype = 'u'`;
  for (const i of indexes) await tx.unsafe(`DROP INDEX ${i.name}`);
  for (const u of uniques) await tx.unsafe(`ALTER TABLE ${u.tbl} DROP CONSTRAINT ${u.name}`);
  return [...uniques.map((u) => `ALTER TABLE ${u.tbl} ADD CONSTRAINT ${u.name} ${u.def}`), ...indexes.map((i) => i.def)];
}

/**
 * Writes the history into a migrated, empty database. With `jobs: 0` it
 * writes the same renters, providers, keys and balances and no history: the
 * empty side of an A/B.
 */
export async function seedHistory(sql: Sql, shape: SeedShape, note: (msg: string) => void): Promise<void> {
  const { jobs: N, renters: R, providers: P, days: D } = shape;
  if (R < Math.max(...LIGHT_RENTERS) || P < 20) throw new Error(`at least ${Math.max(...LIGHT_RENTERS)} renters and 20 providers`);
  const types = await jobTypeRows(sql);
  const t0 = performance.now();
  const step = (what: string) => note(`  ${what} (${Math.round((performance.now() - t0) / 1000)} s)`);
  await sql.begin(async (tx) => {
    await tx`SET LOCAL session_replication_role = replica`;
    await tx`SET LOCAL maintenance_work_mem = '1GB'`;
    await tx`SET LOCAL work_mem = '256MB'`;
    await tx`SET LOCAL synchronous_commit = off`;
    await tx`SET LOCAL wal_compression = on`;
    const rebuild = N > 0 ? await dropSecondaryIndexes(tx) : [];
    const [acc] = await tx<{ fees: number; gateway: number }[]>`
      SELECT (SELECT id FROM ledger_accounts WHERE kind = 'platform_fees') AS fees, (SELECT id FROM ledger_accounts WHERE kind = 'gateway') AS gateway`;
    // Account ids: renter r's available 2r+2 and held 2r+3, provider p's earnings 2R+3+p (above the system accounts 1-3).
    const heavy = [1, 2, 3, 4, 5, ...LIGHT_RENTERS];
    await tx`
      INSERT INTO renters (id, name, email, created_at)
      SELECT g, 'History renter ' || g, 'renter-' || g || '@history.bench.example', now() - make_interval(days => ${D + 1}) FROM generate_series(1, ${R}) g`;
    await tx`SELECT setval('renters_id_seq', ${R})`;
    await tx`
      INSERT INTO renter_quota (renter_id, daily_jobs_limit, monthly_spend_limit_halala)
      SELECT g, CASE WHEN g = ANY(${heavy}::bigint[]) THEN 10000000 ELSE 500 END,
                CASE WHEN g = ANY(${heavy}::bigint[]) THEN 1000000000000 ELSE 10000000 END
      FROM generate_series(1, ${R}) g`;
    await tx`
      INSERT INTO providers (id, name, email, gpu_model, os, status, approval_status, approved_at, gpu_count, gpu_vram_mib,
                             first_heartbeat_at, last_heartbeat, status_since, daemon_version, reliability_score, uptime_percent,
                             reputation_at, created_at)
      SELECT g, 'History rig ' || g, 'rig-' || g || '@history.bench.example', ${GPU.model}, 'linux', 'offline', 'approved',
             now() - make_interval(days => ${D + 1}), 1, ${GPU.vram_mib},
             now() - make_interval(days => ${D}), now() - make_interval(mins => 10 + g % 2000), now() - make_interval(mins => 8 + g % 2000),
             '5.0.0', 80 + (g % 20), 50 + (g % 50), now() - interval '1 hour', now() - make_interval(days => ${D + 1})
      FROM generate_series(1, ${P}) g`;
    await tx`SELECT setval('providers_id_seq', ${P})`;
    await tx`INSERT INTO provider_load (provider_id, active) SELECT g, 0 FROM generate_series(1, ${P}) g`;
    await tx`
      INSERT INTO ledger_accounts (id, kind, owner_id)
      SELECT 2 * g + 2, 'renter_available', g FROM generate_series(1, ${R}) g
      UNION ALL SELECT 2 * g + 3, 'renter_held', g FROM generate_series(1, ${R}) g
      UNION ALL SELECT 2 * ${R} + 3 + g, 'provider_earnings', g FROM generate_series(1, ${P}) g`;
    await tx`SELECT setval('ledger_accounts_id_seq', ${2 * R + 3 + P})`;
    // Keys hashed as hashKey() does (SHA-256 of the key's text).
    await tx`
      INSERT INTO api_keys (key_hash, role, renter_id)
      SELECT sha256(convert_to(k, 'UTF8')), 'renter', id FROM unnest(${heavy.map(renterKey)}::text[], ${heavy}::bigint[]) AS x(k, id)`;
    await tx`
      INSERT INTO api_keys (key_hash, role, provider_id)
      SELECT sha256(convert_to(k, 'UTF8')), 'provider', id FROM unnest(${LIVE_PROVIDERS.map(providerKey)}::text[], ${LIVE_PROVIDERS}::bigint[]) AS x(k, id)`;
    // Heartbeat coverage of the last day (reputation reads a 24 h window).
    await tx`
      INSERT INTO provider_uptime (provider_id, hour, covered_seconds)
      SELECT p, date_trunc('hour', now()) - make_interval(hours => h), 3000 + (p % 600)
      FROM generate_series(1, ${P}) p, generate_series(1, 24) h`;
    step("accounts");

    if (N > 0) {
      await tx`
        CREATE TEMP TABLE seed_types ON COMMIT DROP AS
        SELECT i, job_type, rate, params::jsonb AS params, container_spec::jsonb AS container_spec, task_spec::jsonb AS task_spec, model, pricing_class
        FROM unnest(${types.map((t) => t.i)}::int[], ${types.map((t) => t.t)}::text[], ${types.map((t) => t.rate)}::bigint[],
                    ${types.map((t) => JSON.stringify(t.params))}::text[], ${types.map((t) => JSON.stringify(t.containerSpec))}::text[],
                    ${types.map((t) => JSON.stringify(t.taskSpec))}::text[], ${types.map((t) => t.model)}::text[], ${types.map((t) => t.pricingClass)}::text[])
          AS x(i, job_type, rate, params, container_spec, task_spec, model, pricing_class)`;
      // One row per job, its fate drawn from hashes of its id (the same on every run).
      await tx`
        CREATE TEMP TABLE seed_jobs ON COMMIT DROP AS
        WITH h AS (
          SELECT g,
                 (hashint8(g) & 2147483647) % 10000 AS fate,
                 (hashint8(g * 3 + 1) & 2147483647) % 1000000 AS who,
                 (hashint8(g * 5 + 2) & 2147483647) % 1000000 AS rig,
                 (hashint8(g * 7 + 3) & 2147483647) % 1000 AS kind,
                 (hashint8(g * 11 + 4) & 2147483647) % 1000 AS ran
          FROM generate_series(1, ${N}) g
        ), f AS (
          SELECT g, kind, ran,
                 CASE WHEN who < 100000 THEN 1 WHEN who < 140000 THEN 2 + who % 4 ELSE 6 + who % ${R - 5} END AS renter_id,
                 CASE WHEN rig < 100000 THEN 1 + rig % 10 ELSE 11 + rig % ${P - 10} END AS provider_id,
                 CASE WHEN fate < 8500 THEN 'completed' WHEN fate < 8900 THEN 'runtime_error' WHEN fate < 9000 THEN 'completed_requeued'
                      WHEN fate < 9100 THEN 'provider_silent' WHEN fate < 9800 THEN 'cancelled_queued' ELSE 'cancelled_running' END AS fate,
                 fate < 170 AS extended,
                 (${DURATIONS}::int[])[1 + (kind / 4) % ${DURATIONS.length}] AS duration
          FROM h
        )
        SELECT f.*, t.job_type, t.rate,
               now() - interval '1 hour' - make_interval(secs => ${D * 86400}::float8 * (${N} - g) / ${N}) AS submitted_at,
               f.fate NOT IN ('cancelled_queued', 'provider_silent') AS billed,
               CASE f.fate WHEN 'completed_requeued' THEN 2 WHEN 'provider_silent' THEN 3 ELSE 1 END AS attempt,
               t.rate * f.duration AS estimate,
               t.rate * f.duration + CASE WHEN f.extended AND f.fate = 'completed' THEN 5 * t.rate ELSE 0 END AS held,
               CASE WHEN f.extended AND f.fate = 'completed' THEN f.duration + 1 + f.ran % 5 ELSE 1 + f.ran % f.duration END AS minutes
        FROM f JOIN seed_types t ON t.i = f.kind % ${types.length}`;
      step("job fates");
      await tx`
        INSERT INTO jobs (id, job_id, renter_id, provider_id, job_type, status, priority, duration_minutes, max_duration_seconds,
                          rate_halala_per_minute, cost_halala, held_halala, actual_cost_halala, provider_earned_halala, platform_fee_halala,
                          actual_minutes, params, container_spec, task_spec, task_spec_hmac, model, pricing_class, attempt,
                          submitted_at, assigned_at, started_at, completed_at, timeout_at, result, error, end_reason, fault,
                          progress_pct, updated_at)
        SELECT s.g, s.job_id,
               s.renter_id, CASE WHEN s.fate = 'cancelled_queued' THEN NULL ELSE s.provider_id END, s.job_type,
               CASE s.fate WHEN 'completed' THEN 'completed' WHEN 'completed_requeued' THEN 'completed'
                           WHEN 'runtime_error' THEN 'failed' WHEN 'provider_silent' THEN 'failed' ELSE 'cancelled' END,
               2, s.duration, 3600, s.rate, s.estimate, CASE WHEN s.held > s.estimate THEN s.held END,
               s.cost, s.earned, s.cost - s.earned, CASE WHEN s.billed THEN s.minutes ELSE 0 END,
               t.params, t.container_spec,
               jsonb_set(jsonb_set(t.task_spec, '{job_id}', to_jsonb(s.job_id)), '{workspace,volume}', to_jsonb('svc-ws-' || s.job_id)),
               md5(s.job_id) || md5(s.job_id || ':'), t.model, t.pricing_class, s.attempt,
               s.submitted_at, s.assigned_at, s.started_at, s.ended_at,
               CASE WHEN s.fate IN ('completed', 'completed_requeued') THEN s.assigned_at + interval '3600 seconds' END,
               CASE WHEN s.fate IN ('completed', 'completed_requeued') THEN '{"response": "done", "tokens": 128}'::jsonb END,
               CASE s.fate WHEN 'runtime_error' THEN 'exit code 1: CUDA out of memory'
                           WHEN 'provider_silent' THEN 'provider stopped responding (no heartbeat in the last 120 seconds); gave up after 3 attempts'
                           WHEN 'cancelled_queued' THEN 'cancelled by renter' WHEN 'cancelled_running' THEN 'cancelled by renter' END,
               s.end_reason, s.fault,
               CASE WHEN s.fate IN ('completed', 'completed_requeued') THEN 100 END, s.ended_at
        FROM (
          SELECT j.*, 'job-h' || lpad(j.g::text, 10, '0') AS job_id,
                 CASE WHEN j.billed THEN least(j.rate * j.minutes, j.held) ELSE 0 END AS cost,
                 CASE WHEN j.billed THEN (least(j.rate * j.minutes, j.held) * 75) / 100 ELSE 0 END AS earned,
                 CASE WHEN j.fate = 'cancelled_queued' THEN NULL ELSE j.submitted_at + make_interval(secs => 1 + j.attempt) END AS assigned_at,
                 CASE WHEN j.fate IN ('cancelled_queued', 'provider_silent') THEN NULL ELSE j.submitted_at + make_interval(secs => 4 + j.attempt) END AS started_at,
                 j.submitted_at + make_interval(secs => 4 + j.attempt + CASE WHEN j.billed THEN j.minutes * 60 - 7 ELSE 60 END) AS ended_at,
                 CASE j.fate WHEN 'runtime_error' THEN 'runtime_error' WHEN 'provider_silent' THEN 'provider_silent'
                             WHEN 'cancelled_queued' THEN 'renter_cancelled' WHEN 'cancelled_running' THEN 'renter_cancelled' ELSE 'completed' END AS end_reason,
                 CASE j.fate WHEN 'runtime_error' THEN 'renter' WHEN 'provider_silent' THEN 'provider'
                             WHEN 'cancelled_queued' THEN 'renter' WHEN 'cancelled_running' THEN 'renter' ELSE 'none' END AS fault
          FROM seed_jobs j
        ) s JOIN seed_types t ON t.job_type = s.job_type`;
      await tx`SELECT setval('jobs_id_seq', ${N})`;
      step("jobs");
      // Attempts: the last one on the job's provider; earlier ones (a provider that never picked
      // the job up, or went silent) on other providers, handed back to the queue.
      await tx`
        INSERT INTO job_attempts (job_id, attempt, provider_id, status, assigned_at, started_at, ended_at, end_reason, fault, cost_halala, error, gpu)
        SELECT j.id, k, CASE WHEN k = j.attempt THEN j.provider_id ELSE 11 + (j.provider_id + k * 7919) % ${P - 10} END,
               CASE WHEN k = j.attempt THEN j.status ELSE 'requeued' END,
               j.submitted_at + make_interval(secs => 1 + k), CASE WHEN k = j.attempt THEN j.started_at END,
               CASE WHEN k = j.attempt THEN j.completed_at ELSE j.submitted_at + make_interval(secs => 1 + k, mins => 2) END,
               CASE WHEN k = j.attempt THEN j.end_reason WHEN j.status = 'completed' THEN 'not_picked_up' ELSE 'provider_silent' END,
               CASE WHEN k = j.attempt THEN j.fault ELSE 'provider' END,
               CASE WHEN k = j.attempt THEN j.actual_cost_halala ELSE 0 END,
               CASE WHEN k = j.attempt THEN j.error END,
               ${JSON.stringify(GPU)}::jsonb
        FROM jobs j, generate_series(1, j.attempt) k
        WHERE j.provider_id IS NOT NULL`;
      step("attempts");
      await tx`
        INSERT INTO ledger_holds (job_id, renter_id, amount, status, provider_id, cost, provider_earned, platform_fee, created_at, closed_at)
        SELECT id, renter_id, coalesce(held_halala, cost_halala), CASE WHEN actual_cost_halala > 0 THEN 'settled' ELSE 'released' END,
               CASE WHEN actual_cost_halala > 0 THEN provider_id END,
               CASE WHEN actual_cost_halala > 0 THEN actual_cost_halala END, CASE WHEN actual_cost_halala > 0 THEN provider_earned_halala END,
               CASE WHEN actual_cost_halala > 0 THEN platform_fee_halala END, submitted_at, completed_at
        FROM jobs`;
      step("holds");
      // The entries, in job order (the scan's): the hold (and its growth), then the settlement's legs (those
      // above 0: the ledger writes no empty transfer) or the whole hold released.
      await tx`
        INSERT INTO ledger_transfers (debit_account_id, credit_account_id, amount, kind, idempotency_key, job_id, created_at)
        SELECT debit, credit, amount, kind, key, job_id, created_at FROM (
          SELECT j.id AS job_id, l.ord, l.debit, l.credit, l.amount, l.kind, l.key, l.created_at
          FROM jobs j, LATERAL (VALUES
            (1, 2 * j.renter_id + 2, 2 * j.renter_id + 3, j.cost_halala, 'hold', 'hold:job:' || j.id, j.submitted_at),
            (2, 2 * j.renter_id + 2, 2 * j.renter_id + 3, coalesce(j.held_halala - j.cost_halala, 0), 'hold',
                'hold:job:' || j.id || ':to:' || j.held_halala, j.started_at + interval '4 minutes'),
            (3, 2 * j.renter_id + 3, ${2 * R + 3} + j.provider_id, j.provider_earned_halala, 'charge_provider', 'settle:job:' || j.id || ':provider', j.completed_at),
            (4, 2 * j.renter_id + 3, ${acc.fees}, j.platform_fee_halala, 'charge_platform', 'settle:job:' || j.id || ':platform', j.completed_at),
            (5, 2 * j.renter_id + 3, 2 * j.renter_id + 2,
                CASE WHEN j.actual_cost_halala > 0 THEN coalesce(j.held_halala, j.cost_halala) - j.actual_cost_halala END, 'release',
                'settle:job:' || j.id || ':remainder', j.completed_at),
            (6, 2 * j.renter_id + 3, 2 * j.renter_id + 2,
                CASE WHEN j.actual_cost_halala = 0 THEN coalesce(j.held_halala, j.cost_halala) END, 'release', 'release:job:' || j.id, j.completed_at)
          ) AS l(ord, debit, credit, amount, kind, key, created_at)
          WHERE l.amount > 0
        ) t`;
      step("ledger entries");
    }
    // Top-ups: each renter paid in what its history cost plus what it has left.
    await tx`
      CREATE TEMP TABLE seed_renters ON COMMIT DROP AS
      SELECT r AS renter_id, coalesce(s.spent, 0) AS spent, coalesce(s.n, 0) AS n
      FROM generate_series(1, ${R}) r
      LEFT JOIN (SELECT renter_id, sum(actual_cost_halala)::bigint AS spent, count(*) AS n FROM jobs GROUP BY renter_id) s ON s.renter_id = r`;
    await tx`
      INSERT INTO ledger_transfers (debit_account_id, credit_account_id, amount, kind, idempotency_key, created_at)
      SELECT ${acc.gateway}, 2 * renter_id + 2, spent + ${FINAL_AVAILABLE_HALALA}, 'topup', 'topup:history:' || renter_id, now() - make_interval(days => ${D + 1})
      FROM seed_renters`;
    await tx`
      UPDATE renters r SET total_spent_halala = s.spent, total_jobs = s.n FROM seed_renters s WHERE r.id = s.renter_id`;
    await tx`UPDATE ledger_accounts SET balance = ${FINAL_AVAILABLE_HALALA} WHERE kind = 'renter_available'`;
    if (N > 0) {
      await tx`
        UPDATE ledger_accounts a SET balance = e.earned
        FROM (SELECT provider_id, sum(provider_earned_halala)::bigint AS earned FROM jobs WHERE actual_cost_halala > 0 GROUP BY 1) e
        WHERE a.kind = 'provider_earnings' AND a.owner_id = e.provider_id`;
      await tx`
        UPDATE providers p SET total_earnings_halala = e.earned, total_jobs = e.n
        FROM (SELECT provider_id, sum(provider_earned_halala)::bigint AS earned, count(*) AS n FROM jobs WHERE actual_cost_halala > 0 GROUP BY 1) e
        WHERE p.id = e.provider_id`;
      await tx`
        INSERT INTO renter_daily_jobs (renter_id, day, jobs)
        SELECT renter_id, (submitted_at AT TIME ZONE 'UTC')::date, count(*) FROM jobs GROUP BY 1, 2`;
      await tx`
        INSERT INTO renter_job_ends (renter_id, status, job_type, jobs)
        SELECT renter_id, status, job_type, count(*) FROM jobs WHERE status IN ('completed', 'failed', 'cancelled') GROUP BY 1, 2, 3`;
      await tx`
        INSERT INTO job_ends (status, job_type, shard, jobs)
        SELECT status, job_type, id % 16, count(*) FROM jobs WHERE status IN ('completed', 'failed', 'cancelled') GROUP BY 1, 2, 3`;
      await tx`
        INSERT INTO provider_job_ends (provider_id, status, job_type, jobs)
        SELECT provider_id, status, job_type, count(*) FROM jobs
        WHERE status IN ('completed', 'failed', 'cancelled') AND provider_id IS NOT NULL GROUP BY 1, 2, 3`;
      step("balances and counters");
      for (const def of rebuild) await tx.unsafe(def);
      step("indexes rebuilt");
    }
  });
}
