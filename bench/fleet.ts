// The provider fleet of the heartbeat benches (bench/heartbeat.ts,
// bench/streams.ts): telemetry as daemons send it, providers seeded in SQL,
// a raw HTTP/1.1 heartbeat generator (keep-alive, or a connection per beat), and the servers' memory.
import net from "node:net";
import type { Sql } from "../src/db/index.js";
import { hashKey, newKey } from "../src/domain/accounts/keys.js";
import { answerSplitter, memoryOf } from "./lib.js";

export function gpuStatus(i: number) {
  const vram = [24564, 49140, 81559, 12288][i % 4];
  return {
    gpu_name: ["NVIDIA GeForce RTX 4090", "NVIDIA RTX A6000", "NVIDIA H100 80GB HBM3", "NVIDIA GeForce RTX 3060"][i % 4],
    gpu_vram_mib: vram,
    driver_version: "550.54.14",
    gpu_util_pct: (i * 7) % 100,
    temp_c: 45 + (i % 30),
    power_w: 120 + (i % 200),
    free_vram_mib: Math.floor(vram * 0.8),
    daemon_version: "3.2.0",
    python_version: "3.11.8",
    os_info: "Ubuntu 22.04.4 LTS",
    compute_capability: "8.9",
    cuda_version: "12.4",
    gpu_count: 1,
    all_gpus: [{ index: 0, name: "gpu0", vram_mib: vram, util_pct: (i * 7) % 100, temp_c: 45 + (i % 30) }],
  };
}

export function heartbeatBody(key: string, i: number): string {
  return JSON.stringify({
    api_key: key,
    gpu_status: gpuStatus(i),
    uptime: 3600 + i,
    provider_hostname: `rig-${i}`,
    cached_models: ["llama-3-8b-instruct"],
  });
}

/** `close`: asks for the connection to be closed after the answer, as the legacy daemon's urllib does. */
export function heartbeatRequest(port: number, body: string, close = false): Buffer {
  const b = Buffer.from(body);
  return Buffer.concat([
    Buffer.from(
      `POST /api/providers/heartbeat HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\nContent-Type: application/json\r\n` +
        `${close ? "Connection: close\r\n" : ""}Content-Length: ${b.length}\r\n\r\n`,
    ),
    b,
  ]);
}

export interface RunResult {
  requests: number;
  ok: number;
  nonOk: number;
  statuses: Record<string, number>;
  latenciesMs: Float64Array;
  elapsedS: number;
}

/**
 * Keep-alive connections, one request in flight each, for `seconds`.
 * Requests started after the deadline are not sent; the figures count
 * responses received within the run.
 */
export function runHeartbeats(ports: number[], requests: Buffer[], connections: number, seconds: number, record: boolean, maxRequests = Infinity): Promise<RunResult> {
  return runRequests(ports, requests, connections, seconds, record, maxRequests, false);
}

/**
 * As runHeartbeats, but each request on a connection of its own that the server closes after its
 * answer (`requests` made with `close`), the next one opened once it has: how the legacy daemon
 * beats (urllib opens a connection per request).
 */
export function runHeartbeatsConnectionEach(ports: number[], requests: Buffer[], connections: number, seconds: number, record: boolean): Promise<RunResult> {
  return runRequests(ports, requests, connections, seconds, record, Infinity, true);
}

function runRequests(
  ports: number[],
  requests: Buffer[],
  connections: number,
  seconds: number,
  record: boolean,
  maxRequests: number,
  connectionEach: boolean,
): Promise<RunResult> {
  return new Promise((resolve, reject) => {
    let next = 0;
    let open = connections;
    let ok = 0;
    let nonOk = 0;
    const statuses: Record<string, number> = {};
    let lat = new Float64Array(1 << 20);
    let n = 0;
    const started = performance.now();
    const deadline = started + seconds * 1000;
    const done = () => {
      if (--open === 0) {
        resolve({ requests: ok + nonOk, ok, nonOk, statuses, latenciesMs: lat.subarray(0, n), elapsedS: (performance.now() - started) / 1000 });
      }
    };
    const more = () => performance.now() < deadline && next < maxRequests;
    const connection = (c: number) => {
      const sock = net.connect(ports[c % ports.length], "127.0.0.1");
      sock.setNoDelay(true);
      let sentAt = 0;
      const send = () => {
        if (!more()) {
          sock.end();
          return;
        }
        const req = requests[next++ % requests.length];
        sentAt = performance.now();
        sock.write(req);
      };
      sock.on("connect", send);
      sock.on(
        "data",
        answerSplitter((status) => {
          if (status === "200") ok++;
          else nonOk++;
          statuses[status] = (statuses[status] ?? 0) + 1;
          if (record) {
            if (n === lat.length) {
              const bigger = new Float64Array(lat.length * 2);
              bigger.set(lat);
              lat = bigger;
            }
            lat[n++] = performance.now() - sentAt;
          }
          // With a connection each, the server closes this one: the next request waits for that.
          if (!connectionEach) send();
        }),
      );
      sock.on("error", reject);
      sock.on("close", () => {
        if (connectionEach && more()) connection(c);
        else done();
      });
    };
    for (let c = 0; c < connections; c++) connection(c);
  });
}

/**
 * `count` approved providers, online as if they had been beating, with
 * their keys, inserted set-based in chunks (what registration writes: the
 * provider row and its key's hash).
 */
export async function seedProviders(sql: Sql, count: number, keys: string[], ids: number[]): Promise<void> {
  const CHUNK = 10_000;
  for (let from = 0; from < count; from += CHUNK) {
    const idx = Array.from({ length: Math.min(CHUNK, count - from) }, (_, k) => from + k);
    for (const i of idx) keys[i] = newKey("provider");
    const rows = await sql<{ id: number; i: number }[]>`
      WITH n AS (SELECT i FROM unnest(${idx}::int[]) AS n(i)),
      p AS (
        INSERT INTO providers (name, email, gpu_model, os, approval_status, approved_at, status, status_since, last_heartbeat, first_heartbeat_at)
        SELECT 'bench-rig-' || i, 'bench-' || i || '@bench.example.com',
               (ARRAY['NVIDIA GeForce RTX 4090', 'NVIDIA RTX A6000', 'NVIDIA H100 80GB HBM3', 'NVIDIA GeForce RTX 3060'])[i % 4 + 1],
               'linux', 'approved', now(), 'online', now(), now(), now()
        FROM n ORDER BY i
        RETURNING id, email
      )
      SELECT id, substring(email FROM 'bench-([0-9]+)@')::int AS i FROM p`;
    for (const r of rows) ids[r.i] = r.id;
    await sql`
      INSERT INTO api_keys (key_hash, role, provider_id)
      SELECT decode(h, 'hex'), 'provider', id FROM unnest(${idx.map((i) => hashKey(keys[i]).toString("hex"))}::text[], ${idx.map((i) => ids[i])}::bigint[]) AS k(h, id)`;
  }
}

/** Samples the servers' resident memory every 500 ms; stop() returns the peaks (VmHWM, MiB) and the largest sample. */
export function memorySampler(pids: (number | undefined)[]) {
  let sampledMax = 0;
  let last: { peak_rss_mb: number; rss_mb_sampled_max: number } | undefined;
  const sample = () => {
    for (const pid of pids) sampledMax = Math.max(sampledMax, memoryOf(pid)?.rss_mb ?? 0);
  };
  const timer = setInterval(sample, 500);
  timer.unref();
  return {
    stop() {
      if (last) return last;
      clearInterval(timer);
      sample();
      last = { peak_rss_mb: Math.max(0, ...pids.map((pid) => memoryOf(pid)?.peak_rss_mb ?? 0)), rss_mb_sampled_max: sampledMax };
      return last;
    },
  };
}
