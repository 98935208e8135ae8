// The first vertical slice over real HTTP: provider and renter register,
// login-email and me, field by field against the spec.
import http from "node:http";
import { describe, expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { client, uniqueEmail } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";

const srv = useTestServer();
const api = client(srv);

const PROVIDER_FIELDS = [
  "id", "name", "email", "gpu_model", "status", "last_heartbeat", "daemon_version", "run_mode", "uptime_percent",
  "total_earnings_halala", "total_jobs", "gpu_vram_mib", "gpu_count_reported", "gpu_compute_capability",
  "gpu_cuda_version", "is_paused", "gpu_usage_cap_pct", "vram_reserve_gb", "temp_limit_c",
  "gpu_metrics", "today_earnings_halala", "week_earnings_halala", "active_job",
];
const RENTER_FIELDS = [
  "id", "name", "email", "organization", "use_case", "phone", "webhook_url", "balance_halala",
  "total_spent_halala", "total_jobs", "created_at",
];

describe("provider accounts", () => {
  it("registers with 200, a prefixed key and the installer path", async () => {
    const email = uniqueEmail("prov");
    const r = await api.post("/api/providers/register", { name: "Rig 1", email, gpu_model: "RTX 4090", os: "linux" });
    expect(r.status).toBe(200);
    expect(r.body.success).toBe(true);
    expect(typeof r.body.provider_id).toBe("number");
    expect(r.body.api_key).toMatch(/^svc-provider-[A-Za-z0-9_-]{20,}$/);
    expect(r.body.installer_url).toBe(`/api/providers/installer?key=${r.body.api_key}&os=linux`);
    expect(typeof r.body.message).toBe("string");
  });

  it("names every missing field, rejects a bad os and email, and 409s a duplicate email", async () => {
    const missing = await api.post("/api/providers/register", { name: "x" });
    expect(missing.status).toBe(400);
    expect(missing.body.error).toContain("email");
    expect(missing.body.error).toContain("gpu_model");
    expect(missing.body.error).toContain("os");

    const badOs = await api.post("/api/providers/register", { name: "x", email: uniqueEmail(), gpu_model: "A100", os: "beos" });
    expect(badOs.status).toBe(400);
    expect(badOs.body.error).toMatch(/os must be one of/);

    const badEmail = await api.post("/api/providers/register", { name: "x", email: "not-an-email", gpu_model: "A100", os: "mac" });
    expect(badEmail.status).toBe(400);
    expect(badEmail.body.error).toMatch(/email/);

    const wrongType = await api.post("/api/providers/register", { name: 42, email: uniqueEmail(), gpu_model: "A100", os: "mac" });
    expect(wrongType.status).toBe(400);
    expect(wrongType.body.error).toMatch(/name/);

    const email = uniqueEmail("dup");
    expect((await api.post("/api/providers/register", { name: "a", email, gpu_model: "A100", os: "windows" })).status).toBe(200);
    const dup = await api.post("/api/providers/register", { name: "b", email: email.toUpperCase(), gpu_model: "A100", os: "windows" });
    expect(dup.status).toBe(409);
    expect(dup.body).toEqual({ error: expect.stringContaining("already registered") });
  });

  it("logs in by email with an additional key, and serves me with the dashboard fields", async () => {
    const email = uniqueEmail("login");
    const reg = await api.post("/api/providers/register", { name: "Rig", email, gpu_model: "H100", os: "darwin" });
    const login = await api.post("/api/providers/login-email", { email });
    expect(login.status).toBe(200);
    expect(login.body.success).toBe(true);
    expect(login.body.api_key).toMatch(/^svc-provider-/);
    expect(login.body.api_key).not.toBe(reg.body.api_key);
    expect(login.body.provider).toEqual({ id: reg.body.provider_id, name: "Rig", email, gpu_model: "H100", status: "registered" });

    for (const key of [reg.body.api_key, login.body.api_key]) {
      const me = await api.get(`/api/providers/me?key=${key}`);
      expect(me.status).toBe(200);
      for (const f of PROVIDER_FIELDS) expect(me.body.provider).toHaveProperty(f);
      expect(me.body.provider.last_heartbeat).toBeNull();
      expect(me.body.provider.active_job).toBeNull();
      expect(me.body.provider.gpu_metrics).toEqual({ utilization_pct: 0, vram_used_mib: 0, temperature_c: 0 });
      expect(me.body.recent_jobs).toEqual([]);
    }
    const viaHeader = await api.get("/api/providers/me", { "x-provider-key": reg.body.api_key });
    expect(viaHeader.status).toBe(200);

    expect((await api.post("/api/providers/login-email", { email: uniqueEmail("nobody") })).status).toBe(404);
    expect((await api.post("/api/providers/login-email", {})).status).toBe(400);
  });

  it("answers me with 400 without a key, 404 with an unknown one (spec), 403 with a renter key", async () => {
    expect((await api.get("/api/providers/me")).body).toEqual({ error: "API key required" });
    expect((await api.get("/api/providers/me")).status).toBe(400);
    const bad = await api.get("/api/providers/me?key=svc-provider-doesnotexist");
    expect(bad.status).toBe(404);
    expect(bad.body.error).toMatch(/provider not found/);
    expect((await api.get("/api/providers/status/svc-provider-doesnotexist")).status).toBe(404);
    const renter = await api.post("/api/renters/register", { name: "R", email: uniqueEmail("r") });
    expect((await api.get(`/api/providers/me?key=${renter.body.api_key}`)).status).toBe(403);
  });
});

describe("renter accounts", () => {
  it("registers with 201 and serves me by header (preferred) or query", async () => {
    const email = uniqueEmail("renter");
    const r = await api.post("/api/renters/register", { name: "Lab", email, organization: "Uni", use_case: "research" });
    expect(r.status).toBe(201);
    expect(r.body).toEqual({ success: true, renter_id: expect.any(Number), api_key: expect.stringMatching(/^svc-renter-/), message: expect.any(String) });

    const me = await api.get("/api/renters/me", { "x-renter-key": r.body.api_key });
    expect(me.status).toBe(200);
    for (const f of RENTER_FIELDS) expect(me.body.renter).toHaveProperty(f);
    expect(me.body.renter).toMatchObject({ id: r.body.renter_id, name: "Lab", email, organization: "Uni", use_case: "research", phone: null, webhook_url: null, balance_halala: 0 });
    expect(me.body.renter.created_at).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
    expect(me.body.recent_jobs).toEqual([]);
    expect((await api.get(`/api/renters/me?key=${r.body.api_key}`)).status).toBe(200);
  });

  it("validates register and 409s a duplicate; login-email issues a working key", async () => {
    const missing = await api.post("/api/renters/register", {});
    expect(missing.status).toBe(400);
    expect(missing.body.error).toBe("missing required fields: name, email");
    const email = uniqueEmail("dupr");
    await api.post("/api/renters/register", { name: "a", email });
    expect((await api.post("/api/renters/register", { name: "a", email })).status).toBe(409);

    const login = await api.post("/api/renters/login-email", { email });
    expect(login.status).toBe(200);
    expect(login.body.api_key).toMatch(/^svc-renter-/);
    expect(login.body.renter.email).toBe(email);
    expect((await api.get("/api/renters/me", { "x-renter-key": login.body.api_key })).status).toBe(200);
    expect((await api.post("/api/renters/login-email", { email: uniqueEmail("none") })).status).toBe(404);
  });

  it("answers me with 400 without a key and 404 with an unknown one (spec)", async () => {
    expect((await api.get("/api/renters/me")).status).toBe(400);
    const unknown = await api.get("/api/renters/me", { "x-renter-key": "svc-renter-nope" });
    expect(unknown.status).toBe(404);
    expect(unknown.body.error).toMatch(/renter not found/);
  });
});

describe("transcoder edges", () => {
  it("gives JSON errors for malformed JSON, unknown routes, wrong methods and oversized bodies", async () => {
    const malformed = await api.call("POST", "/api/renters/register", "{not json");
    expect(malformed.status).toBe(400);
    expect(malformed.body).toEqual({ error: "malformed JSON body" });
    const array = await api.call("POST", "/api/renters/register", "[1,2]");
    expect(array.status).toBe(400);

    const unknown = await api.get("/api/does-not-exist");
    expect(unknown.status).toBe(404);
    expect(unknown.headers.get("content-type")).toMatch(/application\/json/);
    expect(unknown.body.error).toMatch(/not found/);

    const wrongMethod = await api.call("DELETE", "/api/renters/register");
    expect(wrongMethod.status).toBe(405);
    expect(wrongMethod.headers.get("allow")).toBe("POST");
    const notDeleted = await api.call("DELETE", "/api/renters/me");
    expect(notDeleted.headers.get("allow")).toBe("GET, HEAD, PATCH");

    const big = await api.post("/api/renters/register", { name: "x".repeat(100 * 1024), email: uniqueEmail() });
    expect(big.status).toBe(413);
    expect(big.body.error).toMatch(/too large/);

    // Chunked (no content-length): the limit is found while reading; still a 413 answer, not a reset.
    const chunked = await new Promise<{ status: number; body: string }>((resolve, reject) => {
      const req = http.request(`${srv.url}/api/renters/register`, { method: "POST", headers: { "content-type": "application/json" } }, (res) => {
        let body = "";
        res.setEncoding("utf8");
        res.on("data", (c) => (body += c));
        res.on("end", () => resolve({ status: res.statusCode ?? 0, body }));
      });
      req.on("error", reject);
      req.write(`{"name":"${"x".repeat(40 * 1024)}`);
      setTimeout(() => req.end(`${"y".repeat(40 * 1024)}","email":"${uniqueEmail()}"}`), 20);
    });
    expect(chunked.status).toBe(413);
    expect(JSON.parse(chunked.body).error).toMatch(/too large/);
  });

  it("answers HEAD wherever GET is answered, with GET's status and headers and no body", async () => {
    const reg = await api.post("/api/renters/register", { name: "Head", email: uniqueEmail() });
    const key = reg.body.api_key as string;
    for (const [path, headers] of [
      ["/api/renters/me", { "x-renter-key": key }],
      ["/api/renters/available-providers", {}],
      ["/api/templates", {}],
    ] as const) {
      const get = await fetch(`${srv.url}${path}`, { headers });
      const head = await fetch(`${srv.url}${path}`, { method: "HEAD", headers });
      expect([path, head.status]).toEqual([path, get.status]);
      expect(head.headers.get("content-type")).toBe(get.headers.get("content-type"));
      expect(head.headers.get("content-length")).toBe(String(Buffer.byteLength(await get.text())));
      expect(await head.text()).toBe("");
    }
    // Unauthenticated, as GET is.
    expect((await fetch(`${srv.url}/api/renters/me`, { method: "HEAD" })).status).toBe(400);
    // A route with no GET has no HEAD either.
    const post = await fetch(`${srv.url}/api/renters/register`, { method: "HEAD" });
    expect(post.status).toBe(405);
    expect(post.headers.get("allow")).toBe("POST");
    // Nor has the legacy poll, a GET that hands out a job: a HEAD of it would take the job and drop the answer.
    const provider = await makeProvider(srv);
    const renter = await makeRenter(srv, 10_000);
    const job = (await api.post("/api/jobs/submit", { job_type: "benchmark" }, renter.headers)).body.job.job_id;
    const headPoll = await fetch(`${srv.url}/api/providers/${provider.key}/jobs`, { method: "HEAD" });
    expect(headPoll.status).toBe(405);
    expect(headPoll.headers.get("allow")).toBe("GET");
    expect((await api.get(`/api/jobs/${job}`, renter.headers)).body.status).not.toBe("running");
    expect((await api.get(`/api/providers/${provider.key}/jobs`)).body.job.job_id).toBe(job);
  });

  it("serves health and readiness", async () => {
    expect((await api.get("/healthz")).body).toEqual({ status: "ok" });
    expect((await api.get("/readyz")).status).toBe(200);
  });
});
