// Streams from a hostile endpoint that never stop: one event that never ends
// (before or after the first words) and a flood of well-formed chunks. The
// gateway cuts them (MAX_SSE_EVENT_LENGTH, MAX_STREAM_BYTES) like any stream
// that breaks off, hangs up on the endpoint, stays responsive meanwhile, and
// bills a cut stream by its own count of delivered chunks within the reservation.
import OpenAI from "openai";
import { afterAll, expect, it } from "vitest";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import { MAX_STREAM_BYTES } from "../../src/http/v1/proxy.js";
import { MAX_SSE_EVENT_LENGTH } from "../../src/http/v1/sse.js";
import { makeRenter } from "../helpers/fixtures.js";
import { useTestServer } from "../helpers/server.js";
import { PROMPT_TOKENS, REPLY_WORDS, startFakeVllm, type FakeVllm, type Mode } from "./fake-vllm.js";
import { serveModel } from "./serving.js";

const RATE = { input: 1_000_000, output: 2_000_000 }; // 1 halala per prompt token, 2 per completion token
const cleanup: (() => Promise<unknown>)[] = [];

const srv = useTestServer({ SVC_V1_UPSTREAM_TIMEOUT_MS: "2000", SVC_V1_TOKEN_RATES: JSON.stringify({ "*": RATE }) });
afterAll(async () => {
  expect(await ledgerProblems(srv.sql)).toEqual([]);
  for (const f of cleanup) await f();
});

const usageRow = async (renterId: number) => {
  const rows = await srv.sql<{ state: string; cost_halala: number; reserved_halala: number; completion_tokens: number; usage_estimated: boolean }[]>`
    SELECT state, cost_halala, reserved_halala, completion_tokens, usage_estimated FROM v1_usage WHERE renter_id = ${renterId}`;
  expect(rows).toHaveLength(1);
  return rows[0];
};

async function setup(model: string, mode: Mode): Promise<{ bad: FakeVllm; key: string; renterId: number }> {
  const bad = await startFakeVllm("bad", mode);
  cleanup.push(bad.close);
  await serveModel(srv, model, bad.url);
  const renter = await makeRenter(srv, 100_000);
  return { bad, key: renter.key, renterId: renter.id };
}

/** Times GET /v1/models: the API process must answer while it consumes a hostile stream. */
async function modelsLatency(key: string): Promise<number> {
  const started = performance.now();
  const res = await fetch(`${srv.url}/v1/models`, { headers: { authorization: `Bearer ${key}` } });
  expect(res.status).toBe(200);
  await res.json();
  return performance.now() - started;
}

interface Streamed {
  status: number;
  /** Content of the chunks, in order. */
  text: string;
  /** Chunks carrying content. */
  deltas: number;
  /** The last event, when it is an error envelope. */
  error?: Record<string, unknown>;
  done: boolean;
  /** GET /v1/models timed once the first bytes arrived, with whether the stream was still going when it answered. */
  models?: { ms: number; duringStream: boolean };
}

async function stream(key: string, model: string): Promise<Streamed> {
  const res = await fetch(`${srv.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({ model, messages: [{ role: "user", content: "hi" }], stream: true, max_tokens: 50 }),
  });
  if (!res.headers.get("content-type")?.includes("text/event-stream")) {
    const json = await res.json();
    return { status: res.status, text: "", deltas: 0, error: json.error, done: false };
  }
  const reader = res.body!.getReader();
  const decoder = new TextDecoder();
  let raw = "";
  let ended = false;
  let models: Promise<{ ms: number; duringStream: boolean }> | undefined;
  for (;;) {
    const r = await reader.read();
    if (r.done) break;
    raw += decoder.decode(r.value, { stream: true });
    models ??= modelsLatency(key).then((ms) => ({ ms, duringStream: !ended }));
  }
  ended = true;
  const data = raw
    .split("\n\n")
    .filter(Boolean)
    .map((e) => e.slice("data: ".length));
  const done = data.at(-1) === "[DONE]";
  const events = data.filter((d) => d !== "[DONE]").map((d) => JSON.parse(d) as Record<string, unknown>);
  const last = events.at(-1);
  const error = last?.error as Record<string, unknown> | undefined;
  const chunks = error ? events.slice(0, -1) : events;
  const contents = chunks.map((c) => (c.choices as { delta?: { content?: string } }[])[0]?.delta?.content ?? "");
  return { status: res.status, text: contents.join(""), deltas: contents.filter(Boolean).length, error, done, models: await models };
}

it("an event that never ends before the first byte: a clean 502 envelope, the endpoint hung up on, nothing charged", async () => {
  const model = "Qwen/Qwen2.5-7B-Instruct";
  const { bad, key, renterId } = await setup(model, "stream-endless-event-first");
  const hungUp = bad.nextAbort();
  const answer = stream(key, model);
  // Asked while the gateway reads the endless event.
  await new Promise((r) => setTimeout(r, 20));
  expect(await modelsLatency(key)).toBeLessThan(1000);
  const a = await answer;
  expect(a.status).toBe(502);
  expect(a.error).toMatchObject({ code: "provider_unavailable", type: "server_error", retryable: true });
  expect(String(a.error!.message)).toMatch(/event longer than/);
  await hungUp;
  expect(bad.aborted).toBe(1);
  expect(bad.sent).toBeLessThan(MAX_SSE_EVENT_LENGTH + 16 * 1024 * 1024); // what the sockets' buffers held when it was cut
  expect(await usageRow(renterId)).toMatchObject({ state: "released", cost_halala: 0 });
});

it("an event that never ends before the first byte, with another endpoint serving the model: failover to it, billed as its answer", async () => {
  const model = "google/gemma-2-9b-it";
  const { bad, key, renterId } = await setup(model, "stream-endless-event-first");
  const good = await startFakeVllm("good");
  cleanup.push(good.close);
  const goodServing = await serveModel(srv, model, good.url);
  // The picker's first choice is random among idle endpoints: ask until the bad one was tried.
  for (let i = 0; i < 30 && bad.requests.length === 0; i++) {
    const a = await stream(key, model);
    expect(a).toMatchObject({ status: 200, text: REPLY_WORDS.join(""), done: true, error: undefined });
  }
  expect(bad.requests).toHaveLength(1);
  expect(bad.aborted).toBe(1);
  const rows = await srv.sql<{ provider_id: number; state: string; cost_halala: number; usage_estimated: boolean }[]>`
    SELECT provider_id, state, cost_halala, usage_estimated FROM v1_usage WHERE renter_id = ${renterId}`;
  for (const row of rows) {
    expect(row).toEqual({ provider_id: goodServing.provider.id, state: "settled", cost_halala: PROMPT_TOKENS + 2 * REPLY_WORDS.length, usage_estimated: false });
  }
});

it("an event that never ends after the first words: the words, then an error event, and only the delivered chunks billed", async () => {
  const model = "meta-llama/Llama-3.1-8B-Instruct";
  const { bad, key, renterId } = await setup(model, "stream-endless-event");
  const hungUp = bad.nextAbort();
  const a = await stream(key, model);
  expect(a.status).toBe(200);
  expect(a.text).toBe("Hello from a");
  expect(a.done).toBe(false);
  expect(a.error).toMatchObject({ code: "provider_unavailable", type: "server_error", retryable: true });
  expect(String(a.error!.message)).toMatch(/event longer than/);
  await hungUp;
  expect(bad.aborted).toBe(1);
  const row = await usageRow(renterId);
  expect(row).toMatchObject({ state: "settled", usage_estimated: true, completion_tokens: 3 });
  expect(row.cost_halala).toBeLessThanOrEqual(row.reserved_halala);
});

it("a flood of chunks past MAX_STREAM_BYTES: relayed up to the cap, then an error event; the API answers meanwhile; billing stays within the reservation", async () => {
  const model = "mistralai/Mistral-7B-Instruct-v0.3";
  const { bad, key, renterId } = await setup(model, "stream-flood");
  const hungUp = bad.nextAbort();
  const a = await stream(key, model);
  expect(a.status).toBe(200);
  expect(a.done).toBe(false);
  expect(a.error).toMatchObject({ code: "provider_unavailable", type: "server_error", retryable: true });
  expect(String(a.error!.message)).toMatch(/stream exceeded/);
  expect(a.models).toEqual({ ms: expect.any(Number), duringStream: true });
  // Everything relayed came within the cap.
  expect(a.text.length).toBeLessThanOrEqual(MAX_STREAM_BYTES);
  expect(a.text.length).toBeGreaterThan(MAX_STREAM_BYTES / 2);
  await hungUp;
  expect(bad.aborted).toBe(1);
  // The gateway's own count (one token per delivered content chunk), charged no more than the reservation.
  const row = await usageRow(renterId);
  expect(row).toMatchObject({ state: "settled", usage_estimated: true, completion_tokens: a.deltas });
  expect(row.cost_halala).toBeLessThanOrEqual(row.reserved_halala);
  expect(row.cost_halala).toBeGreaterThan(0);
});

it("the official client sees a cut stream as an APIError with provider_unavailable", async () => {
  const model = "microsoft/Phi-3-mini-4k-instruct";
  const { key } = await setup(model, "stream-endless-event");
  const s = await new OpenAI({ apiKey: key, baseURL: `${srv.url}/v1`, maxRetries: 0 }).chat.completions.create({
    model,
    messages: [{ role: "user", content: "hi" }],
    stream: true,
  });
  let text = "";
  const err = await (async () => {
    for await (const c of s) text += c.choices[0]?.delta?.content ?? "";
  })().catch((e) => e);
  expect(text).toBe("Hello from a");
  expect(err).toBeInstanceOf(OpenAI.APIError);
  expect(err.error).toMatchObject({ code: "provider_unavailable", retryable: true });
});
