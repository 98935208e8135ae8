// What every bench needs: a database of its own, the service in child
// processes on free loopback ports, a worker pool, percentiles, CPU time and
// a description of the machine. Each bench script keeps only its load.
import { execFileSync, spawn, type ChildProcess } from "node:child_process";
import crypto from "node:crypto";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { pathToFileURL } from "node:url";
import { connect, type Sql } from "../src/db/index.js";
import { startEmbedded, type EmbeddedServer } from "../src/db/embedded.js";
import { createLogger } from "../src/log.js";
import { EVENT_LOOP_SAMPLE_MS } from "../src/metrics/metrics.js";

/** A progress line on stderr (stdout carries only the final JSON line). */
/** POSTs JSON and answers the JSON body; throws on a status of 300 or more. */
export async function postJson(url: string, body: unknown, headers: Record<string, string> = {}): Promise<Record<string, any>> {
  const r = await fetch(url, { method: "POST", headers: { "content-type": "application/json", ...headers }, body: JSON.stringify(body) });
  const json = (await r.json()) as Record<string, any>;
  if (r.status >= 300) throw new Error(`${url}: ${r.status} ${JSON.stringify(json)}`);
  return json;
}

export const noter = (tag: string) => (msg: string) => process.stderr.write(`[${tag}] ${msg}\n`);

export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const port = (s.address() as net.AddressInfo).port;
      s.close(() => resolve(port));
    });
  });
}

/** Runs `fn` over 0..n-1 with `concurrency` calls in flight. */
export async function pool(n: number, concurrency: number, fn: (i: number) => Promise<void>): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (next < n) await fn(next++);
    }),
  );
}

/** The p-th percentile (nearest rank) in ms, rounded to µs; null when there are no values. */
export function percentile(values: ArrayLike<number>, p: number): number | null {
  if (values.length === 0) return null;
  const sorted = Float64Array.from(values).sort();
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return Math.round(sorted[i] * 1000) / 1000;
}

/** CPU seconds (user + system) a process has used so far, from /proc (Linux). */
export function cpuSecondsOf(pid: number | undefined): number | undefined {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, "utf8");
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return (Number(fields[11]) + Number(fields[12])) / 100; // utime, stime in clock ticks (USER_HZ = 100)
  } catch {
    return undefined;
  }
}

/** Resident memory of a process now and at its peak (VmRSS, VmHWM from /proc, in MiB; Linux). */
export function memoryOf(pid: number | undefined): { rss_mb: number; peak_rss_mb: number } | undefined {
  try {
    const status = fs.readFileSync(`/proc/${pid}/status`, "utf8");
    const kib = (field: string) => Number(new RegExp(`^${field}:\\s+(\\d+) kB`, "m").exec(status)?.[1]);
    return { rss_mb: Math.round(kib("VmRSS") / 1024), peak_rss_mb: Math.round(kib("VmHWM") / 1024) };
  } catch {
    return undefined;
  }
}

/** CPU seconds of every process named `postgres` on this machine (every database's; local servers only). */
export function postgresCpuSeconds(): number {
  let total = 0;
  for (const pid of fs.readdirSync("/proc").filter((d) => /^\d+$/.test(d))) {
    try {
      if (fs.readFileSync(`/proc/${pid}/comm`, "utf8").trim() !== "postgres") continue;
      total += cpuSecondsOf(Number(pid)) ?? 0;
    } catch {
      // the process ended meanwhile
    }
  }
  return total;
}

/** The parent's pid of a process (Linux), from /proc. */
function parentOf(pid: number): number | undefined {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, "utf8");
    return Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
  } catch {
    return undefined;
  }
}

/**
 * CPU of one database's PostgreSQL processes over a phase, apart from the
 * rest of the server's: `own` sums the backends connected to `datname`
 * (pids from pg_stat_activity at the start and at the end; a pool's backends
 * live through the phase, and one that appeared meanwhile counts whole),
 * `shared` the background processes every database shares (WAL writer,
 * checkpointer, background writer, launchers, the postmaster), which other
 * databases' work on the same server also feeds. Local servers only (/proc).
 * `ended` counts own backends gone by the end, whose CPU in the phase is lost.
 */
export async function databaseCpuMeter(sql: Sql, datname: string) {
  const sample = async () => {
    const rows = await sql<{ pid: number; datname: string | null }[]>`
      SELECT pid, datname FROM pg_stat_activity WHERE datname = ${datname} OR (datname IS NULL AND backend_type <> 'client backend')`;
    const own = new Map<number, number>();
    const shared = new Map<number, number>();
    for (const r of rows) (r.datname === null ? shared : own).set(r.pid, cpuSecondsOf(r.pid) ?? 0);
    const postmaster = rows.length ? parentOf(rows[0].pid) : undefined;
    if (postmaster) shared.set(postmaster, cpuSecondsOf(postmaster) ?? 0);
    return { own, shared };
  };
  const before = await sample();
  const delta = (b: Map<number, number>, a: Map<number, number>) => [...a].reduce((sum, [pid, cpu]) => sum + cpu - (b.get(pid) ?? 0), 0);
  return async () => {
    const after = await sample();
    return {
      own: delta(before.own, after.own),
      shared: delta(before.shared, after.shared),
      ended: [...before.own.keys()].filter((pid) => !after.own.has(pid)).length,
    };
  };
}

/** Busy and total CPU time of the whole machine so far (seconds, all cores), from /proc/stat. */
export function machineCpuSeconds(): { busy: number; total: number } {
  const [, ...fields] = fs.readFileSync("/proc/stat", "utf8").split("\n")[0].trim().split(/\s+/);
  const t = fields.map(Number);
  const total = t.reduce((a, b) => a + b, 0);
  const idle = t[3] + (t[4] ?? 0); // idle + iowait
  return { busy: (total - idle) / 100, total: total / 100 };
}

export function machine() {
  const cpus = os.cpus();
  return { cpus: cpus.length, cpu_model: cpus[0]?.model ?? "unknown", memory_gb: Math.round(os.totalmem() / 2 ** 30), node: process.version };
}

export interface BenchDatabase {
  /** URL of the bench's own, empty database. */
  url: string;
  /** "DATABASE_URL" or "embedded": where it lives. */
  kind: string;
  /** A small pool on it, for set-up and checks. */
  sql: Sql;
  /** The database's name. */
  name: string;
  /** True when an existing database was reused (nothing was created). */
  reused: boolean;
  /**
   * Closes the pool and drops the database (unless kept or reused; BENCH_KEEP_DB=1 keeps it, to look at
   * plans). `drop` drops a new database even when it was to be kept (a failed set-up).
   */
  close(opts?: { drop?: boolean }): Promise<void>;
}

export interface BenchDatabaseOptions {
  /** Use this existing database (kept by an earlier run) instead of creating one; it is never dropped. */
  reuse?: string;
  /** Keep the new database after the run (its name is printed), for a later `reuse`. */
  keep?: boolean;
}

/**
 * A fresh database on DATABASE_URL when set, otherwise on an embedded
 * PostgreSQL under .data/bench-pg (started here, stopped by close()).
 */
export async function benchDatabase(
  prefix: string,
  note: (msg: string) => void,
  embeddedPort = 54500,
  opts: BenchDatabaseOptions = {},
): Promise<BenchDatabase> {
  let embedded: EmbeddedServer | undefined;
  let baseUrl = process.env.DATABASE_URL;
  const kind = baseUrl ? "DATABASE_URL" : "embedded";
  if (!baseUrl) {
    note("starting embedded PostgreSQL in .data/bench-pg");
    embedded = await startEmbedded(path.resolve(".data/bench-pg"), createLogger("silent"), embeddedPort);
    baseUrl = embedded.url;
  }
  if (opts.reuse !== undefined && !/^[a-z_][a-z0-9_]*$/.test(opts.reuse)) throw new Error(`not a database name: ${opts.reuse}`);
  const name = opts.reuse ?? `${prefix}_${crypto.randomBytes(5).toString("hex")}`;
  const admin = connect(baseUrl, 1);
  if (opts.reuse === undefined) await admin.unsafe(`CREATE DATABASE ${name}`);
  // BENCH_DB_SETTINGS="name=value;..." sets parameters for the database's sessions, e.g. auto_explain
  // (session_preload_libraries=auto_explain;auto_explain.log_min_duration=0) to see the plans run.
  for (const setting of (process.env.BENCH_DB_SETTINGS ?? "").split(";").filter(Boolean)) {
    const [key, ...value] = setting.split("=");
    if (!/^[a-z_][a-z0-9_.]*$/.test(key.trim())) throw new Error(`not a parameter name: ${key}`);
    await admin.unsafe(`ALTER DATABASE ${name} SET ${key.trim()} = '${value.join("=").replace(/'/g, "''")}'`);
  }
  const url = new URL(baseUrl);
  url.pathname = `/${name}`;
  const sql = connect(url.toString(), 2);
  return {
    url: url.toString(),
    kind,
    sql,
    name,
    reused: opts.reuse !== undefined,
    async close(how = {}) {
      await sql.end();
      if (opts.reuse !== undefined) note(`left database ${name} in place`);
      else if (!how.drop && (opts.keep || process.env.BENCH_KEEP_DB)) note(`kept database ${name}`);
      else await admin.unsafe(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
      await admin.end();
      await embedded?.stop();
    },
  };
}

async function waitReady(base: string, child: ChildProcess): Promise<void> {
  const deadline = Date.now() + 60_000;
  while (Date.now() < deadline) {
    if (child.exitCode !== null) throw new Error(`server exited with ${child.exitCode}`);
    const ok = await fetch(`${base}/readyz`).then((r) => r.status === 200, () => false);
    if (ok) return;
    await new Promise((r) => setTimeout(r, 200));
  }
  throw new Error("server did not become ready within 60 s");
}

export interface BenchServers {
  ports: number[];
  children: ChildProcess[];
  /** SIGTERM to each, and waits for them to exit. */
  stop(): Promise<void>;
}

/**
 * Splits the answers of a keep-alive HTTP/1.1 socket (Content-Length bodies,
 * as the service sends them): feed it each chunk read; it calls `onAnswer`
 * with each complete answer's status (three characters) and body, in order.
 */
export function answerSplitter(onAnswer: (status: string, body: Buffer) => void): (chunk: Buffer) => void {
  let buf: Buffer = Buffer.alloc(0);
  return (chunk) => {
    buf = buf.length ? Buffer.concat([buf, chunk]) : chunk;
    for (;;) {
      const headEnd = buf.indexOf("\r\n\r\n");
      if (headEnd < 0) return;
      const head = buf.subarray(0, headEnd).toString("latin1");
      const len = Number(/content-length:\s*(\d+)/i.exec(head)?.[1] ?? 0);
      if (buf.length < headEnd + 4 + len) return;
      const body = buf.subarray(headEnd + 4, headEnd + 4 + len);
      buf = buf.subarray(headEnd + 4 + len);
      onAnswer(head.slice(9, 12), body);
    }
  };
}

/** A server's event-loop delay since the last read (beyond the sampling interval), and its GC pauses so far (from its /metrics). */
export interface StallSample {
  eventLoopDelayP99Ms: number;
  eventLoopDelayMaxMs: number;
  /** By kind (major, minor, incremental, weakcb): pauses and their total, cumulative. */
  gc: Record<string, { count: number; totalMs: number }>;
  /** The route's answers so far by the server's own timing: how many took at most each bucket's seconds. */
  answered: Map<string, number>;
  /** The submit groups so far (svc_submit_group_*): sums and counts, and the waits by bucket. */
  groups: { count: number; submits: number; waitSum: number; writeSum: number; waitsAtMost: Map<string, number> };
}

/**
 * Reads the servers' /metrics. prom-client resets its event-loop delay
 * histogram on each read, so a read before a phase starts its window and a
 * read after it gives the phase's delay percentiles.
 */
export async function readStalls(ports: number[], route?: string): Promise<StallSample[]> {
  return Promise.all(
    ports.map(async (port) => {
      const text = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
      const value = (name: string) => Number(new RegExp(`^${name} ([0-9.eE+-]+)`, "m").exec(text)?.[1] ?? NaN);
      const gc: StallSample["gc"] = {};
      for (const m of text.matchAll(/^nodejs_gc_duration_seconds_(sum|count)\{kind="(\w+)"\} ([0-9.eE+-]+)/gm)) {
        const k = (gc[m[2]] ??= { count: 0, totalMs: 0 });
        if (m[1] === "sum") k.totalMs = Number(m[3]) * 1000;
        else k.count = Number(m[3]);
      }
      // svc_request_duration_seconds of the route, every status together.
      const answered = new Map<string, number>();
      if (route) {
        for (const m of text.matchAll(/^svc_request_duration_seconds_bucket\{(.*)\} ([0-9.eE+-]+)$/gm)) {
          const le = /le="([^"]+)"/.exec(m[1])?.[1];
          if (le && m[1].includes(`route="${route}"`)) answered.set(le, (answered.get(le) ?? 0) + Number(m[2]));
        }
      }
      const waitsAtMost = new Map<string, number>();
      for (const m of text.matchAll(/^svc_submit_group_wait_seconds_bucket\{le="([^"]+)"\} ([0-9.eE+-]+)$/gm)) waitsAtMost.set(m[1], Number(m[2]));
      const groups = {
        count: value("svc_submit_group_size_count") || 0,
        submits: value("svc_submit_group_size_sum") || 0,
        waitSum: value("svc_submit_group_wait_seconds_sum") || 0,
        writeSum: value("svc_submit_group_write_seconds_sum") || 0,
        waitsAtMost,
      };
      const delay = (name: string) => Math.max(0, value(name) * 1000 - EVENT_LOOP_SAMPLE_MS);
      return { eventLoopDelayP99Ms: delay("nodejs_eventloop_lag_p99_seconds"), eventLoopDelayMaxMs: delay("nodejs_eventloop_lag_max_seconds"), gc, answered, groups };
    }),
  );
}

/** What stalled the servers between two reads: event-loop delay (worst server) and GC pauses (all servers). */
export function serverStalls(before: StallSample[], after: StallSample[]) {
  const round = (n: number) => Math.round(n * 10) / 10;
  const gc: Record<string, { pauses: number; total_ms: number; mean_ms: number }> = {};
  after.forEach((a, i) => {
    for (const [kind, k] of Object.entries(a.gc)) {
      const b = before[i]?.gc[kind] ?? { count: 0, totalMs: 0 };
      const g = (gc[kind] ??= { pauses: 0, total_ms: 0, mean_ms: 0 });
      g.pauses += k.count - b.count;
      g.total_ms += k.totalMs - b.totalMs;
    }
  });
  for (const g of Object.values(gc)) {
    g.mean_ms = g.pauses ? round(g.total_ms / g.pauses) : 0;
    g.total_ms = round(g.total_ms);
  }
  // The route's answers that took the server longer than 5, 10, 25, 50 and 100 ms, by its own timing
  // (from the request read to the answer written): a tail the client sees beyond these waited
  // outside the handler (socket buffers, the accept queue, the event loop's turn).
  let total = 0;
  const atMost = new Map<string, number>();
  after.forEach((a, i) => {
    for (const [le, n] of a.answered) {
      const d = n - (before[i]?.answered.get(le) ?? 0);
      if (le === "+Inf") total += d;
      else atMost.set(le, (atMost.get(le) ?? 0) + d);
    }
  });
  const over = (le: string) => total - (atMost.get(le) ?? 0);
  // The submit groups written meanwhile (all servers): their size, how long a submit waited for its
  // group to start, and how long a group took to write.
  const g = { count: 0, submits: 0, waitSum: 0, writeSum: 0, waitsOver: new Map<string, number>() };
  after.forEach((a, i) => {
    const b = before[i]?.groups;
    g.count += a.groups.count - (b?.count ?? 0);
    g.submits += a.groups.submits - (b?.submits ?? 0);
    g.waitSum += a.groups.waitSum - (b?.waitSum ?? 0);
    g.writeSum += a.groups.writeSum - (b?.writeSum ?? 0);
    for (const le of ["0.005", "0.01", "0.025"]) {
      const inWindow = (a.groups.waitsAtMost.get(le) ?? 0) - (b?.waitsAtMost.get(le) ?? 0);
      g.waitsOver.set(le, (g.waitsOver.get(le) ?? 0) + inWindow);
    }
  });
  const groups =
    g.count > 0
      ? {
          submit_groups: {
            groups: g.count,
            mean_size: round(g.submits / g.count),
            mean_wait_ms: round((1000 * g.waitSum) / g.submits),
            mean_write_ms: round((1000 * g.writeSum) / g.count),
            waited_over_5_ms: g.submits - (g.waitsOver.get("0.005") ?? 0),
            waited_over_10_ms: g.submits - (g.waitsOver.get("0.01") ?? 0),
            waited_over_25_ms: g.submits - (g.waitsOver.get("0.025") ?? 0),
          },
        }
      : {};
  return {
    event_loop_delay_p99_ms: round(Math.max(...after.map((a) => a.eventLoopDelayP99Ms))),
    event_loop_delay_max_ms: round(Math.max(...after.map((a) => a.eventLoopDelayMaxMs))),
    gc,
    ...(total > 0 ? { answered_by_server: { total, over_5_ms: over("0.005"), over_10_ms: over("0.01"), over_25_ms: over("0.025"), over_50_ms: over("0.05"), over_100_ms: over("0.1") } } : {}),
    ...groups,
  };
}

/**
 * `count` servers on free loopback ports, on one database, with rate limits
 * off (the documented limits would otherwise be the whole bench) and
 * warn-level logs; started one at a time, so the first applies the
 * migrations. They run as `npm start` runs them: the build (bin/build.mjs),
 * made for this call in a folder of its own and removed on stop(); a checkout
 * without the build runs src/main.ts on tsx. BENCH_NODE_ARGS adds node flags (after the
 * server's own, serverNodeFlags);
 * BENCH_CPU_PROF=dir profiles each server (--cpu-prof; the file is written
 * when it exits on stop()). BENCH_SERVER_DIR runs the servers of another
 * checkout (its sources and node_modules), for an A/B on one harness.
 */
/** The checkout's build in a folder of this process (concurrent benches do not share one); undefined where it has no build. */
export function buildServer(cwd: string): { dir: string; main: string } | undefined {
  if (!fs.existsSync(path.join(cwd, "bin", "build.mjs"))) return undefined;
  const dir = path.join(".data", `bench-build-${process.pid}-${crypto.randomBytes(3).toString("hex")}`);
  execFileSync(process.execPath, ["bin/build.mjs", "--out", dir], { cwd, stdio: ["ignore", "ignore", "inherit"] });
  return { dir, main: path.join(dir, "src", "main.js") };
}

/**
 * The node flags `npm start` gives the server of the checkout at `cwd` (bin/node-flags.mjs), so that each
 * side of an A/B runs as its own start script runs it; BENCH_NODE_ARGS come after them and win.
 */
export async function serverNodeFlags(cwd: string): Promise<string[]> {
  const file = path.join(cwd, "bin", "node-flags.mjs");
  if (!fs.existsSync(file)) return ["--enable-source-maps"];
  return [...((await import(pathToFileURL(file).href)) as { SERVER_NODE_FLAGS: readonly string[] }).SERVER_NODE_FLAGS];
}

export async function startServers(count: number, databaseUrl: string, env: Record<string, string>): Promise<BenchServers> {
  const nodeArgs = (process.env.BENCH_NODE_ARGS ?? "").split(" ").filter(Boolean);
  const profDir = process.env.BENCH_CPU_PROF;
  if (profDir) nodeArgs.push("--cpu-prof", `--cpu-prof-dir=${path.resolve(profDir)}`);
  const cwd = process.env.BENCH_SERVER_DIR ? path.resolve(process.env.BENCH_SERVER_DIR) : process.cwd();
  const build = buildServer(cwd);
  const flags = build ? await serverNodeFlags(cwd) : [];
  const ports: number[] = [];
  const children: ChildProcess[] = [];
  const stop = async () => {
    for (const c of children) c.kill("SIGTERM");
    await Promise.all(children.map((c) => new Promise((r) => (c.exitCode !== null ? r(null) : c.once("exit", r)))));
    if (build) fs.rmSync(path.join(cwd, build.dir), { recursive: true, force: true });
  };
  try {
    for (let i = 0; i < count; i++) {
      const port = await freePort();
      const child = spawn(process.execPath, build ? [...flags, ...nodeArgs, build.main] : [...nodeArgs, "--import", "tsx", "src/main.ts"], {
        cwd,
        env: {
          ...process.env,
          NODE_ENV: "development",
          DATABASE_URL: databaseUrl,
          PORT: String(port),
          HOST: "127.0.0.1",
          SVC_RATE_LIMITS: "off",
          LOG_LEVEL: "warn",
          // The harness reads each server's event-loop delay and GC pauses (serverStalls).
          SVC_METRICS: "open",
          ...env,
        },
        stdio: ["ignore", "inherit", "inherit"],
      });
      children.push(child);
      ports.push(port);
      await waitReady(`http://127.0.0.1:${port}`, child);
    }
  } catch (err) {
    await stop();
    throw err;
  }
  return { ports, children, stop };
}
