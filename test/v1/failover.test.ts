// Failover before the first byte: an endpoint that fails before anything was
// sent to the client (answers 200 and then drops, ends empty, sends an error
// event, or stalls; or never answers at all) is left for another endpoint
// serving the model, and the client gets one clean answer from that one,
// billed to its provider. Which endpoint is tried first is the picker's
// (random among idle ones), so each case asks until the failing endpoint
// was tried; the endpoint that failed rests, so it sees exactly one request.
import OpenAI from "openai";
import { afterAll, expect, it } from "vitest";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import { makeRenter } from "../helpers/fixtures.js";
import { useTestServer } from "../helpers/server.js";
import { PROMPT_TOKENS, REPLY_WORDS, startFakeVllm, type Mode } from "./fake-vllm.js";
import { serveModel } from "./serving.js";

const RATE = { input: 1_000_000, output: 2_000_000 }; // 1 halala per prompt token, 2 per completion token
const COST = PROMPT_TOKENS + 2 * REPLY_WORDS.length;
const TIMEOUT_MS = 300;
const cleanup: (() => Promise<unknown>)[] = [];

const srv = useTestServer({ SVC_V1_UPSTREAM_TIMEOUT_MS: String(TIMEOUT_MS), SVC_V1_TOKEN_RATES: JSON.stringify({ "*": RATE }) });
afterAll(async () => {
  expect(await ledgerProblems(srv.sql)).toEqual([]);
  for (const f of cleanup) await f();
});

interface Answer {
  status: number;
  requestId: string;
  text: string;
  /** Parsed SSE events (streaming) or the JSON body. */
  events: Record<string, unknown>[];
  done: boolean;
}

async function ask(key: string, model: string, stream: boolean): Promise<Answer> {
  const res = await fetch(`${srv.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({ model, messages: [{ role: "user", content: "hi" }], stream, ...(stream ? { stream_options: { include_usage: true } } : {}) }),
  });
  const raw = await res.text();
  const requestId = res.headers.get("x-request-id")!;
  if (!stream || !res.headers.get("content-type")?.includes("text/event-stream")) {
    const json = JSON.parse(raw);
    return { status: res.status, requestId, text: json.choices?.[0]?.message?.content ?? "", events: [json], done: true };
  }
  const data = raw
    .split("\n\n")
    .filter(Boolean)
    .map((e) => {
      expect(e.startsWith("data: ")).toBe(true);
      return e.slice("data: ".length);
    });
  const done = data.at(-1) === "[DONE]";
  const events = data.filter((d) => d !== "[DONE]").map((d) => JSON.parse(d));
  const text = events.map((c) => (c.choices as { delta?: { content?: string } }[])[0]?.delta?.content ?? "").join("");
  return { status: res.status, requestId, text, events, done };
}

const cases: { name: string; model: string; mode: Mode; stream: boolean }[] = [
  { name: "a stream whose endpoint answers 200 and then drops the connection before the first event", model: "mistralai/Mistral-7B-Instruct-v0.3", mode: "stream-drop-before-first", stream: true },
  { name: "a stream whose endpoint answers 200 and then ends the response without any event", model: "Qwen/Qwen2.5-7B-Instruct", mode: "stream-end-before-first", stream: true },
  { name: "a stream whose endpoint's first event is an error", model: "microsoft/Phi-3-mini-4k-instruct", mode: "stream-error-first", stream: true },
  { name: "a stream whose endpoint answers 200 and then sends nothing within the upstream timeout", model: "google/gemma-2-9b-it", mode: "stream-stall-before-first", stream: true },
  { name: "a stream whose endpoint does not answer within the upstream timeout", model: "humain-ai/ALLaM-7B-Instruct-preview", mode: "hang", stream: true },
  { name: "a completion whose endpoint does not answer within the upstream timeout", model: "meta-llama/Llama-3.1-8B-Instruct", mode: "hang", stream: false },
];

it.each(cases)("retries $name on another endpoint, and the client gets one clean answer", async ({ name, model, mode, stream }) => {
  const bad = await startFakeVllm("bad", mode);
  const good = await startFakeVllm("good");
  cleanup.push(bad.close, good.close);
  await serveModel(srv, model, bad.url);
  const goodServing = await serveModel(srv, model, good.url);
  const renter = await makeRenter(srv, 100_000);

  let failedOver: Answer | undefined;
  for (let i = 0; i < 30 && !failedOver; i++) {
    const before = bad.requests.length;
    const started = performance.now();
    const a = await ask(renter.key, model, stream);
    // Every answer is whole and from the good endpoint, whichever was tried first.
    expect(a.status, name).toBe(200);
    expect(a.text).toBe(REPLY_WORDS.join(""));
    for (const e of a.events) {
      expect(e.error).toBeUndefined();
      expect(String(e.id)).toMatch(/^chatcmpl-good-/);
    }
    if (stream) {
      expect(a.done).toBe(true);
      expect(a.events.filter((e) => (e.choices as { delta?: { role?: string } }[])[0]?.delta?.role === "assistant")).toHaveLength(1);
      expect(a.events.at(-1)!.usage).toMatchObject({ prompt_tokens: PROMPT_TOKENS, completion_tokens: REPLY_WORDS.length });
    }
    if (bad.requests.length > before) {
      failedOver = a;
      if (mode === "hang" || mode === "stream-stall-before-first") expect(performance.now() - started).toBeGreaterThanOrEqual(TIMEOUT_MS - 20);
    }
  }
  expect(failedOver, "the failing endpoint was never tried first").toBeDefined();
  expect(bad.requests).toHaveLength(1);
  // Every endpoint is asked for a stream; a non-streaming client's answer is built by the gateway.
  expect(bad.requests[0].stream).toBe(true);

  // Billed once, at the tokens the good endpoint reported, to its provider.
  const [row] = await srv.sql<{ state: string; provider_id: number; cost_halala: number; usage_estimated: boolean }[]>`
    SELECT state, provider_id, cost_halala, usage_estimated FROM v1_usage WHERE request_id = ${failedOver!.requestId}`;
  expect(row).toEqual({ state: "settled", provider_id: goodServing.provider.id, cost_halala: COST, usage_estimated: false });
});

it("the official client reads a failed-over stream as one ordinary stream", async () => {
  const model = "TinyLlama/TinyLlama-1.1B-Chat-v1.0";
  const bad = await startFakeVllm("bad", "stream-drop-before-first");
  const good = await startFakeVllm("good");
  cleanup.push(bad.close, good.close);
  await serveModel(srv, model, bad.url);
  await serveModel(srv, model, good.url);
  const renter = await makeRenter(srv, 100_000);
  const ai = new OpenAI({ apiKey: renter.key, baseURL: `${srv.url}/v1`, maxRetries: 0 });
  for (let i = 0; i < 30 && bad.requests.length === 0; i++) {
    const stream = await ai.chat.completions.create({ model, messages: [{ role: "user", content: "hi" }], stream: true });
    let text = "";
    for await (const c of stream) text += c.choices[0]?.delta?.content ?? "";
    expect(text).toBe(REPLY_WORDS.join(""));
  }
  expect(bad.requests).toHaveLength(1);
});
