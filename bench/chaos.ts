// Faults under load: several server processes on one PostgreSQL, providers and
// careful renters working, while processes are killed, daemons die mid-job,
// the database restarts and daemon streams are cut; then the books and every
// client's view are checked.
//
//   npm run chaos [-- --seconds 50 --instances 4 --stream-daemons 3 --pollers 2 --renters 6 --seed 1]
//
// - Database: an embedded PostgreSQL under .data/chaos-pg that this harness
//   starts, restarts (fast shutdown, under load) and stops; a fresh database
//   in it per run. `--database-url URL` uses another server instead; its
//   restarts then happen only with `--pg-cluster VERSION/NAME` (pg_ctlcluster
//   VERSION NAME restart -m fast, for a system cluster the user opted in).
//   `--keep` keeps the run's database (named on stderr) to look at afterwards.
// - Servers: `--instances` copies of the build (bin/build.mjs, as `npm start`
//   runs it) on fixed loopback ports with one admin token and HMAC secret; a
//   killed one is started again on its port.
// - Providers: `--stream-daemons` bin/svc-daemon.js processes (a fast --runner
//   for llm-inference, a fake nvidia-smi with two GPUs), each behind a TCP
//   proxy of this harness that plays the load balancer (its instance, or the
//   next one up) and cuts the stream on demand; `--pollers` legacy-protocol
//   providers in this process (heartbeat, poll, progress, job-result).
// - Renters: `--renters` careful clients: an Idempotency-Key on every submit
//   and top-up, retried on connection errors and 5xx against the next
//   instance with the same key until a definitive answer; at most two active
//   jobs each; status reads, cancels, top-ups when short, outputs read and
//   compared with what the runner wrote; a webhook receiver for their
//   job.completed/failed/cancelled notifications (signatures checked).
// - Faults for `--seconds`: SIGKILL of a server process (restarted after a
//   moment; at least one stays up), SIGKILL of a stream daemon running a job
//   (restarted), a fast restart of PostgreSQL, daemon streams cut, an
//   operator's re-queue of a running job (with two providers or more). The short
//   default run has at least 5 server kills and one database restart.
// - Then the faults stop, every process is up, the renters resolve any submit
//   or top-up left without an answer (same key), and the system settles
//   within `--settle-seconds`; then the checks (see check()).
// A server or daemon process that exits by itself is started again (as a
// service manager would), reported, and fails the run (`--no-fail-on-crash`:
// reported only). The last line printed is one JSON
// object; the exit status is 1 when a check failed. Every process started here is killed on exit, also on SIGINT/SIGTERM.
import { spawn, execFile, type ChildProcess } from "node:child_process";
import crypto from "node:crypto";
import fs from "node:fs";
import http from "node:http";
import net from "node:net";
import path from "node:path";
import { parseArgs } from "node:util";
import { connect, type Sql } from "../src/db/index.js";
import { startEmbedded, type EmbeddedServer } from "../src/db/embedded.js";
import { ledgerProblems } from "../src/domain/money/ledger.js";
import { splitRevenue } from "../src/domain/money/pricing.js";
import { LIVE_WINDOW_SECONDS } from "../src/domain/shared/liveness.js";
import { webhookSignature } from "../src/domain/notify/webhooks.js";
import { createLogger } from "../src/log.js";
import { DAEMON_VERSION } from "../src/daemon/ts/version.js";
import { buildServer, freePort, machine, noter } from "./lib.js";
import { SERVER_NODE_FLAGS } from "../bin/node-flags.mjs";

const { values: args } = parseArgs({
  options: {
    seconds: { type: "string", default: "50" },
    instances: { type: "string", default: "4" },
    "stream-daemons": { type: "string", default: "3" },
    pollers: { type: "string", default: "2" },
    renters: { type: "string", default: "6" },
    "settle-seconds": { type: "string", default: "180" },
    seed: { type: "string" },
    "database-url": { type: "string" },
    "pg-cluster": { type: "string" },
    keep: { type: "boolean", default: false },
    // The default; kept so that older command lines still parse.
    "fail-on-crash": { type: "boolean", default: true },
    "no-fail-on-crash": { type: "boolean", default: false },
  },
  strict: true,
});

function positive(name: string, min = 1): number {
  const n = Number(args[name as keyof typeof args]);
  if (!Number.isInteger(n) || n < min) {
    console.error(`--${name} must be an integer >= ${min}`);
    process.exit(2);
  }
  return n;
}
const SECONDS = positive("seconds", 10);
const INSTANCES = positive("instances", 2);
const STREAM_DAEMONS = positive("stream-daemons", 1);
const POLLERS = positive("pollers", 0);
const RENTERS = positive("renters", 1);
const SETTLE_SECONDS = positive("settle-seconds", 30);
const SEED = args.seed === undefined ? crypto.randomInt(1, 2 ** 31) : positive("seed", 0);
if (args["pg-cluster"] && !/^\d+\/[\w.-]+$/.test(args["pg-cluster"])) {
  console.error("--pg-cluster must be VERSION/NAME, e.g. 15/main");
  process.exit(2);
}
if (args["pg-cluster"] && !args["database-url"]) {
  console.error("--pg-cluster needs --database-url (the cluster's server)");
  process.exit(2);
}

const ADMIN_TOKEN = `chaos-admin-${crypto.randomBytes(12).toString("hex")}`;
const HMAC_SECRET = crypto.randomBytes(24).toString("hex");
/** Jobs run 0.3–2.5 s; a job stranded on a provider times out after this and is refunded. */
const MAX_DURATION_SECONDS = 60;
const MAX_ACTIVE_PER_RENTER = 2;
const TERMINAL = new Set(["completed", "failed", "cancelled"]);
const RUN_DIR = path.resolve(".data/chaos", `run-${Date.now()}-${process.pid}`);
const note = noter("chaos");

// A seeded generator (mulberry32): the same --seed gives the same fault schedule.
let seedState = SEED >>> 0;
function rand(): number {
  seedState = (seedState + 0x6d2b79f5) >>> 0;
  let t = seedState;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const pick = <T>(xs: T[]): T => xs[Math.floor(rand() * xs.length)];
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

// ---------------------------------------------------------------- processes

/** Every child this harness started, by pid (each leads its own process group). */
const children = new Set<ChildProcess>();
let embedded: EmbeddedServer | undefined;

function spawnGroup(cmd: string, argv: string[], env: NodeJS.ProcessEnv, logName: string): ChildProcess {
  const log = fs.openSync(path.join(RUN_DIR, `${logName}.log`), "a");
  const child = spawn(cmd, argv, { env, stdio: ["ignore", log, log], detached: true });
  fs.closeSync(log);
  children.add(child);
  child.once("exit", () => children.delete(child));
  return child;
}

function killGroup(child: ChildProcess, signal: NodeJS.Signals = "SIGKILL"): void {
  if (child.pid === undefined || child.exitCode !== null || child.signalCode !== null) return;
  try {
    process.kill(-child.pid, signal);
  } catch {
    // already gone
  }
}

const exited = (child: ChildProcess) =>
  child.exitCode !== null || child.signalCode !== null ? Promise.resolve() : new Promise<void>((r) => child.once("exit", () => r()));

/** Synchronous last resort (process 'exit'): SIGKILL every group, and the embedded database. */
function killEverythingNow(): void {
  for (const c of children) killGroup(c);
  const pid = embedded?.pid();
  if (pid) {
    try {
      process.kill(pid, "SIGINT");
    } catch {}
  }
}
process.on("exit", killEverythingNow);

/** SIGKILL to every process group started here, and waits (bounded) for them to go. */
async function killChildren(): Promise<void> {
  stopping = true;
  for (const c of children) killGroup(c);
  await Promise.race([Promise.all([...children].map(exited)), sleep(5000)]);
}

let cleaning: Promise<void> | undefined;
function cleanup(): Promise<void> {
  cleaning ??= (async () => {
    stopping = true;
    await killChildren();
    await Promise.race([embedded?.stop(), sleep(10_000)]).catch(() => {});
    embedded = undefined;
  })();
  return cleaning;
}
for (const signal of ["SIGINT", "SIGTERM"] as const) {
  process.once(signal, () => {
    note(`${signal}: stopping everything`);
    void cleanup().finally(() => process.exit(signal === "SIGINT" ? 130 : 143));
  });
}

// ------------------------------------------------------------------ servers

/** The servers' build, made once before the first start: every start and restart runs it. */
let serverBuild: { dir: string; main: string } | undefined;
process.on("exit", () => serverBuild && fs.rmSync(serverBuild.dir, { recursive: true, force: true }));

/** Set once the harness winds down: nothing is restarted after that. */
let stopping = false;
/** Processes that exited by themselves (not killed here), with the first line of what they printed last. */
const crashes: string[] = [];

function lastError(logName: string): string {
  try {
    const lines = fs.readFileSync(path.join(RUN_DIR, `${logName}.log`), "utf8").split("\n");
    const err = [...lines].reverse().find((l) => /^\w*Error\b/.test(l)) ?? lines.filter(Boolean).at(-1) ?? "";
    return err.slice(0, 300);
  } catch {
    return "";
  }
}

class Instance {
  child: ChildProcess | undefined;
  up = false;
  starts = 0;
  private supervising: Promise<void> | undefined;
  constructor(
    readonly index: number,
    readonly port: number,
    private readonly databaseUrl: string,
  ) {}

  get base() {
    return `http://127.0.0.1:${this.port}`;
  }

  /** Starts the process and waits until /readyz answers; a process that exits (database down) is started again. */
  async start(deadlineMs = 90_000): Promise<void> {
    const deadline = Date.now() + deadlineMs;
    while (Date.now() < deadline) {
      this.starts++;
      const child = spawnGroup(
        process.execPath,
        [...SERVER_NODE_FLAGS, (serverBuild ??= buildServer(process.cwd())!).main],
        {
          ...process.env,
          NODE_ENV: "development",
          DATABASE_URL: this.databaseUrl,
          PORT: String(this.port),
          HOST: "127.0.0.1",
          SVC_ADMIN_TOKEN: ADMIN_TOKEN,
          SVC_HMAC_SECRET: HMAC_SECRET,
          SVC_RATE_LIMITS: "off",
          LOG_LEVEL: "warn",
        },
        `server-${this.index}`,
      );
      this.child = child;
      while (Date.now() < deadline && child.exitCode === null && child.signalCode === null) {
        const ok = await fetch(`${this.base}/readyz`, { signal: AbortSignal.timeout(2000) }).then((r) => r.status === 200, () => false);
        if (ok) {
          this.up = true;
          this.supervise(child);
          return;
        }
        await sleep(250);
      }
      killGroup(child);
      await exited(child);
      await sleep(500);
    }
    throw new Error(`server ${this.index} did not become ready within ${deadlineMs / 1000} s (see ${RUN_DIR}/server-${this.index}.log)`);
  }

  /** As a service manager would: a process that exits by itself is counted and started again. */
  private supervise(child: ChildProcess): void {
    child.once("exit", (code, signal) => {
      if (this.child !== child || !this.up || stopping) return;
      this.up = false;
      crashes.push(`server ${this.index} exited (${signal ?? code}): ${lastError(`server-${this.index}`)}`);
      note(`server ${this.index} exited by itself (${signal ?? code}); starting it again`);
      this.supervising = sleep(500)
        .then(() => (stopping ? undefined : this.start()))
        .catch((err) => void faultErrors.push(String(err)));
    });
  }

  /** Waits for a restart the supervisor began, if any. */
  async settle(): Promise<void> {
    await this.supervising;
  }

  async kill(): Promise<void> {
    this.up = false;
    if (!this.child) return;
    const child = this.child;
    this.child = undefined; // the supervisor ignores an exit it caused
    killGroup(child);
    await exited(child);
  }
}

// -------------------------------------------------------------- HTTP client

const requests = { total: 0, by_status: {} as Record<string, number>, connection_errors: 0, retries: 0 };
/** The first answer of each error status (method, path and error text), to say what went wrong. */
const errorSamples: Record<string, string> = {};

interface Answer {
  status: number;
  body: Record<string, unknown>;
}

/** One request, no retry; a connection error or timeout is status 0. */
async function once(base: string, method: string, p: string, body?: unknown, headers: Record<string, string> = {}): Promise<Answer> {
  requests.total++;
  try {
    const r = await fetch(base + p, {
      method,
      headers: body === undefined ? headers : { "content-type": "application/json", ...headers },
      body: body === undefined ? undefined : JSON.stringify(body),
      signal: AbortSignal.timeout(15_000),
    });
    const text = await r.text();
    requests.by_status[r.status] = (requests.by_status[r.status] ?? 0) + 1;
    let json: Record<string, unknown> = {};
    try {
      json = text ? JSON.parse(text) : {};
    } catch {
      json = { raw: text.slice(0, 200) };
    }
    if (r.status >= 400 && !errorSamples[r.status]) errorSamples[r.status] = `${method} ${p.replace(/svc-[a-z]+-[\w-]+/g, "<key>")}: ${String(json.error ?? json.raw ?? "")}`;
    return { status: r.status, body: json };
  } catch {
    requests.connection_errors++;
    return { status: 0, body: {} };
  }
}

let instances: Instance[] = [];
let rr = 0;

/**
 * A careful client's request: on a connection error or a 5xx it tries the
 * next instance after a short backoff, until a definitive answer or the
 * deadline (then status 0: the outcome is unknown, the caller repeats it with
 * the same Idempotency-Key later).
 */
async function careful(method: string, p: string, body?: unknown, headers: Record<string, string> = {}, deadlineMs = 30_000): Promise<Answer> {
  const deadline = Date.now() + deadlineMs;
  let delay = 100;
  let start = rr++;
  for (let attempt = 0; ; attempt++) {
    const up = instances.filter((i) => i.up);
    const inst = (up.length ? up : instances)[start++ % (up.length || instances.length)];
    const a = await once(inst.base, method, p, body, headers);
    if (a.status !== 0 && a.status < 500) return a;
    if (Date.now() + delay > deadline) return a.status === 0 ? a : { status: 0, body: a.body };
    requests.retries++;
    await sleep(delay);
    delay = Math.min(2000, delay * 2);
  }
}

// ---------------------------------------------------------------- providers

/** A TCP proxy in front of the servers for one daemon: its instance first, else the next one up; cut() drops every connection. */
class Proxy {
  port = 0;
  private server = net.createServer((client) => this.accept(client));
  private sockets = new Set<net.Socket>();
  constructor(private readonly preferred: number) {}

  async listen(): Promise<void> {
    await new Promise<void>((r) => this.server.listen(0, "127.0.0.1", r));
    this.port = (this.server.address() as net.AddressInfo).port;
  }

  private accept(client: net.Socket): void {
    const order = instances.map((_, k) => instances[(this.preferred + k) % instances.length]);
    const target = order.find((i) => i.up) ?? order[0];
    const upstream = net.connect(target.port, "127.0.0.1");
    for (const s of [client, upstream]) {
      this.sockets.add(s);
      s.on("close", () => this.sockets.delete(s));
      s.on("error", () => {});
    }
    client.pipe(upstream).on("error", () => {});
    upstream.pipe(client).on("error", () => {});
    client.on("close", () => upstream.destroy());
    upstream.on("close", () => client.destroy());
  }

  /** Drops every connection at once (a stream cut); returns how many connections were open. */
  cut(): number {
    const n = this.sockets.size;
    for (const s of this.sockets) s.destroy();
    return n;
  }

  close(): Promise<void> {
    this.cut();
    return new Promise((r) => this.server.close(() => r()));
  }
}

interface ProviderAccount {
  id: number;
  key: string;
}

async function registerProvider(name: string): Promise<ProviderAccount> {
  const r = await careful("POST", "/api/providers/register", { name, email: `${name}@chaos.example.com`, gpu_model: "NVIDIA GeForce RTX 4090", os: "linux" });
  if (r.status !== 200) throw new Error(`provider register: ${r.status} ${JSON.stringify(r.body)}`);
  const p = { id: r.body.provider_id as number, key: r.body.api_key as string };
  const a = await careful("POST", `/api/admin/providers/${p.id}/approve`, {}, { "x-admin-token": ADMIN_TOKEN });
  if (a.status !== 200) throw new Error(`provider approve: ${a.status} ${JSON.stringify(a.body)}`);
  return p;
}

const RUNNER_SOURCE = `// A fast llm-inference runner: progress, a short run, the prompt echoed as the result.
let s = "";
process.stdin.on("data", (d) => (s += d)).on("end", () => {
  const job = JSON.parse(s);
  console.log("SVC_PROGRESS 30 generating");
  setTimeout(() => {
    require("fs").writeFileSync(process.env.SVC_RESULT_FILE, JSON.stringify({ response: "echo: " + job.task_spec.inputs.prompt }));
  }, 300 + Math.floor(Math.random() * 2200));
});
`;
const SMI_CSV =
  "0, NVIDIA GeForce RTX 4090, GPU-5c7e4b6a-2b8f-4d2a-9a53-0e1f7f2c9d11, 24564, 1187, 22936, 7, 2, 43, 31.52, 450.00, 2235, 550.54.15, 00000000:01:00.0, 8.9\n" +
  "1, NVIDIA GeForce RTX 4090, GPU-0b9d1e44-7a3c-11ee-b962-0242ac120002, 24564, 18, 24222, 0, 0, 35, [N/A], 350.00, 210, 550.54.15, 00000000:02:00.0, 8.6\n";

class StreamDaemon {
  child: ChildProcess | undefined;
  proxy: Proxy;
  starts = 0;
  constructor(
    readonly index: number,
    readonly account: ProviderAccount,
    private readonly tools: { runner: string; smi: string },
  ) {
    this.proxy = new Proxy(index % INSTANCES);
  }

  start(): void {
    this.starts++;
    const dir = path.join(RUN_DIR, `daemon-${this.index}`);
    const child = (this.child = spawnGroup(
      process.execPath,
      [
        "bin/svc-daemon.js", "--url", `http://127.0.0.1:${this.proxy.port}`, "--docker", "none", "--nvidia-smi", this.tools.smi,
        "--state-dir", dir, "--heartbeat-seconds", "2", "--stop-grace-seconds", "1", "--runner", `llm-inference=${process.execPath} ${this.tools.runner}`,
      ],
      // The key travels in the environment, never on a command line.
      { ...process.env, SVC_API_KEY: this.account.key },
      `daemon-${this.index}`,
    ));
    child.once("exit", (code, signal) => {
      if (this.child !== child || stopping) return;
      crashes.push(`stream daemon ${this.index} exited (${signal ?? code}): ${lastError(`daemon-${this.index}`)}`);
      note(`stream daemon ${this.index} exited by itself (${signal ?? code}); starting it again`);
      setTimeout(() => this.child === child && !stopping && this.start(), 1000);
    });
  }

  get running(): boolean {
    return this.child !== undefined && this.child.exitCode === null && this.child.signalCode === null;
  }

  async kill(): Promise<void> {
    if (!this.child) return;
    const child = this.child;
    this.child = undefined;
    killGroup(child);
    await exited(child);
  }
}

/** A legacy-protocol provider (JSON over HTTP, polling), as svc_daemon.py speaks it. */
class LegacyPoller {
  stopped = false;
  jobsRun = 0;
  private loops: Promise<void>[] = [];
  constructor(readonly account: ProviderAccount) {}

  start(): void {
    this.loops = [this.beatLoop(), this.workLoop()];
  }

  async stop(): Promise<void> {
    this.stopped = true;
    await Promise.all(this.loops);
  }

  private async beatLoop(): Promise<void> {
    const gpu = { gpu_name: "NVIDIA GeForce RTX 4090", gpu_vram_mib: 24564, gpu_count: 1, daemon_version: DAEMON_VERSION, cuda_version: "12.4" };
    let first = true;
    while (!this.stopped) {
      await careful("POST", "/api/providers/heartbeat", { api_key: this.account.key, gpu_status: gpu, uptime: 3600 }, {}, 5000);
      if (first) {
        first = false;
        await careful("POST", "/api/providers/readiness", { api_key: this.account.key, daemon_version: DAEMON_VERSION, checks: { gpu: "ok" } }, {}, 5000);
      }
      await sleep(2000);
    }
  }

  private async workLoop(): Promise<void> {
    while (!this.stopped) {
      const r = await careful("GET", `/api/providers/${this.account.key}/jobs`, undefined, {}, 5000);
      const job = r.status === 200 ? (r.body.job as { job_id: string; task_spec: { inputs?: { prompt?: string } } } | null) : null;
      if (!job) {
        await sleep(300 + rand() * 300);
        continue;
      }
      this.jobsRun++;
      await careful("POST", `/api/jobs/${job.job_id}/progress`, { api_key: this.account.key, progress_pct: 30, phase: "generating" }, {}, 5000);
      await sleep(300 + rand() * 2200);
      // The result is reported until the server answers it (settled, or refused as already ended).
      await careful(
        "POST",
        "/api/providers/job-result",
        { api_key: this.account.key, job_id: job.job_id, success: true, result: { response: `echo: ${job.task_spec.inputs?.prompt}` } },
        {},
        60_000,
      );
    }
  }
}

// ------------------------------------------------------------------ renters

interface SubmitRecord {
  key: string;
  prompt: string;
  /** job ids of every 201 answer received for this key */
  jobIds: string[];
  /** last definitive status (0: none yet) */
  status: number;
}

interface TopupRecord {
  key: string;
  amount: number;
  status: number;
}

interface TrackedJob {
  jobId: string;
  prompt: string;
  status: string;
  outputChecked: boolean;
}

const outputs = { read: 0, mismatched: [] as string[] };

class Renter {
  id = 0;
  key = "";
  webhookSecret = "";
  submits: SubmitRecord[] = [];
  topups: TopupRecord[] = [];
  jobs = new Map<string, TrackedJob>();
  cancelsAsked = 0;
  private n = 0;
  constructor(readonly index: number) {}

  get headers() {
    return { "x-renter-key": this.key };
  }

  async register(webhookBase: string): Promise<void> {
    const r = await careful("POST", "/api/renters/register", { name: `chaos-renter-${this.index}`, email: `renter-${this.index}-${SEED}@chaos.example.com` });
    if (r.status !== 201) throw new Error(`renter register: ${r.status} ${JSON.stringify(r.body)}`);
    this.id = r.body.renter_id as number;
    this.key = r.body.api_key as string;
    const w = await careful("PATCH", "/api/renters/me", { webhook_url: `${webhookBase}/hook/${this.id}` }, this.headers);
    if (w.status !== 200 || typeof w.body.webhook_secret !== "string") throw new Error(`webhook_url: ${w.status} ${JSON.stringify(w.body)}`);
    this.webhookSecret = w.body.webhook_secret;
    await this.topup(20_000);
  }

  async topup(amount: number): Promise<void> {
    const t: TopupRecord = { key: `topup-${this.index}-${crypto.randomUUID()}`, amount, status: 0 };
    this.topups.push(t);
    await this.sendTopup(t, 30_000);
  }

  private async sendTopup(t: TopupRecord, deadlineMs: number): Promise<void> {
    const r = await careful("POST", "/api/renters/topup", { amount_halala: t.amount }, { ...this.headers, "Idempotency-Key": t.key }, deadlineMs);
    t.status = r.status;
  }

  private async sendSubmit(s: SubmitRecord, deadlineMs: number): Promise<Answer> {
    const r = await careful(
      "POST",
      "/api/jobs/submit",
      { job_type: "llm-inference", duration_minutes: 1, max_duration_seconds: MAX_DURATION_SECONDS, params: { prompt: s.prompt, max_tokens: 32 } },
      { ...this.headers, "Idempotency-Key": s.key },
      deadlineMs,
    );
    s.status = r.status;
    if (r.status === 201) {
      const jobId = (r.body.job as { job_id: string }).job_id;
      s.jobIds.push(jobId);
      if (!this.jobs.has(jobId)) this.jobs.set(jobId, { jobId, prompt: s.prompt, status: "queued", outputChecked: false });
    }
    return r;
  }

  private active(): TrackedJob[] {
    return [...this.jobs.values()].filter((j) => !TERMINAL.has(j.status));
  }

  /** Reads a job's status; a completed job's output is read once and compared with what the runner wrote. */
  async refresh(j: TrackedJob): Promise<void> {
    const r = await careful("GET", `/api/jobs/${j.jobId}`, undefined, this.headers, 10_000);
    if (r.status === 200 && typeof r.body.status === "string") j.status = r.body.status;
    if (j.status === "completed" && !j.outputChecked) {
      const o = await careful("GET", `/api/jobs/${j.jobId}/output`, undefined, this.headers, 10_000);
      if (o.status === 0) return;
      outputs.read++;
      j.outputChecked = true;
      if (o.status !== 200 || o.body.response !== `echo: ${j.prompt}`) outputs.mismatched.push(`${j.jobId}: ${o.status} ${JSON.stringify(o.body).slice(0, 200)}`);
    }
  }

  /** The renter's behaviour until `until`: submit while under two active jobs, read, cancel now and then, top up when short. */
  async run(until: number): Promise<void> {
    while (Date.now() < until) {
      const active = this.active();
      const roll = rand();
      if (active.length > 0 && roll < 0.07) {
        const j = pick(active);
        this.cancelsAsked++;
        await careful("POST", `/api/jobs/${j.jobId}/cancel`, {}, this.headers, 10_000);
        await this.refresh(j);
      } else if (roll < 0.1) {
        await this.topup(500 + Math.floor(rand() * 1000));
      } else if (active.length < MAX_ACTIVE_PER_RENTER) {
        const s: SubmitRecord = { key: `submit-${this.index}-${crypto.randomUUID()}`, prompt: `chaos ${this.index}.${this.n++} ${crypto.randomBytes(4).toString("hex")}`, jobIds: [], status: 0 };
        this.submits.push(s);
        const r = await this.sendSubmit(s, 30_000);
        if (r.status === 402) await this.topup(5_000);
      } else {
        await this.refresh(pick(active));
      }
      await sleep(100 + rand() * 300);
    }
  }

  /** After the faults: every submit and top-up without a definitive answer is sent again with its key. */
  async resolve(deadline: number): Promise<void> {
    for (const t of this.topups) if (t.status === 0 || t.status >= 500) await this.sendTopup(t, Math.max(1000, deadline - Date.now()));
    for (const s of this.submits) if (s.status === 0 || s.status >= 500) await this.sendSubmit(s, Math.max(1000, deadline - Date.now()));
  }
}

// ----------------------------------------------------------------- webhooks

interface Delivery {
  eventId: string;
  event: string;
  jobId: string;
  renterId: number;
}

class WebhookReceiver {
  deliveries: Delivery[] = [];
  badSignatures = 0;
  secrets = new Map<number, string>();
  private server = http.createServer((req, res) => {
    let body = "";
    req.on("data", (c) => (body += c));
    req.on("end", () => {
      const renterId = Number(/^\/hook\/(\d+)$/.exec(req.url ?? "")?.[1]);
      const secret = this.secrets.get(renterId);
      const ts = Number(req.headers["x-svc-timestamp"]);
      const sig = String(req.headers["x-svc-signature"] ?? "");
      if (!secret || sig !== `v1=${webhookSignature(secret, ts, body)}`) {
        this.badSignatures++;
        res.writeHead(401).end();
        return;
      }
      try {
        const b = JSON.parse(body) as { id: string; event: string; data: { job_id: string } };
        this.deliveries.push({ eventId: b.id, event: b.event, jobId: b.data.job_id, renterId });
      } catch {
        this.badSignatures++;
      }
      res.writeHead(200).end();
    });
  });
  port = 0;

  async listen(): Promise<void> {
    await new Promise<void>((r) => this.server.listen(0, "127.0.0.1", r));
    this.port = (this.server.address() as net.AddressInfo).port;
  }

  close(): Promise<void> {
    this.server.closeAllConnections();
    return new Promise((r) => this.server.close(() => r()));
  }
}

// ------------------------------------------------------------------- faults

const faults = { server_kill: 0, daemon_kill: 0, daemon_kill_mid_job: 0, db_restart: 0, stream_cut: 0, operator_requeue: 0 };
const faultErrors: string[] = [];

/** `count` events spread over [start, end): one per slot, at a seeded point inside it. */
async function spread(count: number, start: number, end: number, act: (k: number) => Promise<void>): Promise<void> {
  const slot = (end - start) / count;
  for (let k = 0; k < count; k++) {
    const at = start + slot * (k + 0.2 + 0.6 * rand());
    await sleep(Math.max(0, at - Date.now()));
    if (Date.now() >= end) return;
    await act(k).catch((err) => faultErrors.push(String(err)));
  }
}

async function restartDatabase(): Promise<void> {
  if (embedded) return embedded.restart();
  const [version, name] = args["pg-cluster"]!.split("/");
  await new Promise<void>((resolve, reject) =>
    execFile("pg_ctlcluster", [version, name, "restart", "-m", "fast"], { timeout: 60_000 }, (err, _o, stderr) =>
      err ? reject(new Error(`pg_ctlcluster: ${stderr || err.message}`)) : resolve(),
    ),
  );
}

// ------------------------------------------------------------------- checks

interface Checked {
  name: string;
  problems: string[];
}

async function check(sql: Sql, renters: Renter[], receiver: WebhookReceiver, providerIds: number[]) {
  const results: Checked[] = [];
  const add = (name: string, problems: string[]) => results.push({ name, problems });
  const renterIds = renters.map((r) => r.id);

  // The books: the ledger's own invariants (balanced, kept balances = transfers, held = open holds, charges = cost).
  const ledger = await ledgerProblems(sql);
  add("ledger invariants", ledger);

  // Renters: balance = credits - charges, to the halala; the credits are what the client was told.
  let drift = 0;
  const renterRows = await sql<{ renter_id: number; balance: number; credits: number; charged: number }[]>`
    SELECT r.id AS renter_id,
           (SELECT coalesce(sum(balance), 0) FROM ledger_accounts WHERE owner_id = r.id AND kind IN ('renter_available', 'renter_held'))::bigint AS balance,
           (SELECT coalesce(sum(t.amount), 0) FROM ledger_transfers t JOIN ledger_accounts a ON a.id = t.credit_account_id
             WHERE a.owner_id = r.id AND a.kind = 'renter_available' AND t.kind = 'topup')::bigint AS credits,
           (SELECT coalesce(sum(actual_cost_halala), 0) FROM jobs WHERE renter_id = r.id AND status IN ('completed', 'failed', 'cancelled'))::bigint AS charged
    FROM renters r WHERE r.id = ANY(${renterIds}::bigint[])`;
  const renterProblems: string[] = [];
  for (const row of renterRows) {
    const renter = renters.find((r) => r.id === row.renter_id)!;
    const told = renter.topups.filter((t) => t.status === 200).reduce((s, t) => s + t.amount, 0);
    const d1 = Number(row.balance) - (Number(row.credits) - Number(row.charged));
    const d2 = Number(row.credits) - told;
    if (d1 !== 0) renterProblems.push(`renter ${row.renter_id}: balance ${row.balance} but credits ${row.credits} - charges ${row.charged}`);
    if (d2 !== 0) renterProblems.push(`renter ${row.renter_id}: credited ${row.credits} but the client was told ${told}`);
    drift += Math.abs(d1) + Math.abs(d2);
  }
  add("renter balances", renterProblems);

  // Providers earn 75% of each settled charge (rounded down per job); the platform the rest.
  const settled = await sql<{ job_id: string; provider_id: number; cost: number; earned: number; fee: number }[]>`
    SELECT job_id, provider_id, actual_cost_halala AS cost, provider_earned_halala AS earned, platform_fee_halala AS fee
    FROM jobs WHERE status IN ('completed', 'failed', 'cancelled') AND coalesce(actual_cost_halala, 0) > 0`;
  const expectEarn = new Map<number, number>();
  let expectFees = 0;
  const splitProblems: string[] = [];
  for (const j of settled) {
    const s = splitRevenue(j.cost);
    if (j.earned !== s.providerEarned || j.fee !== s.platformFee) splitProblems.push(`job ${j.job_id}: cost ${j.cost} split ${j.earned}/${j.fee}`);
    expectEarn.set(j.provider_id, (expectEarn.get(j.provider_id) ?? 0) + s.providerEarned);
    expectFees += s.platformFee;
  }
  const earnRows = await sql<{ owner_id: number; balance: number }[]>`SELECT owner_id, balance FROM ledger_accounts WHERE kind = 'provider_earnings'`;
  for (const pid of new Set([...providerIds, ...earnRows.map((e) => e.owner_id)])) {
    const have = earnRows.find((e) => e.owner_id === pid)?.balance ?? 0;
    const want = expectEarn.get(pid) ?? 0;
    if (have !== want) splitProblems.push(`provider ${pid}: earned ${have}, 75% of its settled charges is ${want}`);
    drift += Math.abs(have - want);
  }
  const [fees] = await sql<{ balance: number }[]>`
    SELECT (coalesce((SELECT sum(t.amount) FROM ledger_transfers t JOIN ledger_accounts a ON a.id = t.credit_account_id WHERE a.kind = 'platform_fees'), 0)
          - coalesce((SELECT sum(t.amount) FROM ledger_transfers t JOIN ledger_accounts a ON a.id = t.debit_account_id WHERE a.kind = 'platform_fees'), 0))::bigint AS balance`;
  if (Number(fees.balance) !== expectFees) splitProblems.push(`platform fees ${fees.balance}, expected ${expectFees}`);
  drift += Math.abs(Number(fees.balance) - expectFees);
  add("provider earnings and platform fees", splitProblems);

  // Settled once, and the hold's state follows the job's.
  const twice = await sql<{ job_id: number; n: number }[]>`
    SELECT job_id, count(*)::int AS n FROM ledger_transfers WHERE kind IN ('charge_provider', 'charge_platform') GROUP BY job_id HAVING count(*) > 2
       OR count(*) FILTER (WHERE kind = 'charge_provider') > 1`;
  const mismatched = await sql<{ job_id: string; status: string; hold: string | null }[]>`
    SELECT j.job_id, j.status, h.status AS hold FROM jobs j LEFT JOIN ledger_holds h ON h.job_id = j.id
    WHERE NOT ((j.status = 'completed' AND h.status = 'settled')
               OR (j.status IN ('failed', 'cancelled') AND h.status = CASE WHEN coalesce(j.actual_cost_halala, 0) > 0 THEN 'settled' ELSE 'released' END)
               OR (j.status IN ('queued', 'pending', 'running') AND h.status = 'open'))`;
  add("settled at most once", [
    ...twice.map((t) => `job id ${t.job_id}: ${t.n} charge transfers`),
    ...mismatched.map((m) => `job ${m.job_id} is ${m.status} but its hold is ${m.hold ?? "missing"}`),
  ]);

  // No charge beyond the time run, nor for an attempt that did not deliver the result.
  const overcharged = await sql<{ job_id: string; cost: number; allowed: number }[]>`
    SELECT j.job_id, j.actual_cost_halala AS cost,
           LEAST(j.cost_halala, j.rate_halala_per_minute * GREATEST(1, ceil(extract(epoch FROM (j.completed_at - coalesce(a.started_at, j.started_at))) / 60)))::bigint AS allowed
    FROM jobs j LEFT JOIN job_attempts a ON a.job_id = j.id AND a.attempt = j.attempt
    WHERE j.status IN ('completed', 'failed', 'cancelled') AND coalesce(j.actual_cost_halala, 0) > 0`;
  // Only the last attempt can be paid, and never one that ended by the provider's or the platform's fault
  // (the fault each end records, src/domain/money/settlement.ts).
  const faultCharged = await sql<{ job_id: string; attempt: number; end_reason: string | null; cost: number }[]>`
    SELECT j.job_id, a.attempt, a.end_reason || '/' || coalesce(a.fault, '-') AS end_reason, a.cost_halala AS cost FROM job_attempts a JOIN jobs j ON j.id = a.job_id
    WHERE coalesce(a.cost_halala, 0) > 0 AND (a.attempt <> j.attempt OR a.fault IN ('provider', 'platform', 'unattributed'))`;
  const unpaidEnds = await sql<{ job_id: string; status: string; cost: number }[]>`
    SELECT job_id, status || '/' || coalesce(fault, '-') AS status, actual_cost_halala AS cost FROM jobs
    WHERE status IN ('failed', 'cancelled') AND coalesce(actual_cost_halala, 0) <> 0 AND coalesce(fault, '-') <> 'renter'`;
  add("charged only for time run by the attempt that delivered", [
    ...overcharged.filter((o) => o.cost > Number(o.allowed)).map((o) => `job ${o.job_id}: charged ${o.cost}, at most ${o.allowed} for its run`),
    ...faultCharged.map((f) => `job ${f.job_id} attempt ${f.attempt} (${f.end_reason}) charged ${f.cost}`),
    ...unpaidEnds.map((u) => `job ${u.job_id} ${u.status} but charged ${u.cost}`),
  ]);

  // Nothing stuck: terminal, or active on a live provider within its timeout.
  const stuck = await sql<{ job_id: string; status: string; provider_id: number | null; live: boolean | null; within: boolean | null }[]>`
    SELECT j.job_id, j.status, j.provider_id,
           p.last_heartbeat > now() - make_interval(secs => ${LIVE_WINDOW_SECONDS}) AS live,
           j.timeout_at > now() AS within
    FROM jobs j LEFT JOIN providers p ON p.id = j.provider_id
    WHERE j.status IN ('queued', 'pending', 'running')`;
  const stuckJobs = stuck.filter((s) => !(s.status !== "queued" && s.live && s.within));
  add("no stuck jobs", stuckJobs.map((s) => `job ${s.job_id} ${s.status} on provider ${s.provider_id ?? "-"} (live ${s.live}, within timeout ${s.within})`));

  // Every provider's daemon is back within seconds of a fault, so a job assigned to it is picked up:
  // one left unpicked until the pickup window ran out was pushed to a stream that dropped it.
  const unpicked = await sql<{ job_id: string; attempt: number; provider_id: number }[]>`
    SELECT j.job_id, a.attempt, a.provider_id FROM job_attempts a JOIN jobs j ON j.id = a.job_id WHERE a.end_reason = 'not_picked_up'`;
  add("assigned jobs picked up", unpicked.map((u) => `job ${u.job_id} attempt ${u.attempt}: provider ${u.provider_id} never picked it up`));

  // What the clients saw: every 201 names a job, one job per key, no job nobody asked for.
  const dbJobs = await sql<{ job_id: string; renter_id: number }[]>`SELECT job_id, renter_id FROM jobs`;
  const inDb = new Set(dbJobs.map((j) => j.job_id));
  const answered = new Set<string>();
  let lost = 0;
  let duplicated = 0;
  let unresolved = 0;
  const submitProblems: string[] = [];
  for (const r of renters) {
    for (const s of r.submits) {
      const ids = new Set(s.jobIds);
      for (const id of ids) {
        answered.add(id);
        if (!inDb.has(id)) {
          lost++;
          submitProblems.push(`submit ${s.key}: 201 named ${id}, which does not exist`);
        }
      }
      if (ids.size > 1) {
        duplicated += ids.size - 1;
        submitProblems.push(`submit ${s.key}: retries got different jobs ${[...ids].join(", ")}`);
      }
      if (s.status === 0 || s.status >= 500) {
        unresolved++;
        submitProblems.push(`submit ${s.key}: no definitive answer after the faults (${s.status})`);
      }
    }
    for (const t of r.topups) if (t.status === 0 || t.status >= 500) submitProblems.push(`top-up ${t.key}: no definitive answer after the faults`);
  }
  const unasked = dbJobs.filter((j) => !answered.has(j.job_id));
  for (const j of unasked) submitProblems.push(`job ${j.job_id} (renter ${j.renter_id}) was never named in a 201`);
  add("submits: none lost, duplicated or unasked", submitProblems);
  add("outputs match what the provider produced", outputs.mismatched);

  // Every event a renter's webhook subscribed to was delivered at least once.
  const outbox = await sql<{ event_id: string; event: string; status: string; job_id: string }[]>`
    SELECT event_id, event, status, body::jsonb -> 'data' ->> 'job_id' AS job_id FROM webhook_outbox`;
  const received = new Set(receiver.deliveries.map((d) => d.eventId));
  const queuedFor = new Set(outbox.map((o) => `${o.job_id}:${o.event}`));
  const terminal = await sql<{ job_id: string; status: string }[]>`SELECT job_id, status FROM jobs WHERE status IN ('completed', 'failed', 'cancelled')`;
  const webhookProblems = [
    ...outbox.filter((o) => !received.has(o.event_id)).map((o) => `event ${o.event_id} (${o.event} ${o.job_id}, ${o.status}) never received`),
    ...terminal.filter((t) => !queuedFor.has(`${t.job_id}:job.${t.status}`)).map((t) => `job ${t.job_id} ${t.status}: no job.${t.status} notification`),
  ];
  if (receiver.badSignatures > 0) webhookProblems.push(`${receiver.badSignatures} deliveries with a bad signature`);
  add("webhook events delivered at least once", webhookProblems);

  return { results, drift, stuck: stuckJobs.length, lost, duplicated, unresolved, unasked: unasked.length, outbox: outbox.length, receivedEvents: received.size, deliveries: receiver.deliveries.length };
}

// --------------------------------------------------------------------- main

async function settled(sql: Sql): Promise<{ active: number; undelivered: number }> {
  const [r] = await sql<{ active: number; undelivered: number }[]>`
    SELECT (SELECT count(*) FROM jobs WHERE status IN ('queued', 'pending', 'running'))::int AS active,
           (SELECT count(*) FROM webhook_outbox WHERE status = 'pending')::int AS undelivered`;
  return r;
}

async function main() {
  fs.mkdirSync(RUN_DIR, { recursive: true });
  note(`seed ${SEED}; logs in ${RUN_DIR}`);
  let baseUrl = args["database-url"];
  if (!baseUrl) {
    note("starting embedded PostgreSQL in .data/chaos-pg");
    embedded = await startEmbedded(path.resolve(".data/chaos-pg"), createLogger("silent"), 54600);
    baseUrl = embedded.url;
  }
  const dbName = `svc_chaos_${crypto.randomBytes(5).toString("hex")}`;
  const admin = connect(baseUrl, 1);
  if (embedded) {
    // N processes with a pool of 20 each, their listeners, and the harness: above the default 100.
    await admin.unsafe("ALTER SYSTEM SET max_connections = 300");
    await admin.end();
    await embedded.restart();
  }
  const adminSql = embedded ? connect(baseUrl, 1) : admin;
  await adminSql.unsafe(`CREATE DATABASE ${dbName}`);
  const url = new URL(baseUrl);
  url.pathname = `/${dbName}`;
  const sql = connect(url.toString(), 3);

  const receiver = new WebhookReceiver();
  await receiver.listen();
  const ports: number[] = [];
  while (ports.length < INSTANCES) {
    const p = await freePort();
    if (!ports.includes(p)) ports.push(p);
  }
  instances = ports.map((p, i) => new Instance(i, p, url.toString()));
  note(`starting ${INSTANCES} server processes`);
  await instances[0].start(); // the first applies the migrations
  await Promise.all(instances.slice(1).map((i) => i.start()));

  const tools = { runner: path.join(RUN_DIR, "runner.cjs"), smi: path.join(RUN_DIR, "nvidia-smi") };
  fs.writeFileSync(tools.runner, RUNNER_SOURCE);
  fs.writeFileSync(path.join(RUN_DIR, "smi.csv"), SMI_CSV);
  fs.writeFileSync(
    tools.smi,
    `#!/bin/sh\ncase "$1" in\n  --query-gpu=*) cat '${path.join(RUN_DIR, "smi.csv")}' ;;\n  -L) echo 'GPU 0: NVIDIA GeForce RTX 4090 (UUID: GPU-5c7e4b6a)' ;;\n  *) echo 'NVIDIA-SMI 550.54.15' ;;\nesac\n`,
    { mode: 0o755 },
  );

  note(`registering ${RENTERS} renters, ${STREAM_DAEMONS} stream daemons and ${POLLERS} legacy pollers`);
  const renters = Array.from({ length: RENTERS }, (_, i) => new Renter(i));
  for (const r of renters) {
    await r.register(`http://127.0.0.1:${receiver.port}`);
    receiver.secrets.set(r.id, r.webhookSecret);
  }
  const daemons: StreamDaemon[] = [];
  for (let i = 0; i < STREAM_DAEMONS; i++) {
    const d = new StreamDaemon(i, await registerProvider(`chaos-stream-${i}`), tools);
    await d.proxy.listen();
    d.start();
    daemons.push(d);
  }
  const pollers: LegacyPoller[] = [];
  for (let i = 0; i < POLLERS; i++) pollers.push(new LegacyPoller(await registerProvider(`chaos-legacy-${i}`)));
  for (const p of pollers) p.start();
  const providerIds = [...daemons.map((d) => d.account.id), ...pollers.map((p) => p.account.id)];
  // Wait for the daemons to come online (bounded), so that submits have somewhere to go.
  const onlineBy = Date.now() + 60_000;
  for (;;) {
    const [{ n }] = await sql<{ n: number }[]>`SELECT count(*)::int AS n FROM providers WHERE status = 'online' AND id = ANY(${providerIds}::bigint[])`;
    if (n === providerIds.length) break;
    if (Date.now() > onlineBy) throw new Error(`only ${n} of ${providerIds.length} providers came online within 60 s`);
    await sleep(500);
  }

  // ---- load and faults
  const start = Date.now();
  const end = start + SECONDS * 1000;
  note(`load and faults for ${SECONDS} s`);
  const load = renters.map((r) => r.run(end));
  const restartLater = (fn: () => Promise<void>) => fn().catch((err) => faultErrors.push(String(err)));
  const pendingRestarts: Promise<unknown>[] = [];
  const serverKills = spread(Math.max(5, Math.round(SECONDS / 9)), start, end, async () => {
    // One stays up, so a careful client always has somewhere to go: wait (bounded) for a restart.
    while (instances.filter((i) => i.up).length < 2 && Date.now() < end) await sleep(250);
    const up = instances.filter((i) => i.up);
    if (up.length < 2) return;
    const victim = pick(up);
    await victim.kill();
    faults.server_kill++;
    note(`+${((Date.now() - start) / 1000).toFixed(1)} s: SIGKILL server ${victim.index}`);
    pendingRestarts.push(restartLater(async () => {
      await sleep(500 + rand() * 1500);
      await victim.start();
      note(`+${((Date.now() - start) / 1000).toFixed(1)} s: server ${victim.index} up again`);
    }));
  });
  const dbRestarts =
    embedded || args["pg-cluster"]
      ? spread(Math.max(1, Math.round(SECONDS / 60)), start + 0.25 * (end - start), end, async () => {
          const t0 = Date.now();
          await restartDatabase();
          faults.db_restart++;
          note(`+${((t0 - start) / 1000).toFixed(1)} s: database restarted in ${Date.now() - t0} ms`);
        })
      : Promise.resolve();
  const daemonKills = spread(Math.max(2, Math.round(SECONDS / 8)), start, end, async () => {
    // A daemon with a job on it, when there is one (the database may be restarting: then any).
    const busy = await sql<{ provider_id: number }[]>`
      SELECT DISTINCT provider_id FROM jobs WHERE status IN ('pending', 'running') AND provider_id = ANY(${daemons.map((d) => d.account.id)}::bigint[])`.catch(() => []);
    const candidates = daemons.filter((d) => busy.some((b) => b.provider_id === d.account.id));
    const victim = candidates.length ? pick(candidates) : pick(daemons);
    await victim.kill();
    faults.daemon_kill++;
    note(`+${((Date.now() - start) / 1000).toFixed(1)} s: SIGKILL stream daemon ${victim.index}${candidates.length ? " (mid-job)" : ""}`);
    if (candidates.length) faults.daemon_kill_mid_job++;
    pendingRestarts.push(restartLater(async () => {
      await sleep(300 + rand() * 1500);
      victim.start();
    }));
  });
  const streamCuts = spread(Math.max(2, Math.round(SECONDS / 6)), start, end, async () => {
    if (pick(daemons).proxy.cut() > 0) faults.stream_cut++;
  });
  // An operator moves a running job (POST /api/admin/jobs/{id}/requeue) to another provider, which
  // needs one (with a single provider the job would wait for another, and the run's end would find
  // it queued); a job it moved before is not moved again, so there is always one it has not left.
  const moved = new Set<string>();
  const requeues = spread(Math.max(2, Math.round(SECONDS / 10)), start, end, async () => {
    if (providerIds.length < 2) return;
    const running = (await sql<{ job_id: string }[]>`SELECT job_id FROM jobs WHERE status = 'running'`.catch(() => [])).filter((j) => !moved.has(j.job_id));
    if (running.length === 0) return;
    const job = pick(running).job_id;
    moved.add(job);
    const a = await careful("POST", `/api/admin/jobs/${job}/requeue`, { reason: "chaos" }, { "x-admin-token": ADMIN_TOKEN });
    if (a.status === 200) faults.operator_requeue++;
    note(`+${((Date.now() - start) / 1000).toFixed(1)} s: operator re-queued ${job} (${a.status})`);
  });
  await Promise.all([serverKills, dbRestarts, daemonKills, streamCuts, requeues]);
  await Promise.all(load);
  await Promise.all(pendingRestarts);

  // ---- settle
  note("faults stopped; settling");
  const settleBy = Date.now() + SETTLE_SECONDS * 1000;
  for (const i of instances) await i.settle();
  for (const i of instances) if (!i.up) await i.start(Math.max(10_000, settleBy - Date.now()));
  for (const d of daemons) if (!d.running) d.start();
  const since = (t: number) => Math.round((t - end) / 100) / 10;
  // Where a long settle went: the processes back, the renters' unanswered requests answered,
  // then the last active job ended and the last webhook delivered (seconds after the faults stopped).
  const settleSteps: Record<string, number | null> = { processes_up: since(Date.now()), requests_answered: null, jobs_ended: null, webhooks_delivered: null };
  await Promise.all(renters.map((r) => r.resolve(Math.min(settleBy, Date.now() + 60_000))));
  settleSteps.requests_answered = since(Date.now());
  let last = { active: -1, undelivered: -1 };
  while (Date.now() < settleBy) {
    last = await settled(sql).catch(() => last);
    if (last.active === 0) settleSteps.jobs_ended ??= since(Date.now());
    if (last.undelivered === 0) settleSteps.webhooks_delivered ??= since(Date.now());
    if (last.active === 0 && last.undelivered === 0) break;
    await sleep(1000);
  }
  for (const r of renters) for (const j of r.jobs.values()) if (!TERMINAL.has(j.status) || (j.status === "completed" && !j.outputChecked)) await r.refresh(j);
  // Deliveries may still be in flight at the receiver when the outbox says delivered.
  await sleep(500);
  const settleSeconds = Math.round((Date.now() - end) / 100) / 10;

  const c = await check(sql, renters, receiver, providerIds);
  const byOutcome = await sql<{ status: string; end_reason: string | null; n: number }[]>`
    SELECT status, end_reason, count(*)::int AS n FROM jobs GROUP BY 1, 2 ORDER BY 1, 2`;
  const attempts = await sql<{ end_reason: string | null; n: number }[]>`SELECT end_reason, count(*)::int AS n FROM job_attempts GROUP BY 1 ORDER BY 1`;
  // Whose fault each attempt's end was (src/domain/shared/job-end.ts), and what the renters paid for each kind.
  const byFault = await sql<{ fault: string | null; n: number; charged: number }[]>`
    SELECT fault, count(*)::int AS n, coalesce(sum(cost_halala), 0)::bigint AS charged FROM job_attempts GROUP BY 1 ORDER BY 1`;
  // Jobs that failed, with where they ran: the faults' casualties, for the reader.
  const streamIds = daemons.map((d) => d.account.id);
  const failedJobs = await sql<{ job_id: string; end_reason: string; provider_id: number | null; attempts: string }[]>`
    SELECT j.job_id, j.end_reason, j.provider_id,
           (SELECT string_agg(coalesce(a.end_reason, a.status) || '@' || a.provider_id, ' ' ORDER BY a.attempt) FROM job_attempts a WHERE a.job_id = j.id) AS attempts
    FROM jobs j WHERE j.status = 'failed' ORDER BY j.id LIMIT 10`;
  const failedJobList = failedJobs.map((f) => ({
    job_id: f.job_id,
    end_reason: f.end_reason,
    provider: f.provider_id === null ? null : streamIds.includes(f.provider_id) ? "stream" : "legacy",
    attempts: f.attempts,
  }));
  const failed = c.results.filter((r) => r.problems.length > 0);
  for (const f of failed) note(`FAILED ${f.name}:\n  ${f.problems.slice(0, 20).join("\n  ")}${f.problems.length > 20 ? `\n  … ${f.problems.length - 20} more` : ""}`);
  if (faultErrors.length) note(`fault injection errors:\n  ${faultErrors.join("\n  ")}`);
  // A server or daemon that died by itself under these faults is a defect (the supervisor hid it from the
  // clients): it fails the run, unless --no-fail-on-crash (then it is only reported).
  const failOnCrash = !args["no-fail-on-crash"];
  if (crashes.length) note(`${failOnCrash ? "FAILED" : "FINDING"} processes exited by themselves:\n  ${crashes.join("\n  ")}`);
  const minimums: string[] = crashes.length && failOnCrash ? [`${crashes.length} process crash(es)`] : [];
  if (faults.server_kill < 5) minimums.push(`only ${faults.server_kill} server kills`);
  if ((embedded || args["pg-cluster"]) && faults.db_restart < 1) minimums.push("no database restart");
  if (minimums.length) note(`FAILED fault minimums: ${minimums.join(", ")}`);

  const jobsByOutcome: Record<string, number> = {};
  for (const r of byOutcome) jobsByOutcome[`${r.status}${r.end_reason ? `:${r.end_reason}` : ""}`] = r.n;
  const result = {
    benchmark: "chaos",
    ok: failed.length === 0 && minimums.length === 0,
    seed: SEED,
    seconds: SECONDS,
    settle_seconds: settleSeconds,
    settle_steps: settleSteps,
    instances: INSTANCES,
    stream_daemons: STREAM_DAEMONS,
    legacy_pollers: POLLERS,
    renters: RENTERS,
    requests,
    error_samples: errorSamples,
    submits: renters.reduce((s, r) => s + r.submits.length, 0),
    submit_answers: renters.flatMap((r) => r.submits).reduce<Record<string, number>>((m, s) => ((m[s.status] = (m[s.status] ?? 0) + 1), m), {}),
    cancels_asked: renters.reduce((s, r) => s + r.cancelsAsked, 0),
    topups: renters.reduce((s, r) => s + r.topups.length, 0),
    outputs_read: outputs.read,
    jobs_by_outcome: jobsByOutcome,
    attempts_by_end: Object.fromEntries(attempts.map((a) => [a.end_reason ?? "active", a.n])),
    attempts_by_fault: Object.fromEntries(byFault.map((f) => [f.fault ?? "active", { attempts: f.n, charged_halala: Number(f.charged) }])),
    failed_jobs: failedJobList,
    legacy_jobs_run: pollers.reduce((s, p) => s + p.jobsRun, 0),
    faults,
    server_starts: instances.reduce((s, i) => s + i.starts, 0),
    // Exits nobody asked for (restarted as a service manager would); each fails the run unless --no-fail-on-crash.
    process_crashes: crashes,
    daemon_starts: daemons.reduce((s, d) => s + d.starts, 0),
    ledger_drift_halala: c.drift,
    ledger_problems: c.results.find((r) => r.name === "ledger invariants")!.problems.length,
    stuck_jobs: c.stuck,
    lost_submits: c.lost + c.unresolved,
    duplicated_submits: c.duplicated,
    unasked_jobs: c.unasked,
    webhook_events: c.outbox,
    webhook_deliveries: c.deliveries,
    webhook_events_missing: c.results.find((r) => r.name.startsWith("webhook"))!.problems.length,
    checks_failed: [...failed.map((f) => f.name), ...minimums],
    machine: machine(),
    database: embedded ? "embedded" : "database-url",
  };

  stopping = true;
  for (const p of pollers) p.stopped = true;
  await Promise.race([Promise.all(pollers.map((p) => p.stop())), sleep(10_000)]);
  for (const d of daemons) await d.proxy.close();
  await sql.end({ timeout: 5 });
  await killChildren();
  if (args.keep) note(`kept database ${dbName} (${embedded ? "embedded cluster in .data/chaos-pg" : "on --database-url"})`);
  else await adminSql.unsafe(`DROP DATABASE IF EXISTS ${dbName} WITH (FORCE)`).catch(() => {});
  await adminSql.end({ timeout: 5 });
  await receiver.close();
  await cleanup();
  console.log(JSON.stringify(result));
  process.exit(result.ok ? 0 : 1);
}

main().catch(async (err) => {
  console.error(err);
  await cleanup();
  process.exit(1);
});
