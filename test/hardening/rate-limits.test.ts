// Rate limits: every row of the spec's table, counted across two server
// instances sharing one database (and, when redis-server is installed, one
// Redis), with 429 + Retry-After; rows per renter key count the key that
// authenticated (not a decoy beside it), and failed authentication counts
// against the IP; client IP from the socket unless trusted proxy hops are
// configured (then from the right of X-Forwarded-For); an IPv6 client counted
// by its /64, an IPv4-mapped one as its IPv4 address; rows configurable for
// benchmarks; off switch. Two real OS processes: rate-limits-processes.test.ts.
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import http2 from "node:http2";
import net from "node:net";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { JobService } from "../../gen/svc/v1/jobs_pb.js";
import { ProviderService } from "../../gen/svc/v1/providers_pb.js";
import { loadConfig } from "../../src/config.js";
import { clientNetwork, createRateLimits, effectiveRows, RATE_LIMITS, rowNameOf, subjectOf, type RateLimitName } from "../../src/http/rate-limits.js";
import { createLogger } from "../../src/log.js";
import { buildRouteTable, clientIpOf, type NodeRequest } from "../../src/http/rest.js";
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
  renterKey = await realRenterKey();
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

/** Registers a renter (from a fresh address) and returns its key. */
async function realRenterKey(srv: TestServer = a): Promise<string> {
  const r = await client(srv.url).post("/api/renters/register", { name: "R", email: uniqueEmail("rlkey") }, { "x-forwarded-for": freshIp() });
  expect(r.status, r.text).toBe(201);
  return r.body.api_key;
}

let renterKey: string;
const REQUESTS: Record<RateLimitName, Send> = {
  provider_register: post("/api/providers/register", () => ({ name: "Rig", email: uniqueEmail("rl"), gpu_model: "RTX 4090", os: "linux" })),
  heartbeat: post("/api/providers/heartbeat", () => ({ api_key: fakeKey("provider") })),
  renter_register: post("/api/renters/register", () => ({ name: "R", email: uniqueEmail("rl") })),
  job_submit: (srv, ip) =>
    client(srv.url).post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 1 }, { "x-forwarded-for": ip, "x-renter-key": renterKey }),
  payment_topup: post("/api/payments/topup", () => ({ amount_sar: 10 })),
  renter_topup: (srv, ip) => client(srv.url).post("/api/renters/topup", { amount_halala: 100 }, { "x-forwarded-for": ip, "x-renter-key": renterKey }),
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
    const other = await realRenterKey();
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

  it("counts /api requests no route answers (an unknown path: 404; a method its path does not take: 405) on the default row, shared with the known routes", async () => {
    const ip = freshIp();
    const from = { "x-forwarded-for": ip };
    const unknown = ["/api/nope", "/api/jobs/x/y/z", "/api", "/api/renters/me/more"];
    const send = (srv: TestServer, i: number) =>
      i % 5 === 4 ? client(srv.url).call("DELETE", "/api/renters/me", undefined, from) : client(srv.url).get(unknown[i % 5], from);
    for (let i = 0; i < RATE_LIMITS.default.points; i++) {
      const r = await send(i % 2 ? b : a, i);
      expect(r.status, `request ${i + 1}: ${r.text}`).toBe(i % 5 === 4 ? 405 : 404);
      expect(r.body).toEqual({ error: expect.any(String) });
    }
    expect429(await send(a, 0), 60);
    expect429(await send(b, 4), 60);
    expect429(await client(a.url).post("/api/nope", { any: "body" }, from), 60);
    // One row: the known routes of that row, from that address, are over it too.
    expect429(await REQUESTS.default(b, ip, 0), 60);
    // Another client is not affected.
    expect((await client(b.url).get("/api/nope", { "x-forwarded-for": freshIp() })).status).toBe(404);
  });

  it("counts a GET of an unknown path under /api/admin on the GET /api/admin/* row, any other unknown path on the default row", async () => {
    const ip = freshIp();
    const from = { "x-forwarded-for": ip };
    for (let i = 0; i < RATE_LIMITS.admin.points; i++) {
      const r = await client((i % 2 ? a : b).url).get("/api/admin/nope", from);
      expect(r.status, r.text).toBe(404);
    }
    expect429(await client(a.url).get("/api/admin/nope", from), 60);
    expect429(await REQUESTS.admin(b, ip, 0), 60);
    expect((await client(a.url).post("/api/admin/nope", {}, from)).status).toBe(404);
    expect((await client(b.url).get("/api/nope", from)).status).toBe(404);
  });

  it("counts a request nothing answers outside /api (an unknown gRPC or Connect procedure, any other path) on the default row; what answers is not held", async () => {
    const ip = freshIp();
    const from = { "x-forwarded-for": ip };
    const sessions = new Map<TestServer, http2.ClientHttp2Session>();
    /** A gRPC call over HTTP/2 (one empty message) to a procedure no service has: its HTTP status, headers and body. */
    const grpc = (srv: TestServer, headers: Record<string, string> = from) =>
      new Promise<Reply>((resolve, reject) => {
        if (!sessions.has(srv)) sessions.set(srv, http2.connect(srv.url));
        const stream = sessions.get(srv)!.request({ ":method": "POST", ":path": "/svc.v1.Nope/Nope", "content-type": "application/grpc", te: "trailers", ...headers });
        stream.end(Buffer.alloc(5));
        let head: http2.IncomingHttpHeaders = {};
        const chunks: Buffer[] = [];
        stream.on("response", (h) => (head = h));
        stream.on("data", (c: Buffer) => chunks.push(c));
        stream.on("end", () => {
          const text = Buffer.concat(chunks).toString("utf8");
          const h = new Headers(Object.entries(head).filter(([k]) => !k.startsWith(":")).map(([k, v]): [string, string] => [k, String(v)]));
          resolve({ status: Number(head[":status"]), headers: h, text, body: JSON.parse(text || "null") });
        });
        stream.on("error", reject);
      });
    // A Connect unary call over HTTP/1.1 to a procedure no service has, and a plain path nothing serves.
    const connect = (srv: TestServer) => client(srv.url).post("/svc.v1.Nope/Nope", {}, { ...from, "connect-protocol-version": "1" });
    const sends = [grpc, connect, (srv: TestServer) => client(srv.url).get("/nope", from)];
    try {
      for (let i = 0; i < RATE_LIMITS.default.points; i++) {
        const r = await sends[i % 3]!(i % 2 ? b : a);
        expect(r.status, `request ${i + 1}: ${r.text}`).toBe(404);
        expect(r.body).toEqual({ error: expect.any(String) });
      }
      for (const send of sends) expect429(await send(a), 60);
      expect429(await grpc(b), 60);
      // One row: the known routes of that row, from that address, are over it too.
      expect429(await REQUESTS.default(b, ip, 0), 60);
      // What answers outside the transcoder and counts nothing is still answered: the console, the health check.
      expect((await client(a.url).get("/", from)).status).toBe(200);
      expect((await client(b.url).get("/healthz", from)).status).toBe(200);
      // Another client is not affected.
      expect((await grpc(a, { "x-forwarded-for": freshIp() })).status).toBe(404);
    } finally {
      for (const s of sessions.values()) s.close();
    }
  });

  it("counts the API document and its viewer on the default row (served ahead of the transcoder)", async () => {
    const ip = freshIp();
    const docs = (srv: TestServer, path: string, method = "GET") => fetch(`${srv.url}${path}`, { method, headers: { "x-forwarded-for": ip } });
    for (let i = 0; i < RATE_LIMITS.default.points; i++) {
      const r = await docs(i % 2 ? a : b, i % 3 === 0 ? "/api/openapi.json" : "/api/docs", i % 3 === 0 ? "HEAD" : "GET");
      expect(r.status).toBe(200);
    }
    const over = await docs(a, "/api/openapi.json");
    expect(over.status).toBe(429);
    expect(await over.json()).toEqual({ error: expect.stringContaining("rate limit exceeded") });
    expect(over.headers.get("retry-after")).toMatch(/^\d+$/);
    // One row: the rest of /api from that address is over it too.
    expect429(await REQUESTS.default(b, ip, 0), 60);
  });

  it("counts a request before reading its body: malformed JSON and oversized bodies count on the IP row too", async () => {
    const ip = freshIp();
    const raw = (srv: TestServer, body: string) =>
      fetch(`${srv.url}/api/renters/register`, { method: "POST", headers: { "content-type": "application/json", "x-forwarded-for": ip }, body });
    expect((await raw(a, "{not json")).status).toBe(400);
    expect((await raw(b, "{not json")).status).toBe(400);
    expect((await raw(a, JSON.stringify({ name: "x".repeat(100 * 1024) }))).status).toBe(413);
    for (let i = 0; i < RATE_LIMITS.renter_register.points - 3; i++) await raw(i % 2 ? a : b, "{}");
    const over = await raw(a, JSON.stringify({ name: "Late", email: "late@example.com" }));
    expect(over.status).toBe(429);
    expect(over.headers.get("retry-after")).toMatch(/^\d+$/);
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

describe("rows per renter key count the key that authenticated", () => {
  const SUBMIT = { job_type: "benchmark", duration_minutes: 1 };
  const submit = (srv: TestServer, headers: Record<string, string>) => client(srv.url).post("/api/jobs/submit", SUBMIT, headers);

  it("a decoy x-renter-key beside the real Bearer key changes nothing: the real key's 11th submit in a minute is 429", async () => {
    const key = await realRenterKey();
    for (let i = 0; i < RATE_LIMITS.job_submit.points; i++) {
      // A fresh decoy and a fresh address each time: neither opens a bucket.
      const r = await submit(i % 2 ? b : a, { "x-forwarded-for": freshIp(), "x-renter-key": fakeKey("renter"), authorization: `Bearer ${key}` });
      expect(r.status, `submit ${i + 1}: ${r.text}`).not.toBe(429);
      expect(r.status, r.text).toBeLessThan(500);
    }
    const over = await submit(a, { "x-forwarded-for": freshIp(), "x-renter-key": fakeKey("renter"), authorization: `Bearer ${key}` });
    expect429(over, 60);
    // The same over the other wire and the other header order.
    expect429(await submit(b, { "x-forwarded-for": freshIp(), "x-renter-key": key, authorization: `Bearer ${fakeKey("renter")}` }), 60);
    // The decoys were never counted: a request carrying only a decoy fails authentication, not the limit.
    expect((await submit(a, { "x-forwarded-for": freshIp(), "x-renter-key": fakeKey("renter") })).status).toBe(401);
  });

  it("requests failing authentication count against the client IP: rotating invented keys from one IP is 429 after 10", async () => {
    const ip = freshIp();
    for (let i = 0; i < RATE_LIMITS.job_submit.points; i++) {
      const r = await submit(i % 2 ? b : a, { "x-forwarded-for": ip, "x-renter-key": fakeKey("renter") });
      expect(r.status, r.text).toBe(401);
    }
    expect429(await submit(a, { "x-forwarded-for": ip, "x-renter-key": fakeKey("renter") }), 60);
    // No key, or a provider key, from the same IP: the same bucket.
    expect429(await submit(b, { "x-forwarded-for": ip }), 60);
    expect429(await submit(a, { "x-forwarded-for": ip, "x-provider-key": fakeKey("provider") }), 60);
    // A real key from that IP has its own bucket; another IP with an invented key is refused by authentication.
    expect((await submit(a, { "x-forwarded-for": ip, "x-renter-key": await realRenterKey() })).status).not.toBe(429);
    expect((await submit(b, { "x-forwarded-for": freshIp(), "x-renter-key": fakeKey("renter") })).status).toBe(401);
    // renter_topup is the same kind of row.
    const ip2 = freshIp();
    for (let i = 0; i < RATE_LIMITS.renter_topup.points; i++) {
      expect((await client(a.url).post("/api/renters/topup", { amount_halala: 100 }, { "x-forwarded-for": ip2, "x-renter-key": fakeKey("renter") })).status).toBe(401);
    }
    expect429(await client(b.url).post("/api/renters/topup", { amount_halala: 100 }, { "x-forwarded-for": ip2, "x-renter-key": fakeKey("renter") }), 60);
  });

  it("does the same for gRPC/Connect calls", async () => {
    const jobs = (ip: string, headers: Record<string, string>) =>
      createClient(
        JobService,
        createConnectTransport({
          baseUrl: b.url,
          httpVersion: "1.1",
          interceptors: [
            (next) => (req) => {
              req.header.set("x-forwarded-for", ip);
              for (const [k, v] of Object.entries(headers)) req.header.set(k, v);
              return next(req);
            },
          ],
        }),
      );
    const codeOf = (p: Promise<unknown>) => p.then(() => "ok", (err) => Code[ConnectError.from(err).code]);
    const key = await realRenterKey();
    const codes: string[] = [];
    for (let i = 0; i <= RATE_LIMITS.job_submit.points; i++) {
      codes.push(await codeOf(jobs(freshIp(), { "x-renter-key": fakeKey("renter"), authorization: `Bearer ${key}` }).submit({ jobType: "benchmark", durationMinutes: 1 })));
    }
    expect(codes.slice(0, -1)).not.toContain("ResourceExhausted");
    expect(codes.slice(0, -1)).not.toContain("Unauthenticated");
    expect(codes.at(-1)).toBe("ResourceExhausted");

    const ip = freshIp();
    const invented: string[] = [];
    for (let i = 0; i <= RATE_LIMITS.job_submit.points; i++) {
      invented.push(await codeOf(jobs(ip, { "x-renter-key": fakeKey("renter") }).submit({ jobType: "benchmark", durationMinutes: 1 })));
    }
    expect(invented).toEqual([...Array(RATE_LIMITS.job_submit.points).fill("Unauthenticated"), "ResourceExhausted"]);
    // REST from that IP shares the count.
    expect429(await submit(a, { "x-forwarded-for": ip, "x-renter-key": fakeKey("renter") }), 60);
  });

  it("keeps only hashes of keys in the store", async () => {
    const rows = await a.sql<{ key: string }[]>`SELECT key FROM rate_limits`;
    expect(rows.length).toBeGreaterThan(0);
    expect(rows.filter((r) => r.key.includes("svc-"))).toEqual([]);
    expect(rows.some((r) => /^job_submit:key:[0-9a-f]{40}$/.test(r.key))).toBe(true);
  });
});

describe("when the shared store fails", () => {
  it("retries once, then counts on from the store's last count in this process (never from zero)", async () => {
    let failures = 0;
    let queries = 0;
    const tooMany = () => Object.assign(new Error("sorry, too many clients already"), { code: "53300" });
    // The pool of server a, but the limiter's statements fail while `failures` lasts.
    const flaky = new Proxy(a.sql, {
      get(target, prop, receiver) {
        if (prop !== "unsafe") return Reflect.get(target, prop, receiver);
        return (...args: Parameters<typeof target.unsafe>) => {
          queries++;
          if (failures > 0) {
            failures--;
            return Promise.reject(tooMany());
          }
          return target.unsafe(...args);
        };
      },
    });
    const limits = await createRateLimits(loadConfig(BASE_ENV), flaky, createLogger("silent"));
    try {
      const ip = freshIp();
      const outcome = () => limits.check("marketplace", ip).then(() => "ok", (err) => ((err as { status?: number }).status === 429 ? "429" : String(err)));
      for (let i = 0; i < 20; i++) expect(await outcome()).toBe("ok");
      // One failed statement is tried again: still counted in the store.
      failures = 1;
      queries = 0;
      expect(await outcome()).toBe("ok");
      expect(queries).toBe(2);
      const [row] = await a.sql<{ points: number }[]>`SELECT points FROM rate_limits WHERE key = ${`marketplace:ip:${ip}`}`;
      expect(row.points).toBe(21);
      // The store is gone: the count goes on from 21 in this process; the 31st call is refused.
      failures = 1_000;
      const codes: string[] = [];
      for (let i = 21; i < RATE_LIMITS.marketplace.points + 1; i++) codes.push(await outcome());
      expect(codes).toEqual([...Array(RATE_LIMITS.marketplace.points - 21).fill("ok"), "429"]);
    } finally {
      await limits.close();
    }
  });
});

describe("SVC_TRUST_PROXY", () => {
  const req = (xff: string | string[] | undefined, remoteAddress = "203.0.113.9") =>
    ({ headers: xff === undefined ? {} : { "x-forwarded-for": xff }, socket: { remoteAddress } }) as unknown as NodeRequest;

  it("takes off, on or a number of trusted hops", () => {
    const hops = (v?: string) => loadConfig({ ...BASE_ENV, ...(v === undefined ? {} : { SVC_TRUST_PROXY: v }) }).trustProxy;
    expect([hops(), hops("off"), hops("false"), hops("0"), hops("on"), hops("true"), hops("1"), hops("2"), hops(" 3 ")]).toEqual([0, 0, 0, 0, 1, 1, 1, 2, 3]);
    expect(() => hops("maybe")).toThrow(/SVC_TRUST_PROXY/);
    expect(() => hops("-1")).toThrow(/SVC_TRUST_PROXY/);
    expect(() => hops("1.5")).toThrow(/SVC_TRUST_PROXY/);
  });

  it("reads the client IP as the N-th X-Forwarded-For entry from the right, else the socket", () => {
    expect(clientIpOf(req("198.51.100.1"), 0)).toBe("203.0.113.9");
    expect(clientIpOf(req("spoofed, 198.51.100.1"), 1)).toBe("198.51.100.1");
    expect(clientIpOf(req("spoofed,198.51.100.1 , 10.0.0.2"), 2)).toBe("198.51.100.1");
    expect(clientIpOf(req(["spoofed, 198.51.100.1", "10.0.0.2"]), 2)).toBe("198.51.100.1");
    // Fewer entries than trusted hops, or none: the socket.
    expect(clientIpOf(req("198.51.100.1"), 2)).toBe("203.0.113.9");
    expect(clientIpOf(req(undefined), 1)).toBe("203.0.113.9");
    expect(clientIpOf(req("spoofed, "), 1)).toBe("203.0.113.9");
  });

  it("with on, a client-supplied leftmost X-Forwarded-For entry opens no new bucket", async () => {
    const c = await startTestServer({ SVC_RATE_LIMITS: "on", SVC_TRUST_PROXY: "on", SVC_RATE_LIMIT_OVERRIDES: "renter_register=2/3600" });
    try {
      const api = client(c.url);
      const register = (xff: string) => api.post("/api/renters/register", { name: "R", email: uniqueEmail("xff") }, { "x-forwarded-for": xff });
      const codes: number[] = [];
      // What the trusted proxy appended (the rightmost entry) stays the same; the client varies what it sent.
      for (let i = 0; i < 3; i++) codes.push((await register(`192.0.2.${i}, 198.51.100.7`)).status);
      expect(codes).toEqual([201, 201, 429]);
      expect((await register("198.51.100.8")).status).toBe(201);
    } finally {
      await c.close();
    }
  });

  it("an entry with a port (as some proxies write it) counts as its address: each new source port opens no new bucket", async () => {
    const c = await startTestServer({ SVC_RATE_LIMITS: "on", SVC_TRUST_PROXY: "on", SVC_RATE_LIMIT_OVERRIDES: "renter_register=2/3600" });
    try {
      const api = client(c.url);
      const register = (xff: string) => api.post("/api/renters/register", { name: "R", email: uniqueEmail("xffport") }, { "x-forwarded-for": xff });
      const codes: number[] = [];
      for (const xff of ["198.51.100.17:40001", "198.51.100.17:40002", "198.51.100.17:40003", "198.51.100.17", "[::ffff:198.51.100.17]:40004"]) {
        codes.push((await register(xff)).status);
      }
      expect(codes).toEqual([201, 201, 429, 429, 429]);
      expect((await register("198.51.100.18:40001")).status).toBe(201);
    } finally {
      await c.close();
    }
  });
});

describe("IPv6 clients", () => {
  it("count by their /64 prefix; an IPv4-mapped address counts as its IPv4 address", () => {
    const ip = RATE_LIMITS.renter_register;
    const cases: [string, string][] = [
      ["198.51.100.7", "ip:198.51.100.7"],
      ["2001:db8:1:2::1f", "ip:2001:db8:1:2::/64"],
      ["2001:0DB8:0001:0002:ffff:1:2:3", "ip:2001:db8:1:2::/64"],
      ["2001:db8:1:3::1", "ip:2001:db8:1:3::/64"],
      ["2001:db8::", "ip:2001:db8:0:0::/64"],
      ["fe80::1%eth0", "ip:fe80:0:0:0::/64"],
      ["[2001:db8:1:2::9]:443", "ip:2001:db8:1:2::/64"],
      ["198.51.100.7:443", "ip:198.51.100.7"],
      ["1:2:3:4:5:6:1.2.3.4", "ip:1:2:3:4::/64"],
      ["::ffff:198.51.100.7", "ip:198.51.100.7"],
      ["::FFFF:c633:6407", "ip:198.51.100.7"],
      ["0:0:0:0:0:ffff:c633:6407", "ip:198.51.100.7"],
      // Not an address: kept as it is.
      ["not:an:address", "ip:not:an:address"],
      ["", "ip:unknown"],
    ];
    for (const [addr, subject] of cases) expect(subjectOf(ip, addr), addr).toBe(subject);
    expect(clientNetwork("2001:db8:1:2::1")).toBe(clientNetwork("2001:db8:1:2:ffff:ffff:ffff:ffff"));
  });

  it("share one count across the addresses of a /64, on every process; another /64 has its own", async () => {
    const codes: number[] = [];
    for (let i = 1; i <= 6; i++) {
      const from = `2001:db8:64:1::${i.toString(16)}`;
      const r = await client((i % 2 ? a : b).url).post("/api/renters/register", { name: "R", email: uniqueEmail("v6") }, { "x-forwarded-for": from });
      codes.push(r.status);
    }
    expect(codes).toEqual([201, 201, 201, 201, 201, 429]);
    const next = await client(a.url).post("/api/renters/register", { name: "R", email: uniqueEmail("v6") }, { "x-forwarded-for": "2001:db8:64:2::1" });
    expect(next.status).toBe(201);
  });

  it("an IPv4 client counts the same written plain or IPv4-mapped (as a server on :: sees it)", async () => {
    const v4 = freshIp();
    const codes: number[] = [];
    for (let i = 0; i < 6; i++) {
      const from = i % 2 ? `::ffff:${v4}` : v4;
      codes.push((await client(a.url).post("/api/renters/register", { name: "R", email: uniqueEmail("mapped") }, { "x-forwarded-for": from })).status);
    }
    expect(codes).toEqual([201, 201, 201, 201, 201, 429]);
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

// Never skipped: without redis-server these fail and say how to get it (.ci/run installs it).
describe("with REDIS_URL", () => {
  let redis: ChildProcess;
  let port: number;
  beforeAll(async () => {
    if (!hasRedis) throw new Error("redis-server is not installed: apt-get install -y redis-server");
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
