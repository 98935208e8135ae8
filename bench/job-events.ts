// Live job events benchmark: watchers held per process, events delivered per
// second, and the lag from a daemon's report to a watcher's receipt.
//
//   npm run bench:job-events [-- --processes 2 --watchers 500 --jobs 10 --interval 100 --seconds 10]
//
// - Database and servers as bench:jobs (bench/lib.ts): a fresh database,
//   `--processes` servers (the build) with rate limits off.
// - One provider (approved, online, one GPU per job) runs `--jobs` jobs.
// - `--watchers` SSE connections per process (GET /api/jobs/{id}/events),
//   spread evenly over the jobs, so each job is watched from every process;
//   an operator's (the admin token: a renter holds at most 32 per process).
// - A reporter posts one log line per job every `--interval` ms (the legacy
//   daemon route), alternating between the processes: most watchers hear of a
//   line written by another process (LISTEN/NOTIFY).
// - Lag: from just before the report is sent to the moment a watcher has
//   parsed the line (same clock, this process). Each line carries its index.
// - Afterwards every job gets its result; each stream must end with its
//   outcome after every line exactly once, in order (checked, reported).
// The last line printed is one JSON object with the figures.
import crypto from "node:crypto";
import http from "node:http";
import { parseArgs } from "node:util";
import { benchDatabase, cpuSecondsOf, machine, machineCpuSeconds, noter, percentile, pool, postJson, postgresCpuSeconds, startServers } from "./lib.js";
import { DAEMON_VERSION } from "../src/daemon/ts/version.js";

const { values: args } = parseArgs({
  options: {
    processes: { type: "string", default: "2" },
    watchers: { type: "string", default: "500" },
    jobs: { type: "string", default: "10" },
    interval: { type: "string", default: "100" },
    seconds: { type: "string", default: "10" },
  },
});
const PROCESSES = Number(args.processes);
const WATCHERS = Number(args.watchers);
const JOBS = Number(args.jobs);
const INTERVAL_MS = Number(args.interval);
const SECONDS = Number(args.seconds);
const ADMIN_TOKEN = `bench-admin-${crypto.randomBytes(12).toString("hex")}`;
const note = noter("bench:job-events");


const agent = new http.Agent({ keepAlive: false, maxSockets: Infinity });

interface Watcher {
  job: number;
  /** Line indexes received, in order. */
  lines: number[];
  outcome: boolean;
  ended: Promise<void>;
  ready: Promise<void>;
}

const LINE = /"message":"L(\d+):(\d+)"/;

/** One SSE watcher; `onLine(job, index)` is called as each line is parsed. */
function watch(port: number, jobId: string, job: number, onLine: (job: number, index: number) => void): Watcher {
  const w = { job, lines: [] as number[], outcome: false } as Watcher;
  let ready!: () => void;
  w.ready = new Promise((r) => (ready = r));
  w.ended = new Promise((resolve, reject) => {
    const req = http.get({ host: "127.0.0.1", port, path: `/api/jobs/${jobId}/events`, headers: { "x-admin-token": ADMIN_TOKEN }, agent }, (res) => {
      if (res.statusCode !== 200) return reject(new Error(`watch: ${res.statusCode}`));
      res.setEncoding("utf8");
      let buf = "";
      res.on("data", (chunk: string) => {
        buf += chunk;
        let i: number;
        while ((i = buf.indexOf("\n\n")) >= 0) {
          const frame = buf.slice(0, i);
          buf = buf.slice(i + 2);
          if (frame.startsWith("event: snapshot")) ready();
          else if (frame.startsWith("event: log")) {
            const m = LINE.exec(frame);
            if (m) {
              w.lines.push(Number(m[2]));
              onLine(Number(m[1]), Number(m[2]));
            }
          } else if (frame.startsWith("event: outcome")) w.outcome = true;
        }
      });
      res.on("end", () => resolve());
      res.on("error", reject);
    });
    req.on("error", reject);
  });
  return w;
}

async function main() {
  const db = await benchDatabase("svc_bench_events", note);
  const servers = await startServers(PROCESSES, db.url, { SVC_ADMIN_TOKEN: ADMIN_TOKEN, SVC_HMAC_SECRET: crypto.randomBytes(24).toString("hex") }).catch(async (err) => {
    await db.close();
    throw err;
  });
  const { ports, children } = servers;
  const bases = ports.map((p) => `http://127.0.0.1:${p}`);
  let result: Record<string, unknown> | undefined;
  try {
    const renter = await postJson(`${bases[0]}/api/renters/register`, { name: "bench-renter", email: "watch@bench.example.com" });
    const rk = renter.api_key as string;
    await postJson(`${bases[0]}/api/renters/topup`, { amount_halala: 10_000_000 }, { "x-renter-key": rk });
    const prov = await postJson(`${bases[0]}/api/providers/register`, { name: "bench-rig", email: "rig@bench.example.com", gpu_model: "NVIDIA H100 80GB HBM3", os: "linux" });
    const pk = prov.api_key as string;
    await postJson(`${bases[0]}/api/admin/providers/${prov.provider_id}/approve`, {}, { "x-admin-token": ADMIN_TOKEN });
    await postJson(`${bases[0]}/api/providers/heartbeat`, {
      api_key: pk,
      gpu_status: { gpu_name: "NVIDIA H100 80GB HBM3", gpu_vram_mib: 81559, gpu_count: JOBS, daemon_version: DAEMON_VERSION },
    });
    const jobIds: string[] = [];
    for (let j = 0; j < JOBS; j++) {
      const s = await postJson(`${bases[0]}/api/jobs/submit`, { job_type: "benchmark", duration_minutes: 60 }, { "x-renter-key": rk });
      jobIds.push(s.job.job_id);
    }
    for (let j = 0; j < JOBS; j++) await fetch(`${bases[0]}/api/providers/${pk}/jobs`).then((r) => r.json());

    note(`opening ${WATCHERS} watchers in each of ${PROCESSES} process(es) over ${JOBS} jobs`);
    const sentAt: number[][] = jobIds.map(() => []);
    const lags: number[] = [];
    let measuring = false;
    let delivered = 0;
    const onLine = (job: number, index: number) => {
      if (!measuring) return;
      delivered++;
      lags.push(performance.now() - sentAt[job][index]);
    };
    const watchers: Watcher[] = [];
    await pool(WATCHERS * PROCESSES, 32, async (i) => {
      const p = i % PROCESSES;
      const job = Math.floor(i / PROCESSES) % JOBS;
      const w = watch(ports[p], jobIds[job], job, onLine);
      w.ended.catch((err) => note(`watcher failed: ${err.message}`));
      watchers.push(w);
      await w.ready;
    });

    note(`reporting one line per job every ${INTERVAL_MS} ms for ${SECONDS} s`);
    const cpuBefore = children.map((c) => cpuSecondsOf(c.pid));
    const [pgBefore, machineBefore] = [postgresCpuSeconds(), machineCpuSeconds()];
    measuring = true;
    const started = performance.now();
    let reports = 0;
    await Promise.all(
      jobIds.map(async (jobId, j) => {
        for (let k = 0; performance.now() - started < SECONDS * 1000; k++) {
          const due = started + k * INTERVAL_MS + (j * INTERVAL_MS) / JOBS;
          const wait = due - performance.now();
          if (wait > 0) await new Promise((r) => setTimeout(r, wait));
          sentAt[j][k] = performance.now();
          await postJson(`${bases[(j + k) % PROCESSES]}/api/jobs/${jobId}/logs`, { api_key: pk, logs: [`L${j}:${k}`] });
          reports++;
        }
      }),
    );
    // The last lines in flight.
    const expected = sentAt.map((s) => s.length);
    const deadline = performance.now() + 10_000;
    while (watchers.some((w) => w.lines.length < expected[w.job]) && performance.now() < deadline) await new Promise((r) => setTimeout(r, 20));
    const elapsedS = (performance.now() - started) / 1000;
    measuring = false;
    const cpuAfter = children.map((c) => cpuSecondsOf(c.pid));
    const [pgCpu, machineAfter] = [postgresCpuSeconds() - pgBefore, machineCpuSeconds()];
    const serverCpu = cpuAfter.reduce((sum: number, v, i) => sum + ((v ?? 0) - (cpuBefore[i] ?? 0)), 0);

    note("finishing the jobs");
    await pool(JOBS, 4, async (j) => {
      await postJson(`${bases[0]}/api/providers/job-result`, { api_key: pk, job_id: jobIds[j], success: true, result: { response: "ok" } });
    });
    await Promise.race([Promise.allSettled(watchers.map((w) => w.ended)), new Promise((r) => setTimeout(r, 15_000))]);
    const exact = watchers.filter((w) => w.outcome && w.lines.length === expected[w.job] && w.lines.every((x, i) => x === i)).length;

    result = {
      benchmark: "job-events",
      processes: PROCESSES,
      watchers_per_process: WATCHERS,
      watchers_total: watchers.length,
      jobs: JOBS,
      report_interval_ms: INTERVAL_MS,
      duration_s: Math.round(elapsedS * 100) / 100,
      reports,
      reports_per_s: Math.round(reports / elapsedS),
      events_delivered: delivered,
      events_delivered_per_s: Math.round(delivered / elapsedS),
      lag_p50_ms: percentile(lags, 50),
      lag_p90_ms: percentile(lags, 90),
      lag_p99_ms: percentile(lags, 99),
      lag_max_ms: percentile(lags, 100),
      server_cpu_ms_per_report: Math.round((serverCpu * 1e5) / Math.max(1, reports)) / 100,
      database_cpu_ms_per_report: Math.round((pgCpu * 1e5) / Math.max(1, reports)) / 100,
      machine_busy_pct: Math.round((1000 * (machineAfter.busy - machineBefore.busy)) / Math.max(0.01, machineAfter.total - machineBefore.total)) / 10,
      verified: { watchers_with_every_line_once_in_order_and_outcome: exact, watchers: watchers.length },
      machine: machine(),
      database: db.kind,
    };
  } finally {
    await servers.stop();
    await db.close();
  }
  console.log(JSON.stringify(result));
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
