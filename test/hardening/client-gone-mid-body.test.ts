// A client that closes its connection while sending a request's body is a
// client gone (499), not a failure of the server's (5xx): operators alert on
// 5xx, and nothing broke. Checked on the /api routes and on /v1, through the
// requests counter of /metrics.
import net from "node:net";
import { expect, it } from "vitest";
import { makeRenter } from "../helpers/fixtures.js";
import { client } from "../helpers/http.js";
import { useTestServer } from "../helpers/server.js";

const METRICS_TOKEN = "metrics-token-0123456789abcdef";
const srv = useTestServer({ SVC_METRICS_TOKEN: METRICS_TOKEN });

/** svc_requests_total of `wire` by status. */
async function requestsByStatus(wire: string): Promise<Record<string, number>> {
  const r = await client(srv.url).get("/metrics", { authorization: `Bearer ${METRICS_TOKEN}` });
  expect(r.status, r.text).toBe(200);
  const out: Record<string, number> = {};
  for (const m of r.text.matchAll(/^svc_requests_total\{([^}]*)\} (\S+)$/gm)) {
    const labels = Object.fromEntries([...m[1].matchAll(/(\w+)="([^"]*)"/g)].map((l) => [l[1], l[2]]));
    if (labels.wire === wire) out[labels.status] = (out[labels.status] ?? 0) + Number(m[2]);
  }
  return out;
}

/** Sends the head of a POST promising 1,000 bytes, a few of them, then closes the connection. */
async function leaveMidBody(path: string, headers: Record<string, string>): Promise<void> {
  const port = new URL(srv.url).port;
  const sock = net.connect(Number(port), "127.0.0.1");
  await new Promise((res) => sock.once("connect", res));
  const head = Object.entries({ host: `127.0.0.1:${port}`, "content-type": "application/json", "content-length": "1000", ...headers })
    .map(([k, v]) => `${k}: ${v}\r\n`)
    .join("");
  sock.write(`POST ${path} HTTP/1.1\r\n${head}\r\n{"model": "x", `);
  await new Promise((res) => setTimeout(res, 200));
  sock.destroy();
}

it.each([
  ["/api", "rest", "/api/jobs/submit", (key: string) => ({ "x-renter-key": key })],
  ["/v1", "v1", "/v1/chat/completions", (key: string) => ({ authorization: `Bearer ${key}` })],
])("on %s: counted as 499, never as a 5xx", async (_what, wire, path, auth) => {
  const renter = await makeRenter(srv, 10_000);
  const before = await requestsByStatus(wire);
  await leaveMidBody(path, auth(renter.key));
  await expect.poll(async () => ((await requestsByStatus(wire))["499"] ?? 0) - (before["499"] ?? 0), { timeout: 10_000 }).toBe(1);
  const serverErrors = (by: Record<string, number>) => Object.entries(by).reduce((n, [status, count]) => n + (Number(status) >= 500 ? count : 0), 0);
  expect(serverErrors(await requestsByStatus(wire))).toBe(serverErrors(before));
});
