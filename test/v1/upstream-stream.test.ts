// Every endpoint is asked for a stream with usage on every chunk, whatever the
// client asked: a non-streaming client's answer is built by the gateway from
// the chunks (the same JSON the endpoint would have answered unstreamed), the
// idle limit counts between chunks, so a long generation is answered and
// billed on one endpoint, and once an endpoint has sent its first event the
// request is never tried on another; an answer past MAX_RESPONSE_BYTES (or
// past the request's deadline) is cut there, answered and billed; a stream cut
// short is billed the usage the endpoint last reported, also when the renter
// turned continuous_usage_stats off. Beam search and prompt_logprobs are
// refused. The fake below plays vLLM's OpenAI server closely: no byte of an
// unstreamed answer before the generation ends, one chunk per token and
// choice, usage on every chunk only under continuous_usage_stats (counting
// that chunk's choice), the usage chunk under include_usage.
import http from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import { MAX_RESPONSE_BYTES } from "../../src/http/v1/proxy.js";
import { makeRenter } from "../helpers/fixtures.js";
import { startTestServer, useTestServer, type TestServer } from "../helpers/server.js";
import { serveModel } from "./serving.js";

// 1 halala per prompt token, 2 per completion token.
const RATE = { input: 1_000_000, output: 2_000_000 };
const TIMEOUT_MS = 400;
const MODEL = "meta-llama/Llama-3.1-8B-Instruct";
/** Prompt tokens the fake reports: within the prompt's bound (78 for "hi"), and not the gateway's estimate of it (a quarter of the bound). */
const PROMPT_TOKENS = 30;

const srv = useTestServer({
  SVC_V1_TOKEN_RATES: JSON.stringify({ "*": RATE }),
  SVC_V1_UPSTREAM_TIMEOUT_MS: String(TIMEOUT_MS),
  SVC_JOB_SWEEP_MS: "60000",
  SVC_LIVENESS_SWEEP_SECONDS: "0",
});

interface Behaviour {
  /** Tokens of text per choice. */
  tokens: number;
  /** Milliseconds per step (one token of every choice). */
  tokenMs: number;
  /** The text of token `i` (from 1) of choice `c`. */
  piece: (i: number, c: number) => string;
  /** After this many tokens of each choice: send nothing more ("stall") or close the connection ("drop"). */
  failAfter?: { tokens: number; how: "stall" | "drop" };
}

const DEFAULT: Behaviour = { tokens: 6, tokenMs: 0, piece: (i, c) => `t${c}.${i} ` };

interface Fake {
  url: string;
  behaviour: Behaviour;
  requests: Record<string, unknown>[];
  /** Generations run to their end. */
  generated: number;
  /** Requests whose caller hung up before the answer ended (how vLLM learns to stop generating). */
  aborted: number;
  close(): Promise<void>;
}

type Json = Record<string, unknown>;

/** One choice's generation: its content tokens, then (with `tools`) a call of the first tool in three pieces. */
function script(b: Behaviour, body: Json, c: number) {
  const tools = Array.isArray(body.tools) ? (body.tools as { function: { name: string } }[]) : [];
  const text = Array.from({ length: b.tokens }, (_, i) => b.piece(i + 1, c));
  const call = tools.length ? { id: `call_${c}`, name: tools[0].function.name, args: [`{"city": `, `"Riyadh`, `"}`] } : undefined;
  const top = typeof body.top_logprobs === "number" ? body.top_logprobs : 0;
  const logprob = (token: string) => {
    const entry = (t: string, lp: number) => ({ token: t, logprob: lp, bytes: [...Buffer.from(t)] });
    return { ...entry(token, -0.25), top_logprobs: [entry(token, -0.25), entry("x", -3)].slice(0, top) };
  };
  return { text, call, finish: call ? "tool_calls" : "stop", steps: text.length + (call?.args.length ?? 0), logprob, logprobs: body.logprobs === true };
}

async function fakeVllm(): Promise<Fake> {
  const sockets = new Set<import("node:net").Socket>();
  const f: Fake = {
    url: "",
    behaviour: DEFAULT,
    requests: [],
    generated: 0,
    aborted: 0,
    close: async () => {
      for (const s of sockets) s.destroy();
      await new Promise((r) => server.close(r));
    },
  };
  const server = http.createServer(async (req, res) => {
    let ended = false;
    res.on("close", () => {
      if (!ended) f.aborted++;
    });
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    const body = JSON.parse(Buffer.concat(chunks).toString("utf8")) as Json;
    f.requests.push(body);
    const b = f.behaviour;
    const n = typeof body.n === "number" ? body.n : 1;
    const scripts = Array.from({ length: n }, (_, c) => script(b, body, c));
    const id = `chatcmpl-fake-${f.requests.length}`;
    const created = 1_700_000_000 + f.requests.length;
    const steps = Math.max(...scripts.map((s) => s.steps));
    const failAt = b.failAfter?.tokens ?? Infinity;
    const usage = (completion: number) => ({ prompt_tokens: PROMPT_TOKENS, total_tokens: PROMPT_TOKENS + completion, completion_tokens: completion });
    const sleep = (ms: number) => (ms > 0 ? new Promise((r) => setTimeout(r, ms)) : Promise.resolve());

    if (body.stream !== true) {
      // vLLM's JSONResponse: nothing is sent before the whole generation is done.
      for (let step = 1; step <= Math.min(steps, failAt); step++) await sleep(b.tokenMs);
      if (res.destroyed) return;
      if (failAt < steps) {
        if (b.failAfter!.how === "drop") res.destroy();
        return;
      }
      f.generated++;
      ended = true;
      res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify(unstreamed(body, scripts, id, created)));
      return;
    }

    const so = (body.stream_options ?? {}) as { include_usage?: boolean; continuous_usage_stats?: boolean };
    const continuous = so.include_usage === true && so.continuous_usage_stats === true;
    res.writeHead(200, { "content-type": "text/event-stream" });
    /** Writes one event, waiting out backpressure (as vLLM's server does) until the gateway reads on or hangs up. */
    const send = async (o: unknown) => {
      if (res.write(`data: ${typeof o === "string" ? o : JSON.stringify(o)}\n\n`)) return;
      await new Promise<void>((resolve) => {
        const go = () => {
          res.off("drain", go);
          res.off("close", go);
          resolve();
        };
        res.on("drain", go);
        res.on("close", go);
      });
    };
    const done = scripts.map(() => 0);
    const chunk = (c: number, delta: Json, logprobs: unknown, finish: string | null) => ({
      id,
      object: "chat.completion.chunk",
      created,
      model: body.model,
      choices: [{ index: c, delta, logprobs, finish_reason: finish, ...(finish ? { stop_reason: null } : {}) }],
      ...(continuous ? { usage: usage(done[c]) } : {}),
    });
    for (let c = 0; c < n; c++) await send(chunk(c, { role: "assistant", content: "" }, null, null));
    for (let step = 1; step <= steps; step++) {
      await sleep(b.tokenMs);
      if (res.destroyed) return;
      if (step > failAt) {
        if (b.failAfter!.how === "drop") res.destroy();
        return;
      }
      for (const [c, s] of scripts.entries()) {
        if (step > s.steps) continue;
        done[c] = step;
        const last = step === s.steps ? s.finish : null;
        if (step <= s.text.length) {
          const t = s.text[step - 1];
          await send(chunk(c, { content: t }, s.logprobs ? { content: [s.logprob(t)] } : null, last));
        } else {
          const k = step - s.text.length - 1;
          const fn = k === 0 ? { name: s.call!.name, arguments: s.call!.args[0] } : { arguments: s.call!.args[k] };
          const tc = { index: 0, ...(k === 0 ? { id: s.call!.id, type: "function" } : {}), function: fn };
          await send(chunk(c, { tool_calls: [tc] }, null, last));
        }
        if (res.destroyed) return;
      }
    }
    f.generated++;
    if (so.include_usage) await send({ id, object: "chat.completion.chunk", created, model: body.model, choices: [], usage: usage(done.reduce((a, x) => a + x, 0)) });
    await send("[DONE]");
    ended = true;
    res.end();
  });
  server.on("connection", (s) => {
    sockets.add(s);
    s.on("close", () => sockets.delete(s));
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  f.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return f;
}

/** What the fake answers an unstreamed request: vLLM's chat.completion. */
function unstreamed(body: Json, scripts: ReturnType<typeof script>[], id: string, created: number): Json {
  const completion = scripts.reduce((a, s) => a + s.steps, 0);
  return {
    id,
    object: "chat.completion",
    created,
    model: body.model,
    choices: scripts.map((s, index) => ({
      index,
      message: {
        role: "assistant",
        content: s.text.join(""),
        ...(s.call ? { tool_calls: [{ id: s.call.id, type: "function", function: { name: s.call.name, arguments: s.call.args.join("") } }] } : {}),
      },
      logprobs: s.logprobs ? { content: s.text.map((t) => s.logprob(t)) } : null,
      finish_reason: s.finish,
      stop_reason: null,
    })),
    usage: { prompt_tokens: PROMPT_TOKENS, total_tokens: PROMPT_TOKENS + completion, completion_tokens: completion },
  };
}

// Two endpoints serve MODEL: a request that failed over would reach the second.
let a: Fake;
let b: Fake;
const fakes: Fake[] = [];
const cleanup: (() => Promise<unknown>)[] = [];
beforeAll(async () => {
  a = await fakeVllm();
  b = await fakeVllm();
  fakes.push(a, b);
  await serveModel(srv, MODEL, a.url);
  await serveModel(srv, MODEL, b.url);
});
beforeEach(() => {
  for (const f of fakes) Object.assign(f, { behaviour: DEFAULT, requests: [], generated: 0, aborted: 0 });
});
afterAll(async () => {
  expect(await ledgerProblems(srv.sql)).toEqual([]);
  for (const f of cleanup) await f();
  for (const f of fakes) await f.close();
});

const requests = () => [...a.requests, ...b.requests];
const behave = (x: Partial<Behaviour>) => {
  for (const f of fakes) f.behaviour = { ...DEFAULT, ...x };
};

function chat(key: string, body: Json, opts: { signal?: AbortSignal; server?: TestServer } = {}) {
  return fetch(`${(opts.server ?? srv).url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({ model: MODEL, messages: [{ role: "user", content: "hi" }], ...body }),
    signal: opts.signal,
  });
}

interface Row {
  state: string;
  cost_halala: number;
  prompt_tokens: number;
  completion_tokens: number;
  usage_estimated: boolean;
}
async function usageRow(renterId: number, server: TestServer = srv): Promise<Row | undefined> {
  const [row] = await server.sql<Row[]>`
    SELECT state, cost_halala, prompt_tokens, completion_tokens, usage_estimated FROM v1_usage WHERE renter_id = ${renterId} ORDER BY created_at DESC LIMIT 1`;
  return row;
}
const settled = (renterId: number, server: TestServer = srv) =>
  expect.poll(async () => (await usageRow(renterId, server))?.state, { timeout: 10_000 }).not.toBe("open");

/** SSE events of a streamed answer, parsed ([DONE] as the string). */
function events(raw: string): (Json | string)[] {
  return raw
    .split("\n\n")
    .filter(Boolean)
    .map((e) => e.slice("data: ".length))
    .map((d) => (d === "[DONE]" ? d : (JSON.parse(d) as Json)));
}

describe("a non-streaming client", () => {
  it("is answered what the endpoint would have answered unstreamed, built from the stream it was asked for (n choices, logprobs, tool calls)", async () => {
    const renter = await makeRenter(srv, 100_000);
    const ask = {
      n: 2,
      logprobs: true,
      top_logprobs: 2,
      tools: [{ type: "function", function: { name: "get_weather", parameters: { type: "object", properties: { city: { type: "string" } } } } }],
      stream_options: { include_usage: false }, // a non-streaming client's stream_options do not reach the endpoint
    };
    const res = await chat(renter.key, ask);
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toContain("application/json");
    expect(res.headers.get("x-svc-truncated")).toBeNull();
    const json = (await res.json()) as Json;

    expect(requests()).toHaveLength(1);
    const sent = requests()[0];
    expect(sent.stream).toBe(true);
    expect(sent.stream_options).toEqual({ include_usage: true, continuous_usage_stats: true });

    // The same request answered unstreamed by the endpoint: what the gateway's client got, usage aside.
    const { usage, ...rest } = json;
    const direct = unstreamed({ ...sent, stream: false }, [0, 1].map((c) => script(DEFAULT, sent, c)), String(json.id), Number(json.created));
    const { usage: directUsage, ...directRest } = direct;
    expect(rest).toEqual(directRest);
    expect(json.id).toMatch(/^chatcmpl-fake-/);
    expect((json.choices as Json[]).map((c) => c.finish_reason)).toEqual(["tool_calls", "tool_calls"]);
    // The usage the endpoint reported (within the bounds), billed as shown.
    expect(usage).toEqual(directUsage);
    const completion = (directUsage as { completion_tokens: number }).completion_tokens;
    await settled(renter.id);
    expect(await usageRow(renter.id)).toEqual({
      state: "settled",
      cost_halala: PROMPT_TOKENS + 2 * completion,
      prompt_tokens: PROMPT_TOKENS,
      completion_tokens: completion,
      usage_estimated: false,
    });
    expect(res.headers.get("x-svc-cost-halala")).toBe(String(PROMPT_TOKENS + 2 * completion));
  });

  it(`a generation longer than the upstream timeout (${TIMEOUT_MS} ms) is answered and billed, on one endpoint`, async () => {
    behave({ tokens: 12, tokenMs: 80 }); // about a second, each chunk within the idle limit
    const renter = await makeRenter(srv, 100_000);
    const res = await chat(renter.key, { max_tokens: 50 });
    const json = await res.json();
    expect(res.status, JSON.stringify(json)).toBe(200);
    expect(json.choices[0].message.content).toBe(Array.from({ length: 12 }, (_, i) => DEFAULT.piece(i + 1, 0)).join(""));
    expect(json.choices[0].finish_reason).toBe("stop");
    expect(json.usage).toMatchObject({ prompt_tokens: PROMPT_TOKENS, completion_tokens: 12 });
    expect(requests()).toHaveLength(1);
    expect(a.generated + b.generated).toBe(1);
    await settled(renter.id);
    expect(await usageRow(renter.id)).toMatchObject({ state: "settled", cost_halala: PROMPT_TOKENS + 2 * 12, usage_estimated: false });
  });

  it.each([
    { how: "stall" as const, status: 504, code: "upstream_timeout" },
    { how: "drop" as const, status: 502, code: "provider_unavailable" },
  ])("an endpoint that fails ($how) after its first event: $status $code, never tried on another endpoint, nothing charged (nothing delivered)", async ({ how, status, code }) => {
    behave({ tokens: 20, tokenMs: 30, failAfter: { tokens: 3, how } });
    const renter = await makeRenter(srv, 100_000);
    const res = await chat(renter.key, { max_tokens: 50 });
    const body = await res.json();
    expect(res.status).toBe(status);
    expect(body.error).toMatchObject({ code, status, retryable: true });
    expect(res.headers.get("x-should-retry")).toBe("true");
    expect(requests()).toHaveLength(1);
    // The client got nothing but a retryable error (which OpenAI's SDKs retry on their own): charged nothing.
    await settled(renter.id);
    expect(await usageRow(renter.id)).toMatchObject({ state: "released", cost_halala: 0 });
  });

  it(`an answer past MAX_RESPONSE_BYTES is cut there: generated once, answered with what was generated (finish_reason "length", x-svc-truncated), and billed`, async () => {
    // 200 tokens of 256 KiB: 50 MiB of text (n = 16 x top_logprobs = 20 x a few thousand tokens comes to as much).
    const big = "y".repeat(256 * 1024);
    behave({ tokens: 200, piece: () => big });
    const renter = await makeRenter(srv, 100_000);
    const res = await chat(renter.key, { max_tokens: 1000 });
    expect(res.status).toBe(200);
    expect(res.headers.get("x-svc-truncated")).toBe("response_too_large");
    const raw = await res.text();
    expect(raw.length).toBeLessThanOrEqual(MAX_RESPONSE_BYTES + 64 * 1024);
    const json = JSON.parse(raw);
    const content: string = json.choices[0].message.content;
    expect(json.choices[0].finish_reason).toBe("length");
    expect(content.length % big.length).toBe(0);
    const kept = content.length / big.length;
    expect(kept * big.length).toBeGreaterThan(MAX_RESPONSE_BYTES - 2 * big.length);
    // One endpoint, hung up on at the cap: not generated to the end, not generated again elsewhere.
    expect(requests()).toHaveLength(1);
    await expect.poll(() => a.aborted + b.aborted).toBe(1);
    expect(a.generated + b.generated).toBe(0);
    // Billed the usage the endpoint reported when it was cut, as the answer shows.
    await settled(renter.id);
    const row = (await usageRow(renter.id))!;
    expect(row).toMatchObject({ state: "settled", prompt_tokens: PROMPT_TOKENS, usage_estimated: false });
    expect(row.completion_tokens).toBeGreaterThanOrEqual(kept);
    expect(row.completion_tokens).toBeLessThanOrEqual(kept + 1);
    expect(json.usage).toMatchObject({ prompt_tokens: PROMPT_TOKENS, completion_tokens: row.completion_tokens });
    expect(row.cost_halala).toBe(PROMPT_TOKENS + 2 * row.completion_tokens);
  });

  it("a generation still running at SVC_V1_MAX_REQUEST_SECONDS is answered with what was generated (x-svc-truncated: deadline) and billed", async () => {
    const short = await startTestServer({ SVC_V1_TOKEN_RATES: JSON.stringify({ "*": RATE }), SVC_V1_MAX_REQUEST_SECONDS: "1", SVC_V1_UPSTREAM_TIMEOUT_MS: String(TIMEOUT_MS) });
    cleanup.push(() => short.close());
    const up = await fakeVllm();
    fakes.push(up);
    up.behaviour = { ...DEFAULT, tokens: 40, tokenMs: 100 }; // 4 s
    await serveModel(short, MODEL, up.url);
    const renter = await makeRenter(short, 100_000);
    const started = performance.now();
    const res = await chat(renter.key, { max_tokens: 100 }, { server: short });
    const json = await res.json();
    expect(res.status, JSON.stringify(json)).toBe(200);
    expect(performance.now() - started).toBeLessThan(2500);
    expect(res.headers.get("x-svc-truncated")).toBe("deadline");
    expect(json.choices[0].finish_reason).toBe("length");
    const kept = (json.choices[0].message.content as string).split(" ").filter(Boolean).length;
    expect(kept).toBeGreaterThan(3);
    expect(kept).toBeLessThan(40);
    await settled(renter.id, short);
    const row = (await usageRow(renter.id, short))!;
    expect(row).toMatchObject({ state: "settled", prompt_tokens: PROMPT_TOKENS, completion_tokens: kept, usage_estimated: false });
    expect(json.usage).toMatchObject({ prompt_tokens: PROMPT_TOKENS, completion_tokens: kept });
    expect(await ledgerProblems(short.sql)).toEqual([]);
  });
});

describe("a streaming client", () => {
  it("that turned continuous_usage_stats off and leaves mid-stream pays the prompt the endpoint computed, not an estimate", async () => {
    behave({ tokens: 40, tokenMs: 100 });
    const renter = await makeRenter(srv, 1_000_000);
    const ctl = new AbortController();
    const res = await chat(renter.key, { stream: true, max_tokens: 40, stream_options: { include_usage: true, continuous_usage_stats: false } }, { signal: ctl.signal });
    const reader = res.body!.getReader();
    let seen = "";
    while (!seen.includes("t0.2 ")) seen += new TextDecoder().decode((await reader.read()).value);
    ctl.abort();
    expect(requests()[0].stream_options).toEqual({ include_usage: true, continuous_usage_stats: true });
    await settled(renter.id);
    const row = (await usageRow(renter.id))!;
    expect(row).toMatchObject({ state: "settled", prompt_tokens: PROMPT_TOKENS, usage_estimated: false });
    expect(row.completion_tokens).toBeGreaterThanOrEqual(2);
    expect(row.completion_tokens).toBeLessThan(40);
  });

  it("cut after k tokens of each of n choices is billed the k x n completion tokens the endpoint reported (vLLM counts per choice)", async () => {
    behave({ tokens: 20, tokenMs: 20, failAfter: { tokens: 4, how: "drop" } });
    const renter = await makeRenter(srv, 1_000_000);
    const res = await chat(renter.key, { stream: true, n: 3, max_tokens: 20 });
    const evs = events(await res.text());
    expect((evs.at(-1) as Json).error).toMatchObject({ code: "provider_unavailable" });
    await settled(renter.id);
    expect(await usageRow(renter.id)).toMatchObject({ state: "settled", prompt_tokens: PROMPT_TOKENS, completion_tokens: 12, usage_estimated: false });
  });

  it("is shown usage only as it asked: on the finishing chunk (no stream_options), in the usage chunk (include_usage), on every chunk (continuous_usage_stats)", async () => {
    const renter = await makeRenter(srv, 1_000_000);
    const chunksOf = async (extra: Json) => {
      const res = await chat(renter.key, { stream: true, max_tokens: 20, ...extra });
      const evs = events(await res.text());
      expect(evs.at(-1)).toBe("[DONE]");
      return evs.slice(0, -1) as Json[];
    };
    const withChoices = (cs: Json[]) => cs.filter((c) => (c.choices as unknown[]).length > 0);

    const plain = await chunksOf({});
    expect(plain.every((c) => (c.choices as unknown[]).length === 1)).toBe(true);
    expect(plain.slice(0, -1).every((c) => c.usage === undefined)).toBe(true);
    expect(plain.at(-1)!.usage).toMatchObject({ prompt_tokens: PROMPT_TOKENS, completion_tokens: 6 });

    const final = await chunksOf({ stream_options: { include_usage: true } });
    expect(withChoices(final).every((c) => c.usage === undefined)).toBe(true);
    expect(final.at(-1)).toMatchObject({ choices: [], usage: { prompt_tokens: PROMPT_TOKENS, completion_tokens: 6 } });

    const every = await chunksOf({ stream_options: { include_usage: true, continuous_usage_stats: true } });
    expect(withChoices(every).map((c) => (c.usage as Json).completion_tokens)).toEqual([0, 1, 2, 3, 4, 5, 6]);
    expect(every.at(-1)).toMatchObject({ choices: [], usage: { completion_tokens: 6 } });
    for (const r of requests()) expect(r.stream_options).toMatchObject({ include_usage: true, continuous_usage_stats: true });
  });
});

describe("refused parameters", () => {
  it.each([
    { name: "use_beam_search", extra: { use_beam_search: true, n: 4 }, message: /use_beam_search is not accepted/ },
    { name: "prompt_logprobs", extra: { prompt_logprobs: 5 }, message: /prompt_logprobs is not accepted/ },
  ])("$name: 400 invalid_request in the /v1 envelope, nothing forwarded or reserved", async ({ extra, message }) => {
    const renter = await makeRenter(srv, 100_000);
    const res = await chat(renter.key, { max_tokens: 100, ...extra });
    expect(res.status).toBe(400);
    const body = await res.json();
    expect(body).toEqual({ error: { message: expect.stringMatching(message), type: "invalid_request_error", code: "invalid_request", status: 400, retryable: false } });
    expect(requests()).toHaveLength(0);
    expect(await usageRow(renter.id)).toBeUndefined();
  });

  it("use_beam_search: false and prompt_logprobs: 0 ask for nothing and are accepted", async () => {
    const renter = await makeRenter(srv, 100_000);
    const res = await chat(renter.key, { use_beam_search: false, prompt_logprobs: 0 });
    expect(res.status).toBe(200);
    expect(requests()).toHaveLength(1);
  });
});
