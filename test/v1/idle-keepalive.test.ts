// An endpoint that keeps its stream open with SSE comments (keep-alive pings, as some engines' servers
// send) but sends no event is idle: SVC_V1_UPSTREAM_TIMEOUT_MS counts between events, not between
// bytes. Before its first event the request moves on (and with no other endpoint ends 504 at the idle
// limit, not at the request's deadline); after it, a stream ends with the timeout's error event and is
// billed what was delivered.
import http from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, expect, it } from "vitest";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import { makeRenter } from "../helpers/fixtures.js";
import { useTestServer } from "../helpers/server.js";
import { chunk } from "./evil-upstream.js";
import { serveModel } from "./serving.js";

const TIMEOUT_MS = 300;
const PING_MS = 50;
const srv = useTestServer({
  SVC_V1_TOKEN_RATES: JSON.stringify({ "*": { input: 1_000_000, output: 2_000_000 } }),
  SVC_V1_UPSTREAM_TIMEOUT_MS: String(TIMEOUT_MS),
  SVC_V1_MAX_REQUEST_SECONDS: "8",
  SVC_JOB_SWEEP_MS: "60000",
  SVC_LIVENESS_SWEEP_SECONDS: "0",
});

/** Answers 200 with an event stream, sends `first` (if any) as its events, then only comments every PING_MS until hung up on. */
async function startPinger(first: (body: Record<string, unknown>) => unknown[]) {
  const sockets = new Set<import("node:net").Socket>();
  const pinger = { url: "", hungUp: 0 };
  const server = http.createServer(async (req, res) => {
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    if (req.method === "GET") return void res.writeHead(200).end();
    const body = JSON.parse(Buffer.concat(chunks).toString("utf8"));
    res.writeHead(200, { "content-type": "text/event-stream" });
    res.flushHeaders();
    for (const e of first(body)) res.write(`data: ${JSON.stringify(e)}\n\n`);
    const ping = setInterval(() => res.write(": ping\n\n"), PING_MS);
    res.on("close", () => {
      clearInterval(ping);
      pinger.hungUp++;
    });
  });
  server.on("connection", (s) => {
    sockets.add(s);
    s.on("close", () => sockets.delete(s));
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  pinger.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return {
    ...pinger,
    get hungUp() {
      return pinger.hungUp;
    },
    close: async () => {
      for (const s of sockets) s.destroy();
      await new Promise((r) => server.close(r));
    },
  };
}

const cleanup: (() => Promise<unknown>)[] = [];
afterAll(async () => {
  expect(await ledgerProblems(srv.sql)).toEqual([]);
  for (const f of cleanup) await f();
});

const usageRows = (renterId: number) =>
  srv.sql<{ state: string; cost_halala: number; completion_tokens: number }[]>`
    SELECT state, cost_halala, completion_tokens FROM v1_usage WHERE renter_id = ${renterId} ORDER BY created_at`;

const post = (key: string, body: Record<string, unknown>) =>
  fetch(`${srv.url}/v1/chat/completions`, { method: "POST", headers: { authorization: `Bearer ${key}`, "content-type": "application/json" }, body: JSON.stringify(body) });

let silent: Awaited<ReturnType<typeof startPinger>>;
let stalled: Awaited<ReturnType<typeof startPinger>>;
beforeAll(async () => {
  silent = await startPinger(() => []);
  stalled = await startPinger((body) => [
    { ...chunk(body.model, { role: "assistant", content: "Hello" }), usage: { prompt_tokens: 10, completion_tokens: 1, total_tokens: 11 } },
  ]);
  cleanup.push(silent.close, stalled.close);
  await serveModel(srv, "google/gemma-2-9b-it", silent.url);
  await serveModel(srv, "mistralai/Mistral-7B-Instruct-v0.3", stalled.url);
});

it("gives up on an endpoint that sends only keep-alive comments before its first event at the idle limit (504), charging nothing", async () => {
  const renter = await makeRenter(srv, 100_000);
  const started = Date.now();
  const res = await post(renter.key, { model: "google/gemma-2-9b-it", messages: [{ role: "user", content: "hi" }] });
  const elapsed = Date.now() - started;
  const body = await res.json();
  expect(res.status, JSON.stringify(body)).toBe(504);
  expect(body.error).toMatchObject({ code: "upstream_timeout", type: "timeout_error", retryable: true });
  expect(body.error.message).toContain(`${TIMEOUT_MS} ms`);
  expect(elapsed).toBeLessThan(5_000);
  expect(await usageRows(renter.id)).toMatchObject([{ state: "released", cost_halala: 0 }]);
});

it("ends a stream whose endpoint sends only keep-alive comments after its first event at the idle limit, billing what was delivered", async () => {
  const renter = await makeRenter(srv, 100_000);
  const started = Date.now();
  const res = await post(renter.key, { model: "mistralai/Mistral-7B-Instruct-v0.3", messages: [{ role: "user", content: "hi" }], stream: true });
  expect(res.status).toBe(200);
  const text = await res.text();
  const elapsed = Date.now() - started;
  const events = text.split("\n\n").filter((e) => e.startsWith("data: ")).map((e) => JSON.parse(e.slice(6)));
  expect(events[0].choices[0].delta.content).toBe("Hello");
  expect(events.at(-1).error).toMatchObject({ code: "upstream_timeout", retryable: true });
  expect(elapsed).toBeLessThan(5_000);
  const [row] = await usageRows(renter.id);
  expect(row).toMatchObject({ state: "settled", completion_tokens: 1 });
  expect(row.cost_halala).toBeGreaterThan(0);
  await expect.poll(() => stalled.hungUp).toBeGreaterThan(0);
});
