// GET /metrics from a real server: the series are there, change with real
// traffic on every wire, carry no ids, show the database pool's connections
// in use and the statements waiting for one, read the database at most once
// per period, and are only readable the ways the operator chose.
import { describe, expect, it } from "vitest";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import { RenterService } from "../../gen/svc/v1/renters_pb.js";
import { loadConfig, ConfigError } from "../../src/config.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { ADMIN_TOKEN, startTestServer, useTestServer, type TestServer } from "../helpers/server.js";
import { openStream } from "../daemon/grpc-stream.js";
import { startFakeVllm } from "../v1/fake-vllm.js";
import { serveModel } from "../v1/serving.js";

const METRICS_TOKEN = "metrics-token-0123456789abcdef";
const admin = { "x-admin-token": ADMIN_TOKEN };

interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

/** The Prometheus text format's sample lines. */
function parse(text: string): Sample[] {
  const out: Sample[] = [];
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const m = /^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)$/.exec(line);
    if (!m) throw new Error(`unparsable metrics line: ${line}`);
    const labels: Record<string, string> = {};
    for (const l of (m[2] ?? "").matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]] = l[2];
    out.push({ name: m[1], labels, value: Number(m[3]) });
  }
  return out;
}

function value(samples: Sample[], name: string, labels: Record<string, string> = {}): number {
  return samples
    .filter((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v))
    .reduce((n, s) => n + s.value, 0);
}

async function scrape(srv: TestServer, headers: Record<string, string> = { authorization: `Bearer ${METRICS_TOKEN}` }) {
  const r = await client(srv.url).get("/metrics", headers);
  expect(r.status, r.text).toBe(200);
  expect(r.headers.get("content-type")).toMatch(/^text\/plain; version=0\.0\.4/);
  return { text: r.text, samples: parse(r.text) };
}

describe("metrics", () => {
  const srv = useTestServer({ SVC_METRICS_TOKEN: METRICS_TOKEN, SVC_METRICS_DB_SECONDS: "1", SVC_LEDGER_AUDIT_SECONDS: "0" });

  it("lists every documented series", async () => {
    const { text } = await scrape(srv);
    for (const name of [
      "svc_requests_total", "svc_request_duration_seconds", "svc_job_submits_total", "svc_queue_jobs", "svc_queue_oldest_age_seconds",
      "svc_providers", "svc_daemon_streams_connected", "svc_heartbeats_total", "svc_job_settlements_total", "svc_ledger_moved_halala_total",
      "svc_webhook_outbox_pending", "svc_webhook_delivery_failures_total", "svc_v1_tokens_total", "svc_v1_upstream_errors_total",
      "svc_db_pool_max", "svc_db_pool_in_use", "svc_db_pool_idle", "svc_db_pool_waiting", "svc_db_figure_reads_total",
      "svc_submit_group_size", "svc_submit_group_wait_seconds", "svc_submit_group_write_seconds",
      "nodejs_eventloop_lag_seconds", "process_cpu_user_seconds_total", "process_resident_memory_bytes", "nodejs_heap_size_used_bytes",
    ]) {
      expect(text, name).toContain(`# TYPE ${name} `);
    }
  });

  it("changes with traffic on every wire and names no ids", async () => {
    const api = client(srv.url);
    const before = (await scrape(srv)).samples;
    const renter = await makeRenter(srv);
    const poor = await makeRenter(srv);
    expect((await api.post("/api/renters/topup", { amount_halala: 50_000 }, renter.headers)).status).toBe(200);
    const provider = await makeProvider(srv, { gpuModel: "NVIDIA GeForce RTX 4090" });
    const hb = await api.post("/api/providers/heartbeat", { api_key: provider.key, gpu_status: { gpu_name: "RTX 4090", gpu_count: 1, memory_total_mib: 24564 } });
    expect(hb.status).toBe(200);

    const first = await api.post("/api/jobs/submit", { job_type: "llm-inference", duration_minutes: 5 }, renter.headers);
    expect(first.status, first.text).toBe(201);
    expect(first.body.queued).toBe(false);
    const second = await api.post("/api/jobs/submit", { job_type: "llm-inference", duration_minutes: 5 }, renter.headers);
    expect(second.status, second.text).toBe(201);
    expect(second.body.queued).toBe(true);
    expect((await api.post("/api/jobs/submit", { job_type: "llm-inference", duration_minutes: 5 }, poor.headers)).status).toBe(402);

    // The second job waits (until the first ends); the fleet shows the provider online under its GPU model.
    // The database figures are re-read once the period (1 s here) has passed: wait for the queue to show.
    let figures = (await scrape(srv)).samples;
    for (let i = 0; i < 100 && value(figures, "svc_queue_jobs") < 1; i++) {
      await new Promise((r) => setTimeout(r, 100));
      figures = (await scrape(srv)).samples;
    }
    expect(value(figures, "svc_queue_jobs")).toBe(1);
    expect(figures.filter((s) => s.name === "svc_queue_jobs" && s.value > 0).map((s) => s.labels.queue_reason)).toEqual(["providers_busy"]);
    expect(value(figures, "svc_queue_oldest_age_seconds")).toBeGreaterThanOrEqual(0);
    expect(value(figures, "svc_providers", { state: "online", gpu_model: "nvidia geforce rtx 4090" })).toBe(1);

    // The provider runs the first job and reports it: one settlement, money moved by kind.
    const jobId = first.body.job.job_id as string;
    expect((await api.get(`/api/providers/${provider.key}/jobs`)).status).toBe(200);
    const done = await api.post("/api/providers/job-result", { api_key: provider.key, job_id: jobId, success: true, result: { response: "hi" } });
    expect(done.status, done.text).toBe(200);

    // gRPC and Connect calls are counted under their wire.
    for (const transport of [createGrpcTransport({ baseUrl: srv.url }), createConnectTransport({ baseUrl: srv.url, httpVersion: "1.1" })]) {
      const renters = createClient(RenterService, transport);
      await renters.getBalance({}, { headers: renter.headers });
    }
    // A stream daemon is counted while connected, and its heartbeats by protocol.
    const stream = openStream(srv.port, provider.key);
    stream.send({ case: "hello", value: { daemonVersion: "3.2.0" } });
    await stream.next("welcome");
    stream.send({ case: "heartbeat", value: {} });
    await stream.next("heartbeatAck");

    const during = (await scrape(srv)).samples;
    expect(value(during, "svc_daemon_streams_connected")).toBe(1);
    stream.end();
    await stream.ended;

    const after = (await scrape(srv)).samples;
    const delta = (name: string, labels: Record<string, string> = {}) => value(after, name, labels) - value(before, name, labels);

    expect(value(after, "svc_daemon_streams_connected")).toBe(0);
    expect(delta("svc_job_submits_total", { outcome: "assigned" })).toBe(1);
    expect(delta("svc_job_submits_total", { outcome: "queued" })).toBe(1);
    expect(delta("svc_job_submits_total", { outcome: "402" })).toBe(1);
    // Three submits, one after another: three groups of one (the refused one was judged in its group).
    expect(delta("svc_submit_group_size_count")).toBe(3);
    expect(delta("svc_submit_group_size_sum")).toBe(3);
    expect(delta("svc_submit_group_wait_seconds_count")).toBe(3);
    expect(delta("svc_submit_group_write_seconds_count")).toBe(3);
    expect(delta("svc_submit_group_write_seconds_sum")).toBeGreaterThan(0);
    expect(delta("svc_heartbeats_total", { protocol: "legacy" })).toBe(1);
    expect(delta("svc_heartbeats_total", { protocol: "stream" })).toBe(1);
    expect(delta("svc_job_settlements_total", { status: "completed", reason: "completed" })).toBe(1);
    expect(delta("svc_ledger_moved_halala_total", { kind: "topup" })).toBe(50_000);
    expect(delta("svc_ledger_moved_halala_total", { kind: "hold" })).toBe(first.body.job.cost_halala + second.body.job.cost_halala);
    expect(delta("svc_ledger_moved_halala_total", { kind: "charge_provider" })).toBeGreaterThan(0);
    expect(delta("svc_ledger_moved_halala_total", { kind: "charge_platform" })).toBeGreaterThan(0);
    expect(delta("svc_requests_total", { wire: "rest", route: "POST /api/jobs/submit", status: "201" })).toBe(2);
    expect(delta("svc_requests_total", { wire: "rest", route: "POST /api/jobs/submit", status: "402" })).toBe(1);
    expect(delta("svc_request_duration_seconds_count", { wire: "rest", route: "POST /api/jobs/submit" })).toBe(3);
    expect(delta("svc_requests_total", { wire: "grpc", route: "svc.v1.RenterService/GetBalance", status: "ok" })).toBe(1);
    expect(delta("svc_requests_total", { wire: "connect", route: "svc.v1.RenterService/GetBalance", status: "ok" })).toBe(1);
    expect(delta("svc_requests_total", { wire: "grpc", route: "svc.v1.DaemonService/Connect" })).toBe(1);
    expect(value(after, "svc_db_pool_max")).toBe(20);

    // No label carries an id or a key: the only numbers are statuses, buckets and the Node.js version.
    const ids = [jobId, second.body.job.job_id, renter.key, provider.key];
    for (const s of after) {
      for (const [k, v] of Object.entries(s.labels)) {
        expect(k).not.toMatch(/(^|_)(id|key)$/);
        expect(ids, `${s.name}{${k}="${v}"}`).not.toContain(v);
        if (s.name.startsWith("svc_") && !["status", "outcome", "le"].includes(k)) expect(v, `${s.name}{${k}="${v}"}`).not.toMatch(/^\d+$/);
        if (["status", "outcome"].includes(k) && /^\d+$/.test(v)) expect(Number(v)).toBeGreaterThanOrEqual(100);
      }
    }
  });

  it("counts /v1 requests, billed tokens and failed upstream attempts", async () => {
    const good = await startFakeVllm("metrics-good");
    const bad = await startFakeVllm("metrics-bad", "error500");
    try {
      await serveModel(srv, "Qwen/Qwen2.5-7B-Instruct", good.url);
      await serveModel(srv, "mistralai/Mistral-7B-Instruct-v0.3", bad.url);
      const renter = await makeRenter(srv, 100_000);
      const before = (await scrape(srv)).samples;
      const ask = (model: string) =>
        fetch(`${srv.url}/v1/chat/completions`, {
          method: "POST",
          headers: { authorization: `Bearer ${renter.key}`, "content-type": "application/json" },
          body: JSON.stringify({ model, messages: [{ role: "user", content: "hi" }] }),
        });
      const ok = await ask("Qwen/Qwen2.5-7B-Instruct");
      expect(ok.status, await ok.clone().text()).toBe(200);
      const usage = (await ok.json()).usage;
      expect((await ask("mistralai/Mistral-7B-Instruct-v0.3")).status).toBeGreaterThanOrEqual(500);
      const after = (await scrape(srv)).samples;
      const delta = (name: string, labels: Record<string, string> = {}) => value(after, name, labels) - value(before, name, labels);
      expect(delta("svc_requests_total", { wire: "v1", route: "POST /v1/chat/completions", status: "200" })).toBe(1);
      expect(delta("svc_v1_tokens_total", { type: "prompt" })).toBe(usage.prompt_tokens);
      expect(delta("svc_v1_tokens_total", { type: "completion" })).toBe(usage.completion_tokens);
      expect(delta("svc_v1_upstream_errors_total", { code: "provider_unavailable" })).toBe(1);
    } finally {
      await good.close();
      await bad.close();
    }
  });

  it("answers 401 without a token or with a wrong one, 405 to other methods; the admin token also reads it", async () => {
    const api = client(srv.url);
    const none = await api.get("/metrics");
    expect(none.status).toBe(401);
    expect(none.body.error).toMatch(/token required/);
    expect((await api.get("/metrics", { authorization: "Bearer not-the-metrics-token-at-all" })).status).toBe(401);
    expect((await api.get("/metrics", { authorization: `Bearer ${METRICS_TOKEN}x` })).status).toBe(401);
    expect((await api.get("/metrics", { authorization: `Bearer ${ADMIN_TOKEN}` })).status).toBe(200);
    expect((await api.get("/metrics", admin)).status).toBe(200);
    expect((await api.post("/metrics", {}, admin)).status).toBe(405);
    // The metrics token reads metrics only: it is no admin token.
    expect((await api.get("/api/admin/dashboard", { authorization: `Bearer ${METRICS_TOKEN}` })).status).toBe(401);
  });
});

describe("database pool metrics", () => {
  // Database figures read once and then cached, and no background sweeps: the scrapes
  // below need no connection while the test holds every one of the server's.
  const srv = useTestServer({
    SVC_METRICS_TOKEN: METRICS_TOKEN, SVC_METRICS_DB_SECONDS: "3600", SVC_LEDGER_AUDIT_SECONDS: "0",
    SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0",
  });

  /** Scrapes until `ok` holds for the pool's figures (bounded), and returns them. */
  async function poolWhen(ok: (p: { max: number; inUse: number; idle: number; waiting: number }) => boolean, polls = 300) {
    let p = { max: 0, inUse: 0, idle: 0, waiting: 0 };
    for (let i = 0; i < polls; i++) {
      const s = (await scrape(srv)).samples;
      p = { max: value(s, "svc_db_pool_max"), inUse: value(s, "svc_db_pool_in_use"), idle: value(s, "svc_db_pool_idle"), waiting: value(s, "svc_db_pool_waiting") };
      if (ok(p)) break;
      await new Promise((r) => setTimeout(r, 50));
    }
    return p;
  }

  it("counts connections busy with single statements, and statements waiting while transactions hold every connection", async () => {
    const api = client(srv.url);
    const renter = await makeRenter(srv, 10_000);
    expect((await api.get("/api/renters/balance", renter.headers)).status).toBe(200); // the key is cached from now on
    expect((await api.post("/api/renters/topup", { amount_halala: 100 }, renter.headers)).status).toBe(200);
    // Every connection opened first: the pool opens them lazily, and a statement that finds none idle
    // while the others are still connecting is pipelined behind a busy one.
    await Promise.all(Array.from({ length: 20 }, () => srv.app.sql`SELECT pg_sleep(0.05)`));
    const quiet = await poolWhen((p) => p.inUse === 0 && p.idle === 20);
    expect(quiet).toMatchObject({ max: 20, inUse: 0, waiting: 0, idle: 20 });

    const locker = await srv.sql.reserve();
    try {
      // Single statements (balance reads) blocked by a table lock: each of the 20 connections serves one, the rest pipelined.
      // A request's other statements (not blocked) hold a connection for a moment, and a read that finds none idle
      // then is pipelined behind one of them, which may leave a connection idle: more reads until none is.
      await locker`BEGIN`;
      await locker`LOCK TABLE ledger_accounts IN ACCESS EXCLUSIVE MODE`;
      const reads: ReturnType<typeof api.get>[] = [];
      let busy = { max: 0, inUse: 0, idle: 0, waiting: 0 };
      for (let round = 0; round < 10 && busy.inUse < 20; round++) {
        reads.push(...Array.from({ length: 25 }, () => api.get("/api/renters/balance", renter.headers)));
        busy = await poolWhen((p) => p.inUse === 20, 40);
      }
      expect(busy).toMatchObject({ inUse: 20, idle: 0 });
      await locker`COMMIT`;
      for (const r of await Promise.all(reads)) expect(r.status).toBe(200);
      expect(await poolWhen((p) => p.inUse === 0 && p.waiting === 0)).toMatchObject({ inUse: 0, waiting: 0 });

      // 20 top-ups (transactions) blocked on the renter's account row hold every connection: the next statements wait.
      await locker`BEGIN`;
      await locker`SELECT 1 FROM ledger_accounts WHERE owner_id = ${renter.id} AND kind = 'renter_available' FOR UPDATE`;
      const topups = Array.from({ length: 20 }, () => api.post("/api/renters/topup", { amount_halala: 100 }, renter.headers));
      expect(await poolWhen((p) => p.inUse === 20)).toMatchObject({ inUse: 20 });
      const waiting = Array.from({ length: 3 }, () => api.get("/api/renters/balance", renter.headers));
      expect((await poolWhen((p) => p.waiting >= 3)).waiting).toBeGreaterThanOrEqual(3);
      await locker`COMMIT`;
      for (const r of await Promise.all([...topups, ...waiting])) expect(r.status, r.text).toBe(200);
      expect(await poolWhen((p) => p.inUse === 0 && p.waiting === 0)).toMatchObject({ inUse: 0, waiting: 0 });
    } finally {
      await locker`ROLLBACK`.catch(() => {});
      locker.release();
    }
  });
});

describe("metrics access choices", () => {
  it("reads the database figures at most once per period, however often it is scraped", async () => {
    const srv = await startTestServer({ SVC_METRICS_DB_SECONDS: "3600" });
    try {
      const reads = [];
      for (let i = 0; i < 5; i++) reads.push(value((await scrape(srv, admin)).samples, "svc_db_figure_reads_total"));
      expect(reads).toEqual([1, 1, 1, 1, 1]);
    } finally {
      await srv.close();
    }
  });

  it("serves a separate listener without credentials, and nothing on the service's port when off", async () => {
    const srv = await startTestServer({ SVC_METRICS: "off", SVC_METRICS_LISTEN: "127.0.0.1:0" });
    try {
      expect((await client(srv.url).get("/metrics", admin)).status).toBe(404);
      const port = srv.app.metricsPort!;
      expect(port).toBeGreaterThan(0);
      const side = client(`http://127.0.0.1:${port}`);
      const r = await side.get("/metrics");
      expect(r.status).toBe(200);
      expect(r.text).toContain("# TYPE svc_requests_total counter");
      expect((await side.get("/api/renters/me")).status).toBe(404);
    } finally {
      await srv.close();
    }
    expect((await fetch(`http://127.0.0.1:${srv.app.metricsPort}/metrics`).catch(() => undefined))?.status).toBeUndefined();
  });

  it("SVC_METRICS=open serves without credentials outside production and is refused in production", async () => {
    const srv = await startTestServer({ SVC_METRICS: "open" });
    try {
      expect((await client(srv.url).get("/metrics")).status).toBe(200);
    } finally {
      await srv.close();
    }
    const prod = {
      NODE_ENV: "production", SVC_ADMIN_TOKEN: ADMIN_TOKEN, SVC_HMAC_SECRET: "x".repeat(32), DATABASE_URL: "postgres://x@127.0.0.1/x",
      BACKEND_URL: "https://api.example.org", FRONTEND_URL: "https://example.org",
    };
    expect(() => loadConfig({ ...prod, SVC_METRICS: "open" })).toThrow(ConfigError);
    expect(loadConfig(prod).metrics).toMatchObject({ access: "token", listen: undefined });
    expect(() => loadConfig({ ...prod, SVC_METRICS_TOKEN: "short" })).toThrow(/at least 16/);
    expect(() => loadConfig({ ...prod, SVC_METRICS_LISTEN: "nope" })).toThrow(/host:port/);
    expect(loadConfig({ ...prod, SVC_METRICS_LISTEN: "10.0.0.5:9464" }).metrics.listen).toEqual({ host: "10.0.0.5", port: 9464 });
    expect(loadConfig({ ...prod, SVC_METRICS_LISTEN: "[::1]:9464" }).metrics.listen).toEqual({ host: "::1", port: 9464 });
  });
});
