// A client that leaves (closes its connection, or cancels its HTTP/2 stream) while its request waits for its
// key to be checked, before the body is read, is a client gone: the request ends (499) rather than waiting
// forever for a body that will never come, which held the request (its revocation watch, its count in the
// metrics) for the life of the process.
import http2 from "node:http2";
import net from "node:net";
import { expect, it } from "vitest";
import { makeRenter } from "../helpers/fixtures.js";
import { client } from "../helpers/http.js";
import { useTestServer } from "../helpers/server.js";

const METRICS_TOKEN = "metrics-token-0123456789abcdef";
const srv = useTestServer({ SVC_METRICS_TOKEN: METRICS_TOKEN });

/** svc_requests_total of /v1 by status. */
async function v1RequestsByStatus(): Promise<Record<string, number>> {
  const r = await client(srv.url).get("/metrics", { authorization: `Bearer ${METRICS_TOKEN}` });
  expect(r.status, r.text).toBe(200);
  const out: Record<string, number> = {};
  for (const m of r.text.matchAll(/^svc_requests_total\{([^}]*)\} (\S+)$/gm)) {
    const labels = Object.fromEntries([...m[1].matchAll(/(\w+)="([^"]*)"/g)].map((l) => [l[1], l[2]]));
    if (labels.wire === "v1") out[labels.status] = (out[labels.status] ?? 0) + Number(m[2]);
  }
  return out;
}

/** Starts a chat completion promising 1,000 bytes of body and sends a few; returns how to leave. */
async function startRequest(wire: "HTTP/1.1" | "h2c", key: string): Promise<() => Promise<void>> {
  if (wire === "h2c") {
    const session = http2.connect(srv.url);
    session.on("error", () => {});
    const stream = session.request({
      ":method": "POST",
      ":path": "/v1/chat/completions",
      "content-type": "application/json",
      authorization: `Bearer ${key}`,
      "content-length": "1000",
    });
    stream.on("error", () => {});
    stream.write('{"model": "x", ');
    return async () => {
      stream.close(http2.constants.NGHTTP2_CANCEL);
      await new Promise((res) => stream.once("close", res));
      session.close();
    };
  }
  const sock = net.connect(srv.port, "127.0.0.1");
  await new Promise((res) => sock.once("connect", res));
  sock.on("error", () => {});
  sock.write(
    `POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:${srv.port}\r\ncontent-type: application/json\r\n` +
      `authorization: Bearer ${key}\r\ncontent-length: 1000\r\n\r\n{"model": "x", `,
  );
  return async () => {
    sock.destroy();
    await new Promise((res) => sock.once("close", res));
  };
}

it.each(["HTTP/1.1", "h2c"] as const)("over %s: a client gone while its key is looked up, before its body is read, ends as 499", async (wire) => {
  const renter = await makeRenter(srv, 10_000);
  const before = await v1RequestsByStatus();
  // The key lookup (the renter's key is not cached yet: never used) waits behind this lock.
  const lock = await srv.sql.reserve();
  try {
    await lock`BEGIN`;
    await lock`LOCK TABLE api_keys IN ACCESS EXCLUSIVE MODE`;
    const leave = await startRequest(wire, renter.key);
    // The request's lookup is waiting for the lock...
    await expect
      .poll(async () => (await srv.sql`SELECT 1 FROM pg_locks l JOIN pg_class c ON c.oid = l.relation WHERE c.relname = 'api_keys' AND NOT l.granted`).length, {
        timeout: 10_000,
      })
      .toBe(1);
    // ...when its client leaves; the server has seen the connection close once a request on a new one is answered.
    await leave();
    await expect.poll(async () => (await fetch(`${srv.url}/v1/models`)).status, { timeout: 10_000 }).toBe(401);
  } finally {
    await lock`ROLLBACK`;
    lock.release();
  }
  await expect.poll(async () => ((await v1RequestsByStatus())["499"] ?? 0) - (before["499"] ?? 0), { timeout: 10_000 }).toBe(1);
});
