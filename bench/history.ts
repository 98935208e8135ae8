// Growth with history: the same measurements on a database holding millions
// of ended jobs and on one holding none, in one run, and their ratios.
//
//   npm run bench:history [-- --jobs 10000000 --keep]          seed, measure, keep the seeded database
//   npm run bench:history [-- --reuse svc_bench_history_xxxx]   measure on a kept one (migrated first)
//
// - Databases: on DATABASE_URL (or an embedded PostgreSQL). The history side
//   is migrated to the schema the seed knows (SEED_SCHEMA), seeded in
//   set-based SQL (bench/history-seed.ts: renters, providers, jobs with their
//   attempts, holds and ledger entries; the ledger audit must find it sound),
//   then migrated to the end, each later migration timed (that is what it
//   costs a deployment with this history to start). The empty side gets the
//   same renters, providers, keys and balances, and no jobs. Both are then
//   brought to what a running deployment holds: the retention sweep deletes
//   the reputation rows past their window (the seed writes 180 days of them;
//   a server runs the sweep at start and hourly), and VACUUM ANALYZE does
//   autovacuum's work, which this server may not do. Without it, the
//   history's reliability refresh read the deleted days' dead rows: 86 ms for
//   1,000 providers against 23 ms after a VACUUM.
// - Servers: one server (the build) per database (rate limits off, the periodic
//   ledger audit off: it reads the whole ledger), both running their sweeps.
// - Measured, in `--rounds` rounds alternating which side goes first:
//   submits in a closed loop (`--connections`, `--seconds`, and no more than
//   the live providers' free GPUs take: SUBMITS_PER_PHASE) by the heavy
//   renter (a tenth of the history) and by light renters; the first page of
//   GET /api/jobs for the heavy renter and a light one (what each held is
//   reported under `first_pages`); each periodic sweep
//   timed in this process on its own pool (the job sweep, the liveness sweep,
//   the queue pass, and the reliability refresh of 1,000 providers, the
//   liveness sweep's batch), the admin dashboard (the console reads it
//   every 10 s) and the platform's daily figures of 14 days (every 30 s).
//   The submitted jobs are cancelled after each round.
// The last line printed is one JSON object with the figures and the ratios
// (history / empty).
import crypto from "node:crypto";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import { parseArgs } from "node:util";
import type { Sql } from "../src/db/index.js";
import { connect } from "../src/db/index.js";
import { migrate, migrationFiles } from "../src/db/migrate.js";
import { auditLedger } from "../src/domain/money/ledger-audit.js";
import { dashboard } from "../src/domain/admin/dashboard.js";
import { platformByDay } from "../src/domain/money/daily-reports.js";
import { endLocked, isActive, lockJobById } from "../src/domain/money/settlement.js";
import { dispatchQueued } from "../src/domain/dispatch/dispatch.js";
import { markSilentProvidersOffline } from "../src/domain/dispatch/liveness-sweep.js";
import { refreshDueReputations, refreshReputation } from "../src/domain/providers/reputation.js";
import { deleteExpiredReputationRows } from "../src/domain/providers/retention.js";
import { sweepJobs } from "../src/workers/job-timeouts.js";
import { HEAVY_RENTER, LIGHT_RENTERS, LIVE_PROVIDERS, providerKey, renterKey, seedHistory, type SeedShape } from "./history-seed.js";
import { answerSplitter, benchDatabase, machine, noter, percentile, pool, startServers, type BenchDatabase, type BenchServers } from "./lib.js";

const { values: args } = parseArgs({
  options: {
    jobs: { type: "string", default: "10000000" },
    renters: { type: "string", default: "100000" },
    providers: { type: "string", default: "10000" },
    days: { type: "string", default: "180" },
    keep: { type: "boolean", default: false },
    reuse: { type: "string" },
    rounds: { type: "string", default: "3" },
    seconds: { type: "string", default: "6" },
    connections: { type: "string", default: "4" },
    lists: { type: "string", default: "100" },
    sweeps: { type: "string", default: "10" },
    "seed-only": { type: "boolean", default: false },
    "no-audit": { type: "boolean", default: false },
  },
});
const SHAPE: SeedShape = { jobs: Number(args.jobs), renters: Number(args.renters), providers: Number(args.providers), days: Number(args.days) };
const ROUNDS = Number(args.rounds);
const SECONDS = Number(args.seconds);
const CONNECTIONS = Number(args.connections);
const LISTS = Number(args.lists);
const SWEEPS = Number(args.sweeps);
/** The last migration whose schema bench/history-seed.ts writes; later ones run on the seeded rows. */
const SEED_SCHEMA = 24;
const ADMIN_TOKEN = `bench-admin-${crypto.randomBytes(12).toString("hex")}`;
/** The provider that takes one job at a time: jobs pinned to it wait in the queue. */
const NARROW_PROVIDER = LIVE_PROVIDERS[LIVE_PROVIDERS.length - 1];
const QUEUED_PER_ROUND = 20;
/** GPUs of each other live provider (the most a heartbeat reports). */
const WIDE_GPUS = 1024;
/**
 * Submits per phase at most (the warm-up, the heavy renter's, the light renters'): together they fit
 * the live providers' free GPUs, so both sides' rounds end with the same jobs running and none queued
 * but the pinned ones. Bounded by time alone, the faster side submitted more in a round, and its last
 * jobs (the light renters' first pages) queued behind a full fleet, with their queue reasons to read.
 */
const SUBMITS_PER_PHASE = Math.floor(((LIVE_PROVIDERS.length - 1) * WIDE_GPUS) / 3) - 10;

const note = noter("bench:history");
const seconds = (ms: number) => Math.round(ms / 100) / 10;
const loadAverage = () => os.loadavg().map((l) => Math.round(l * 100) / 100);

// ---- set-up ----

/** The remaining migrations one at a time, each timed. */
async function migrateRest(sql: Sql): Promise<{ migration: string; s: number }[]> {
  const done = new Set((await sql<{ version: number }[]>`SELECT version FROM schema_migrations`).map((r) => r.version));
  const timed: { migration: string; s: number }[] = [];
  for (const m of migrationFiles().filter((f) => !done.has(f.version))) {
    const t = performance.now();
    await sql.begin((tx) => tx.unsafe(fs.readFileSync(m.file, "utf8")).then(() => tx`INSERT INTO schema_migrations (version, name) VALUES (${m.version}, ${m.name})`));
    timed.push({ migration: m.name, s: seconds(performance.now() - t) });
    note(`  migration ${m.name}: ${seconds(performance.now() - t)} s`);
  }
  if ((await migrate(sql)).length > 0) throw new Error("migrations left after migrating");
  return timed;
}

interface Prepared {
  db: BenchDatabase;
  seedS?: number;
  migrations: { migration: string; s: number }[];
  audit?: { s: number; entries: number; drift: number; discrepancies: number };
}

async function prepareHistory(): Promise<Prepared> {
  const db = await benchDatabase("svc_bench_history", note, 54500, { reuse: args.reuse, keep: args.keep });
  try {
    return await prepareHistoryIn(db);
  } catch (err) {
    await db.close({ drop: !db.reused }); // a half-seeded database is of no use
    throw err;
  }
}

async function prepareHistoryIn(db: BenchDatabase): Promise<Prepared> {
  const sql = db.sql;
  if (db.reused) {
    const [shape] = await sql<SeedShape[]>`SELECT jobs, renters, providers, days FROM bench_history_seed`;
    Object.assign(SHAPE, shape);
    note(`reusing ${db.name}: ${JSON.stringify(shape)}`);
    const migrations = await migrateRest(sql);
    await cleanUp(sql);
    await steadyState(sql);
    return { db, migrations };
  }
  note(`seeding ${db.name}: ${JSON.stringify(SHAPE)}`);
  const t = performance.now();
  await migrate(sql, { through: SEED_SCHEMA });
  await seedHistory(sql, SHAPE, note);
  await sql`CREATE TABLE bench_history_seed AS SELECT ${SHAPE.jobs}::bigint AS jobs, ${SHAPE.renters}::int AS renters,
                   ${SHAPE.providers}::int AS providers, ${SHAPE.days}::int AS days, now() AS seeded_at`;
  const seedS = seconds(performance.now() - t);
  note(`seeded in ${seedS} s; migrating the rest`);
  const migrations = await migrateRest(sql);
  await steadyState(sql);
  let audit: Prepared["audit"];
  if (!args["no-audit"]) {
    const a = performance.now();
    const r = await auditLedger(sql);
    audit = { s: seconds(performance.now() - a), entries: r.entries, drift: r.driftHalala, discrepancies: r.discrepancyCount };
    note(`ledger audit: ${JSON.stringify(audit)}`);
    if (r.driftHalala !== 0 || r.discrepancyCount !== 0) throw new Error(`the seeded books are off: ${JSON.stringify(r.discrepancies.slice(0, 3))}`);
  }
  return { db, seedS, migrations, audit };
}

/**
 * What a running deployment's database holds: expired reputation rows deleted (the retention sweep),
 * then vacuumed and analyzed. Index cleanup is forced: VACUUM skips it when under 2% of a table's
 * pages hold dead rows, so on a database measured before (`--reuse`) the index entries of the jobs
 * earlier rounds cancelled stayed, and every later read of the active jobs' indexes visited them
 * (2,354 dead entries for the safety net's read of one pass, after two runs on 10,000,000 jobs).
 */
async function steadyState(sql: Sql): Promise<void> {
  const r = await deleteExpiredReputationRows(sql);
  const v = performance.now();
  await sql.unsafe("VACUUM (ANALYZE, INDEX_CLEANUP ON)");
  note(`retention sweep (${JSON.stringify(r)}), then VACUUM ANALYZE: ${seconds(performance.now() - v)} s`);
}

async function prepareEmpty(): Promise<Prepared> {
  const db = await benchDatabase("svc_bench_history_empty", note);
  try {
    await migrate(db.sql, { through: SEED_SCHEMA });
    await seedHistory(db.sql, { ...SHAPE, jobs: 0 }, note);
    const migrations = await migrateRest(db.sql);
    await steadyState(db.sql);
    return { db, migrations };
  } catch (err) {
    await db.close();
    throw err;
  }
}

/** Ends every job still active (the bench's own submits): cancelled by their renter, holds released. */
async function cleanUp(sql: Sql): Promise<number> {
  const active = await sql<{ id: number }[]>`SELECT id FROM jobs WHERE status IN ('queued', 'pending', 'running') ORDER BY id`;
  await pool(active.length, 4, async (i) => {
    await sql.begin(async (tx) => {
      const job = await lockJobById(tx, active[i].id);
      if (job && isActive(job.status)) await endLocked(tx, job, "cancelled", { reason: "renter_cancelled", error: "cancelled by renter: bench round over" });
    });
  });
  return active.length;
}

// ---- HTTP on raw keep-alive sockets ----

function request(port: number, method: string, path: string, headers: Record<string, string>, body?: unknown): Buffer {
  const payload = body === undefined ? Buffer.alloc(0) : Buffer.from(JSON.stringify(body));
  const head = [`${method} ${path} HTTP/1.1`, `Host: 127.0.0.1:${port}`, ...Object.entries(headers).map(([k, v]) => `${k}: ${v}`)];
  if (body !== undefined) head.push("Content-Type: application/json", `Content-Length: ${payload.length}`);
  return Buffer.concat([Buffer.from(`${head.join("\r\n")}\r\n\r\n`), payload]);
}

interface LoopResult {
  latenciesMs: number[];
  statuses: Record<string, number>;
  elapsedS: number;
}

/** `connections` sockets, one request in flight each, rotating over `requests`, until `seconds` pass or `count` answers came. */
function loop(port: number, requests: Buffer[], connections: number, until: { seconds?: number; count?: number }): Promise<LoopResult> {
  return new Promise((resolve, reject) => {
    let next = 0;
    let open = connections;
    let answered = 0;
    const statuses: Record<string, number> = {};
    const latenciesMs: number[] = [];
    const started = performance.now();
    const deadline = until.seconds === undefined ? Infinity : started + until.seconds * 1000;
    const limit = until.count ?? Infinity;
    for (let c = 0; c < connections; c++) {
      const sock = net.connect(port, "127.0.0.1");
      sock.setNoDelay(true);
      let sentAt = 0;
      const send = () => {
        if (performance.now() >= deadline || next >= limit) return void sock.end();
        sentAt = performance.now();
        sock.write(requests[next++ % requests.length]);
      };
      sock.on("connect", send);
      sock.on(
        "data",
        answerSplitter((status) => {
          latenciesMs.push(performance.now() - sentAt);
          statuses[status] = (statuses[status] ?? 0) + 1;
          answered++;
          send();
        }),
      );
      sock.on("error", reject);
      sock.on("close", () => {
        if (--open === 0) resolve({ latenciesMs, statuses, elapsedS: (performance.now() - started) / 1000 });
      });
    }
  });
}

async function post(base: string, path: string, body: unknown, headers: Record<string, string> = {}) {
  const r = await fetch(`${base}${path}`, { method: "POST", headers: { "content-type": "application/json", ...headers }, body: JSON.stringify(body) });
  if (r.status >= 300) throw new Error(`${path}: ${r.status} ${await r.text()}`);
  return r.json() as Promise<Record<string, unknown>>;
}

// ---- one side's measurements ----

interface Side {
  name: "empty" | "history";
  prepared: Prepared;
  servers: BenchServers;
  /** This process's own pool for the sweeps and the clean-up. */
  sql: Sql;
  samples: Record<string, number[]>;
  statuses: Record<string, Record<string, number>>;
  /** What each round's first pages held: rows by status and the body's bytes. */
  pages: Record<string, { rows: Record<string, number>; bytes: number }[]>;
}

function record(side: Side, key: string, r: LoopResult | number[]) {
  (side.samples[key] ??= []).push(...(Array.isArray(r) ? r : r.latenciesMs));
  if (Array.isArray(r)) return;
  const counts = (side.statuses[key] ??= {});
  for (const [status, n] of Object.entries(r.statuses)) counts[status] = (counts[status] ?? 0) + n;
}

async function heartbeatAll(base: string) {
  for (const id of LIVE_PROVIDERS) {
    await post(base, "/api/providers/heartbeat", {
      api_key: providerKey(id),
      gpu_status: { gpu_name: "NVIDIA H100 80GB HBM3", gpu_vram_mib: 81559, gpu_count: id === NARROW_PROVIDER ? 1 : WIDE_GPUS, daemon_version: "5.0.0" },
    });
  }
}

/**
 * The measured light renter submits a page of jobs (then cancelled) on each side before the rounds,
 * so that its first page is full on the empty side too: without them the empty side's page in the
 * first round held only that round's jobs (about half a page), against a full page of history.
 */
async function fillFirstPage(side: Side) {
  await heartbeatAll(`http://127.0.0.1:${side.servers.ports[0]}`);
  const port = side.servers.ports[0];
  const submit = { job_type: "benchmark", duration_minutes: 0.01, params: { suite: "quick" } };
  const req = [request(port, "POST", "/api/jobs/submit", { "x-renter-key": renterKey(LIGHT_RENTERS[0]) }, submit)];
  // Until 50 were taken, so that the page is full whatever a submit was answered.
  for (let taken = 0, tries = 0; taken < 50; tries++) {
    if (tries === 20) throw new Error(`${side.name}: the light renter's submits were refused`);
    taken += (await loop(port, req, 1, { count: 50 - taken })).statuses["201"] ?? 0;
    if (taken < 50) await new Promise((r) => setTimeout(r, 500));
  }
  await cleanUp(side.sql);
}

/** A renter's first page as the loop reads it: its rows by status and its size, to compare like with like. */
async function pageShape(base: string, renter: number) {
  const r = await fetch(`${base}/api/jobs`, { headers: { "x-renter-key": renterKey(renter) } });
  const body = await r.text();
  const rows: Record<string, number> = {};
  for (const j of (JSON.parse(body) as { jobs: { status: string }[] }).jobs) rows[j.status] = (rows[j.status] ?? 0) + 1;
  return { rows, bytes: Buffer.byteLength(body) };
}

async function timed(n: number, fn: () => Promise<unknown>): Promise<number[]> {
  const out: number[] = [];
  for (let i = 0; i < n; i++) {
    const t = performance.now();
    await fn();
    out.push(performance.now() - t);
  }
  return out;
}

async function measure(side: Side, round: number): Promise<void> {
  const port = side.servers.ports[0];
  const base = `http://127.0.0.1:${port}`;
  await heartbeatAll(base);
  const submit = { job_type: "benchmark", duration_minutes: 0.01, params: { suite: "quick" } };
  const heavy = [request(port, "POST", "/api/jobs/submit", { "x-renter-key": renterKey(HEAVY_RENTER) }, submit)];
  const light = LIGHT_RENTERS.map((id) => request(port, "POST", "/api/jobs/submit", { "x-renter-key": renterKey(id) }, submit));
  // Warm this side's server and caches after the other side ran.
  await loop(port, [...heavy, ...light], CONNECTIONS, { seconds: 1, count: SUBMITS_PER_PHASE });
  record(side, "submit_heavy", await loop(port, heavy, CONNECTIONS, { seconds: SECONDS, count: SUBMITS_PER_PHASE }));
  record(side, "submit_light", await loop(port, light, CONNECTIONS, { seconds: SECONDS, count: SUBMITS_PER_PHASE }));
  // Jobs pinned to the one-GPU provider: one runs there, the rest wait in the queue for the sweeps to look at.
  const pinned = { ...submit, provider_id: NARROW_PROVIDER };
  await loop(port, [request(port, "POST", "/api/jobs/submit", { "x-renter-key": renterKey(LIGHT_RENTERS[1]) }, pinned)], 1, { count: QUEUED_PER_ROUND });

  const list = (id: number, query = "") => [request(port, "GET", `/api/jobs${query}`, { "x-renter-key": renterKey(id) })];
  for (const [key, id] of [["list_heavy", HEAVY_RENTER], ["list_light", LIGHT_RENTERS[0]]] as const) (side.pages[key] ??= []).push(await pageShape(base, id));
  record(side, "list_heavy", await loop(port, list(HEAVY_RENTER), 1, { count: LISTS }));
  record(side, "list_light", await loop(port, list(LIGHT_RENTERS[0]), 1, { count: LISTS }));
  record(side, "list_heavy_completed", await loop(port, list(HEAVY_RENTER, "?status=completed"), 1, { count: Math.ceil(LISTS / 4) }));

  const sql = side.sql;
  const thousand = Array.from({ length: 1000 }, (_, i) => i + 1);
  record(side, "sweep_jobs", await timed(SWEEPS, () => sweepJobs(sql)));
  record(side, "sweep_liveness", await timed(SWEEPS, async () => {
    await markSilentProvidersOffline(sql);
    await refreshDueReputations(sql);
  }));
  record(side, "sweep_queue", await timed(SWEEPS, () => dispatchQueued(sql)));
  record(side, "reputation_1000_providers", await timed(Math.ceil(SWEEPS / 2), () => refreshReputation(sql, thousand)));
  record(side, "admin_dashboard", await timed(Math.ceil(SWEEPS / 2), () => dashboard(sql)));
  // The first report on a side writes its days that are over (platform_days); the rest read them back.
  record(side, "admin_daily", await timed(Math.ceil(SWEEPS / 2), () => platformByDay(sql, 14)));
  const cancelled = await cleanUp(sql);
  note(`  ${side.name} round ${round}: done (${cancelled} jobs cancelled)`);
}

// ---- main ----

const summary = (v: number[] | undefined) => (v?.length ? { n: v.length, p50_ms: percentile(v, 50), p90_ms: percentile(v, 90), p99_ms: percentile(v, 99) } : null);

async function main() {
  const uptimeBefore = fs.readFileSync("/proc/loadavg", "utf8").trim();
  note(`load average before: ${uptimeBefore}`);
  const history = await prepareHistory();
  if (args["seed-only"]) {
    await history.db.close();
    console.log(JSON.stringify({ benchmark: "history", seeded: history.db.name, seed_s: history.seedS, migrations: history.migrations, audit: history.audit }));
    return;
  }
  const empty = await prepareEmpty().catch(async (err) => {
    await history.db.close();
    throw err;
  });
  const env = { SVC_ADMIN_TOKEN: ADMIN_TOKEN, SVC_HMAC_SECRET: crypto.randomBytes(24).toString("hex"), SVC_LEDGER_AUDIT_SECONDS: "0" };
  const sides: Side[] = [];
  try {
    for (const [name, prepared] of [["empty", empty], ["history", history]] as const) {
      const servers = await startServers(1, prepared.db.url, env);
      sides.push({ name, prepared, servers, sql: connect(prepared.db.url, 4), samples: {}, statuses: {}, pages: {} });
    }
    for (const side of sides) await fillFirstPage(side);
    const [sizes] = await history.db.sql<{ jobs: number; entries: number; database: string }[]>`
      SELECT (SELECT count(*) FROM jobs)::bigint AS jobs, (SELECT count(*) FROM ledger_transfers)::bigint AS entries,
             pg_size_pretty(pg_database_size(current_database())) AS database`;
    const [heavyCounts] = await history.db.sql<{ jobs: number; month_charges: number }[]>`
      SELECT (SELECT count(*) FROM jobs WHERE renter_id = ${HEAVY_RENTER})::bigint AS jobs,
             (SELECT count(*) FROM ledger_transfers WHERE debit_account_id = ${2 * HEAVY_RENTER + 3} AND kind IN ('charge_provider', 'charge_platform')
                AND created_at >= date_trunc('month', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC')::bigint AS month_charges`;
    note(`history: ${JSON.stringify(sizes)}; heavy renter ${JSON.stringify(heavyCounts)}`);
    const loadDuring: number[][] = [];
    for (let round = 1; round <= ROUNDS; round++) {
      const order = round % 2 === 1 ? sides : [...sides].reverse();
      for (const side of order) await measure(side, round);
      loadDuring.push(loadAverage());
    }
    const figures = Object.fromEntries(sides.map((s) => [s.name, Object.fromEntries(Object.keys(s.samples).map((k) => [k, summary(s.samples[k])]))]));
    const ratio = Object.fromEntries(
      Object.keys(sides[0].samples).map((k) => {
        const e = percentile(sides[0].samples[k], 50);
        const h = percentile(sides[1].samples[k], 50);
        return [k, e && h ? Math.round((100 * h) / e) / 100 : null];
      }),
    );
    console.log(
      JSON.stringify({
        benchmark: "history",
        shape: SHAPE,
        history_database: history.db.name,
        history_jobs: Number(sizes.jobs),
        history_ledger_entries: Number(sizes.entries),
        history_database_size: sizes.database,
        heavy_renter: { jobs: Number(heavyCounts.jobs), job_charges_this_month: Number(heavyCounts.month_charges) },
        seed_s: history.seedS ?? null,
        migrations_on_history: history.migrations,
        audit: history.audit ?? null,
        rounds: ROUNDS,
        connections: CONNECTIONS,
        seconds: SECONDS,
        p50_ratio_history_over_empty: ratio,
        figures,
        statuses: Object.fromEntries(sides.map((s) => [s.name, s.statuses])),
        first_pages: Object.fromEntries(sides.map((s) => [s.name, s.pages])),
        load_average_before: uptimeBefore,
        load_average_after_each_round: loadDuring,
        machine: machine(),
        database: history.db.kind,
      }),
    );
  } finally {
    for (const s of sides) {
      await s.sql.end();
      await s.servers.stop();
    }
    await empty.db.close();
    await history.db.close();
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
