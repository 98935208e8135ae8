// A suspended renter's key is refused (403 account_suspended) before the
// per-key /v1 limit counts it, and counts instead as a failed authentication
// against the client IP on the rate-limit table's default row, as on /api,
// where every refused credential counts per IP: a suspended key cannot be
// tried from one address without end, and /v1 and /api agree on it.
import { expect, it } from "vitest";
import { makeRenter } from "../helpers/fixtures.js";
import { client } from "../helpers/http.js";
import { ADMIN_TOKEN, useTestServer } from "../helpers/server.js";

const ROW = 4;
const srv = useTestServer({
  SVC_RATE_LIMITS: "on",
  SVC_TRUST_PROXY: "on",
  SVC_RATE_LIMIT_OVERRIDES: `default=${ROW}/60`,
  SVC_V1_RATE_LIMIT_PER_MINUTE: "1000",
});
const api = client(srv);

let n = 0;
/** A fresh client address (the server trusts X-Forwarded-For). */
const freshIp = () => `10.${(process.pid >> 8) & 255}.${process.pid & 255}.${++n}`;
const v1Models = (ip: string, key: string) => api.get("/v1/models", { "x-forwarded-for": ip, authorization: `Bearer ${key}` });
const apiMe = (ip: string, key: string) => api.get("/api/renters/me", { "x-forwarded-for": ip, "x-renter-key": key });

async function suspendedRenter() {
  const r = await makeRenter(srv);
  const s = await api.post(`/api/admin/renters/${r.id}/suspend`, { reason: "fraud" }, { "x-admin-token": ADMIN_TOKEN });
  expect(s.status, s.text).toBe(200);
  return r;
}

it("counts a suspended key's refused /v1 requests per client IP, as /api does", async () => {
  const suspended = await suspendedRenter();
  const ok = await makeRenter(srv);

  const ip = freshIp();
  for (let i = 0; i < ROW; i++) {
    const r = await v1Models(ip, suspended.key);
    expect(r.status, r.text).toBe(403);
    expect(r.body.error.code).toBe("account_suspended");
  }
  const over = await v1Models(ip, suspended.key);
  expect(over.status, over.text).toBe(429);
  expect(over.body.error.code).toBe("rate_limit_exceeded");
  // The row is the address's: a valid key from it is refused too, on /v1 and /api alike; another address is not.
  expect((await v1Models(ip, ok.key)).status).toBe(429);
  expect((await apiMe(ip, ok.key)).status).toBe(429);
  expect((await v1Models(freshIp(), ok.key)).status).toBe(200);

  // /api counts the same refusals on the same row, and /v1 goes on from where they left it.
  const ip2 = freshIp();
  for (let i = 0; i < ROW; i++) expect((await apiMe(ip2, suspended.key)).status).toBe(403);
  expect((await v1Models(ip2, suspended.key)).status).toBe(429);
  expect((await apiMe(ip2, ok.key)).status).toBe(429);
});
