// The /v1 gateway driven by the official `openai` SDK the way its users call it, against a
// vLLM-like stand-in (sdk-engine.ts): every answer and chunk parses as the SDK's types say.
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { makeRenter } from "../helpers/fixtures.js";
import { useTestServer } from "../helpers/server.js";
import { serveModel } from "./serving.js";
import { PROMPT, startEngine, WORDS, type Engine } from "./sdk-engine.js";

const MODEL = "Qwen/Qwen2.5-7B-Instruct";
const RATE = { input: 1_000_000, output: 2_000_000 };
const srv = useTestServer({ SVC_V1_TOKEN_RATES: JSON.stringify({ "*": RATE }), SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0" });
let engine: Engine;
let key: string;
beforeAll(async () => {
  engine = await startEngine();
  await serveModel(srv, MODEL, engine.url);
  key = (await makeRenter(srv, 1_000_000)).key;
});
afterAll(() => engine?.close());

const ai = (opts: Record<string, unknown> = {}) => new OpenAI({ apiKey: key, baseURL: `${srv.url}/v1`, maxRetries: 0, ...opts });
const msgs = [{ role: "user" as const, content: "What is the answer?" }];
const lastReq = () => engine.requests.at(-1)!;

describe("chat.completions.create, non-streaming", () => {
  it("answers a chat.completion the SDK parses, with OpenAI's fields", async () => {
    const { data: r, response, request_id } = await ai().chat.completions.create({ model: MODEL, messages: msgs, seed: 7, max_tokens: 50 }).withResponse();
    expect(r.object).toBe("chat.completion");
    expect(r.id).toMatch(/^chatcmpl-/);
    expect(typeof r.created).toBe("number");
    expect(r.model).toBe(MODEL);
    expect(r.choices).toHaveLength(1);
    expect(r.choices[0]).toMatchObject({ index: 0, finish_reason: "stop", logprobs: null, message: { role: "assistant", content: WORDS.join("") } });
    expect(r.usage).toMatchObject({ prompt_tokens: PROMPT, completion_tokens: WORDS.length, total_tokens: PROMPT + WORDS.length });
    expect(request_id).toMatch(/^req-/);
    expect(response.headers.get("content-type")).toMatch(/application\/json/);
    expect(lastReq().seed).toBe(7);
  });

  it("n > 1: n choices in index order, usage summed", async () => {
    const r = await ai().chat.completions.create({ model: MODEL, messages: msgs, n: 3 });
    expect(r.choices.map((c) => c.index)).toEqual([0, 1, 2]);
    for (const c of r.choices) expect(c.message.content).toBe(WORDS.join(""));
    expect(r.usage?.completion_tokens).toBe(3 * WORDS.length);
  });

  it("max_completion_tokens and max_tokens reach the engine; length finish", async () => {
    const r = await ai().chat.completions.create({ model: MODEL, messages: msgs, max_completion_tokens: 2 });
    expect(lastReq().max_completion_tokens).toBe(2);
    expect(lastReq().max_tokens).toBe(2);
    expect(r.choices[0].finish_reason).toBe("length");
    expect(r.choices[0].message.content).toBe("The answer");
    const r2 = await ai().chat.completions.create({ model: MODEL, messages: msgs, max_tokens: 3 });
    expect(lastReq().max_tokens).toBe(3);
    expect(lastReq().max_completion_tokens).toBeUndefined();
    expect(r2.choices[0].finish_reason).toBe("length");
  });

  it("stop strings", async () => {
    const r = await ai().chat.completions.create({ model: MODEL, messages: msgs, stop: [" forty"] });
    expect(lastReq().stop).toEqual([" forty"]);
    expect(r.choices[0].message.content).toBe("The answer is");
  });

  it("logprobs + top_logprobs merged in the SDK's shape", async () => {
    const r = await ai().chat.completions.create({ model: MODEL, messages: msgs, logprobs: true, top_logprobs: 2 });
    const lp = r.choices[0].logprobs!;
    expect(lp.content).toHaveLength(WORDS.length);
    expect(lp.content![0]).toMatchObject({ token: "The", logprob: -0.25, top_logprobs: [{ token: "The0" }, { token: "The1" }] });
  });

  it("response_format json_object", async () => {
    const r = await ai().chat.completions.create({ model: MODEL, messages: msgs, response_format: { type: "json_object" } });
    expect(lastReq().response_format).toEqual({ type: "json_object" });
    expect(JSON.parse(r.choices[0].message.content!)).toEqual({ answer: 42 });
  });

  it("tools + tool_choice: tool_calls as OpenAI returns them (no index)", async () => {
    const tools = [{ type: "function" as const, function: { name: "get_weather", parameters: { type: "object", properties: { city: { type: "string" } } } } }];
    const r = await ai().chat.completions.create({ model: MODEL, messages: msgs, tools, tool_choice: { type: "function", function: { name: "get_weather" } } });
    expect(lastReq().tool_choice).toEqual({ type: "function", function: { name: "get_weather" } });
    const m = r.choices[0].message;
    expect(r.choices[0].finish_reason).toBe("tool_calls");
    expect(m.tool_calls).toEqual([{ id: "chatcmpl-tool-" + engine.requests.length + "-0", type: "function", function: { name: "get_weather", arguments: '{"city": "Riyadh"}' } }]);
  });

  it("a message that only calls tools has content null (OpenAI, and vLLM unstreamed), not \"\"", async () => {
    const tools = [{ type: "function" as const, function: { name: "get_weather", parameters: { type: "object", properties: { city: { type: "string" } } } } }];
    const r = await ai().chat.completions.create({ model: MODEL, messages: msgs, tools, tool_choice: "auto" });
    expect(r.choices[0].message.tool_calls).toHaveLength(1);
    expect(r.choices[0].message.content).toBeNull();
  });
});

describe("chat.completions.create, streaming", () => {
  it("every chunk as the SDK parses it; include_usage ends with a usage chunk of empty choices", async () => {
    const stream = await ai().chat.completions.create({ model: MODEL, messages: msgs, stream: true, stream_options: { include_usage: true } });
    const chunks: OpenAI.ChatCompletionChunk[] = [];
    for await (const c of stream) chunks.push(c);
    for (const c of chunks) {
      expect(c.object).toBe("chat.completion.chunk");
      expect(c.id).toMatch(/^chatcmpl-/);
      expect(typeof c.created).toBe("number");
      expect(c.model).toBe(MODEL);
    }
    const withChoices = chunks.filter((c) => c.choices.length > 0);
    expect(withChoices[0].choices[0].delta.role).toBe("assistant");
    expect(withChoices.map((c) => c.choices[0].delta.content ?? "").join("")).toBe(WORDS.join(""));
    expect(withChoices.at(-1)!.choices[0].finish_reason).toBe("stop");
    const last = chunks.at(-1)!;
    expect(last.choices).toEqual([]);
    expect(last.usage).toMatchObject({ prompt_tokens: PROMPT, completion_tokens: WORDS.length, total_tokens: PROMPT + WORDS.length });
    // OpenAI: with include_usage, every other chunk's usage is null (absent is tolerated by the SDK's types).
    for (const c of withChoices) expect(c.usage ?? null).toBeNull();
  });

  it("without stream_options: the text, a finish chunk, no usage-only chunk", async () => {
    const stream = await ai().chat.completions.create({ model: MODEL, messages: msgs, stream: true });
    const chunks: OpenAI.ChatCompletionChunk[] = [];
    for await (const c of stream) chunks.push(c);
    expect(chunks.every((c) => c.choices.length > 0)).toBe(true);
    expect(chunks.at(-1)!.choices[0].finish_reason).toBe("stop");
  });

  it("n > 1 and tool calls streamed; chat.completions.stream().finalChatCompletion() assembles them", async () => {
    const tools = [{ type: "function" as const, function: { name: "get_weather", parameters: { type: "object", properties: {} } } }];
    const s = ai().chat.completions.stream({ model: MODEL, messages: msgs, n: 2, tools, stream_options: { include_usage: true } });
    const final = await s.finalChatCompletion();
    expect(final.choices).toHaveLength(2);
    for (const c of final.choices) {
      expect(c.finish_reason).toBe("tool_calls");
      expect(c.message.tool_calls?.[0]).toMatchObject({ type: "function", function: { name: "get_weather", arguments: '{"city": "Riyadh"}' } });
    }
    expect(final.usage?.completion_tokens).toBe(6);
    const s2 = ai().chat.completions.stream({ model: MODEL, messages: msgs });
    const deltas: string[] = [];
    s2.on("content", (d) => deltas.push(d));
    expect(await s2.finalContent()).toBe(WORDS.join(""));
    expect(deltas.join("")).toBe(WORDS.join(""));
  });

  it("logprobs streamed per chunk", async () => {
    const s = ai().chat.completions.stream({ model: MODEL, messages: msgs, logprobs: true, top_logprobs: 1 });
    const final = await s.finalChatCompletion();
    expect(final.choices[0].logprobs?.content).toHaveLength(WORDS.length);
  });
});

describe("models", () => {
  it("list and retrieve (an id with a slash)", async () => {
    const page = await ai().models.list();
    const ids: string[] = [];
    for await (const m of page) ids.push(m.id);
    expect(ids).toContain(MODEL);
    const m = await ai().models.retrieve(MODEL);
    expect(m).toMatchObject({ id: MODEL, object: "model", owned_by: "svc-marketplace" });
    expect(typeof m.created).toBe("number");
  });
});

describe("errors as the SDK classes them", () => {
  it("400 BadRequestError, 401 AuthenticationError, 404 NotFoundError; envelope fields readable", async () => {
    const bad = await ai().chat.completions.create({ model: MODEL, messages: [] }).catch((e) => e);
    expect(bad).toBeInstanceOf(OpenAI.BadRequestError);
    expect(bad.type).toBe("invalid_request_error");
    expect(typeof bad.message).toBe("string");
    const unauth = await new OpenAI({ apiKey: "svc-renter-nope", baseURL: `${srv.url}/v1`, maxRetries: 0 }).models.list().catch((e) => e);
    expect(unauth).toBeInstanceOf(OpenAI.AuthenticationError);
    expect(unauth.code).toBe("invalid_api_key");
    const nf = await ai().models.retrieve("nobody/serves-this").catch((e) => e);
    expect(nf).toBeInstanceOf(OpenAI.NotFoundError);
    const nf2 = await ai().chat.completions.create({ model: "nobody/serves-this", messages: msgs, stream: true }).catch((e) => e);
    expect(nf2).toBeInstanceOf(OpenAI.NotFoundError);
    expect(nf2.code).toBe("model_not_found");
  });

  it("undocumented /v1 routes (completions, embeddings, responses) answer a clean 404 in the envelope", async () => {
    const c = await ai().completions.create({ model: MODEL, prompt: "hi" }).catch((e) => e);
    expect(c).toBeInstanceOf(OpenAI.NotFoundError);
    expect(c.error).toMatchObject({ type: "invalid_request_error", code: "unknown_url" });
    const emb = await ai().embeddings.create({ model: MODEL, input: "hi" }).catch((e) => e);
    expect(emb).toBeInstanceOf(OpenAI.NotFoundError);
    const resp = await ai().responses.create({ model: MODEL, input: "hi" }).catch((e) => e);
    expect(resp).toBeInstanceOf(OpenAI.NotFoundError);
  });

  it("402 insufficient_quota: a plain APIError, not retried", async () => {
    const poor = await makeRenter(srv, 0);
    let calls = 0;
    const client = new OpenAI({ apiKey: poor.key, baseURL: `${srv.url}/v1`, maxRetries: 2, fetch: (u: any, i: any) => (calls++, fetch(u, i)) });
    const err = await client.chat.completions.create({ model: MODEL, messages: msgs }).catch((e) => e);
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect(err.status).toBe(402);
    expect(err.code).toBe("insufficient_quota");
    expect(calls).toBe(1);
  });
});
