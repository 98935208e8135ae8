// Heartbeat benchmark: one command, its own server and database.
//
//   npm run bench:heartbeat [-- --providers 5000 --connections 64 --seconds 20 --warmup 3 --servers 1]
//   npm run bench:heartbeat -- --outage [--providers 100000]
//   npm run bench:heartbeat -- --open-loop half [--open-seconds 20 --open-sockets 64 --max-sockets 2000]
//
// - Database: a fresh database on DATABASE_URL when set (dropped afterwards),
//   otherwise a real embedded PostgreSQL in .data/bench-pg.
// - Server: the build (as `npm start` runs it) in child processes (--servers, default 1) on free
//   loopback ports with SVC_RATE_LIMITS=off (the documented limits stay the
//   default elsewhere) and LOG_LEVEL=warn (no per-request log line). With
//   several, the generator spreads its connections over them like a load
//   balancer, so a provider's beats land on different processes.
// - Providers: registered over HTTP and approved in one SQL statement; each
//   sends one first heartbeat (the state-changing path, answered after its
//   grouped write committed: measured apart), then all of them beat
//   round-robin for the measured run.
// - Load: a hand-rolled HTTP/1.1 generator on raw keep-alive sockets (one
//   request in flight per connection, pre-built request bytes per provider), so
//   the client spends as little of the machine as possible.
// - Open loop (--open-loop half, or a rate per second): after the saturated
//   phase, beats sent on a fixed schedule at half of its heartbeats/s
//   (bench/open-loop.ts), each latency measured from the beat's intended send
//   time, so a stall is not hidden; reported under `open_loop` with the
//   generator's own lag, the servers' stalls and their own answer times for
//   the route (`answered_by_server`), and the target (p99 <= 20 ms).
// - CPU per beat of the saturated phase: the server processes', and the
//   database's (its backends for the bench's database, over the phase and
//   the last telemetry batch after it: a beat is written in batches).
// - Afterwards it checks that every provider's last_heartbeat was written.
// - --outage: the providers are seeded in SQL as a running fleet, approved
//   and online (registration has its own tests; 100,000 over HTTP would only
//   lengthen the setup), each beats once, and after the measured run of
//   ordinary beats the fleet comes back from an outage: silent for 5 minutes,
//   marked offline by the liveness sweep's own function (which tells the
//   server's cache), then every provider beats once, `connections` at a
//   time. Reported under `outage`: first beats/s, p50/p99, and the time until
//   the whole fleet is online again (the last answer; a beat is answered
//   after its state change committed, checked by counting afterwards).
// - The server processes' resident memory (VmRSS sampled, VmHWM at the end).
// The last line printed is one JSON object with the figures.
import crypto from "node:crypto";
import os from "node:os";
import { parseArgs } from "node:util";
import { benchDatabase, cpuSecondsOf, databaseCpuMeter, machine, noter, percentile, pool, readStalls, serverStalls, startServers } from "./lib.js";
import { gpuStatus, heartbeatBody, heartbeatRequest, memorySampler, runHeartbeats, seedProviders } from "./fleet.js";
import { markSilentProvidersOffline } from "../src/domain/dispatch/liveness-sweep.js";
import type { Sql } from "../src/db/index.js";
import { openLoop, openLoopRate } from "./open-loop.js";

const { values: args } = parseArgs({
  options: {
    providers: { type: "string", default: "5000" },
    connections: { type: "string", default: "64" },
    seconds: { type: "string", default: "20" },
    warmup: { type: "string", default: "3" },
    // Server processes behind the generator, which spreads its connections over
    // them like a load balancer (the service is stateless; PostgreSQL is shared).
    servers: { type: "string", default: "1" },
    outage: { type: "boolean", default: false },
    // After the saturated phase: "half" (of its heartbeats/s) or a fixed rate per second; "off" skips it.
    "open-loop": { type: "string", default: "off" },
    "open-seconds": { type: "string" },
    // Sockets connected before the open-loop schedule starts, and the most it may open.
    "open-sockets": { type: "string", default: "64" },
    "max-sockets": { type: "string", default: "2000" },
  },
});
const OUTAGE = args.outage;
const PROVIDERS = Number(args.providers);
const CONNECTIONS = Number(args.connections);
const SECONDS = Number(args.seconds);
const WARMUP_SECONDS = Number(args.warmup);
const SERVERS = Number(args.servers);
const OPEN_LOOP = args["open-loop"]!;
const OPEN_SECONDS = Number(args["open-seconds"] ?? args.seconds);
const OPEN_SOCKETS = Number(args["open-sockets"]);
const MAX_SOCKETS = Number(args["max-sockets"]);
/** Target of the open-loop phase (issue: latency at a steady load). */
const TARGET_P99_MS = 20;
/** The route whose server-side answer times the open-loop phase reports (svc_request_duration_seconds). */
const HEARTBEAT_ROUTE = "POST /api/providers/heartbeat";
const ADMIN_TOKEN = `bench-admin-${crypto.randomBytes(12).toString("hex")}`;
const HMAC_SECRET = crypto.randomBytes(24).toString("hex");

const note = noter("bench");

async function main() {
  const db = await benchDatabase("svc_bench", note);
  const sql = db.sql;
  // --outage: the bench runs the liveness sweep itself, once; the server's own would also take
  // offline the providers that came back early and beat only once.
  const env = { SVC_ADMIN_TOKEN: ADMIN_TOKEN, SVC_HMAC_SECRET: HMAC_SECRET, ...(OUTAGE ? { SVC_LIVENESS_SWEEP_SECONDS: "0" } : {}) };
  const servers = await startServers(SERVERS, db.url, env).catch(async (err) => {
    await db.close();
    throw err;
  });
  const { ports, children } = servers;
  const port = ports[0];
  const base = `http://127.0.0.1:${port}`;
  let result: Record<string, unknown> | undefined;
  const memory = memorySampler(children.map((c) => c.pid));
  try {
    const keys: string[] = new Array(PROVIDERS);
    const ids: number[] = new Array(PROVIDERS);
    const regStarted = performance.now();
    if (OUTAGE) {
      note(`seeding ${PROVIDERS} approved, online providers in SQL`);
      await seedProviders(sql, PROVIDERS, keys, ids);
    } else {
      await registerOverHttp(sql, base, keys, ids);
    }
    note(`registered and approved in ${((performance.now() - regStarted) / 1000).toFixed(1)} s`);
    if (ids.length !== new Set(ids).size) throw new Error("duplicate provider ids");

    const requests = keys.map((k, i) => heartbeatRequest(port, heartbeatBody(k, i)));
    // First beats: every one moves a provider registered -> online before it is answered.
    let first: Awaited<ReturnType<typeof runFirstBeats>> | undefined;
    if (OUTAGE) {
      // Seeded online, as a running fleet: one round of beats puts every provider in the server's cache.
      note("one beat from every provider");
      await runHeartbeats(ports, requests, CONNECTIONS, 600, false, requests.length);
    } else {
      note("first heartbeats (state-changing: written before they are answered)");
      first = await runFirstBeats(ports, requests, CONNECTIONS);
    }

    note(`warm-up ${WARMUP_SECONDS} s`);
    await runHeartbeats(ports, requests, CONNECTIONS, WARMUP_SECONDS, false);
    const [{ t0 }] = await sql<{ t0: Date }[]>`SELECT now() AS t0`;
    note(`measuring ${SECONDS} s with ${CONNECTIONS} connections over ${PROVIDERS} providers`);
    const cpuOfServers = () => children.reduce((t, c) => t + (cpuSecondsOf(c.pid) ?? NaN), 0);
    const cpuBefore = cpuOfServers();
    const dbMeter = await databaseCpuMeter(sql, db.name);
    const run = await runHeartbeats(ports, requests, CONNECTIONS, SECONDS, true);
    const cpuAfter = cpuOfServers();
    await new Promise((r) => setTimeout(r, 1000)); // let the last batch land
    // The database's CPU over the phase and its last batch: the beats' writes, batched every 250 ms.
    const dbCpu = await dbMeter();

    let openLoopFigures: Record<string, unknown> | undefined;
    if (OPEN_LOOP !== "off") {
      const rate = openLoopRate(OPEN_LOOP, run.ok / run.elapsedS);
      note(`open loop: ${rate} heartbeats/s for ${OPEN_SECONDS} s (latency from each beat's intended send time)`);
      const stallsBefore = await readStalls(ports, HEARTBEAT_ROUTE);
      const olCpuBefore = cpuOfServers();
      const ol = await openLoop({
        ports,
        rate,
        seconds: OPEN_SECONDS,
        // Providers in turn, each port taking every SERVERS-th beat.
        request: (i) => requests[i % requests.length],
        okStatus: "200",
        initialSockets: Math.ceil(OPEN_SOCKETS / ports.length),
        maxSockets: MAX_SOCKETS,
      });
      const olCpu = cpuOfServers() - olCpuBefore;
      const stalls = serverStalls(stallsBefore, await readStalls(ports, HEARTBEAT_ROUTE));
      await new Promise((r) => setTimeout(r, 1000));
      const p99 = percentile(ol.latenciesMs, 99);
      openLoopFigures = {
        mode: OPEN_LOOP === "half" ? "half of the saturated phase's heartbeats/s" : "fixed rate",
        rate_per_s: rate,
        duration_s: ol.duration_s,
        scheduled: ol.scheduled,
        ok: ol.ok,
        statuses: ol.statuses,
        unanswered: ol.unanswered,
        heartbeats_per_s: ol.ok_per_s,
        // From each beat's intended send time.
        p50_ms: percentile(ol.latenciesMs, 50),
        p90_ms: percentile(ol.latenciesMs, 90),
        p99_ms: p99,
        max_ms: percentile(ol.latenciesMs, 100),
        server_cpu_us_per_heartbeat: Number.isFinite(olCpu) ? Math.round((olCpu * 1e6) / Math.max(1, ol.answered)) : null,
        generator: ol.generator,
        server_stalls: stalls,
        targets: { p99_ms: TARGET_P99_MS, met: ol.unanswered === 0 && ol.ok === ol.scheduled && p99 !== null && p99 <= TARGET_P99_MS },
      };
    }
    const [check] = await sql<{ updated: number; online: number }[]>`
      SELECT count(*) FILTER (WHERE last_heartbeat >= ${t0})::int AS updated, count(*) FILTER (WHERE status = 'online')::int AS online
      FROM providers`;
    const sorted = Float64Array.from(run.latenciesMs).sort();
    const outage = OUTAGE ? await runOutage(sql, ports, requests, CONNECTIONS, cpuOfServers) : undefined;
    result = {
      benchmark: "heartbeat",
      providers: PROVIDERS,
      server_processes: SERVERS,
      connections: CONNECTIONS,
      duration_s: Math.round(run.elapsedS * 100) / 100,
      requests: run.requests,
      ok: run.ok,
      non_200: run.nonOk,
      statuses: run.statuses,
      heartbeats_per_s: Math.round(run.ok / run.elapsedS),
      p50_ms: percentile(sorted, 50),
      p90_ms: percentile(sorted, 90),
      p99_ms: percentile(sorted, 99),
      max_ms: percentile(sorted, 100),
      server_cpu_us_per_heartbeat:
        Number.isFinite(cpuAfter - cpuBefore) ? Math.round(((cpuAfter - cpuBefore) * 1e6) / Math.max(1, run.requests)) : null,
      database_cpu_us_per_heartbeat: Math.round((dbCpu.own * 1e6) / Math.max(1, run.requests)),
      load_average_1m: Math.round(os.loadavg()[0] * 100) / 100,
      first_beats: first,
      ...(openLoopFigures ? { open_loop: openLoopFigures } : {}),
      verified: { providers_written_during_run: check.updated, providers_online: check.online },
      ...(outage ? { outage: { ...outage, first_beats_vs_ordinary: Math.round((outage.per_s / Math.max(1, run.ok / run.elapsedS)) * 100) / 100 } } : {}),
      server_memory: memory.stop(),
      machine: machine(),
      database: db.kind,
    };
  } finally {
    memory.stop();
    await servers.stop();
    await db.close();
  }
  console.log(JSON.stringify(result));
}

/** Each provider's first beat once, `connections` at a time; figures for that phase alone. */
async function runFirstBeats(ports: number[], requests: Buffer[], connections: number) {
  const run = await runHeartbeats(ports, requests, Math.min(connections, requests.length), 600, true, requests.length);
  const sorted = Float64Array.from(run.latenciesMs).sort();
  return {
    beats: run.requests,
    statuses: run.statuses,
    per_s: Math.round(run.requests / run.elapsedS),
    elapsed_s: Math.round(run.elapsedS * 100) / 100,
    p50_ms: percentile(sorted, 50),
    p99_ms: percentile(sorted, 99),
  };
}

/** PROVIDERS providers registered over HTTP, 64 at a time, then approved. */
async function registerOverHttp(sql: Sql, base: string, keys: string[], ids: number[]): Promise<void> {
  note(`registering ${PROVIDERS} providers over HTTP`);
  await pool(PROVIDERS, 64, async (i) => {
    const r = await fetch(`${base}/api/providers/register`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ name: `bench-rig-${i}`, email: `bench-${i}@bench.example.com`, gpu_model: gpuStatus(i).gpu_name, os: "linux" }),
    });
    const body = (await r.json()) as { api_key: string; provider_id: number };
    if (r.status !== 200) throw new Error(`register ${i}: ${r.status} ${JSON.stringify(body)}`);
    keys[i] = body.api_key;
    ids[i] = body.provider_id;
  });
  // Approved in one statement: the admin approval path has its own tests, and
  // thousands of audited transactions would only lengthen the setup.
  await sql`UPDATE providers SET approval_status = 'approved', approved_at = now() WHERE id = ANY(${ids}::bigint[])`;
}

/**
 * The fleet comes back from an outage: silent for 5 minutes, marked offline
 * by the liveness sweep (which tells the server's cache), then every provider
 * beats once, `connections` at a time.
 */
async function runOutage(sql: Sql, ports: number[], requests: Buffer[], connections: number, cpuOfServers: () => number) {
  // The server's last telemetry batches land first (a late one would bring its providers back online).
  let passes = 0;
  for (let left = PROVIDERS; left > 0; passes++) {
    await new Promise((r) => setTimeout(r, 1500));
    await sql`UPDATE providers SET last_heartbeat = now() - interval '5 minutes' WHERE status <> 'offline'`;
    await markSilentProvidersOffline(sql);
    [{ left }] = await sql<{ left: number }[]>`SELECT count(*)::int AS left FROM providers WHERE status <> 'offline'`;
  }
  note(`outage: all ${PROVIDERS} providers marked offline (${passes} sweep passes); every one beats again`);
  await new Promise((r) => setTimeout(r, 1000)); // the server hears of it (NOTIFY)
  const cpuBefore = cpuOfServers();
  const back = await runFirstBeats(ports, requests, connections);
  const cpu = cpuOfServers() - cpuBefore;
  const [c] = await sql<{ online: number }[]>`SELECT count(*) FILTER (WHERE status = 'online')::int AS online FROM providers`;
  return {
    sweep_passes: passes,
    ...back,
    online_after: c.online,
    all_online_s: c.online === PROVIDERS ? back.elapsed_s : null,
    server_cpu_us_per_beat: Number.isFinite(cpu) ? Math.round((cpu * 1e6) / Math.max(1, back.beats)) : null,
  };
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
