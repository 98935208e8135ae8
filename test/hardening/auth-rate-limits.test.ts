// Credential guessing on the plain handlers, which take credentials outside the
// REST guard and the gRPC interceptor, is bounded by the rate-limit rows the
// rest of the API counts on, per client IP: a wrong token on /metrics counts
// on the admin row (with the admin routes' requests), a failed /v1
// authentication (no key, an invented one) on the default row (with the /api
// requests). Over the row, a right credential from that address is refused
// too, so 429 against 200 tells nothing; other addresses are unaffected, and
// requests that authenticate are not counted. Small rows
// (SVC_RATE_LIMIT_OVERRIDES) keep the tests fast.
import { describe, expect, it } from "vitest";
import { makeRenter } from "../helpers/fixtures.js";
import { client, type Reply } from "../helpers/http.js";
import { ADMIN_TOKEN, useTestServer } from "../helpers/server.js";

const METRICS_TOKEN = "metrics-token-0123456789abcdef";
const ROW = 5;
const srv = useTestServer({
  SVC_RATE_LIMITS: "on",
  SVC_TRUST_PROXY: "on",
  SVC_RATE_LIMIT_OVERRIDES: `admin=${ROW}/60,default=${ROW}/60`,
  SVC_METRICS_TOKEN: METRICS_TOKEN,
  SVC_V1_RATE_LIMIT_PER_MINUTE: "1000",
});
const api = client(srv);

let n = 0;
/** A fresh client address (the server trusts X-Forwarded-For). */
const freshIp = () => `10.${(process.pid >> 8) & 255}.${process.pid & 255}.${++n}`;
const from = (ip: string, headers: Record<string, string> = {}) => ({ "x-forwarded-for": ip, ...headers });

const metrics = (ip: string, token?: string) => api.get("/metrics", from(ip, token ? { authorization: `Bearer ${token}` } : {}));
const guess = (i: number) => `wrong-guess-${i}-${"x".repeat(24)}`;
const v1Models = (ip: string, key?: string) => api.get("/v1/models", from(ip, key ? { authorization: `Bearer ${key}` } : {}));
const inventedKey = (i: number) => `svc-renter-invented${i}${"x".repeat(24)}`;

function expectRetryAfter(r: Reply) {
  const retry = Number(r.headers.get("retry-after"));
  expect(Number.isInteger(retry)).toBe(true);
  expect(retry).toBeGreaterThanOrEqual(1);
  expect(retry).toBeLessThanOrEqual(60);
  return retry;
}

function expectMetrics429(r: Reply) {
  expect(r.status, r.text).toBe(429);
  expect(r.body).toEqual({ error: expect.stringContaining("rate limit exceeded") });
  expectRetryAfter(r);
}

function expectV1429(r: Reply) {
  expect(r.status, r.text).toBe(429);
  expect(r.body.error).toMatchObject({ type: "rate_limit_error", code: "rate_limit_exceeded", status: 429, retryable: true });
  expect(r.body.error.message).toMatch(/failed authentication/);
  const retry = expectRetryAfter(r);
  expect(r.body.error.retry_after_seconds).toBe(retry);
  expect(r.body.retry_after_seconds).toBe(retry);
  expect(r.body.retry_after_ms).toBeGreaterThan(0);
  expect(r.headers.get("retry-after-ms")).toBe(String(r.body.retry_after_ms));
}

describe("/metrics token guessing", () => {
  it("counts wrong tokens per client IP on the admin row: 429 with Retry-After once over, for a right token too; other addresses unaffected", async () => {
    const ip = freshIp();
    for (let i = 0; i < ROW; i++) {
      const r = await metrics(ip, guess(i));
      expect(r.status, r.text).toBe(401);
      expect(r.body).toEqual({ error: "invalid metrics token" });
    }
    expectMetrics429(await metrics(ip, guess(ROW)));
    // A right guess from that address now answers as a wrong one: the admin token and the metrics token alike.
    expectMetrics429(await metrics(ip, ADMIN_TOKEN));
    expectMetrics429(await metrics(ip, METRICS_TOKEN));
    const viaHeader = await api.get("/metrics", from(ip, { "x-admin-token": ADMIN_TOKEN }));
    expectMetrics429(viaHeader);
    // Another address scrapes as before.
    const other = await metrics(freshIp(), METRICS_TOKEN);
    expect(other.status).toBe(200);
    expect(other.text).toMatch(/^# HELP /m);
  });

  it("shares the row with the admin routes, both ways", async () => {
    // Guesses at the admin routes first: /metrics is then refused too.
    const ip = freshIp();
    for (let i = 0; i < ROW; i++) expect((await api.get("/api/admin/dashboard", from(ip, { "x-admin-token": guess(i) }))).status).toBe(401);
    expect((await api.get("/api/admin/dashboard", from(ip, { "x-admin-token": guess(ROW) }))).status).toBe(429);
    expectMetrics429(await metrics(ip, guess(ROW + 1)));
    expectMetrics429(await metrics(ip, ADMIN_TOKEN));
    // Guesses at /metrics first: the admin routes are then refused too, the right token as well.
    const ip2 = freshIp();
    for (let i = 0; i < ROW; i++) expect((await metrics(ip2, guess(i))).status).toBe(401);
    expect((await api.get("/api/admin/dashboard", from(ip2, { "x-admin-token": ADMIN_TOKEN }))).status).toBe(429);
  });

  it("counts only wrong tokens: not scrapes with a right one, nor requests without any", async () => {
    const ip = freshIp();
    for (let i = 0; i < ROW * 2; i++) expect((await metrics(ip, i % 2 ? ADMIN_TOKEN : METRICS_TOKEN)).status).toBe(200);
    for (let i = 0; i < ROW * 2; i++) expect((await metrics(ip)).status).toBe(401);
    // The row is still whole: ROW wrong guesses, then the next is over.
    for (let i = 0; i < ROW; i++) expect((await metrics(ip, guess(i))).status).toBe(401);
    expectMetrics429(await metrics(ip, guess(ROW)));
  });
});

describe("/metrics and the admin routes read x-admin-token alike", () => {
  it("an empty x-admin-token is no token (not counted); one padded with whitespace the admin routes take reads /metrics", async () => {
    const ip = freshIp();
    for (let i = 0; i < ROW * 2; i++) {
      const r = await api.get("/metrics", from(ip, { "x-admin-token": "" }));
      expect(r.status, r.text).toBe(401);
      expect(r.body.error).toMatch(/token required/);
    }
    expect((await metrics(ip, METRICS_TOKEN)).status).toBe(200);
    const padded = { "x-admin-token": `${ADMIN_TOKEN}\u00a0` };
    expect((await api.get("/api/admin/dashboard", from(freshIp(), padded))).status).toBe(200);
    const r = await api.get("/metrics", from(freshIp(), padded));
    expect(r.status, r.text).toBe(200);
  });
});

describe("/v1 failed authentication", () => {
  it("counts invented keys per client IP on the default row: the /v1 429 envelope once over, for a real key too; other addresses unaffected", async () => {
    const renter = await makeRenter(srv);
    const ip = freshIp();
    for (let i = 0; i < ROW; i++) {
      const r = await v1Models(ip, inventedKey(i));
      expect(r.status, r.text).toBe(401);
      expect(r.body.error.code).toBe("invalid_api_key");
    }
    expectV1429(await v1Models(ip, inventedKey(ROW)));
    // Refused before any key is looked up: a real key from that address too.
    expectV1429(await v1Models(ip, renter.key));
    const chat = await api.post("/v1/chat/completions", { model: "m", messages: [{ role: "user", content: "hi" }] }, from(ip, { "x-renter-key": renter.key }));
    expectV1429(chat);
    // The renter from another address is served.
    expect((await v1Models(freshIp(), renter.key)).status).toBe(200);
  });

  it("counts a missing key and a provider key as failures too", async () => {
    const ip = freshIp();
    for (let i = 0; i < ROW; i++) {
      const r = i % 2 ? await v1Models(ip) : await v1Models(ip, `svc-provider-invented${i}${"x".repeat(24)}`);
      expect(r.status, r.text).toBe(401);
    }
    expectV1429(await v1Models(ip));
  });

  it("shares the default row with /api, both ways", async () => {
    // Failed /v1 authentication first: the /api routes of the default row are refused from that address.
    const ip = freshIp();
    for (let i = 0; i < ROW; i++) expect((await v1Models(ip, inventedKey(i))).status).toBe(401);
    const rest = await api.get("/api/templates", from(ip));
    expect(rest.status).toBe(429);
    expect(rest.body).toEqual({ error: expect.stringContaining("rate limit exceeded") });
    // /api requests first: a failed /v1 authentication is then over the row.
    const ip2 = freshIp();
    for (let i = 0; i < ROW; i++) expect((await api.get("/api/templates", from(ip2))).status).toBe(200);
    expectV1429(await v1Models(ip2, inventedKey(0)));
  });

  it("counts only failures: not requests that authenticate", async () => {
    const renter = await makeRenter(srv);
    const ip = freshIp();
    for (let i = 0; i < ROW * 2; i++) expect((await v1Models(ip, renter.key)).status).toBe(200);
    // The row is still whole: ROW failures, then the next is over.
    for (let i = 0; i < ROW; i++) expect((await v1Models(ip, inventedKey(i))).status).toBe(401);
    expectV1429(await v1Models(ip, inventedKey(ROW)));
  });
});
