// Billed tokens are bounded by what the gateway can see: an endpoint that
// reports far more usage than the text it delivered (fake vLLM "overstate") is
// paid only for the bound, the renter is charged only that, the rest is
// recorded against the provider and docks its reliability. The books balance.
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import { refreshReputation, reliabilityScore } from "../../src/domain/providers/reputation.js";
import {
  COMPLETION_TOKENS_PER_CHOICE,
  COMPLETION_TOKENS_PER_TOOL_CALL,
  completionTokensBound,
  deliveredText,
  PROMPT_TOKENS_PER_MESSAGE,
  PROMPT_TOKENS_PER_REQUEST,
  promptTokensBound,
} from "../../src/domain/money/token-pricing.js";
import { makeRenter } from "../helpers/fixtures.js";
import { useTestServer } from "../helpers/server.js";
import { OVERSTATED_TOKENS, PROMPT_TOKENS, REPLY_WORDS, startFakeVllm, type FakeVllm } from "./fake-vllm.js";
import { serveModel, type Serving } from "./serving.js";

const OVER_MODEL = "TinyLlama/TinyLlama-1.1B-Chat-v1.0";
const HONEST_MODEL = "Qwen/Qwen2.5-7B-Instruct";
// 1 halala per prompt token, 2 per completion token.
const RATE = { input: 1_000_000, output: 2_000_000 };
const PROMPT = "Say hello";
const REPLY = REPLY_WORDS.join("");
// The bounds for one user message PROMPT answered with REPLY (n = 1, no stop strings).
const PROMPT_BOUND = Buffer.byteLength(PROMPT) + "user".length + PROMPT_TOKENS_PER_MESSAGE + PROMPT_TOKENS_PER_REQUEST;
const COMPLETION_BOUND = Buffer.byteLength(REPLY) + COMPLETION_TOKENS_PER_CHOICE;
const BOUNDED_COST = PROMPT_BOUND + 2 * COMPLETION_BOUND;
const PROVIDER_SHARE = Math.floor((BOUNDED_COST * 75) / 100);
const START_BALANCE = 100_000;

let over: FakeVllm;
let honest: FakeVllm;
let overServing: Serving;
let honestServing: Serving;

const srv = useTestServer({ SVC_V1_TOKEN_RATES: JSON.stringify({ "*": RATE }), SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0" });
beforeAll(async () => {
  over = await startFakeVllm("over", "overstate");
  honest = await startFakeVllm("honest");
  overServing = await serveModel(srv, OVER_MODEL, over.url);
  honestServing = await serveModel(srv, HONEST_MODEL, honest.url);
});
afterAll(async () => {
  expect(await ledgerProblems(srv.sql)).toEqual([]);
  await over?.close();
  await honest?.close();
});

const ai = (key: string) => new OpenAI({ apiKey: key, baseURL: `${srv.url}/v1`, maxRetries: 0 });

async function usageRow(requestId: string) {
  const [row] = await srv.sql<
    {
      state: string;
      provider_id: number;
      prompt_tokens: number;
      completion_tokens: number;
      reported_prompt_tokens: number | null;
      reported_completion_tokens: number | null;
      overstated_tokens: number;
      cost_halala: number;
      provider_earned_halala: number;
      platform_fee_halala: number;
    }[]
  >`SELECT state, provider_id, prompt_tokens, completion_tokens, reported_prompt_tokens, reported_completion_tokens,
           overstated_tokens, cost_halala, provider_earned_halala, platform_fee_halala
    FROM v1_usage WHERE request_id = ${requestId}`;
  return row;
}

async function legs(requestId: string) {
  return srv.sql<{ kind: string; amount: number; to_kind: string; owner_id: number | null }[]>`
    SELECT t.kind, t.amount, a.kind AS to_kind, a.owner_id
    FROM ledger_transfers t JOIN ledger_accounts a ON a.id = t.credit_account_id
    WHERE t.idempotency_key LIKE ${`v1:${requestId}:%`} ORDER BY t.kind`;
}

async function availableOf(renterId: number): Promise<number> {
  const [row] = await srv.sql<{ balance: number }[]>`SELECT balance FROM ledger_accounts WHERE kind = 'renter_available' AND owner_id = ${renterId}`;
  return row?.balance ?? 0;
}

/** What the overstating provider is owed below one halala from its charges so far (v1_accruals), in micro-halala. */
let overCarry = 0;

/** The money of one overstated request: the bound charged, 75/25 (with the provider's carry), and the claim kept on its row. */
async function expectBoundedCharge(requestId: string, renterId: number, completionBound = COMPLETION_BOUND) {
  const cost = PROMPT_BOUND + 2 * completionBound;
  // 75 % of the cost plus what the provider's earlier charges left below a halala, rounded down; the rest is carried.
  const share = Math.floor((overCarry + cost * 750_000) / 1_000_000);
  overCarry += cost * 750_000 - share * 1_000_000;
  const [carried] = await srv.sql<{ micro: number }[]>`SELECT micro FROM v1_accruals WHERE owner_kind = 'provider' AND owner_id = ${overServing.provider.id}`;
  expect(carried.micro).toBe(overCarry);
  expect(await legs(requestId)).toEqual([
    { kind: "v1_charge_platform", amount: cost - share, to_kind: "platform_fees", owner_id: null },
    { kind: "v1_charge_provider", amount: share, to_kind: "provider_earnings", owner_id: overServing.provider.id },
  ]);
  expect(await availableOf(renterId)).toBe(START_BALANCE - cost);
  expect(await usageRow(requestId)).toEqual({
    state: "settled",
    provider_id: overServing.provider.id,
    prompt_tokens: PROMPT_BOUND,
    completion_tokens: completionBound,
    reported_prompt_tokens: OVERSTATED_TOKENS,
    reported_completion_tokens: OVERSTATED_TOKENS,
    overstated_tokens: 2 * OVERSTATED_TOKENS - PROMPT_BOUND - completionBound,
    cost_halala: cost,
    provider_earned_halala: share,
    platform_fee_halala: cost - share,
  });
}

describe("an endpoint that overstates its usage", () => {
  it("non-streaming: the renter pays, and the provider earns on, only the bound of what was forwarded and delivered", async () => {
    const renter = await makeRenter(srv, START_BALANCE);
    const { data, response } = await ai(renter.key)
      .chat.completions.create({ model: OVER_MODEL, messages: [{ role: "user", content: PROMPT }], max_tokens: 5000 })
      .withResponse();
    expect(data.choices[0].message.content).toBe(REPLY);
    // The renter sees the usage it is billed for.
    expect(data.usage).toMatchObject({ prompt_tokens: PROMPT_BOUND, completion_tokens: COMPLETION_BOUND, total_tokens: PROMPT_BOUND + COMPLETION_BOUND });
    expect(response.headers.get("x-svc-cost-halala")).toBe(String(BOUNDED_COST));
    await expectBoundedCharge(response.headers.get("x-request-id")!, renter.id);
    expect(PROVIDER_SHARE).toBe(Math.floor((BOUNDED_COST * 3) / 4));
  });

  it("streaming with include_usage: the usage chunk and the charge are the bound", async () => {
    const renter = await makeRenter(srv, START_BALANCE);
    const { data: stream, response } = await ai(renter.key)
      .chat.completions.create({ model: OVER_MODEL, messages: [{ role: "user", content: PROMPT }], max_tokens: 5000, stream: true, stream_options: { include_usage: true } })
      .withResponse();
    const chunks = [];
    for await (const c of stream) chunks.push(c);
    expect(chunks.map((c) => c.choices[0]?.delta?.content ?? "").join("")).toBe(REPLY);
    expect(chunks.at(-1)!.usage).toMatchObject({ prompt_tokens: PROMPT_BOUND, completion_tokens: COMPLETION_BOUND });
    await expectBoundedCharge(response.headers.get("x-request-id")!, renter.id);
  });

  it("streaming without include_usage, with a stop string: the allowance grows by the longest stop string, no further", async () => {
    const renter = await makeRenter(srv, START_BALANCE);
    const stop = ["\n\nUser:", "###"];
    const res = await fetch(`${srv.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${renter.key}`, "content-type": "application/json" },
      body: JSON.stringify({ model: OVER_MODEL, messages: [{ role: "user", content: PROMPT }], max_tokens: 5000, stream: true, stop }),
    });
    const events = (await res.text()).split("\n\n").filter(Boolean);
    expect(events.at(-1)).toBe("data: [DONE]");
    const bound = COMPLETION_BOUND + Buffer.byteLength("\n\nUser:");
    const finishing = JSON.parse(events.at(-2)!.slice("data: ".length));
    expect(finishing.usage).toMatchObject({ prompt_tokens: PROMPT_BOUND, completion_tokens: bound });
    await expectBoundedCharge(res.headers.get("x-request-id")!, renter.id, bound);
  });

  it("an honest endpoint is billed what it reports, with nothing recorded against it", async () => {
    const renter = await makeRenter(srv, START_BALANCE);
    const { data, response } = await ai(renter.key)
      .chat.completions.create({ model: HONEST_MODEL, messages: [{ role: "user", content: PROMPT }] })
      .withResponse();
    expect(data.usage).toMatchObject({ prompt_tokens: PROMPT_TOKENS, completion_tokens: REPLY_WORDS.length });
    const row = await usageRow(response.headers.get("x-request-id")!);
    expect(row).toMatchObject({
      prompt_tokens: PROMPT_TOKENS,
      completion_tokens: REPLY_WORDS.length,
      reported_prompt_tokens: PROMPT_TOKENS,
      reported_completion_tokens: REPLY_WORDS.length,
      overstated_tokens: 0,
      cost_halala: PROMPT_TOKENS + 2 * REPLY_WORDS.length,
    });
  });

  it("overstated requests count against the provider's reliability as failed jobs would", async () => {
    const ids = [overServing.provider.id, honestServing.provider.id];
    // The same record for both: first heartbeat a day ago, live now.
    await srv.sql`UPDATE providers SET first_heartbeat_at = now() - interval '1 day', last_heartbeat = now() WHERE id = ANY(${ids}::bigint[])`;
    // The charges above made the overstating provider's figures due now.
    const [due] = await srv.sql<{ reputation_at: Date | null }[]>`SELECT reputation_at FROM providers WHERE id = ${overServing.provider.id}`;
    expect(due.reputation_at).toBeNull();
    await refreshReputation(srv.sql, ids);
    const rows = await srv.sql<{ id: number; reliability_score: number; uptime_percent: number }[]>`
      SELECT id, reliability_score, uptime_percent FROM providers WHERE id = ANY(${ids}::bigint[])`;
    const score = (id: number) => rows.find((r) => r.id === id)!;
    const [{ n }] = await srv.sql<{ n: number }[]>`SELECT count(*)::int AS n FROM v1_usage WHERE provider_id = ${overServing.provider.id} AND overstated_tokens > 0`;
    expect(n).toBe(3);
    const o = score(overServing.provider.id);
    const h = score(honestServing.provider.id);
    // S: 1/2 for the honest provider (no finished jobs), 1/(3 + 2) with three overstated requests.
    const expected = reliabilityScore({ completedJobs: 0, failedJobs: 0, overstatedRequests: 3, uptimePercent: o.uptime_percent, ageDays: 1 });
    expect(Math.abs(o.reliability_score - expected)).toBeLessThanOrEqual(0.1); // the age grew a little since "a day ago"
    expect(h.reliability_score - o.reliability_score).toBeGreaterThan(14);
  });
});

describe("the bounds", () => {
  it("refuses a prompt its bytes cannot bound (a request's own chat_template, image, audio or video parts), forwarding and reserving nothing", async () => {
    const renter = await makeRenter(srv, START_BALANCE);
    const post = (body: Record<string, unknown>) =>
      fetch(`${srv.url}/v1/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json", authorization: `Bearer ${renter.key}` },
        body: JSON.stringify({ model: HONEST_MODEL, ...body }),
      });
    const before = honest.requests.length;
    const user = (content: unknown) => [{ role: "user", content }];
    const refusals: [Record<string, unknown>, RegExp][] = [
      // A few bytes of template, a prompt of 10,000 copies of the message.
      [{ messages: user("hi"), chat_template: "{% for i in range(10000) %}{{ messages[0].content }}{% endfor %}" }, /chat_template is not accepted/],
      [{ messages: user([{ type: "text", text: "what is this?" }, { type: "image_url", image_url: { url: "https://example.com/a.png" } }]) }, /messages\[0\]\.content: a part of type "image_url" is not accepted/],
      [{ messages: [{ role: "system", content: "s" }, ...user([{ type: "input_audio", input_audio: { data: "AAAA", format: "wav" } }])] }, /messages\[1\]\.content: a part of type "input_audio"/],
      [{ messages: user([{ text: "no type" }]) }, /a part of type null is not accepted/],
      // A special token the template prints after every message, replaced by a long one.
      [{ messages: user("hi"), chat_template_kwargs: { eos_token: "x".repeat(4096) } }, /chat_template_kwargs\.eos_token is not accepted/],
      [{ messages: user("hi"), chat_template_kwargs: { additional_special_tokens: ["x"] } }, /chat_template_kwargs\.additional_special_tokens/],
      [{ messages: user("hi"), chat_template_kwargs: { chat_template: "{{ messages }}" } }, /chat_template_kwargs\.chat_template/],
      [{ messages: user("hi"), chat_template_kwargs: [1] }, /chat_template_kwargs must be an object/],
      // Completions that may deliver no text for what they generate.
      [{ messages: user("hi"), allowed_token_ids: [151644] }, /allowed_token_ids is not accepted/],
      [{ messages: user("hi"), model: "a\u0000b" }, /model must be a string \(at most 256 characters, no NUL\)/],
      [{ messages: user("hi"), logit_bias: Object.fromEntries(Array.from({ length: 301 }, (_, i) => [String(i), -100])) }, /logit_bias may name at most 300 tokens \(301 given\)/],
    ];
    for (const [body, message] of refusals) {
      const res = await post(body);
      expect(res.status).toBe(400);
      expect((await res.json()).error).toMatchObject({ code: "invalid_request", type: "invalid_request_error", message: expect.stringMatching(message) });
    }
    expect(honest.requests.length).toBe(before);
    expect(await srv.sql`SELECT 1 FROM v1_usage WHERE renter_id = ${renter.id}`).toHaveLength(0);
    // Text parts, chat_template_kwargs and a null chat_template are forwarded as ever.
    const ok = await post({ messages: user([{ type: "text", text: PROMPT }]), chat_template_kwargs: { enable_thinking: false }, chat_template: null });
    expect(ok.status).toBe(200);
    expect(honest.requests.length).toBe(before + 1);
  });

  it("asks for special tokens to be delivered when a request can make the model generate them on purpose", async () => {
    const renter = await makeRenter(srv, START_BALANCE);
    const sent = async (extra: Record<string, unknown>) => {
      const before = honest.requests.length;
      await ai(renter.key).chat.completions.create({ model: HONEST_MODEL, messages: [{ role: "user", content: PROMPT }], ...extra } as never);
      return honest.requests[before];
    };
    expect((await sent({ logit_bias: { "151644": 100 } })).skip_special_tokens).toBe(false);
    expect((await sent({ ignore_eos: true })).skip_special_tokens).toBe(false);
    expect((await sent({ logit_bias: { "151644": 100 }, skip_special_tokens: true })).skip_special_tokens).toBe(false);
    // Biases that only hold tokens back, and a request without either, are forwarded as sent.
    expect((await sent({ logit_bias: { "42": -100 } })).skip_special_tokens).toBeUndefined();
    expect((await sent({})).skip_special_tokens).toBeUndefined();
  });

  it("reliabilityScore counts each overstated request as a failed job", () => {
    const base = { completedJobs: 2, failedJobs: 1, uptimePercent: 100, ageDays: 30 };
    expect(reliabilityScore({ ...base, overstatedRequests: 3 })).toBe(reliabilityScore({ ...base, failedJobs: 4 }));
    expect(reliabilityScore({ ...base, overstatedRequests: 0 })).toBe(reliabilityScore(base));
  });

  it("prompt: every string of the messages in UTF-8 bytes, a per-message and a per-request allowance, tools as Python's JSON", () => {
    const messages = [
      { role: "system", content: "مرحبا" }, // 10 bytes
      { role: "user", content: [{ type: "text", text: "hi" }], name: "ali" },
    ];
    const tools = [{ type: "function", function: { name: "f", parameters: {} } }];
    const text = "system".length + 10 + "user".length + "text".length + 2 + 3;
    expect(promptTokensBound({ messages })).toBe(text + 2 * PROMPT_TOKENS_PER_MESSAGE + PROMPT_TOKENS_PER_REQUEST);
    // Each tool as vLLM dumps it (description null) and json.dumps writes it with indent 4 (prompt-json-bound.test.ts).
    const dumped = '{\n    "type": "function",\n    "function": {\n        "description": null,\n        "parameters": {},\n        "name": "f"\n    }\n}';
    expect(promptTokensBound({ messages, tools })).toBe(text + 2 * PROMPT_TOKENS_PER_MESSAGE + PROMPT_TOKENS_PER_REQUEST + dumped.length);
  });

  it("completion: generated text in bytes (content, reasoning, tool calls), per choice and per tool call allowances", () => {
    const message = {
      role: "assistant",
      content: "é",
      reasoning_content: "think",
      tool_calls: [{ id: "call_1", type: "function", function: { name: "get", arguments: '{"a":1}' } }],
    };
    const d = deliveredText([{ index: 0, message }, { index: 1, message: { content: "ok" } }], "message");
    expect(d).toEqual({ bytes: 2 + 5 + 3 + 7 + 2, toolCalls: 1 });
    expect(completionTokensBound(d, 2, undefined)).toBe(19 + 2 * COMPLETION_TOKENS_PER_CHOICE + COMPLETION_TOKENS_PER_TOOL_CALL);
    expect(completionTokensBound(d, 1, "STOP")).toBe(19 + COMPLETION_TOKENS_PER_CHOICE + 4 + COMPLETION_TOKENS_PER_TOOL_CALL);
    // Streamed: the name arrives once per call, the arguments in pieces.
    const first = deliveredText([{ delta: { tool_calls: [{ index: 0, id: "c", function: { name: "get", arguments: "" } }] } }], "delta");
    const next = deliveredText([{ delta: { tool_calls: [{ index: 0, function: { arguments: '{"a":1}' } }] } }], "delta");
    expect([first, next]).toEqual([{ bytes: 3, toolCalls: 1 }, { bytes: 7, toolCalls: 0 }]);
    expect(deliveredText(null, "delta")).toEqual({ bytes: 0, toolCalls: 0 });
  });
});
