// Jobs benchmark: submit throughput and submit -> assignment latency as seen by
// connected daemons. One command, its own servers and database.
//
//   npm run bench:jobs [-- --renters 200 --providers 100 --processes 1 --connections 32 --seconds 15 --warmup 3]
//   npm run bench:jobs -- --open-loop half [--open-seconds 15 --open-sockets 64 --max-sockets 2000]
//   npm run bench:jobs -- --gpus 1   (a full fleet: past the first jobs, every submit waits in the queue)
//
// - Database: a fresh database on DATABASE_URL when set (dropped afterwards),
//   otherwise a real embedded PostgreSQL in .data/bench-pg.
// - Servers: `--processes` servers (the build, as `npm start` runs it; child processes, one port
//   each, all on the one database) with SVC_RATE_LIMITS=off (the documented
//   10 submits/min per key would otherwise be the whole benchmark) and
//   LOG_LEVEL=warn.
// - Renters: registered and topped up over HTTP (default quotas apply).
// - Providers: registered, approved through the admin API and online by
//   heartbeat, each reporting 1024 GPUs so that nothing queues: the run
//   measures submit and assignment, not capacity (`--gpus N` sets that number;
//   with 1 the fleet is full once each provider has a job, and the run measures
//   a submit that queues). Every provider holds a gRPC
//   daemon stream (DaemonService.Connect), spread over the processes, so a
//   submit is usually answered by one process while the daemon that gets the
//   job is connected to another (LISTEN/NOTIFY across processes).
// - Load: keep-alive HTTP/1.1 connections on raw sockets, one submit in flight
//   each, rotating over the renters (benchmark jobs of 0.01 min, 1 halala).
// - Figures: submit latency (request sent -> 201 read), and assignment
//   latency (request sent -> the `job` message read on the daemon stream;
//   also from the 201 read, which may be negative when the push wins).
// - Open loop (--open-loop half, or a rate per second): after the saturated
//   (closed-loop) phase, submits sent on a fixed schedule at half of its
//   submits/s (bench/open-loop.ts), each latency measured from the submit's
//   intended send time, so a stall is not hidden; reported under `open_loop`
//   with the generator's own lag and the targets (submit p99 <= 50 ms; the job
//   on the daemon stream within 5 ms p50 and 25 ms p99 of the 201).
// - Afterwards: every 201 is one pending job, the held sum equals the jobs'
//   estimates, and the ledger's invariants hold.
// The last line printed is one JSON object with the figures.
import crypto from "node:crypto";
import net from "node:net";
import os from "node:os";
import { parseArgs } from "node:util";
import * as grpc from "@grpc/grpc-js";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { DaemonMessageSchema, DaemonService, ServerMessageSchema, type ServerMessage } from "../gen/svc/v1/daemon_pb.js";
import { DAEMON_VERSION } from "../src/daemon/ts/version.js";
import { ledgerProblems } from "../src/domain/money/ledger.js";
import type { ChildProcess } from "node:child_process";
import { openLoop, openLoopRate } from "./open-loop.js";
import {
  answerSplitter,
  benchDatabase,
  cpuSecondsOf,
  databaseCpuMeter,
  machine,
  machineCpuSeconds,
  noter,
  percentile,
  pool,
  postgresCpuSeconds,
  readStalls,
  serverStalls,
  startServers,
  type BenchDatabase,
} from "./lib.js";

const { values: args } = parseArgs({
  options: {
    renters: { type: "string", default: "200" },
    providers: { type: "string", default: "100" },
    gpus: { type: "string", default: "1024" },
    processes: { type: "string", default: "1" },
    connections: { type: "string", default: "32" },
    seconds: { type: "string", default: "15" },
    warmup: { type: "string", default: "3" },
    // After the saturated phase: "half" (of its submits/s) or a fixed rate per second; "off" skips it.
    "open-loop": { type: "string", default: "off" },
    "open-seconds": { type: "string" },
    // Sockets connected before the open-loop schedule starts, and the most it may open.
    "open-sockets": { type: "string", default: "64" },
    "max-sockets": { type: "string", default: "2000" },
  },
});
const RENTERS = Number(args.renters);
const PROVIDERS = Number(args.providers);
const PROCESSES = Number(args.processes);
const CONNECTIONS = Number(args.connections);
const SECONDS = Number(args.seconds);
const WARMUP_SECONDS = Number(args.warmup);
const OPEN_LOOP = args["open-loop"]!;
const OPEN_SECONDS = Number(args["open-seconds"] ?? args.seconds);
const OPEN_SOCKETS = Number(args["open-sockets"]);
const MAX_SOCKETS = Number(args["max-sockets"]);
/** The route whose server-side answer times the open-loop phase reports (svc_request_duration_seconds). */
const SUBMIT_ROUTE = "POST /api/jobs/submit";
/** Targets of the open-loop phase (issue: latency at a steady load). */
const TARGETS = { submit_p99_ms: 50, assign_after_201_p50_ms: 5, assign_after_201_p99_ms: 25 };
const ADMIN_TOKEN = `bench-admin-${crypto.randomBytes(12).toString("hex")}`;
const GPUS_PER_PROVIDER = Number(args.gpus);
if (!Number.isInteger(GPUS_PER_PROVIDER) || GPUS_PER_PROVIDER < 1) throw new Error(`--gpus must be a whole number of at least 1, got ${args.gpus}`);

const note = noter("bench:jobs");

async function post(url: string, body: unknown, headers: Record<string, string> = {}) {
  const r = await fetch(url, { method: "POST", headers: { "content-type": "application/json", ...headers }, body: JSON.stringify(body) });
  const json = (await r.json()) as Record<string, unknown>;
  if (r.status >= 300) throw new Error(`${url}: ${r.status} ${JSON.stringify(json)}`);
  return json;
}

function heartbeat(base: string, key: string, i: number) {
  return post(`${base}/api/providers/heartbeat`, {
    api_key: key,
    gpu_status: { gpu_name: "NVIDIA H100 80GB HBM3", gpu_vram_mib: 81559, gpu_count: GPUS_PER_PROVIDER, daemon_version: DAEMON_VERSION, cuda_version: "12.4" },
    uptime: 3600 + i,
  });
}

// ---- daemon streams (grpc-js, messages serialised with protobuf-es) ----

const connectMethod = DaemonService.method.connect;
const StreamClient = grpc.makeGenericClientConstructor(
  {
    connect: {
      path: `/${DaemonService.typeName}/${connectMethod.name}`,
      requestStream: true,
      responseStream: true,
      requestSerialize: (m: unknown) => Buffer.from(toBinary(DaemonMessageSchema, m as never)),
      requestDeserialize: (b: Buffer) => fromBinary(DaemonMessageSchema, b),
      responseSerialize: (m: unknown) => Buffer.from(toBinary(ServerMessageSchema, m as never)),
      responseDeserialize: (b: Buffer) => fromBinary(ServerMessageSchema, b),
    },
  },
  "DaemonService",
);

interface Daemon {
  close(): void;
}

/** A connected daemon: says hello, resolves on welcome, reports each pushed job id. */
function openDaemon(port: number, key: string, onJob: (jobId: string) => void): Promise<Daemon> {
  return new Promise((resolve, reject) => {
    // Its own connection, as a real daemon has (grpc-js would otherwise share one per address, and
    // the server allows 1000 streams per HTTP/2 connection).
    const client = new StreamClient(`127.0.0.1:${port}`, grpc.credentials.createInsecure(), { "grpc.use_local_subchannel_pool": 1 }) as unknown as {
      connect(md: grpc.Metadata): grpc.ClientDuplexStream<unknown, ServerMessage>;
      close(): void;
    };
    const md = new grpc.Metadata();
    md.set("x-provider-key", key);
    const call = client.connect(md);
    let welcomed = false;
    call.on("data", (m: ServerMessage) => {
      if (m.kind.case === "job") onJob(m.kind.value.jobId);
      else if (m.kind.case === "welcome" && !welcomed) {
        welcomed = true;
        resolve({ close: () => (call.end(), client.close()) });
      }
    });
    call.on("error", (err) => {
      if (!welcomed) reject(err);
    });
    call.write(create(DaemonMessageSchema, { kind: { case: "hello", value: { daemonVersion: DAEMON_VERSION } } }));
  });
}

// ---- load ----

function submitRequest(port: number, renterKey: string): Buffer {
  const body = Buffer.from(JSON.stringify({ job_type: "benchmark", duration_minutes: 0.01, params: { suite: "quick" } }));
  return Buffer.concat([
    Buffer.from(
      `POST /api/jobs/submit HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\nContent-Type: application/json\r\nx-renter-key: ${renterKey}\r\nContent-Length: ${body.length}\r\n\r\n`,
    ),
    body,
  ]);
}

interface Sample {
  sentAt: number;
  answeredAt: number;
}

interface LoadResult {
  ok: number;
  statuses: Record<string, number>;
  latenciesMs: number[];
  elapsedS: number;
}

/** Keep-alive sockets, one submit in flight each, for `seconds`; submits sent after the deadline are not made. */
function runLoad(ports: number[], requests: Buffer[][], connections: number, seconds: number, samples: Map<string, Sample> | undefined): Promise<LoadResult> {
  return new Promise((resolve, reject) => {
    let next = 0;
    let open = connections;
    let ok = 0;
    const statuses: Record<string, number> = {};
    const latenciesMs: number[] = [];
    const started = performance.now();
    const deadline = started + seconds * 1000;
    for (let c = 0; c < connections; c++) {
      const p = c % ports.length;
      const sock = net.connect(ports[p], "127.0.0.1");
      sock.setNoDelay(true);
      let sentAt = 0;
      const send = () => {
        if (performance.now() >= deadline) return void sock.end();
        const reqs = requests[p];
        sentAt = performance.now();
        sock.write(reqs[next++ % reqs.length]);
      };
      sock.on("connect", send);
      sock.on(
        "data",
        answerSplitter((status, body) => {
          const answeredAt = performance.now();
          statuses[status] = (statuses[status] ?? 0) + 1;
          if (status === "201") {
            ok++;
            if (samples) {
              latenciesMs.push(answeredAt - sentAt);
              const jobId = /"job_id":"(job-[^"]+)"/.exec(body.toString("utf8"))?.[1];
              if (jobId) samples.set(jobId, { sentAt, answeredAt });
            }
          }
          send();
        }),
      );
      sock.on("error", reject);
      sock.on("close", () => {
        if (--open === 0) resolve({ ok, statuses, latenciesMs, elapsedS: (performance.now() - started) / 1000 });
      });
    }
  });
}

/** Assignment latency of the submits in `samples` whose job a daemon received. */
function assignFigures(samples: Map<string, Sample>, received: Map<string, number>) {
  const fromSend: number[] = [];
  const fromAnswer: number[] = [];
  for (const [jobId, s] of samples) {
    const at = received.get(jobId);
    if (at === undefined) continue;
    fromSend.push(at - s.sentAt);
    fromAnswer.push(at - s.answeredAt);
  }
  return {
    assignments_seen_by_daemons: fromSend.length,
    assign_visible_p50_ms: percentile(fromSend, 50),
    assign_visible_p99_ms: percentile(fromSend, 99),
    assign_after_201_p50_ms: percentile(fromAnswer, 50),
    assign_after_201_p99_ms: percentile(fromAnswer, 99),
  };
}

/** Starts counting CPU; the returned function gives where it went per submit since, and how busy the machine was. */
async function cpuMeter(children: ChildProcess[], db: BenchDatabase) {
  const cpuBefore = children.map((c) => cpuSecondsOf(c.pid));
  const dbMeter = await databaseCpuMeter(db.sql, db.name);
  const [pgBefore, selfBefore, machineBefore] = [postgresCpuSeconds(), process.cpuUsage(), machineCpuSeconds()];
  return async (submits: number) => {
    const cpuAfter = children.map((c) => cpuSecondsOf(c.pid));
    const [pgCpu, selfCpu, machineAfter] = [postgresCpuSeconds() - pgBefore, process.cpuUsage(selfBefore), machineCpuSeconds()];
    const dbCpu = await dbMeter();
    const serverCpu = cpuAfter.every((v, i) => v !== undefined && cpuBefore[i] !== undefined)
      ? cpuAfter.reduce((sum: number, v, i) => sum + (v! - cpuBefore[i]!), 0)
      : undefined;
    const n = Math.max(1, submits);
    const perSubmit = (seconds: number) => Math.round((seconds * 1e5) / n) / 100;
    return {
      server_cpu_ms_per_submit: serverCpu === undefined ? null : perSubmit(serverCpu),
      // Where the machine's CPU went per submit (a local database only): the bench database's own
      // backends; PostgreSQL's shared background processes (WAL writer, checkpointer, ...), which
      // other databases on the server also feed; every postgres process on the machine (the
      // figure before the first two were split out); and this load generator with its daemon streams.
      database_cpu_ms_per_submit: perSubmit(dbCpu.own),
      database_shared_cpu_ms_per_submit: perSubmit(dbCpu.shared),
      all_postgres_cpu_ms_per_submit: perSubmit(pgCpu),
      database_backends_ended: dbCpu.ended,
      load_generator_cpu_ms_per_submit: Math.round((selfCpu.user + selfCpu.system) / 10 / n) / 100,
      machine_busy_pct: Math.round((1000 * (machineAfter.busy - machineBefore.busy)) / Math.max(0.01, machineAfter.total - machineBefore.total)) / 10,
    };
  };
}

async function main() {
  const db = await benchDatabase("svc_bench_jobs", note);
  const sql = db.sql;
  const servers = await startServers(PROCESSES, db.url, { SVC_ADMIN_TOKEN: ADMIN_TOKEN, SVC_HMAC_SECRET: crypto.randomBytes(24).toString("hex") }).catch(
    async (err) => {
      await db.close();
      throw err;
    },
  );
  const { ports, children } = servers;
  const daemons: Daemon[] = [];
  let result: Record<string, unknown> | undefined;
  try {
    const base = `http://127.0.0.1:${ports[0]}`;

    if (WARMUP_SECONDS + SECONDS + (OPEN_LOOP === "off" ? 0 : OPEN_SECONDS) > 100) {
      // The daemons never take their jobs: past the pickup window (120 s) the first ones are re-queued mid-run.
      note("warning: the phases together run past 100 s; jobs left pending 120 s are re-queued, which adds load");
    }
    note(`registering ${RENTERS} renters and ${PROVIDERS} providers over HTTP`);
    const renterKeys: string[] = new Array(RENTERS);
    await pool(RENTERS, 16, async (i) => {
      const r = await post(`${base}/api/renters/register`, { name: `bench-renter-${i}`, email: `renter-${i}@bench.example.com` });
      renterKeys[i] = r.api_key as string;
      await post(`${base}/api/renters/topup`, { amount_halala: 1_000_000 }, { "x-renter-key": renterKeys[i] });
    });
    const providerKeys: string[] = new Array(PROVIDERS);
    await pool(PROVIDERS, 16, async (i) => {
      const r = await post(`${base}/api/providers/register`, { name: `bench-rig-${i}`, email: `rig-${i}@bench.example.com`, gpu_model: "NVIDIA H100 80GB HBM3", os: "linux" });
      providerKeys[i] = r.api_key as string;
      await post(`${base}/api/admin/providers/${r.provider_id}/approve`, {}, { "x-admin-token": ADMIN_TOKEN });
      await heartbeat(base, providerKeys[i], i);
    });

    const received = new Map<string, number>();
    // Planner statistics for the freshly loaded tables, as autovacuum would gather within its first
    // minutes; without them plans are costed (and cached, also inside the ledger's SQL functions) on
    // tables that were empty: placement on an empty providers table, the ledger on empty accounts
    // (a sequential scan of 40,000 accounts per hold with --renters 20000).
    await sql`ANALYZE`;
    note(`opening ${PROVIDERS} daemon streams over ${PROCESSES} process(es)`);
    await pool(PROVIDERS, 16, async (i) => {
      daemons.push(await openDaemon(ports[(i + 1) % PROCESSES], providerKeys[i], (jobId) => received.set(jobId, performance.now())));
    });

    const requests = ports.map((port) => renterKeys.map((k) => submitRequest(port, k)));
    const beat = () => pool(PROVIDERS, 16, (i) => heartbeat(base, providerKeys[i], i).then(() => undefined));
    await beat();
    note(`warm-up ${WARMUP_SECONDS} s`);
    await runLoad(ports, requests, CONNECTIONS, WARMUP_SECONDS, undefined);
    // Statistics again now that jobs, holds and transfers have rows, as autovacuum would after their
    // first 50 (within a minute). Without it the plans the backends cached while those tables were
    // empty stay: the foreign-key checks of every new attempt, hold and transfer then scan jobs whole.
    await sql`ANALYZE`;
    await beat();
    const [{ before }] = await sql<{ before: number }[]>`SELECT count(*)::int AS before FROM jobs`;
    note(`measuring ${SECONDS} s with ${CONNECTIONS} connections`);
    const samples = new Map<string, Sample>();
    let meter = await cpuMeter(children, db);
    const run = await runLoad(ports, requests, CONNECTIONS, SECONDS, samples);
    const cpu = await meter(run.ok);
    await new Promise((r) => setTimeout(r, 1000)); // the last pushes in flight
    const assign = assignFigures(samples, received);

    let openLoopFigures: { submits: number; [k: string]: unknown } | undefined;
    if (OPEN_LOOP !== "off") {
      const rate = openLoopRate(OPEN_LOOP, run.ok / run.elapsedS);
      await beat();
      note(`open loop: ${rate} submits/s for ${OPEN_SECONDS} s (latency from each submit's intended send time)`);
      const openSamples = new Map<string, Sample>();
      meter = await cpuMeter(children, db);
      const stallsBefore = await readStalls(ports, SUBMIT_ROUTE);
      const ol = await openLoop({
        ports,
        rate,
        seconds: OPEN_SECONDS,
        // Renters in turn on each port, as the closed loop does.
        request: (i, p) => requests[p][Math.floor(i / ports.length) % RENTERS],
        okStatus: "201",
        onAnswer: (a) => {
          const jobId = /"job_id":"(job-[^"]+)"/.exec(a.body.toString("utf8"))?.[1];
          if (jobId && a.status === "201") openSamples.set(jobId, { sentAt: a.intendedAt, answeredAt: a.answeredAt });
        },
        initialSockets: Math.ceil(OPEN_SOCKETS / ports.length),
        maxSockets: MAX_SOCKETS,
      });
      const olCpu = await meter(ol.ok);
      const stalls = serverStalls(stallsBefore, await readStalls(ports, SUBMIT_ROUTE));
      await new Promise((r) => setTimeout(r, 1000));
      const olAssign = assignFigures(openSamples, received);
      const submitP99 = percentile(ol.latenciesMs, 99);
      openLoopFigures = {
        mode: OPEN_LOOP === "half" ? "half of the saturated phase's submits/s" : "fixed rate",
        rate_per_s: rate,
        duration_s: ol.duration_s,
        scheduled: ol.scheduled,
        submits: ol.ok,
        statuses: ol.statuses,
        unanswered: ol.unanswered,
        submits_per_s: ol.ok_per_s,
        // From each submit's intended send time.
        submit_p50_ms: percentile(ol.latenciesMs, 50),
        submit_p90_ms: percentile(ol.latenciesMs, 90),
        submit_p99_ms: submitP99,
        submit_max_ms: percentile(ol.latenciesMs, 100),
        ...olAssign,
        ...olCpu,
        generator: ol.generator,
        server_stalls: stalls,
        targets: {
          ...TARGETS,
          met:
            ol.ok === ol.scheduled &&
            submitP99 !== null && submitP99 <= TARGETS.submit_p99_ms &&
            olAssign.assign_after_201_p50_ms !== null && olAssign.assign_after_201_p50_ms <= TARGETS.assign_after_201_p50_ms &&
            olAssign.assign_after_201_p99_ms !== null && olAssign.assign_after_201_p99_ms <= TARGETS.assign_after_201_p99_ms,
        },
      };
    }

    const [check] = await sql<{ jobs: number; pending: number; queued: number; held: number; estimates: number }[]>`
      SELECT count(*)::int AS jobs, count(*) FILTER (WHERE status = 'pending')::int AS pending,
             count(*) FILTER (WHERE status = 'queued')::int AS queued,
             (SELECT coalesce(sum(balance), 0) FROM ledger_accounts WHERE kind = 'renter_held')::bigint AS held,
             coalesce(sum(cost_halala), 0)::bigint AS estimates
      FROM jobs`;
    const problems = await ledgerProblems(sql);
    result = {
      benchmark: "jobs",
      renters: RENTERS,
      providers: PROVIDERS,
      daemon_streams: daemons.length,
      processes: PROCESSES,
      connections: CONNECTIONS,
      duration_s: Math.round(run.elapsedS * 100) / 100,
      submits: run.ok,
      statuses: run.statuses,
      submits_per_s: Math.round(run.ok / run.elapsedS),
      submit_p50_ms: percentile(run.latenciesMs, 50),
      submit_p90_ms: percentile(run.latenciesMs, 90),
      submit_p99_ms: percentile(run.latenciesMs, 99),
      submit_max_ms: percentile(run.latenciesMs, 100),
      ...assign,
      ...cpu,
      load_average_1m: Math.round(os.loadavg()[0] * 100) / 100,
      verified: {
        jobs_created_during_run: check.jobs - before,
        // Both phases: every 201 is one job, and nothing else made one.
        one_job_per_201: check.jobs - before === run.ok + Number(openLoopFigures?.submits ?? 0),
        pending: check.pending,
        queued: check.queued,
        held_equals_estimates: Number(check.held) === Number(check.estimates),
        ledger_problems: problems.length,
      },
      ...(openLoopFigures ? { open_loop: openLoopFigures } : {}),
      machine: machine(),
      database: db.kind,
    };
  } finally {
    for (const d of daemons) d.close();
    await servers.stop();
    await db.close();
  }
  console.log(JSON.stringify(result));
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
