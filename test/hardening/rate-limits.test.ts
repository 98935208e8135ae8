// Rate limits: every row of the spec's table, counted across two server
// processes sharing one database (and, when redis-server is installed, one
// Redis), with 429 + Retry-After; client IP from the socket unless a trusted
// proxy is configured; rows configurable for benchmarks; off switch.
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import net from "node:net";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ProviderService } from "../../gen/svc/v1/providers_pb.js";
import { loadConfig } from "../../src/config.js";
import { effectiveRows, RATE_LIMITS, rowNameOf, type RateLimitName } from "../../src/http/rate-limits.js";
import { buildRouteTable } from "../../src/http/rest.js";
import { buildServices } from "../../src/services/index.js";
import { client, uniqueEmail, type Reply } from "../helpers/http.js";
import { ADMIN_TOKEN, startTestServer, type TestServer } from "../helpers/server.js";

const BASE_ENV = { SVC_ADMIN_TOKEN: ADMIN_TOKEN, SVC_HMAC_SECRET: "x".repeat(32), SVC_DATA_DIR: "/tmp/svc-test-data" };

let a: TestServer;
let b: TestServer;

const LIMITED = { SVC_RATE_LIMITS: "on", SVC_TRUST_PROXY: "on" };

beforeAll(async () => {
  a = await startTestServer(LIMITED);
  b = await startTestServer(LIMITED, a.databaseUrl);
});
afterAll(async () => {
  await b?.app.close();
  await b?.sql.end();
  await a?.close();
});

let ipCounter = 0;
/** A fresh client address (the servers trust X-Forwarded-For). */
const freshIp = () => `10.${(process.pid >> 8) & 255}.${process.pid & 255}.${++ipCounter}`;
const fakeKey = (role: "renter" | "provider") => `svc-${role}-${Math.random().toString(36).slice(2)}${"x".repeat(20)}`;

type Send = (srv: TestServer, ip: string, i: number) => Promise<Reply>;

const post = (path: string, body: (i: number) => unknown, headers: Record<string, string> = {}): Send => (srv, ip, i) =>
  client(srv.url).post(path, body(i), { "x-forwarded-for": ip, ...headers });
const get = (path: string, headers: Record<string, string> = {}): Send => (srv, ip) =>
  client(srv.url).get(path, { "x-forwarded-for": ip, ...headers });

const renterKey = fakeKey("renter");
const REQUESTS: Record<RateLimitName, Send> = {
  provider_register: post("/api/providers/register", () => ({ name: "Rig", email: uniqueEmail("rl"), gpu_model: "RTX 4090", os: "linux" })),
  heartbeat: post("/api/providers/heartbeat", () => ({ api_key: fakeKey("provider") })),
  renter_register: post("/api/renters/register", () => ({ name: "R", email: uniqueEmail("rl") })),
  job_submit: post("/api/jobs/submit", () => ({ job_type: "benchmark", duration_minutes: 1 }), { "x-renter-key": renterKey }),
  payment_topup: post("/api/payments/topup", () => ({ amount_sar: 10 })),
  renter_topup: post("/api/renters/topup", () => ({ amount_halala: 100 }), { "x-renter-key": renterKey }),
  marketplace: get("/api/providers/marketplace"),
  admin: get("/api/admin/dashboard", { "x-admin-token": ADMIN_TOKEN }),
  default: get("/api/templates"),
};

function expect429(r: Reply, durationSec: number) {
  expect(r.status).toBe(429);
  expect(r.body).toEqual({ error: expect.stringContaining("rate limit exceeded") });
  const retry = Number(r.headers.get("retry-after"));
  expect(Number.isInteger(retry)).toBe(true);
  expect(retry).toBeGreaterThanOrEqual(1);
  expect(retry).toBeLessThanOrEqual(durationSec);
}

describe("the table", () => {
  it("is the spec's table exactly", () => {
    const rows = Object.fromEntries(Object.entries(RATE_LIMITS).map(([k, v]) => [k, `${v.points}/${v.durationSec}s per ${v.per}`]));
    expect(rows).toEqual({
      provider_register: "5/3600s per ip",
      heartbeat: "4/60s per ip",
      renter_register: "5/3600s per ip",
      job_submit: "10/60s per renter_key",
      payment_topup: "10/60s per ip",
      renter_topup: "10/60s per renter_key",
      marketplace: "30/60s per ip",
      admin: "100/60s per ip",
      default: "300/60s per ip",
    });
  });
});

describe("the rows the routes name", () => {
  it("puts every GET /api/admin/* route, and only those, on the admin row; every named row exists", () => {
    const routes = buildRouteTable(buildServices(a.app.deps));
    for (const r of routes) {
      const isAdminGet = r.httpMethod === "GET" && r.template.startsWith("/api/admin/");
      expect(r.rateLimit === "admin", `${r.httpMethod} ${r.template}`).toBe(isAdminGet);
      expect(Object.keys(RATE_LIMITS)).toContain(rowNameOf(r.rateLimit));
    }
    const named = new Set(routes.map((r) => r.rateLimit).filter(Boolean));
    expect([...named].sort()).toEqual(Object.keys(RATE_LIMITS).filter((k) => k !== "default").sort());
  });
});

describe("each row, shared by two server processes", () => {
  for (const [name, row] of Object.entries(RATE_LIMITS) as [RateLimitName, (typeof RATE_LIMITS)[RateLimitName]][]) {
    it(`${name}: ${row.points} per ${row.durationSec}s per ${row.per}, then 429 with Retry-After`, async () => {
      const ip = freshIp();
      const send = REQUESTS[name];
      // Alternate between the two processes: the count is one count.
      for (let i = 0; i < row.points; i++) {
        const r = await send(i % 2 ? b : a, ip, i);
        expect(r.status, `${name} request ${i + 1}: ${r.text}`).not.toBe(429);
        // Routes still being built answer 501; nothing else may fail.
        expect(r.status === 501 || r.status < 500, r.text).toBe(true);
      }
      expect429(await send(a, ip, row.points), row.durationSec);
      expect429(await send(b, ip, row.points + 1), row.durationSec);
      if (row.per === "ip") {
        // Another client is not affected.
        expect((await send(b, freshIp(), 0)).status).not.toBe(429);
      }
    });
  }

  it("counts job_submit per renter key: another key from the same IP passes, the same key from another IP does not", async () => {
    const ip = freshIp();
    const other = fakeKey("renter");
    const submit = (srv: TestServer, from: string, key: string) =>
      client(srv.url).post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 1 }, { "x-forwarded-for": from, "x-renter-key": key });
    // renterKey was used up by the job_submit row test above (same file, same database).
    expect((await submit(a, ip, renterKey)).status).toBe(429);
    expect((await submit(b, ip, other)).status).not.toBe(429);
  });

  it("counts a POST under /api/admin against the default row, not the admin row", async () => {
    const ip = freshIp();
    for (let i = 0; i < RATE_LIMITS.admin.points; i++) await REQUESTS.admin(i % 2 ? a : b, ip, i);
    expect((await REQUESTS.admin(a, ip, 0)).status).toBe(429);
    const r = await client(a.url).post("/api/admin/renters/999999/suspend", {}, { "x-forwarded-for": ip, "x-admin-token": ADMIN_TOKEN });
    expect(r.status).toBe(404);
  });

  it("limits gRPC/Connect calls with the same rows", async () => {
    const ip = freshIp();
    const transport = createConnectTransport({
      baseUrl: a.url,
      httpVersion: "1.1",
      interceptors: [(next) => (req) => (req.header.set("x-forwarded-for", ip), next(req))],
    });
    const providers = createClient(ProviderService, transport);
    const codes: Code[] = [];
    for (let i = 0; i <= RATE_LIMITS.marketplace.points; i++) {
      try {
        await providers.getMarketplace({});
        codes.push(Code.Unknown + 100);
      } catch (err) {
        codes.push(ConnectError.from(err).code);
      }
    }
    expect(codes.slice(0, -1)).not.toContain(Code.ResourceExhausted);
    expect(codes.at(-1)).toBe(Code.ResourceExhausted);
    // The REST route of the same RPC shares the count.
    expect((await REQUESTS.marketplace(b, ip, 0)).status).toBe(429);
  });
});

describe("client address, overrides and the off switch", () => {
  it("ignores X-Forwarded-For unless SVC_TRUST_PROXY is on (a spoofed header opens no new bucket)", async () => {
    const c = await startTestServer({ SVC_RATE_LIMITS: "on", SVC_RATE_LIMIT_OVERRIDES: "renter_register=2/3600" });
    try {
      const api = client(c.url);
      const codes: number[] = [];
      for (let i = 0; i < 3; i++) {
        codes.push((await api.post("/api/renters/register", { name: "R", email: uniqueEmail("spoof") }, { "x-forwarded-for": `192.0.2.${i}` })).status);
      }
      expect(codes).toEqual([201, 201, 429]);
    } finally {
      await c.close();
    }
  });

  it("takes rows from SVC_RATE_LIMIT_OVERRIDES for benchmarks and refuses unknown rows", async () => {
    const c = await startTestServer({ SVC_RATE_LIMITS: "on", SVC_RATE_LIMIT_OVERRIDES: "default=3/60" });
    try {
      const api = client(c.url);
      const codes = [];
      for (let i = 0; i < 4; i++) codes.push((await api.get("/api/templates")).status);
      expect(codes).toEqual([200, 200, 200, 429]);
    } finally {
      await c.close();
    }
    expect(() => effectiveRows(loadConfig({ ...BASE_ENV, SVC_RATE_LIMIT_OVERRIDES: "nosuchrow=1/60" }).rateLimitOverrides)).toThrow(/nosuchrow/);
    expect(() => loadConfig({ ...BASE_ENV, SVC_RATE_LIMIT_OVERRIDES: "heartbeat=lots" })).toThrow(/row=points\/seconds/);
    expect(effectiveRows(loadConfig({ ...BASE_ENV, SVC_RATE_LIMIT_OVERRIDES: "heartbeat=1000/1" }).rateLimitOverrides).heartbeat).toMatchObject({
      points: 1000,
      durationSec: 1,
      per: "ip",
    });
  });

  it("SVC_RATE_LIMITS=off disables every limit", async () => {
    const c = await startTestServer({ SVC_RATE_LIMITS: "off" });
    try {
      const api = client(c.url);
      for (let i = 0; i < RATE_LIMITS.renter_register.points + 2; i++) {
        expect((await api.post("/api/renters/register", { name: "R", email: uniqueEmail("off") })).status).toBe(201);
      }
    } finally {
      await c.close();
    }
  });
});

const hasRedis = spawnSync("redis-server", ["--version"]).status === 0;

describe.skipIf(!hasRedis)("with REDIS_URL", () => {
  let redis: ChildProcess;
  let port: number;
  beforeAll(async () => {
    port = await new Promise<number>((resolve) => {
      const s = net.createServer().listen(0, "127.0.0.1", () => {
        const p = (s.address() as net.AddressInfo).port;
        s.close(() => resolve(p));
      });
    });
    redis = spawn("redis-server", ["--port", String(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"], { stdio: "ignore" });
    for (let i = 0; i < 50; i++) {
      const up = await new Promise<boolean>((resolve) => {
        const s = net.connect(port, "127.0.0.1", () => (s.end(), resolve(true)));
        s.on("error", () => resolve(false));
      });
      if (up) return;
      await new Promise((r) => setTimeout(r, 100));
    }
    throw new Error("redis-server did not start");
  });
  afterAll(() => {
    redis?.kill();
  });

  it("shares the heartbeat row between two processes through Redis", async () => {
    const env = { ...LIMITED, REDIS_URL: `redis://127.0.0.1:${port}` };
    const c = await startTestServer(env);
    const d = await startTestServer(env);
    try {
      const ip = freshIp();
      for (let i = 0; i < RATE_LIMITS.heartbeat.points; i++) {
        expect((await REQUESTS.heartbeat(i % 2 ? c : d, ip, i)).status).not.toBe(429);
      }
      expect429(await REQUESTS.heartbeat(c, ip, 0), 60);
      // Nothing was counted in PostgreSQL.
      const [n] = await c.sql<{ n: number }[]>`SELECT count(*)::int AS n FROM rate_limits`;
      expect(n.n).toBe(0);
    } finally {
      await d.close();
      await c.close();
    }
  });
});
