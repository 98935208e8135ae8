// Reads of the active jobs on a busy fleet: the job sweep
// (src/workers/job-timeouts.ts: every SVC_JOB_SWEEP_MS, 1 s by default, in
// every server process), what one pass costs when it has nothing to do, as it
// has almost every second; and the serving endpoints every /v1 request reads
// (src/http/v1/endpoints.ts).
//
//   npm run bench:sweeps [-- --providers 100000 --pending 10000 --serving 10 --passes 20]
//
// - Database: a fresh one on DATABASE_URL (dropped afterwards), otherwise an
//   embedded PostgreSQL; migrated, then seeded in set-based SQL: `--providers`
//   providers approved and heartbeating, each running one job (picked up,
//   paid for well past now), `--pending` more jobs assigned a moment ago and
//   not picked up yet, and `--serving` vllm_serve jobs with their endpoints
//   up; 1,000 renters own them.
// - Timed in this process, in turn, `--passes` of each:
//   - the steady sweep pass, as the worker runs it most seconds
//     (`sweepJobs(sql, { lostJobs: false })`);
//   - the whole pass, with the safety net that looks for jobs held by
//     providers that are no longer live (`sweepJobs(sql)`, every
//     LOST_JOBS_SWEEP_SECONDS);
//   - a read of the serving endpoints.
//   Reported for each: wall time (p50, max) and the database's CPU (its
//   backends' CPU time). A sweep pass must find nothing to do here, and the
//   read every serving endpoint: the bench fails otherwise.
// The last line printed is one JSON object with the figures.
import { parseArgs } from "node:util";
import { connect, type Sql } from "../src/db/index.js";
import { migrate } from "../src/db/migrate.js";
import { sweepJobs, type SweepResult } from "../src/workers/job-timeouts.js";
import { servingEndpoints } from "../src/http/v1/endpoints.js";
import { benchDatabase, databaseCpuMeter, machine, noter, percentile } from "./lib.js";

const { values: args } = parseArgs({
  options: {
    providers: { type: "string", default: "100000" },
    pending: { type: "string", default: "10000" },
    serving: { type: "string", default: "10" },
    passes: { type: "string", default: "20" },
  },
});
const PROVIDERS = Number(args.providers);
const PENDING = Number(args.pending);
const SERVING = Number(args.serving);
const PASSES = Number(args.passes);
const RENTERS = 1000;
const note = noter("bench:sweeps");

async function seed(sql: Sql): Promise<void> {
  await sql`
    INSERT INTO renters (name, email) SELECT 'renter ' || g, 'renter' || g || '@example.com' FROM generate_series(1, ${RENTERS}) g`;
  await sql`
    INSERT INTO providers (name, email, gpu_model, os, status, approval_status, approved_at, last_heartbeat, gpu_count, gpu_vram_mib)
    SELECT 'rig ' || g, 'rig' || g || '@example.com', 'RTX 4090', 'linux', 'online', 'approved', now(), now(), 1, 24576
    FROM generate_series(1, ${PROVIDERS}) g`;
  // Running for ten minutes of a two-hour estimate (paid far past now), then the ones just assigned.
  await sql`
    INSERT INTO jobs (job_id, renter_id, provider_id, job_type, status, duration_minutes, max_duration_seconds,
                      rate_halala_per_minute, cost_halala, submitted_at, assigned_at, started_at, acked_at, timeout_at)
    SELECT 'job-sweep-' || g, 1 + g % ${RENTERS}, g, 'benchmark', 'running', 120, 7200, 10, 1200,
           now() - interval '11 minutes', now() - interval '11 minutes', now() - interval '10 minutes', now() - interval '10 minutes',
           now() + interval '110 minutes'
    FROM generate_series(1, ${PROVIDERS}) g`;
  await sql`
    INSERT INTO jobs (job_id, renter_id, provider_id, job_type, status, duration_minutes, max_duration_seconds,
                      rate_halala_per_minute, cost_halala, submitted_at, assigned_at, timeout_at)
    SELECT 'job-sweep-pending-' || g, 1 + g % ${RENTERS}, 1 + g % ${PROVIDERS}, 'benchmark', 'pending', 120, 7200, 10, 1200,
           now(), now(), now() + interval '120 minutes'
    FROM generate_series(1, ${PENDING}) g`;
  await sql`
    INSERT INTO jobs (job_id, renter_id, provider_id, job_type, status, duration_minutes, max_duration_seconds,
                      rate_halala_per_minute, cost_halala, model, endpoint_url, submitted_at, assigned_at, started_at, acked_at, timeout_at)
    SELECT 'job-sweep-serving-' || g, 1 + g % ${RENTERS}, g, 'vllm_serve', 'running', 120, 7200, 10, 1200,
           'bench-model', 'http://127.0.0.1:9/' || g, now(), now(), now(), now(), now() + interval '120 minutes'
    FROM generate_series(1, ${SERVING}) g`;
  await sql`VACUUM ANALYZE`;
}

function mustBeIdle(r: SweepResult): void {
  if (!Object.values(r).every((n) => n === 0)) throw new Error(`a sweep pass acted on the seeded jobs: ${JSON.stringify(r)}`);
}

async function main() {
  const db = await benchDatabase("svc_bench_sweeps", note);
  const sql = connect(db.url, 4);
  try {
    await migrate(sql);
    const t0 = performance.now();
    await seed(sql);
    note(`seeded ${PROVIDERS} running jobs on as many providers and ${PENDING} pending ones in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
    const kinds = {
      steady: () => sweepJobs(sql, { lostJobs: false }).then(mustBeIdle),
      whole: () => sweepJobs(sql).then(mustBeIdle),
      serving: async () => {
        const found = (await servingEndpoints(sql)).length;
        if (found !== SERVING) throw new Error(`read ${found} serving endpoints, seeded ${SERVING}`);
      },
    } as const;
    type Kind = keyof typeof kinds;
    const times: Record<Kind, number[]> = { steady: [], whole: [], serving: [] };
    const dbCpu: Record<Kind, number> = { steady: 0, whole: 0, serving: 0 };
    // One of each first, untimed: plans made, pages read into the cache.
    for (const run of Object.values(kinds)) await run();
    for (let i = 0; i < PASSES; i++) {
      for (const kind of Object.keys(kinds) as Kind[]) {
        const meter = await databaseCpuMeter(sql, db.name);
        const started = performance.now();
        await kinds[kind]();
        times[kind].push(performance.now() - started);
        dbCpu[kind] += (await meter()).own;
      }
    }
    const figures = (kind: Kind) => ({
      p50_ms: Number(percentile(times[kind], 50)!.toFixed(2)),
      max_ms: Number(Math.max(...times[kind]).toFixed(2)),
      database_cpu_ms: Number(((dbCpu[kind] * 1000) / PASSES).toFixed(2)),
    });
    console.log(JSON.stringify({
      benchmark: "sweeps",
      providers: PROVIDERS,
      running_jobs: PROVIDERS,
      pending_jobs: PENDING,
      serving_jobs: SERVING,
      passes: PASSES,
      sweep_steady: figures("steady"),
      sweep_whole: figures("whole"),
      serving_endpoints_read: figures("serving"),
      machine: machine(),
      database: db.kind,
    }));
  } finally {
    await sql.end();
    await db.close();
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
