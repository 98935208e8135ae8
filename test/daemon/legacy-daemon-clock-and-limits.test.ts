// svc_daemon.py in situations a provider's machine meets: its clock stepped by NTP mid-job, a job that
// reports progress many times a second while the server enforces its rate limits, a progress phase longer
// than the server takes, a server that asks it to wait (429 with Retry-After) before it sends more logs,
// and a work folder it cannot create. The served file, run as a subprocess against the real server; the
// file from src against a scripted fake server where the real one would not answer as needed.
import fs from "node:fs";
import http from "node:http";
import path from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { useTestServer, type TestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { clearMarketplace } from "../helpers/isolation.js";
import { signTask } from "../../src/shared/task-signature.js";
import { FIXTURES, killedAfterEach, LEGACY_DIR, realPython, runLegacyDaemon, start, tempDir, waitFor, writeExecutable, type Spawned } from "./helpers.js";
import { jobProcesses } from "./procs.js";

/** The served daemon file, written into a folder of its own. */
async function download(srv: TestServer, key: string): Promise<{ file: string; dir: string }> {
  const r = await client(srv.url).get(`/api/providers/download/daemon`, { "x-provider-key": key });
  expect(r.status, r.text).toBe(200);
  const dir = tempDir("legacy-limits");
  const file = path.join(dir, "svc_daemon.py");
  fs.writeFileSync(file, r.text, { mode: 0o600 });
  return { file, dir };
}

/** runLegacyDaemon with its cadences chosen (a server enforcing rate limits takes 4 heartbeats a minute). */
function runDaemon(file: string, dir: string, env: Record<string, string | undefined>, heartbeat = "1", poll = "0.3"): Spawned {
  const smi = writeExecutable(
    dir,
    "nvidia-smi",
    `#!/bin/sh\ncase "$1" in\n  --query-gpu=*) cat '${path.join(FIXTURES, "nvidia-smi-query-2gpu.csv")}' ;;\n  *) cat '${path.join(FIXTURES, "nvidia-smi.txt")}' ;;\nesac\n`,
  );
  return start(realPython(), [file, "--heartbeat-seconds", heartbeat, "--poll-seconds", poll], {
    env: { SVC_NVIDIA_SMI: smi, SVC_DOCKER: "none", SVC_WORK_DIR: path.join(dir, "work"), HOME: dir, PYTHONDONTWRITEBYTECODE: "1", CUDA_VISIBLE_DEVICES: undefined, ...env },
  });
}

/** A runner for llm-inference: `body` (python, after the task is read) runs, then it waits for its gate and writes its result. */
function runner(body: string[]): { runner: string; started(): boolean; open(): void } {
  const dir = tempDir("limits-runner");
  const gate = path.join(dir, "go");
  const started = path.join(dir, "started");
  const file = writeExecutable(
    dir,
    "job.py",
    [
      "#!/usr/bin/env python3",
      "import json, os, sys, time",
      "json.load(sys.stdin)",
      ...body,
      `open(${JSON.stringify(started)}, "w").close()`,
      `while not os.path.exists(${JSON.stringify(gate)}):`,
      "    time.sleep(0.05)",
      'json.dump({"response": "done"}, open(os.environ["SVC_RESULT_FILE"], "w"))',
      "",
    ].join("\n"),
  );
  return { runner: `llm-inference=${realPython()} ${file}`, started: () => fs.existsSync(started), open: () => fs.writeFileSync(gate, "") };
}

async function submit(srv: TestServer, renter: { headers: Record<string, string> }, providerId: number): Promise<string> {
  const r = await client(srv.url).post("/api/jobs/submit", { job_type: "llm-inference", duration_minutes: 1, params: { prompt: "hi", max_tokens: 32 } }, renter.headers);
  expect(r.status, r.text).toBe(201);
  expect(r.body.job.provider_id).toBe(providerId);
  return r.body.job.job_id as string;
}

const jobRow = async (srv: TestServer, jobId: string) => (await srv.sql`SELECT * FROM jobs WHERE job_id = ${jobId}`)[0];

describe("svc_daemon.py on a provider's host", { timeout: 120_000 }, () => {
  const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000" });
  const daemons = killedAfterEach(() => clearMarketplace(srv));

  it("keeps a job running when NTP steps the host's clock forward mid-job: the kill timer measures the job's own time", async () => {
    const p = await makeProvider(srv);
    const renter = await makeRenter(srv, 1_000);
    const { file, dir } = await download(srv, p.key);
    // The host's clock as NTP steps it: two hours ahead from the moment `step` exists (a VM resumed, a
    // machine without an RTC battery synchronising after boot). time.time() is the wall clock.
    const site = tempDir("stepped-clock");
    const step = path.join(site, "stepped");
    fs.writeFileSync(
      path.join(site, "sitecustomize.py"),
      [
        "import os, time",
        "_wall = time.time",
        `_step = ${JSON.stringify(step)}`,
        "time.time = lambda: _wall() + (7200.0 if os.path.exists(_step) else 0.0)",
        "",
      ].join("\n"),
    );
    const job = runner([]);
    const d = runDaemon(file, dir, { SVC_RUNNERS: job.runner, PYTHONPATH: site });
    daemons.push(d);
    const jobId = await submit(srv, renter, p.id);
    await waitFor(async () => (await jobRow(srv, jobId)).status === "running" && job.started(), 45_000, `running (${d.output()})`);
    fs.writeFileSync(step, "");
    // The job has run a few seconds of its 60: it is not killed as having run out of time.
    await new Promise((r) => setTimeout(r, 6_000));
    const now = await jobRow(srv, jobId);
    const [attempt] = await srv.sql`SELECT a.status, a.end_reason, a.fault, a.error FROM job_attempts a JOIN jobs j ON j.id = a.job_id WHERE j.job_id = ${jobId} AND a.attempt = 1`;
    expect({ status: now.status, end_reason: attempt.end_reason, error: attempt.error }).toEqual({ status: "running", end_reason: null, error: null });
    expect(jobProcesses(jobId).length, d.output()).toBeGreaterThan(0);
    job.open();
    const done = await waitFor(async () => {
      const r = await jobRow(srv, jobId);
      return ["completed", "failed", "cancelled"].includes(r.status) ? r : undefined;
    }, 30_000, `job end (${d.output()})`);
    expect(done.status, done.error).toBe("completed");
  });

  it("reports a progress line whose phase is longer than the server takes: cut to 200 characters, its percentage still arrives", async () => {
    const p = await makeProvider(srv);
    const renter = await makeRenter(srv, 1_000);
    const { file, dir } = await download(srv, p.key);
    // A progress line of a renter's program, its phase text 330 characters (the server takes 200).
    const job = runner([`print("SVC_PROGRESS 42 " + "epoch 3/10 " * 30, flush=True)`]);
    const d = runDaemon(file, dir, { SVC_RUNNERS: job.runner });
    daemons.push(d);
    const jobId = await submit(srv, renter, p.id);
    await waitFor(async () => (await jobRow(srv, jobId)).status === "running" && job.started(), 45_000, `running (${d.output()})`);
    const row = await waitFor(async () => {
      const r = await jobRow(srv, jobId);
      return r.progress_pct !== null ? r : undefined;
    }, 10_000, `progress recorded (${d.output()})`).catch(() => undefined);
    expect(row ? Number(row.progress_pct) : null, d.output().slice(-2000)).toBe(42);
    expect(row?.progress_phase).toMatch(/^epoch 3\/10/);
    expect(row?.progress_phase.length).toBeLessThanOrEqual(200);
    job.open();
  });
});

describe("svc_daemon.py against a server enforcing its rate limits", { timeout: 120_000 }, () => {
  const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000", SVC_RATE_LIMITS: "on" });
  // No clearMarketplace: its cancels would meet the exhausted per-IP row too (this server is this block's only).
  const daemons = killedAfterEach();

  it("a job that reports progress many times a second does not use up the provider's request budget: its log lines still arrive", async () => {
    const p = await makeProvider(srv);
    const renter = await makeRenter(srv, 1_000);
    const { file, dir } = await download(srv, p.key);
    // A training loop printing its progress each step (a tqdm-like bar): 500 steps in a couple of seconds,
    // then one ordinary line.
    const job = runner([
      "for i in range(500):",
      '    print("SVC_PROGRESS %d training" % (i // 5), flush=True)',
      "    time.sleep(0.004)",
      'print("checkpoint saved after the burst", flush=True)',
    ]);
    // The spec's cadence: a heartbeat every 30 s (the heartbeat row takes 4 a minute), polls every 2 s.
    const d = runDaemon(file, dir, { SVC_RUNNERS: job.runner }, "30", "2");
    daemons.push(d);
    const jobId = await submit(srv, renter, p.id);
    await waitFor(async () => (await jobRow(srv, jobId)).status === "running" && job.started(), 45_000, `running (${d.output()})`);
    const logged = await waitFor(async () => {
      const rows = await srv.sql`SELECT l.message FROM job_logs l JOIN jobs j ON j.id = l.job_id WHERE j.job_id = ${jobId}`;
      return rows.some((r) => r.message === "checkpoint saved after the burst");
    }, 20_000, "the line after the burst stored").catch(() => false);
    const refused = (d.output().match(/HTTP 429/g) ?? []).length;
    expect({ logged, refused }, d.output().slice(-3000)).toEqual({ logged: true, refused: 0 });
    // The latest progress of the burst is what the server holds.
    const row = await waitFor(async () => {
      const r = await jobRow(srv, jobId);
      return Number(r.progress_pct) === 99 ? r : undefined;
    }, 10_000, `the burst's last progress (${d.output().slice(-2000)})`);
    expect(row.progress_phase).toBe("training");
    job.open();
  });
});

// ---------------------------------------------------------------- a server that asks the daemon to wait --

const SECRET = "limits-hmac-secret";
const KEY = "svc-provider-limitskey";

interface WaitingServer {
  url: string;
  /** Log lines as the server took them, in order. */
  lines: string[];
  /** Every report on the job as [route, ms since the server started, what it answered]. */
  reports: [string, number, number][];
  /** progress_pct of each progress report taken. */
  progress: number[];
  /** Whether the job's result has arrived. */
  resulted(): boolean;
  close(): Promise<void>;
}

/**
 * A fake server that hands out one llm-inference job and answers its first `refusals` log batches 429
 * with `Retry-After: 1` (as the real server does when the provider's per-IP budget is spent).
 */
async function waitingServer(jobId: string, refusals: number): Promise<WaitingServer> {
  const task = {
    version: 1, job_id: jobId, job_type: "llm-inference", container: { image: "nvidia/cuda:12.4.1-runtime-ubuntu22.04", image_type: "cuda" },
    inputs: { prompt: "hi" }, limits: { max_duration_seconds: 120, gpu_requirements: null },
    workspace: { volume: `svc-ws-${jobId}`, mount_path: "/workspace", checkpoint_enabled: false },
  };
  const job = { id: 1, job_id: jobId, job_type: "llm-inference", attempt: 1, max_duration_seconds: 120, duration_minutes: 2, gpu_requirements: null, task_spec: task, task_spec_hmac: signTask(SECRET, task) };
  const began = Date.now();
  const lines: string[] = [];
  const reports: WaitingServer["reports"] = [];
  const progress: number[] = [];
  let handedOut = false;
  let resulted = false;
  let refused = 0;
  const server = http.createServer((req, res) => {
    let body = "";
    req.on("data", (d) => (body += d));
    req.on("end", () => {
      const raw = req.url!.split("?")[0];
      const send = (v: unknown, status = 200, headers: Record<string, string> = {}) => {
        res.writeHead(status, { "content-type": "application/json", ...headers });
        res.end(JSON.stringify(v));
      };
      if (req.method === "GET" && raw === `/api/providers/${KEY}/jobs`) {
        const first = !handedOut;
        handedOut = true;
        return send({ job: first ? job : null });
      }
      if (req.method === "GET" && raw === `/api/jobs/${jobId}`) return send({ status: resulted ? "completed" : "running", attempt: 1 });
      if (raw === `/api/jobs/${jobId}/logs`) {
        const batch = JSON.parse(body).logs as string[];
        if (batch.length > 0 && refused < refusals) {
          refused++;
          reports.push(["logs", Date.now() - began, 429]);
          return send({ error: "rate limit exceeded: 300 requests per minute (all other /api/*); retry in 1 s" }, 429, { "retry-after": "1" });
        }
        reports.push(["logs", Date.now() - began, 200]);
        lines.push(...batch);
        return send({ ok: true, count: batch.length });
      }
      if (raw === `/api/jobs/${jobId}/progress`) {
        reports.push(["progress", Date.now() - began, 200]);
        progress.push(JSON.parse(body).progress_pct);
        return send({ ok: true });
      }
      if (raw === "/api/providers/job-result") {
        reports.push(["result", Date.now() - began, 200]);
        resulted = true;
        return send({ ok: true });
      }
      if (raw === "/api/providers/heartbeat") return send({ approved: true, paused: false });
      if (raw === "/api/providers/readiness") return send({ readiness_status: "ready" });
      return send({ ok: true });
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const port = (server.address() as { port: number }).port;
  return {
    url: `http://127.0.0.1:${port}`, lines, reports, progress, resulted: () => resulted,
    close: () => new Promise((r) => { server.closeAllConnections(); server.close(() => r()); }),
  };
}

describe("svc_daemon.py against a server that asks it to wait", { timeout: 60_000 }, () => {
  const spawned: Spawned[] = [];
  const servers: WaitingServer[] = [];
  afterEach(async () => {
    for (const d of spawned.splice(0)) {
      d.kill("SIGKILL");
      await d.exited;
    }
    for (const s of servers.splice(0)) await s.close();
  });

  it("keeps the log lines a 429 refused and sends them after its Retry-After, every line once and in order; progress goes at most about once a second, its last value before the result", async () => {
    const jobId = "job-waits-for-retry-after";
    const fake = await waitingServer(jobId, 2);
    servers.push(fake);
    const dir = tempDir("legacy-retry-after");
    const file = writeExecutable(
      dir,
      "job.py",
      [
        "import json, sys, time",
        "json.load(sys.stdin)",
        "for i in range(60):",
        '    print("line %d" % i, flush=True)',
        '    print("SVC_PROGRESS %d steps" % (i + 40), flush=True)',
        "    time.sleep(0.05)",
        'print("the last line", flush=True)',
        'print("SVC_PROGRESS 100 done", flush=True)',
        "",
      ].join("\n"),
    );
    const d = runLegacyDaemon(path.join(LEGACY_DIR, "svc_daemon.py"), dir, {
      SVC_BACKEND_URL: fake.url, SVC_API_KEY: KEY, SVC_HMAC_SECRET: SECRET, SVC_RUNNERS: `llm-inference=${realPython()} ${file}`,
    });
    spawned.push(d);
    await waitFor(() => fake.resulted(), 30_000, `the job's result (${d.output()})`);

    const expected = [...Array.from({ length: 60 }, (_, i) => `line ${i}`), "the last line"];
    expect(fake.lines, d.output().slice(-3000)).toEqual(expected);
    // After each 429 the next log batch waited for the Retry-After (1 s).
    const logs = fake.reports.filter((r) => r[0] === "logs");
    for (let i = 0; i < logs.length - 1; i++) {
      if (logs[i][2] === 429) expect(logs[i + 1][1] - logs[i][1], JSON.stringify(logs)).toBeGreaterThanOrEqual(900);
    }
    expect(logs.filter((r) => r[2] === 429)).toHaveLength(2);
    // 62 progress lines over about 3 s: a handful of reports, the last one 100, before the result.
    expect(fake.progress.length, JSON.stringify(fake.progress)).toBeLessThanOrEqual(8);
    expect(fake.progress[fake.progress.length - 1]).toBe(100);
    const order = fake.reports.map((r) => r[0]);
    expect(order.lastIndexOf("progress")).toBeLessThan(order.indexOf("result"));
    expect(order.lastIndexOf("logs")).toBeLessThan(order.indexOf("result"));
  });

  it("exits with a message naming its work folder, not a traceback, when it cannot create the folder", async () => {
    const dir = tempDir("legacy-workdir");
    // A file where the work folder's parent should be: nothing can be created under it.
    const blocker = path.join(dir, "not-a-folder");
    fs.writeFileSync(blocker, "");
    const work = path.join(blocker, "work");
    const d = runLegacyDaemon(path.join(LEGACY_DIR, "svc_daemon.py"), dir, { SVC_BACKEND_URL: "http://127.0.0.1:9", SVC_API_KEY: KEY, SVC_WORK_DIR: work });
    spawned.push(d);
    const code = await d.exited;
    expect(code, d.output()).toBe(1);
    expect(d.output()).toContain(`cannot use the work folder ${work}`);
    expect(d.output()).not.toContain("Traceback");
  });
});

/**
 * A fake server whose first poll and first heartbeat are answered 429 with a Retry-After (as the real
 * server does when a row of the provider's budget is spent); it records when each poll and heartbeat came.
 */
async function busyServer(pollWait: number, beatWait: number) {
  const began = Date.now();
  const polls: [number, number][] = [];
  const beats: [number, number][] = [];
  const server = http.createServer((req, res) => {
    req.resume();
    req.on("end", () => {
      const raw = req.url!.split("?")[0];
      const send = (v: unknown, status = 200, headers: Record<string, string> = {}) => {
        res.writeHead(status, { "content-type": "application/json", ...headers });
        res.end(JSON.stringify(v));
      };
      const at = Date.now() - began;
      if (req.method === "GET" && raw === `/api/providers/${KEY}/jobs`) {
        const refuse = polls.length === 0;
        polls.push([at, refuse ? 429 : 200]);
        return refuse ? send({ error: "rate limit exceeded; retry later" }, 429, { "retry-after": String(pollWait) }) : send({ job: null });
      }
      if (raw === "/api/providers/heartbeat") {
        const refuse = beats.length === 1; // the start's own beat goes through; the loop's first is refused
        beats.push([at, refuse ? 429 : 200]);
        return refuse ? send({ error: "rate limit exceeded; retry later" }, 429, { "retry-after": String(beatWait) }) : send({ approved: true, paused: false });
      }
      if (raw === "/api/providers/readiness") return send({ readiness_status: "ready" });
      return send({ ok: true });
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const port = (server.address() as { port: number }).port;
  return { url: `http://127.0.0.1:${port}`, polls, beats, close: () => new Promise<void>((r) => { server.closeAllConnections(); server.close(() => r()); }) };
}

describe("svc_daemon.py when its polls and heartbeats are refused with a wait", { timeout: 60_000 }, () => {
  it("sends its next poll and its next heartbeat only after the Retry-After each was answered", async () => {
    const fake = await busyServer(2, 3);
    const dir = tempDir("legacy-poll-wait");
    const d = runLegacyDaemon(path.join(LEGACY_DIR, "svc_daemon.py"), dir, { SVC_BACKEND_URL: fake.url, SVC_API_KEY: KEY, SVC_HMAC_SECRET: SECRET });
    try {
      await waitFor(() => fake.polls.length >= 3 && fake.beats.length >= 4, 20_000, `polls ${JSON.stringify(fake.polls)}, beats ${JSON.stringify(fake.beats)} (${d.output().slice(-2000)})`);
      // Polls come every 0.3 s and heartbeats every second, except right after a 429.
      expect(fake.polls[1][0] - fake.polls[0][0], JSON.stringify(fake.polls)).toBeGreaterThanOrEqual(1900);
      expect(fake.polls[2][0] - fake.polls[1][0], JSON.stringify(fake.polls)).toBeLessThan(1500);
      expect(fake.beats[2][0] - fake.beats[1][0], JSON.stringify(fake.beats)).toBeGreaterThanOrEqual(2900);
      expect(fake.beats[3][0] - fake.beats[2][0], JSON.stringify(fake.beats)).toBeLessThan(2500);
    } finally {
      d.kill("SIGKILL");
      await d.exited;
      await fake.close();
    }
  });
});
