// The /v1 gateway through the official `openai` client, unmodified, against a
// real server and a fake vLLM upstream registered the way a provider does.
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { client } from "../helpers/http.js";
import { useTestServer } from "../helpers/server.js";
import { PROMPT_TOKENS, REPLY_WORDS, startFakeVllm, type FakeVllm } from "./fake-vllm.js";
import { serveModel, type Serving } from "./serving.js";

const MODEL = "TinyLlama/TinyLlama-1.1B-Chat-v1.0";
const IDLE_MODEL = "Qwen/Qwen2.5-7B-Instruct"; // a known model nobody serves in this file
// 1 halala per prompt token, 2 per completion token (every model here): a reply costs 11 + 2 x 6 = 23 halala.
const RATE = { input: 1_000_000, output: 2_000_000 };
const RATES = JSON.stringify({ [MODEL]: RATE, "*": RATE });
const COST = PROMPT_TOKENS + 2 * REPLY_WORDS.length;

let vllm: FakeVllm;
let serving: Serving;
const cleanup: (() => Promise<unknown>)[] = [];

// The sweeps stay off: "endpoint lifecycle" stages a silent provider by SQL, and a
// sweep landing in that window would re-queue its serving job for real.
const srv = useTestServer({
  SVC_V1_TOKEN_RATES: RATES,
  SVC_V1_MODELS: "catalog/only-model",
  SVC_JOB_SWEEP_MS: "60000",
  SVC_LIVENESS_SWEEP_SECONDS: "0",
});
beforeAll(async () => {
  vllm = await startFakeVllm("a");
  serving = await serveModel(srv, MODEL, `${vllm.url}/v1`);
});
afterAll(async () => {
  // Every /v1 charge above left the books balanced.
  expect(await ledgerProblems(srv.sql)).toEqual([]);
  for (const f of cleanup) await f();
  await vllm?.close();
});

const openai = (apiKey: string, opts: Partial<ConstructorParameters<typeof OpenAI>[0]> = {}) =>
  new OpenAI({ apiKey, baseURL: `${srv.url}/v1`, maxRetries: 0, ...opts });

async function ledgerOf(requestId: string) {
  const rows = await srv.sql<{ kind: string; amount: number; to_kind: string; owner_id: number | null }[]>`
    SELECT t.kind, t.amount, a.kind AS to_kind, a.owner_id
    FROM ledger_transfers t JOIN ledger_accounts a ON a.id = t.credit_account_id
    WHERE t.idempotency_key LIKE ${`v1:${requestId}:%`} ORDER BY t.kind`;
  return rows;
}

/**
 * A provider's share of its next charge of `cost` halala: 75 % of it plus what it is owed below one
 * halala from its earlier charges (v1_accruals), rounded down; the platform gets the rest.
 */
async function nextShare(providerId: number, cost: number): Promise<number> {
  const [row] = await srv.sql<{ micro: number }[]>`SELECT micro FROM v1_accruals WHERE owner_kind = 'provider' AND owner_id = ${providerId}`;
  return Math.floor(((row?.micro ?? 0) + cost * 750_000) / 1_000_000);
}

async function availableOf(renterId: number): Promise<number> {
  const [row] = await srv.sql<{ balance: number }[]>`SELECT balance FROM ledger_accounts WHERE kind = 'renter_available' AND owner_id = ${renterId}`;
  return row?.balance ?? 0;
}

describe("models", () => {
  it("lists served models and the configured catalog in OpenAI list format", async () => {
    const renter = await makeRenter(srv, 1000);
    const page = await openai(renter.key).models.list();
    const ids = page.data.map((m) => m.id);
    expect(ids).toContain(MODEL);
    expect(ids).toContain("catalog/only-model");
    expect(ids).not.toContain(IDLE_MODEL);
    const served = page.data.find((m) => m.id === MODEL)! as unknown as Record<string, unknown>;
    expect(served).toMatchObject({ object: "model", owned_by: "svc-marketplace", endpoints: 1 });
    expect(served.pricing).toEqual({ input_halala_per_million_tokens: 1_000_000, output_halala_per_million_tokens: 2_000_000 });
    expect(typeof served.created).toBe("number");

    const one = await openai(renter.key).models.retrieve(MODEL);
    expect(one.id).toBe(MODEL);
    // A malformed escape in the id is the request's fault: 400 in the envelope, not a 500.
    const bad = await fetch(`${srv.url}/v1/models/%`, { headers: { authorization: `Bearer ${renter.key}` } });
    expect(bad.status).toBe(400);
    expect((await bad.json()).error).toMatchObject({ code: "invalid_request", message: expect.stringMatching(/percent-encoding/) });
  });

  it("accepts x-renter-key as well as Bearer, and refuses a missing or provider key in the /v1 envelope", async () => {
    const renter = await makeRenter(srv, 0);
    const api = client(srv.url);
    const viaHeader = await api.get("/v1/models", { "x-renter-key": renter.key });
    expect(viaHeader.status).toBe(200);
    expect(viaHeader.body.object).toBe("list");

    const none = await api.get("/v1/models");
    expect(none.status).toBe(401);
    expect(none.body).toEqual({
      error: { message: expect.stringContaining("missing API key"), type: "authentication_error", code: "missing_api_key", status: 401, retryable: false },
    });
    const provider = await api.get("/v1/models", { authorization: `Bearer ${serving.provider.key}` });
    expect(provider.status).toBe(401);
    expect(provider.body.error.code).toBe("invalid_api_key");

    const err = await openai("svc-renter-not-a-real-key").models.list().catch((e) => e);
    expect(err).toBeInstanceOf(OpenAI.AuthenticationError);
    expect(err.code).toBe("invalid_api_key");
  });
});

describe("chat completions", () => {
  it("answers a completion and bills its tokens 75/25 to the serving provider", async () => {
    const renter = await makeRenter(srv, 10_000);
    const { data, response } = await openai(renter.key)
      .chat.completions.create({ model: MODEL, messages: [{ role: "user", content: "Say hello" }] })
      .withResponse();
    expect(data.object).toBe("chat.completion");
    expect(data.choices[0].message.content).toBe(REPLY_WORDS.join(""));
    expect(data.usage).toMatchObject({ prompt_tokens: PROMPT_TOKENS, completion_tokens: REPLY_WORDS.length });
    expect(response.headers.get("x-svc-cost-halala")).toBe(String(COST));

    // The gateway bounded max_tokens by what the balance pays for, and never forwarded the renter key.
    const sent = vllm.requests.at(-1)!;
    expect(sent.max_tokens).toBe(4096);
    expect(JSON.stringify(sent)).not.toContain(renter.key);

    const requestId = response.headers.get("x-request-id")!;
    const legs = await ledgerOf(requestId);
    expect(legs).toEqual([
      { kind: "v1_charge_platform", amount: 6, to_kind: "platform_fees", owner_id: null },
      { kind: "v1_charge_provider", amount: 17, to_kind: "provider_earnings", owner_id: serving.provider.id },
    ]);
    expect(await availableOf(renter.id)).toBe(10_000 - COST);

    const usage = await client(srv.url).get("/v1/usage", { authorization: `Bearer ${renter.key}` });
    expect(usage.status).toBe(200);
    expect(usage.body).toMatchObject({
      object: "usage",
      requests: 1,
      prompt_tokens: PROMPT_TOKENS,
      completion_tokens: REPLY_WORDS.length,
      total_tokens: PROMPT_TOKENS + REPLY_WORDS.length,
      cost_halala: COST,
      in_flight: 0,
      available_halala: 10_000 - COST,
      by_model: [{ model: MODEL, requests: 1, cost_halala: COST }],
    });
    const me = await client(srv.url).get("/api/renters/me", { "x-renter-key": renter.key });
    expect(me.body.renter?.total_spent_halala ?? me.body.total_spent_halala).toBe(COST);
  });

  it("bills every request, whatever x-request-id the client sends", async () => {
    const renter = await makeRenter(srv, 10_000);
    const ai = openai(renter.key, { defaultHeaders: { "x-request-id": "same-id" } });
    const ids = [];
    for (let i = 0; i < 2; i++) {
      const { response } = await ai.chat.completions.create({ model: MODEL, messages: [{ role: "user", content: "hi" }] }).withResponse();
      ids.push(response.headers.get("x-request-id"));
    }
    expect(new Set(ids).size).toBe(2);
    expect(ids).not.toContain("same-id");
    expect(await availableOf(renter.id)).toBe(10_000 - 2 * COST);
  });

  it("streams chat.completion.chunk events, the final usage and [DONE], and bills the stream", async () => {
    const renter = await makeRenter(srv, 10_000);
    // The provider's earlier charges left it owed 0.75 halala: this one pays it 18 of 23 (17.25 + 0.75), the platform 5.
    const share = await nextShare(serving.provider.id, COST);
    const { data: stream, response } = await openai(renter.key)
      .chat.completions.create({ model: MODEL, messages: [{ role: "user", content: "Say hello" }], stream: true, stream_options: { include_usage: true } })
      .withResponse();
    expect(response.headers.get("content-type")).toContain("text/event-stream");
    const chunks = [];
    for await (const c of stream) chunks.push(c);
    expect(chunks.every((c) => c.object === "chat.completion.chunk")).toBe(true);
    expect(chunks.map((c) => c.choices[0]?.delta?.content ?? "").join("")).toBe(REPLY_WORDS.join(""));
    const last = chunks.at(-1)!;
    expect(last.choices).toEqual([]);
    expect(last.usage).toMatchObject({ prompt_tokens: PROMPT_TOKENS, completion_tokens: REPLY_WORDS.length });
    // The endpoint is asked for usage on every chunk too (a cut stream is billed by it); the client was not shown it.
    expect(vllm.requests.at(-1)!.stream_options).toEqual({ include_usage: true, continuous_usage_stats: true });

    const legs = await ledgerOf(response.headers.get("x-request-id")!);
    expect(legs.map((l) => l.amount)).toEqual([COST - share, share]);
    expect(await availableOf(renter.id)).toBe(10_000 - COST);
  });

  it("without include_usage still reports usage, on the finishing chunk, and ends with data: [DONE]", async () => {
    const renter = await makeRenter(srv, 10_000);
    const res = await fetch(`${srv.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${renter.key}`, "content-type": "application/json" },
      body: JSON.stringify({ model: MODEL, messages: [{ role: "user", content: "hi" }], stream: true }),
    });
    const text = await res.text();
    const events = text.split("\n\n").filter(Boolean);
    expect(events.at(-1)).toBe("data: [DONE]");
    const chunks = events.slice(0, -1).map((e) => JSON.parse(e.slice("data: ".length)));
    expect(chunks.every((c) => c.choices.length === 1)).toBe(true);
    const finishing = chunks.at(-1);
    expect(finishing.choices[0].finish_reason).toBe("stop");
    expect(finishing.usage).toMatchObject({ prompt_tokens: PROMPT_TOKENS, completion_tokens: REPLY_WORDS.length });
    // Upstream was asked for usage regardless.
    expect(vllm.requests.at(-1)!.stream_options).toEqual({ include_usage: true, continuous_usage_stats: true });
  });

  it("answers no_capacity_available (503, retryable) for a known model nobody serves, model_not_found for an unknown one", async () => {
    const renter = await makeRenter(srv, 10_000);
    const err = await openai(renter.key)
      .chat.completions.create({ model: IDLE_MODEL, messages: [{ role: "user", content: "hi" }] })
      .catch((e) => e);
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect(err.status).toBe(503);
    expect(err.code).toBe("no_capacity_available");
    expect(err.error).toMatchObject({ type: "server_error", status: 503, retryable: true });

    const unknown = await openai(renter.key)
      .chat.completions.create({ model: "nobody/serves-this", messages: [{ role: "user", content: "hi" }] })
      .catch((e) => e);
    expect(unknown).toBeInstanceOf(OpenAI.NotFoundError);
    expect(unknown.code).toBe("model_not_found");
    expect(unknown.error.retryable).toBe(false);
    expect(await availableOf(renter.id)).toBe(10_000);
  });

  it("refuses a renter without funds, and a max_tokens the balance cannot pay, with insufficient_quota", async () => {
    const broke = await makeRenter(srv, 0);
    const e1 = await openai(broke.key)
      .chat.completions.create({ model: MODEL, messages: [{ role: "user", content: "hi" }] })
      .catch((e) => e);
    expect(e1.status).toBe(402);
    expect(e1.error).toMatchObject({ type: "insufficient_quota", code: "insufficient_quota", retryable: false });

    const poor = await makeRenter(srv, 100);
    const e2 = await openai(poor.key)
      .chat.completions.create({ model: MODEL, messages: [{ role: "user", content: "hi" }], max_tokens: 1000 })
      .catch((e) => e);
    expect(e2.status).toBe(402);
    expect(e2.message).toMatch(/max_tokens 1000/);
    expect(vllm.requests.filter((r) => r.max_tokens === 1000)).toHaveLength(0);

    // Without max_tokens the gateway asks only for what the balance pays for.
    const before = vllm.requests.length;
    await openai(poor.key).chat.completions.create({ model: MODEL, messages: [{ role: "user", content: "hi" }] });
    const asked = vllm.requests[before].max_tokens as number;
    expect(asked).toBeGreaterThan(0);
    expect(asked).toBeLessThan(50);
    expect(await availableOf(poor.id)).toBe(100 - COST);
  });

  it("holds a renter to monthly_spend_limit_halala: 429 spend_limit_exceeded until the next UTC month, and no more asked for than fits", async () => {
    const renter = await makeRenter(srv, 10_000);
    await srv.sql`UPDATE renter_quota SET monthly_spend_limit_halala = 200 WHERE renter_id = ${renter.id}`;
    const post = (extra: Record<string, unknown>) =>
      fetch(`${srv.url}/v1/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json", authorization: `Bearer ${renter.key}` },
        body: JSON.stringify({ model: MODEL, messages: [{ role: "user", content: "hi" }], ...extra }),
      });
    const before = vllm.requests.length;
    // The balance pays for 1,000 completion tokens (2,000 halala); the limit does not.
    const over = await post({ max_tokens: 1000 });
    expect(over.status).toBe(429);
    const body = await over.json();
    const untilMonth = Math.ceil((Date.UTC(new Date().getUTCFullYear(), new Date().getUTCMonth() + 1, 1) - Date.now()) / 1000);
    expect(body.error).toMatchObject({ type: "insufficient_quota", code: "spend_limit_exceeded", status: 429, retryable: false });
    expect(body.error.message).toMatch(/monthly_spend_limit_halala is 200; 0 halala spent, held or reserved .*\(max_tokens 1000\)/);
    expect(Math.abs(body.retry_after_seconds - untilMonth)).toBeLessThan(60);
    expect(body.error.retry_after_ms).toBeGreaterThan(0);
    expect(Number(over.headers.get("retry-after"))).toBe(body.retry_after_seconds);
    expect(vllm.requests.length).toBe(before);
    expect(await srv.sql`SELECT 1 FROM v1_usage WHERE renter_id = ${renter.id}`).toHaveLength(0);

    // Without max_tokens the endpoint is asked for what the limit leaves: (200 - the prompt's bound) / 2 per token.
    const fits = await post({});
    expect(fits.status).toBe(200);
    const asked = vllm.requests[before].max_tokens as number;
    expect(asked).toBeGreaterThan(0);
    expect(asked).toBeLessThan(100);
    expect(await availableOf(renter.id)).toBe(10_000 - COST);

    // Spent up to within a prompt of the limit: refused whatever max_tokens says.
    await srv.sql`UPDATE renter_quota SET monthly_spend_limit_halala = ${COST + 10} WHERE renter_id = ${renter.id}`;
    const spent = await post({});
    expect(spent.status).toBe(429);
    expect((await spent.json()).error).toMatchObject({ code: "spend_limit_exceeded", message: expect.stringMatching(/this prompt would cost more than what is left/) });
    expect(vllm.requests.length).toBe(before + 1);
  });

  it("authenticates chat completions with x-renter-key alone, JSON and streamed, and bills that renter", async () => {
    const renter = await makeRenter(srv, 10_000);
    const body = { model: MODEL, messages: [{ role: "user" as const, content: "hi" }] };
    const post = (headers: Record<string, string>, extra: Record<string, unknown> = {}) =>
      fetch(`${srv.url}/v1/chat/completions`, { method: "POST", headers: { "content-type": "application/json", ...headers }, body: JSON.stringify({ ...body, ...extra }) });

    const json = await post({ "x-renter-key": renter.key });
    expect(json.status).toBe(200);
    expect((await json.json()).choices[0].message.content).toBe(REPLY_WORDS.join(""));
    expect(json.headers.get("x-svc-cost-halala")).toBe(String(COST));

    const streamed = await post({ "x-renter-key": renter.key }, { stream: true });
    expect(streamed.status).toBe(200);
    expect(streamed.headers.get("content-type")).toContain("text/event-stream");
    expect((await streamed.text()).trimEnd().endsWith("data: [DONE]")).toBe(true);

    // The official client too, with the key in x-renter-key and no Authorization header at all.
    const ai = new OpenAI({ apiKey: "unused", baseURL: `${srv.url}/v1`, maxRetries: 0, defaultHeaders: { authorization: null, "x-renter-key": renter.key } });
    const viaSdk = await ai.chat.completions.create(body);
    expect(viaSdk.choices[0].message.content).toBe(REPLY_WORDS.join(""));
    expect(await availableOf(renter.id)).toBe(10_000 - 3 * COST);
    const [{ n }] = await srv.sql`SELECT count(*)::int AS n FROM v1_usage WHERE renter_id = ${renter.id} AND state = 'settled'`;
    expect(n).toBe(3);

    // A wrong x-renter-key (and none at all) is refused in the envelope before anything is proxied.
    const before = vllm.requests.length;
    const wrong = await post({ "x-renter-key": "svc-renter-not-a-real-key" });
    expect(wrong.status).toBe(401);
    expect((await wrong.json()).error).toMatchObject({ type: "authentication_error", code: "invalid_api_key", status: 401, retryable: false });
    const none = await post({});
    expect(none.status).toBe(401);
    expect((await none.json()).error.code).toBe("missing_api_key");
    expect(vllm.requests.length).toBe(before);
  });

  it("answers an oversized body with 413 in the /v1 envelope, declared or streamed, and proxies nothing", async () => {
    const renter = await makeRenter(srv, 10_000);
    const before = vllm.requests.length;
    const big = JSON.stringify({ model: MODEL, messages: [{ role: "user", content: "x".repeat(4 * 1024 * 1024) }] });
    const expected = {
      error: { message: expect.stringMatching(/too large/), type: "invalid_request_error", code: "request_too_large", status: 413, retryable: false },
    };

    // With a content-length over the limit.
    const declared = await client(srv.url).post("/v1/chat/completions", big, { authorization: `Bearer ${renter.key}` });
    expect(declared.status).toBe(413);
    expect(declared.body).toEqual(expected);
    expect(declared.headers.get("content-type")).toContain("application/json");
    // As on /api: the connection closes after the answer, so the rest of an endless body cannot keep it busy.
    expect(declared.headers.get("connection")).toBe("close");

    // Chunked, without a content-length: refused once the limit is passed.
    const chunks = [Buffer.from(big.slice(0, 1024 * 1024)), Buffer.from(big.slice(1024 * 1024))];
    const streamed = await fetch(`${srv.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${renter.key}`, "content-type": "application/json" },
      body: new ReadableStream({
        pull(ctl) {
          const c = chunks.shift();
          if (c) ctl.enqueue(c);
          else ctl.close();
        },
      }),
      duplex: "half",
    } as RequestInit);
    expect(streamed.status).toBe(413);
    expect(await streamed.json()).toEqual(expected);
    expect(streamed.headers.get("connection")).toBe("close");

    // The official client sees a 413 APIError with the code.
    const err = await openai(renter.key)
      .chat.completions.create({ model: MODEL, messages: [{ role: "user", content: "x".repeat(4 * 1024 * 1024) }] })
      .catch((e) => e);
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect(err.status).toBe(413);
    expect(err.code).toBe("request_too_large");

    expect(vllm.requests.length).toBe(before);
    expect(await srv.sql`SELECT 1 FROM v1_usage WHERE renter_id = ${renter.id}`).toHaveLength(0);
    expect(await availableOf(renter.id)).toBe(10_000);
  });

  it("rejects a malformed request with invalid_request_error naming the field", async () => {
    const renter = await makeRenter(srv, 1000);
    const api = client(srv.url);
    const r = await api.post("/v1/chat/completions", { model: MODEL }, { authorization: `Bearer ${renter.key}` });
    expect(r.status).toBe(400);
    expect(r.body.error).toMatchObject({ type: "invalid_request_error", code: "invalid_request", status: 400, retryable: false });
    expect(r.body.error.message).toContain("messages");
    const bad = await api.post("/v1/chat/completions", "{nope", { authorization: `Bearer ${renter.key}` });
    expect(bad.status).toBe(400);
    const unknown = await api.get("/v1/nothing-here", { authorization: `Bearer ${renter.key}` });
    expect(unknown.status).toBe(404);
    expect(unknown.body.error.code).toBe("unknown_url");
  });
});

describe("upstream failures", () => {
  const FAILOVER_MODEL = "microsoft/Phi-3-mini-4k-instruct";

  it("retries on another endpoint when one fails before any byte, and bills the one that served", async () => {
    const bad = await startFakeVllm("bad", "error500");
    const good = await startFakeVllm("good", "slow-stream");
    cleanup.push(bad.close, good.close);
    const badServing = await serveModel(srv, FAILOVER_MODEL, bad.url);
    const goodServing = await serveModel(srv, FAILOVER_MODEL, good.url);
    const renter = await makeRenter(srv, 10_000);
    const ai = openai(renter.key);
    // A slow stream keeps the good endpoint busy (it ends up there whichever endpoint is tried first)...
    const first = await ai.chat.completions
      .create({ model: FAILOVER_MODEL, messages: [{ role: "user", content: "one" }], stream: true })
      .withResponse();
    const it = first.data[Symbol.asyncIterator]();
    await it.next();
    // ...so the next request is tried on the idle (failing) endpoint first, unless that one already failed and rests.
    const second = await ai.chat.completions.create({ model: FAILOVER_MODEL, messages: [{ role: "user", content: "two" }] }).withResponse();
    expect(second.data.choices[0].message.content).toBe(REPLY_WORDS.join(""));
    while (!(await it.next()).done);
    expect(bad.requests).toHaveLength(1);
    expect(good.requests).toHaveLength(2);
    for (const r of [first.response, second.response]) {
      const legs = await ledgerOf(r.headers.get("x-request-id")!);
      expect(legs.find((l) => l.kind === "v1_charge_provider")?.owner_id).toBe(goodServing.provider.id);
    }
    const badEarned = await srv.sql`SELECT 1 FROM ledger_accounts WHERE kind = 'provider_earnings' AND owner_id = ${badServing.provider.id} AND balance > 0`;
    expect(badEarned).toHaveLength(0);
  });

  it("spreads requests in flight across the endpoints serving a model", async () => {
    const model = "humain-ai/ALLaM-7B-Instruct-preview";
    const a = await startFakeVllm("spread-a", "slow-stream");
    const b = await startFakeVllm("spread-b", "slow-stream");
    cleanup.push(a.close, b.close);
    await serveModel(srv, model, a.url);
    await serveModel(srv, model, b.url);
    const renter = await makeRenter(srv, 10_000);
    const ai = openai(renter.key);
    const open = async () => {
      const it = (await ai.chat.completions.create({ model, messages: [{ role: "user", content: "hi" }], stream: true, max_tokens: 16 }))[Symbol.asyncIterator]();
      await it.next();
      return it;
    };
    // Four streams held open at once: each goes to the endpoint with fewer in flight.
    const streams = [];
    for (let i = 0; i < 4; i++) streams.push(await open());
    expect([a.requests.length, b.requests.length]).toEqual([2, 2]);
    for (const it of streams) while (!(await it.next()).done);
  });

  it("answers provider_unavailable (502) when every endpoint fails, and charges nothing", async () => {
    const model = "mistralai/Mistral-7B-Instruct-v0.3";
    const a = await startFakeVllm("down-a", "error500");
    const b = await startFakeVllm("down-b", "error500");
    cleanup.push(a.close, b.close);
    await serveModel(srv, model, a.url);
    await serveModel(srv, model, b.url);
    const renter = await makeRenter(srv, 10_000);
    const err = await openai(renter.key).chat.completions.create({ model, messages: [{ role: "user", content: "hi" }] }).catch((e) => e);
    expect(err.status).toBe(502);
    expect(err.error).toMatchObject({ type: "server_error", code: "provider_unavailable", retryable: true });
    expect(a.requests).toHaveLength(1);
    expect(b.requests).toHaveLength(1);
    expect(await availableOf(renter.id)).toBe(10_000);
    const [row] = await srv.sql`SELECT state FROM v1_usage WHERE renter_id = ${renter.id}`;
    expect(row.state).toBe("released");
  });
});

describe("private and public endpoints", () => {
  const PRIVATE_MODEL = "google/gemma-2-9b-it"; // a known model only the test below serves, privately

  it("lets only the managed-endpoint accounts (SVC_V1_MANAGED_RENTERS) serve every renter: another renter's public job is refused", async () => {
    const renter = await makeRenter(srv, 100_000);
    const provider = await makeProvider(srv);
    const submit = (params: Record<string, unknown>) =>
      client(srv.url).post("/api/jobs/submit", { job_type: "vllm_serve", params: { model: PRIVATE_MODEL, ...params }, provider_id: provider.id }, renter.headers);
    // Pinned to a provider of its own, a public job would draw other renters' prompts to a server of its choosing.
    const refused = await submit({ public: true });
    expect(refused.status).toBe(403);
    expect(refused.body.error).toMatch(/params\.public: only the platform's managed-endpoint accounts \(SVC_V1_MANAGED_RENTERS\)/);
    expect(await srv.sql`SELECT 1 FROM jobs WHERE renter_id = ${renter.id}`).toHaveLength(0);
    expect((await submit({ public: false })).status).toBe(201);
  });

  it("a renter's own serving job serves its own requests only, recorded without a token charge", async () => {
    const own = await startFakeVllm("own");
    cleanup.push(own.close);
    const serving = await serveModel(srv, PRIVATE_MODEL, `${own.url}/v1`, { public: false });
    const other = await makeRenter(srv, 10_000);
    const ask = (key: string) => openai(key).chat.completions.create({ model: PRIVATE_MODEL, messages: [{ role: "user", content: "hi" }] });

    // Another renter neither sees the model as served nor reaches the endpoint its owner pays for.
    const listed = (await openai(other.key).models.list()).data.find((m) => m.id === PRIVATE_MODEL) as unknown as { endpoints: number } | undefined;
    expect(listed?.endpoints ?? 0).toBe(0);
    const refused = await ask(other.key).catch((e) => e);
    expect(refused.status).toBe(503);
    expect(refused.code).toBe("no_capacity_available");
    expect(own.requests).toHaveLength(0);
    expect(await availableOf(other.id)).toBe(10_000);

    // Its owner is served there, and pays for the GPU by the minute only: the tokens are recorded, not charged.
    const before = await availableOf(serving.owner.id);
    const ownList = (await openai(serving.owner.key).models.list()).data.find((m) => m.id === PRIVATE_MODEL) as unknown as { endpoints: number };
    expect(ownList.endpoints).toBe(1);
    const answer = await ask(serving.owner.key);
    expect(answer.choices[0].message.content).toBe(REPLY_WORDS.join(""));
    expect(own.requests).toHaveLength(1);
    expect(await availableOf(serving.owner.id)).toBe(before);
    const [row] = await srv.sql`
      SELECT state, cost_halala, provider_earned_halala, prompt_tokens, completion_tokens FROM v1_usage
      WHERE renter_id = ${serving.owner.id} AND model = ${PRIVATE_MODEL}`;
    expect(row).toMatchObject({ state: "settled", cost_halala: 0, provider_earned_halala: 0 });
    expect(row.prompt_tokens + row.completion_tokens).toBeGreaterThan(0);
    // A public endpoint of another model still bills the same renter per token.
    await openai(serving.owner.key).chat.completions.create({ model: MODEL, messages: [{ role: "user", content: "hi" }] });
    expect(await availableOf(serving.owner.id)).toBe(before - COST);
  });
});

describe("endpoint lifecycle", () => {
  it("stops routing to an endpoint once its provider goes silent or its serving job ends", async () => {
    const model = "meta-llama/Llama-3.1-8B-Instruct";
    const up = await startFakeVllm("lifecycle");
    cleanup.push(up.close);
    const s = await serveModel(srv, model, `${up.url}/v1/`);
    const renter = await makeRenter(srv, 10_000);
    const ai = openai(renter.key);
    const ask = () => ai.chat.completions.create({ model, messages: [{ role: "user", content: "hi" }] }).catch((e) => e);
    const listed = async () => (await ai.models.list()).data.some((m) => m.id === model);

    expect((await ask()).choices[0].message.content).toBe(REPLY_WORDS.join(""));
    expect(await listed()).toBe(true);

    // Silent past the live window (last heartbeat 3 minutes ago): not routed to, not listed.
    await srv.sql`UPDATE providers SET last_heartbeat = now() - interval '3 minutes' WHERE id = ${s.provider.id}`;
    expect((await ask()).error?.code).toBe("no_capacity_available");
    expect(await listed()).toBe(false);

    // Back (a heartbeat), then the daemon reports the serving job finished.
    const beat = await client(srv.url).post("/api/providers/heartbeat", { api_key: s.provider.key, gpu_status: {} });
    expect(beat.status).toBe(200);
    // A heartbeat that changes no state is written with the next telemetry batch (src/domain/providers/heartbeat.ts).
    await expect.poll(listed, { timeout: 15_000 }).toBe(true);
    const done = await client(srv.url).post("/api/providers/job-result", { api_key: s.provider.key, job_id: s.jobId, success: true, result: {} });
    expect(done.status).toBe(200);
    expect((await ask()).error?.code).toBe("no_capacity_available");
    expect(await listed()).toBe(false);
    expect(up.requests).toHaveLength(1);
  });
});

describe("client disconnect", () => {
  const model = "google/gemma-2-9b-it";
  let slow: FakeVllm;
  beforeAll(async () => {
    slow = await startFakeVllm("slow", "slow-stream");
    cleanup.push(slow.close);
    await serveModel(srv, model, slow.url);
  });

  it("aborts the upstream call when the client goes away mid-stream, and bills what was delivered", async () => {
    slow.mode = "slow-stream";
    slow.aborted = 0;
    const renter = await makeRenter(srv, 10_000);
    const aborted = slow.nextAbort();
    const ctl = new AbortController();
    const stream = await openai(renter.key).chat.completions.create(
      { model, messages: [{ role: "user", content: "hi" }], stream: true },
      { signal: ctl.signal },
    );
    for await (const c of stream) {
      if (c.choices[0]?.delta?.content) break; // leaving the loop aborts the request
    }
    await aborted;
    expect(slow.aborted).toBe(1);
    // Settled with the gateway's own count, once the request ended.
    await expect.poll(async () => (await srv.sql`SELECT state, usage_estimated FROM v1_usage WHERE renter_id = ${renter.id}`)[0], { timeout: 15_000 }).toMatchObject({
      state: "settled",
      usage_estimated: true,
    });
  });

  it("aborts the upstream call when the client goes away before a non-streamed answer, and charges nothing", async () => {
    slow.mode = "slow-json"; // answers after 2 s unless its caller goes away first
    slow.aborted = 0;
    const renter = await makeRenter(srv, 10_000);
    const aborted = slow.nextAbort();
    const ctl = new AbortController();
    const before = slow.requests.length;
    const pending = openai(renter.key)
      .chat.completions.create({ model, messages: [{ role: "user", content: "hi" }] }, { signal: ctl.signal })
      .catch((e) => e);
    await expect.poll(() => slow.requests.length, { timeout: 5_000, interval: 20 }).toBe(before + 1);
    ctl.abort();
    expect(await pending).toBeInstanceOf(OpenAI.APIUserAbortError);
    // The gateway hangs up on the endpoint well before it would have answered.
    const outcome = await Promise.race([aborted.then(() => "aborted"), new Promise((r) => setTimeout(() => r("answered"), 1500))]);
    expect(outcome).toBe("aborted");
    expect(slow.aborted).toBe(1);
    await expect.poll(async () => (await srv.sql`SELECT state, cost_halala FROM v1_usage WHERE renter_id = ${renter.id}`)[0], { timeout: 5_000 }).toMatchObject({
      state: "released",
      cost_halala: 0,
    });
    expect(await availableOf(renter.id)).toBe(10_000);
  });
});
