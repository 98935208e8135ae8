// A chat completion in progress ends when the key that authenticated it is
// revoked (rotate-key) or its renter is suspended, as job watches and daemon
// streams do (src/domain/accounts/open-streams.ts): the endpoint is hung up on,
// a stream ends with a 401 error event (a non-streaming client gets the 401),
// and what was delivered until then is billed. Other renters' completions go on.
import http from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { openStreamCount } from "../../src/domain/accounts/open-streams.js";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import { makeRenter } from "../helpers/fixtures.js";
import { client } from "../helpers/http.js";
import { ADMIN_TOKEN, useTestServer } from "../helpers/server.js";
import { serveModel } from "./serving.js";

const MODEL = "TinyLlama/TinyLlama-1.1B-Chat-v1.0";
const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0" });
const api = client(srv);

// An endpoint that sends one word every 50 ms for 10 s (and no usage: the gateway counts what it delivered).
let upstream: http.Server;
/** Generations the endpoint is still sending. */
let generating = 0;
beforeAll(async () => {
  upstream = http.createServer((req, res) => {
    req.resume();
    req.on("end", async () => {
      generating++;
      res.writeHead(200, { "content-type": "text/event-stream" });
      for (let i = 0; i < 200 && !res.destroyed; i++) {
        const choices = [{ index: 0, delta: { content: ` w${i}` }, finish_reason: null }];
        const chunk = { id: "c", object: "chat.completion.chunk", created: 1, model: MODEL, choices };
        res.write(`data: ${JSON.stringify(chunk)}\n\n`);
        await new Promise((r) => setTimeout(r, 50));
      }
      if (!res.destroyed) res.end("data: [DONE]\n\n");
      generating--;
    });
  });
  await new Promise<void>((r) => upstream.listen(0, "127.0.0.1", r));
  await serveModel(srv, MODEL, `http://127.0.0.1:${(upstream.address() as AddressInfo).port}/v1`);
});
afterAll(async () => {
  expect(await ledgerProblems(srv.sql)).toEqual([]);
  upstream.closeAllConnections();
  await new Promise((r) => upstream.close(r));
});

const words = (t: string) => (t.match(/ w\d+/g) ?? []).length;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** A streamed chat completion, read as it comes. */
async function openChat(key: string) {
  const res = await fetch(`${srv.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({ model: MODEL, messages: [{ role: "user", content: "hi" }], stream: true, max_tokens: 1000 }),
  });
  expect(res.status).toBe(200);
  const reader = res.body!.getReader();
  const decoder = new TextDecoder();
  let text = "";
  const ended = (async () => {
    for (;;) {
      const r = await reader.read();
      if (r.done) return;
      text += decoder.decode(r.value, { stream: true });
    }
  })();
  return {
    get text() {
      return text;
    },
    ended,
    /** The error envelope of the last event, if it is one. */
    lastError(): Record<string, unknown> | undefined {
      const events = text.split("\n\n").filter((e) => e.startsWith("data: ") && e !== "data: [DONE]");
      return JSON.parse(events.at(-1)!.slice(6)).error;
    },
    cancel: () => reader.cancel().catch(() => {}),
  };
}

async function until(pred: () => boolean, ms = 5000) {
  const deadline = Date.now() + ms;
  while (!pred()) {
    if (Date.now() > deadline) throw new Error("timed out");
    await sleep(20);
  }
}

/** The request's usage row, once settled. */
async function settledUsage(renterId: number) {
  for (let i = 0; i < 100; i++) {
    const rows = await srv.sql<{ state: string; completion_tokens: number; cost_halala: number; usage_estimated: boolean }[]>`
      SELECT state, completion_tokens, cost_halala, usage_estimated FROM v1_usage WHERE renter_id = ${renterId}`;
    if (rows.length === 1 && rows[0].state !== "open") return rows[0];
    await sleep(50);
  }
  throw new Error("the request was never settled");
}

describe("/v1 chat completions and the revocation of their key", () => {
  it("a stream ends with a 401 error event once its key is rotated, billed what it delivered; the new key works", async () => {
    const renter = await makeRenter(srv, 1_000_000);
    const bystander = await makeRenter(srv, 1_000_000);
    const s = await openChat(renter.key);
    const other = await openChat(bystander.key);
    await until(() => words(s.text) >= 3);

    const rotated = await api.post("/api/renters/rotate-key", {}, renter.headers);
    expect(rotated.status, rotated.text).toBe(200);
    await Promise.race([s.ended, sleep(3000).then(() => Promise.reject(new Error("the stream went on after its key was revoked")))]);
    expect(s.lastError()).toMatchObject({ code: "invalid_api_key", status: 401, message: expect.stringMatching(/key this stream was opened with was revoked/) });
    const delivered = words(s.text);

    // Billed what was delivered: the endpoint reported no usage, so one token per word.
    expect(await settledUsage(renter.id)).toMatchObject({ state: "settled", completion_tokens: delivered, usage_estimated: true });

    // Another renter's stream goes on.
    const before = words(other.text);
    await sleep(300);
    expect(words(other.text)).toBeGreaterThan(before);
    other.cancel();
    await other.ended.catch(() => {});

    const models = await fetch(`${srv.url}/v1/models`, { headers: { authorization: `Bearer ${rotated.body.api_key}` } });
    expect(models.status).toBe(200);
    // The endpoint was hung up on (it stops generating), and nothing of either request is still tracked.
    await until(() => generating === 0);
    await until(() => openStreamCount(srv.app.sql) === 0);
  });

  it("a stream ends once its renter is suspended", async () => {
    const renter = await makeRenter(srv, 1_000_000);
    const s = await openChat(renter.key);
    await until(() => words(s.text) >= 3);
    const susp = await api.post(`/api/admin/renters/${renter.id}/suspend`, { reason: "fraud" }, { "x-admin-token": ADMIN_TOKEN });
    expect(susp.status, susp.text).toBe(200);
    await Promise.race([s.ended, sleep(3000).then(() => Promise.reject(new Error("the stream went on after the renter was suspended")))]);
    expect(s.lastError()).toMatchObject({ code: "invalid_api_key", status: 401 });
    expect(await settledUsage(renter.id)).toMatchObject({ state: "settled", completion_tokens: words(s.text) });
    await until(() => generating === 0);
  });

  it("a non-streaming completion is answered 401 once its key is rotated", async () => {
    const renter = await makeRenter(srv, 1_000_000);
    const started = Date.now();
    const answer = fetch(`${srv.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${renter.key}`, "content-type": "application/json" },
      body: JSON.stringify({ model: MODEL, messages: [{ role: "user", content: "hi" }], max_tokens: 1000 }),
    });
    await until(() => generating > 0);
    await sleep(200);
    expect((await api.post("/api/renters/rotate-key", {}, renter.headers)).status).toBe(200);
    const res = await answer;
    expect(res.status).toBe(401);
    expect((await res.json()).error).toMatchObject({ code: "invalid_api_key", type: "authentication_error" });
    expect(Date.now() - started).toBeLessThan(5000); // not the endpoint's 10 s
    expect((await settledUsage(renter.id)).state).toBe("settled");
    await until(() => openStreamCount(srv.app.sql) === 0);
  });
});
