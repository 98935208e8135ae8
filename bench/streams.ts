// Stream daemons: heartbeats over daemon streams against heartbeats over JSON
// in one run, and a fleet of stream daemons on one server process.
//
//   npm run bench:streams [-- --daemons 2000 --connections 64 --seconds 10 --rounds 2]
//   npm run bench:streams -- --daemons 10000 --client connect --rounds 0 --cadence 30 --assign
//
// - Database: a fresh database on DATABASE_URL when set (dropped afterwards),
//   otherwise an embedded PostgreSQL in .data/bench-pg. Server: the
//   build (rate limits off, warn-level logs).
// - Providers: seeded in SQL, approved and online (bench/fleet.ts).
// - Daemons: one per provider, each with its own HTTP/2 connection as a real
//   daemon has, said hello and welcomed; they stay connected for the whole
//   run. `--client raw` (default): node:http2 with each message encoded once
//   with the generated schemas (a generator as cheap as bench:heartbeat's raw
//   sockets); `--client connect`: the generated Connect client
//   (createClient(DaemonService, createGrpcTransport)) the TypeScript daemon uses.
// - Measured in `--rounds` rounds, each a JSON phase then a stream phase of
//   `--seconds`: `--connections` heartbeats in flight either way, over the
//   same providers with the same telemetry. JSON beats go out on raw
//   keep-alive HTTP/1.1 sockets (bench/fleet.ts), or with `--json-wire
//   connection-each` each on a TCP connection of its own, as the legacy
//   daemon sends them; a stream beat is a
//   heartbeat message on a daemon's stream, done when its heartbeat_ack is
//   read. Reported per phase: beats/s, p50/p99, the server's CPU per beat,
//   the generator's and the database's (the phase's telemetry batches); then
//   the ratio of the medians (stream / JSON).
// - --cadence N: every daemon beats once, the beats spread evenly over N
//   seconds (a fleet beating every N seconds), each answered by its ack.
// - --assign: with every stream still open, one job per daemon is submitted
//   over HTTP; every daemon must receive exactly one job, its own provider's.
// - The server's resident memory is sampled throughout (peak and largest
//   sample) and reported with the number of streams open.
// The last line printed is one JSON object with the figures.
import crypto from "node:crypto";
import http2 from "node:http2";
import os from "node:os";
import { parseArgs } from "node:util";
import { create, fromBinary, fromJson, toBinary, type JsonObject } from "@bufbuild/protobuf";
import { ValueSchema } from "@bufbuild/protobuf/wkt";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { DaemonMessageSchema, DaemonService, ServerMessageSchema, type DaemonMessage, type ServerMessage } from "../gen/svc/v1/daemon_pb.js";
import { DAEMON_VERSION } from "../src/daemon/ts/version.js";
import { AsyncQueue } from "../src/daemon/async-queue.js";
import { gpuStatus, heartbeatRequest, memorySampler, runHeartbeats, runHeartbeatsConnectionEach, seedProviders } from "./fleet.js";
import { benchDatabase, cpuSecondsOf, databaseCpuMeter, machine, memoryOf, noter, percentile, pool, postJson, startServers } from "./lib.js";

const { values: args } = parseArgs({
  options: {
    daemons: { type: "string", default: "2000" },
    connections: { type: "string", default: "64" },
    seconds: { type: "string", default: "10" },
    warmup: { type: "string", default: "2" },
    rounds: { type: "string", default: "2" },
    cadence: { type: "string", default: "0" },
    assign: { type: "boolean", default: false },
    // The daemons' client: "raw" (node:http2, each message encoded once with the generated
    // schema, answers parsed by hand: a cheap generator, as bench:heartbeat's raw sockets are) or
    // "connect" (the generated Connect client, as the TypeScript daemon uses it).
    client: { type: "string", default: "raw" },
    // Run one side only (to profile it): "json" or "stream".
    only: { type: "string" },
    // How the JSON beats travel: "keep-alive" (a few sockets, each beat after the last: the cheapest
    // JSON there is) or "connection-each" (a TCP connection per beat, closed by the server after its
    // answer: how the legacy daemon beats, as urllib opens a connection per request).
    "json-wire": { type: "string", default: "keep-alive" },
  },
});
const DAEMONS = Number(args.daemons);
const CLIENT = args.client!;
const ONLY = args.only;
if (CLIENT !== "raw" && CLIENT !== "connect") throw new Error("--client is raw or connect");
const JSON_WIRE = args["json-wire"]!;
if (JSON_WIRE !== "keep-alive" && JSON_WIRE !== "connection-each") throw new Error("--json-wire is keep-alive or connection-each");
const jsonBeats = JSON_WIRE === "keep-alive" ? runHeartbeats : runHeartbeatsConnectionEach;
const CONNECTIONS = Number(args.connections);
const SECONDS = Number(args.seconds);
const WARMUP_SECONDS = Number(args.warmup);
const ROUNDS = Number(args.rounds);
const ADMIN_TOKEN = `bench-admin-${crypto.randomBytes(12).toString("hex")}`;
/** Jobs a renter may submit per UTC day by its default quota, less a margin. */
const JOBS_PER_RENTER = 400;
/** Target of the issue: stream heartbeats at least this many times the JSON ones. */
const TARGET_RATIO = 3;

const note = noter("bench:streams");

/** Telemetry as the daemons send it, with this release's version (dispatch wants a current daemon). */
function telemetry(i: number): JsonObject {
  return { ...gpuStatus(i), daemon_version: DAEMON_VERSION } as JsonObject;
}

function jsonBody(key: string, i: number): string {
  return JSON.stringify({ api_key: key, gpu_status: telemetry(i), uptime: 3600 + i, provider_hostname: `rig-${i}`, cached_models: ["llama-3-8b-instruct"] });
}

interface Daemon {
  providerId: number;
  /** Sends one heartbeat; resolves when its ack is read (acks come in order). */
  beat(): Promise<void>;
  jobs: string[];
  close(): void;
}

function heartbeatMessage(i: number): DaemonMessage {
  return create(DaemonMessageSchema, {
    kind: {
      case: "heartbeat",
      value: {
        gpuStatus: fromJson(ValueSchema, telemetry(i)),
        uptime: 3600 + i,
        providerHostname: `rig-${i}`,
        cachedModels: ["llama-3-8b-instruct"],
        daemonVersion: DAEMON_VERSION,
      },
    },
  });
}

const helloMessage = () => create(DaemonMessageSchema, { kind: { case: "hello", value: { daemonVersion: DAEMON_VERSION } } });

/** What a daemon does with the server's messages: acks settle beats in order, jobs are kept. */
class Inbox {
  readonly acks: { resolve(): void; reject(err: Error): void }[] = [];
  readonly jobs: string[] = [];
  private welcomed: (id: number) => void = () => {};
  private failed: (err: Error) => void = () => {};
  readonly welcome = new Promise<number>((resolve, reject) => ((this.welcomed = resolve), (this.failed = reject)));

  onMessage(m: ServerMessage) {
    const k = m.kind;
    if (k.case === "welcome") this.welcomed(Number(k.value.providerId));
    else if (k.case === "heartbeatAck") this.acks.shift()?.resolve();
    else if (k.case === "job") this.jobs.push(k.value.jobId);
    else if (k.case === "error" && k.value.report === "heartbeat") this.acks.shift()?.reject(new Error(`${k.value.code}: ${k.value.message}`));
  }

  onEnd(err: Error) {
    this.failed(err);
    for (const a of this.acks.splice(0)) a.reject(err);
  }

  beat(send: () => void): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      this.acks.push({ resolve, reject });
      send();
    });
  }
}

/** A stream daemon on its own HTTP/2 connection: hello, welcome, then beats on demand. */
function openDaemon(baseUrl: string, key: string, i: number): Promise<Daemon> {
  return CLIENT === "raw" ? openRawDaemon(baseUrl, key, i) : openConnectDaemon(baseUrl, key, i);
}

/** On the generated Connect client, as the TypeScript daemon runs it. */
async function openConnectDaemon(baseUrl: string, key: string, i: number): Promise<Daemon> {
  const client = createClient(DaemonService, createGrpcTransport({ baseUrl }));
  const out = new AsyncQueue<DaemonMessage>();
  const abort = new AbortController();
  const heartbeat = heartbeatMessage(i);
  const inbox = new Inbox();
  out.push(helloMessage());
  void (async () => {
    try {
      for await (const m of client.connect(out, { headers: { "x-provider-key": key }, signal: abort.signal }) as AsyncIterable<ServerMessage>) inbox.onMessage(m);
      throw new Error("stream ended");
    } catch (err) {
      inbox.onEnd(err as Error);
    }
  })();
  const providerId = await inbox.welcome;
  return { providerId, jobs: inbox.jobs, beat: () => inbox.beat(() => out.push(heartbeat)), close: () => (out.close(), abort.abort()) };
}

/** gRPC framing: a flag byte, the length, the message. */
function grpcFrame(m: DaemonMessage): Buffer {
  const body = toBinary(DaemonMessageSchema, m);
  const frame = Buffer.alloc(5 + body.length);
  frame.writeUInt32BE(body.length, 1);
  frame.set(body, 5);
  return frame;
}

/** ServerMessage field 2 (heartbeat_ack), length-delimited: its first byte. */
const ACK_TAG = (2 << 3) | 2;

/** On node:http2 directly: the heartbeat is encoded once, acks are recognised by their tag. */
async function openRawDaemon(baseUrl: string, key: string, i: number): Promise<Daemon> {
  const session = http2.connect(baseUrl);
  session.on("error", () => {});
  const stream = session.request({
    ":method": "POST",
    ":path": `/${DaemonService.typeName}/${DaemonService.method.connect.name}`,
    "content-type": "application/grpc+proto",
    te: "trailers",
    "x-provider-key": key,
  });
  const heartbeat = grpcFrame(heartbeatMessage(i));
  const inbox = new Inbox();
  let buf: Buffer = Buffer.alloc(0);
  stream.on("data", (chunk: Buffer) => {
    buf = buf.length ? Buffer.concat([buf, chunk]) : chunk;
    while (buf.length >= 5) {
      const len = buf.readUInt32BE(1);
      if (buf.length < 5 + len) break;
      const body = buf.subarray(5, 5 + len);
      buf = buf.subarray(5 + len);
      if (body[0] === ACK_TAG) inbox.acks.shift()?.resolve();
      else inbox.onMessage(fromBinary(ServerMessageSchema, body));
    }
  });
  stream.on("close", () => inbox.onEnd(new Error(`stream closed (${stream.rstCode ?? "no code"})`)));
  stream.on("error", () => {});
  stream.write(grpcFrame(helloMessage()));
  const providerId = await inbox.welcome;
  return {
    providerId,
    jobs: inbox.jobs,
    beat: () => inbox.beat(() => stream.write(heartbeat)),
    close: () => (stream.close(), session.close()),
  };
}

interface StreamRun {
  ok: number;
  errors: number;
  latenciesMs: Float64Array;
  elapsedS: number;
}

/** `inFlight` heartbeats in flight over the daemons in turn, for `seconds`. */
async function runStreamBeats(daemons: Daemon[], inFlight: number, seconds: number): Promise<StreamRun> {
  let next = 0;
  let ok = 0;
  let errors = 0;
  const lat: number[] = [];
  const started = performance.now();
  const deadline = started + seconds * 1000;
  await Promise.all(
    Array.from({ length: inFlight }, async () => {
      while (performance.now() < deadline) {
        const d = daemons[next++ % daemons.length];
        const t0 = performance.now();
        try {
          await d.beat();
          ok++;
          lat.push(performance.now() - t0);
        } catch {
          errors++;
        }
      }
    }),
  );
  return { ok, errors, latenciesMs: Float64Array.from(lat), elapsedS: (performance.now() - started) / 1000 };
}

/** Every daemon beats once, the beats spread evenly over `seconds`. */
async function beatEachOnce(daemons: Daemon[], seconds: number) {
  const started = performance.now();
  const lat: number[] = [];
  let errors = 0;
  await Promise.all(
    daemons.map(async (d, i) => {
      const due = started + (i * seconds * 1000) / daemons.length;
      const wait = due - performance.now();
      if (wait > 0) await new Promise((r) => setTimeout(r, wait));
      try {
        await d.beat();
        lat.push(performance.now() - due);
      } catch {
        errors++;
      }
    }),
  );
  const sorted = Float64Array.from(lat).sort();
  return { beats: lat.length, errors, per_s: Math.round(lat.length / seconds), p50_ms: percentile(sorted, 50), p99_ms: percentile(sorted, 99) };
}

/** Server and generator CPU over a phase. */
function cpuMeter(pid: number | undefined) {
  const server = cpuSecondsOf(pid) ?? NaN;
  const self = process.cpuUsage();
  return (beats: number) => {
    const s = (cpuSecondsOf(pid) ?? NaN) - server;
    const g = process.cpuUsage(self);
    const us = (seconds: number) => (Number.isFinite(seconds) ? Math.round((seconds * 1e6) / Math.max(1, beats)) : null);
    return { server_cpu_us_per_beat: us(s), generator_cpu_us_per_beat: us((g.user + g.system) / 1e6) };
  };
}

const perBeat = (seconds: number, beats: number) => (beats > 0 ? Math.round((seconds * 1e6) / beats) : null);

function figures<E extends Record<string, number>>(
  ok: number,
  elapsedS: number,
  latenciesMs: ArrayLike<number>,
  cpu: ReturnType<ReturnType<typeof cpuMeter>> & { database_cpu_us_per_beat: number | null },
  extra: E,
) {
  const sorted = Float64Array.from(latenciesMs).sort();
  return {
    beats_per_s: Math.round(ok / elapsedS),
    ok,
    ...extra,
    p50_ms: percentile(sorted, 50),
    p99_ms: percentile(sorted, 99),
    ...cpu,
  };
}

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};

/** The server's heap as its /metrics reports it (MiB). */
async function heapOf(base: string) {
  const text = await (await fetch(`${base}/metrics`, { headers: { "x-admin-token": ADMIN_TOKEN } })).text();
  const mib = (name: string) => {
    const m = new RegExp(`^${name}(?:\\{[^}]*\\})? ([0-9.e+]+)$`, "m").exec(text);
    return m ? Math.round(Number(m[1]) / 2 ** 20) : null;
  };
  return { heap_used_mb: mib("nodejs_heap_size_used_bytes"), heap_total_mb: mib("nodejs_heap_size_total_bytes"), external_mb: mib("nodejs_external_memory_bytes") };
}


/** One job per daemon, submitted over HTTP; each daemon must get exactly one, on its own stream. */
async function assignOnePerDaemon(base: string, daemons: Daemon[]) {
  const renters = Math.ceil(daemons.length / JOBS_PER_RENTER);
  const keys: string[] = new Array(renters);
  await pool(renters, 8, async (i) => {
    const r = await postJson(`${base}/api/renters/register`, { name: `bench-renter-${i}`, email: `renter-${i}@bench.example.com` });
    keys[i] = r.api_key as string;
    await postJson(`${base}/api/renters/topup`, { amount_halala: 1_000_000 }, { "x-renter-key": keys[i] });
  });
  note(`submitting ${daemons.length} jobs (one per daemon) from ${renters} renters`);
  const placedOn = new Map<string, number>();
  const started = performance.now();
  await pool(daemons.length, 32, async (i) => {
    const r = await postJson(`${base}/api/jobs/submit`, { job_type: "benchmark", duration_minutes: 0.01, params: { suite: "quick" } }, { "x-renter-key": keys[i % renters] });
    const job = r.job as { job_id: string; provider_id: number | null };
    placedOn.set(job.job_id, job.provider_id ?? 0);
  });
  const submitS = (performance.now() - started) / 1000;
  const everyone = () => daemons.every((d) => d.jobs.length >= 1);
  const deadline = Date.now() + 60_000;
  while (!everyone() && Date.now() < deadline) await new Promise((r) => setTimeout(r, 200));
  await new Promise((r) => setTimeout(r, 500)); // a second push would show here
  let exactlyOne = 0;
  let ownJob = 0;
  for (const d of daemons) {
    if (d.jobs.length === 1) exactlyOne++;
    if (d.jobs.every((j) => placedOn.get(j) === d.providerId)) ownJob++;
  }
  return {
    jobs_submitted: placedOn.size,
    placed_at_submit: [...placedOn.values()].filter((p) => p > 0).length,
    submit_s: Math.round(submitS * 10) / 10,
    daemons_with_exactly_one_job: exactlyOne,
    daemons_with_only_their_own_jobs: ownJob,
    every_daemon_got_its_job: exactlyOne === daemons.length && ownJob === daemons.length,
  };
}

async function main() {
  const db = await benchDatabase("svc_bench_streams", note);
  const sql = db.sql;
  const servers = await startServers(1, db.url, { SVC_ADMIN_TOKEN: ADMIN_TOKEN, SVC_HMAC_SECRET: crypto.randomBytes(24).toString("hex") }).catch(async (err) => {
    await db.close();
    throw err;
  });
  const [port] = servers.ports;
  const pid = servers.children[0].pid;
  const base = `http://127.0.0.1:${port}`;
  const memory = memorySampler([pid]);
  const daemons: Daemon[] = [];
  let result: Record<string, unknown> | undefined;
  try {
    note(`seeding ${DAEMONS} approved, online providers in SQL`);
    const keys: string[] = new Array(DAEMONS);
    const ids: number[] = new Array(DAEMONS);
    await seedProviders(sql, DAEMONS, keys, ids);
    await sql`ANALYZE`;
    const idle = memory.stop();
    const sampler = memorySampler([pid]);
    // The largest resident size sampled in each phase, to tell which one makes the peak.
    const phases: Record<string, number> = {};
    let phase = memorySampler([pid]);
    const endPhase = (name: string) => {
      phases[name] = phase.stop().rss_mb_sampled_max;
      phase = memorySampler([pid]);
    };

    note(`opening ${DAEMONS} daemon streams (one HTTP/2 connection each)`);
    const opened = performance.now();
    const byIndex: Daemon[] = new Array(DAEMONS);
    await pool(DAEMONS, 64, async (i) => {
      byIndex[i] = await openDaemon(base, keys[i], i);
    });
    daemons.push(...byIndex);
    const openS = (performance.now() - opened) / 1000;
    if (daemons.some((d, i) => d.providerId !== ids[i])) throw new Error("a daemon was welcomed as another provider");

    const requests = keys.map((k, i) => heartbeatRequest(port, jsonBody(k, i), JSON_WIRE === "connection-each"));
    note(`warm-up ${WARMUP_SECONDS} s each way`);
    endPhase("opening");
    const heapWithStreams = { rss_mb: memoryOf(pid)?.rss_mb ?? null, ...(await heapOf(base)) };
    const json = ONLY !== "stream";
    const stream = ONLY !== "json";
    if (ROUNDS > 0 && json) await jsonBeats([port], requests, CONNECTIONS, WARMUP_SECONDS, false);
    if (ROUNDS > 0 && stream) await runStreamBeats(daemons, CONNECTIONS, WARMUP_SECONDS);

    const rounds: { json: ReturnType<typeof figures<{ non_200: number }>>; stream: ReturnType<typeof figures<{ errors: number }>> }[] = [];
    for (let r = 0; r < ROUNDS; r++) {
      note(`round ${r + 1}/${ROUNDS}: ${SECONDS} s of ${[json && "JSON heartbeats", stream && "heartbeats over streams"].filter(Boolean).join(", then ")}, ${CONNECTIONS} in flight`);
      let meter = cpuMeter(pid);
      let dbMeter = await databaseCpuMeter(sql, db.name);
      const j = json ? await jsonBeats([port], requests, CONNECTIONS, SECONDS, true) : { ok: 0, elapsedS: 1, latenciesMs: [], requests: 0, nonOk: 0 };
      const jsonCpu = meter(j.requests);
      // The pause lets the phase's last telemetry batch (every 250 ms) land in the phase's database CPU.
      await new Promise((res) => setTimeout(res, 500));
      const jsonFigures = figures(j.ok, j.elapsedS, j.latenciesMs, { ...jsonCpu, database_cpu_us_per_beat: perBeat((await dbMeter()).own, j.requests) }, { non_200: j.nonOk });
      meter = cpuMeter(pid);
      dbMeter = await databaseCpuMeter(sql, db.name);
      const s = stream ? await runStreamBeats(daemons, CONNECTIONS, SECONDS) : { ok: 0, elapsedS: 1, latenciesMs: [], errors: 0 };
      const streamCpu = meter(s.ok + s.errors);
      await new Promise((res) => setTimeout(res, 500));
      const streamFigures = figures(s.ok, s.elapsedS, s.latenciesMs, { ...streamCpu, database_cpu_us_per_beat: perBeat((await dbMeter()).own, s.ok + s.errors) }, { errors: s.errors });
      rounds.push({ json: jsonFigures, stream: streamFigures });
      note(`  JSON ${jsonFigures.beats_per_s}/s, streams ${streamFigures.beats_per_s}/s`);
    }
    const cadenceSeconds = Number(args.cadence);
    let cadence: Awaited<ReturnType<typeof beatEachOnce>> | undefined;
    if (cadenceSeconds > 0) {
      note(`every daemon beats once over ${cadenceSeconds} s`);
      cadence = await beatEachOnce(daemons, cadenceSeconds);
    }
    endPhase("beats");
    const jsonMedian = median(rounds.map((r) => r.json.beats_per_s));
    const streamMedian = median(rounds.map((r) => r.stream.beats_per_s));
    const ratio = Math.round((streamMedian / Math.max(1, jsonMedian)) * 100) / 100;

    const assignment = args.assign ? await assignOnePerDaemon(base, daemons) : undefined;
    endPhase("assignment");
    const heapAfter = { rss_mb: memoryOf(pid)?.rss_mb ?? null, ...(await heapOf(base)) };
    const [check] = await sql<{ online: number }[]>`SELECT count(*) FILTER (WHERE status = 'online')::int AS online FROM providers`;
    result = {
      benchmark: "streams",
      daemons: DAEMONS,
      client: CLIENT,
      json_wire: JSON_WIRE,
      connections_in_flight: CONNECTIONS,
      seconds_per_phase: SECONDS,
      streams_opened_in_s: Math.round(openS * 10) / 10,
      rounds,
      json_beats_per_s_median: jsonMedian,
      stream_beats_per_s_median: streamMedian,
      stream_vs_json: ratio,
      target: { stream_vs_json: TARGET_RATIO, met: !ONLY && rounds.length > 0 && ratio >= TARGET_RATIO && rounds.every((r) => r.stream.errors === 0 && r.json.non_200 === 0) },
      ...(cadence ? { cadence: { seconds: cadenceSeconds, ...cadence } } : {}),
      ...(assignment ? { assignment } : {}),
      providers_online: check.online,
      server_memory: {
        before_streams: idle,
        with_streams: sampler.stop(),
        rss_mb_sampled_max_by_phase: phases,
        streams_open: daemons.length,
        heap_after_opening: heapWithStreams,
        heap_at_end: heapAfter,
      },
      load_average_1m: Math.round(os.loadavg()[0] * 100) / 100,
      machine: machine(),
      database: db.kind,
    };
  } finally {
    for (const d of daemons) d.close();
    memory.stop();
    await servers.stop();
    await db.close();
  }
  console.log(JSON.stringify(result));
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
