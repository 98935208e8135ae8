// The official `openai` SDK's automatic retries, timeouts and aborts against the
// /v1 gateway — what they cost a renter, and whether the SDK hangs.
import OpenAI from "openai";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { makeRenter } from "../helpers/fixtures.js";
import { useTestServer } from "../helpers/server.js";
import { serveModel } from "./serving.js";
import { PROMPT, startEngine, WORDS, type Engine } from "./sdk-engine.js";

const MODEL = "Qwen/Qwen2.5-7B-Instruct";
// 1 halala per prompt token, 2 per completion token: one full answer costs 11 + 2 x 6 = 23 halala.
const RATE = { input: 1_000_000, output: 2_000_000 };
const ONE_ANSWER = PROMPT + 2 * WORDS.length;
const srv = useTestServer({ SVC_V1_TOKEN_RATES: JSON.stringify({ "*": RATE }), SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0" });
let engine: Engine;
beforeAll(async () => {
  engine = await startEngine();
  await serveModel(srv, MODEL, engine.url);
});
afterAll(() => engine?.close());
beforeEach(() => {
  engine.breakOn.clear();
  engine.delayMs = 0;
});

const msgs = [{ role: "user" as const, content: "What is the answer?" }];

/** An SDK client of a fresh funded renter, counting the HTTP requests the SDK makes. */
async function renterClient(opts: Record<string, unknown> = {}, funds = 100_000) {
  const renter = await makeRenter(srv, funds);
  const sent: { retry: string | null; idem: string | null }[] = [];
  const ai = new OpenAI({
    apiKey: renter.key,
    baseURL: `${srv.url}/v1`,
    fetch: (url: any, init: any) => {
      const h = new Headers(init?.headers);
      sent.push({ retry: h.get("x-stainless-retry-count"), idem: h.get("idempotency-key") });
      return fetch(url, init);
    },
    ...opts,
  });
  const billed = async () => {
    const rows = await srv.sql<{ state: string; cost_halala: string; prompt_tokens: string; completion_tokens: string }[]>`
      SELECT state, cost_halala, prompt_tokens, completion_tokens FROM v1_usage WHERE renter_id = ${renter.id} AND state = 'settled' ORDER BY created_at`;
    return { requests: rows.length, halala: rows.reduce((a, r) => a + Number(r.cost_halala), 0), rows };
  };
  return { renter, ai, sent, billed };
}

describe("a 429 spend_limit_exceeded (until next month) is not retried by the SDK", () => {
  it("the SDK (default maxRetries 2) gives up at once: one request, RateLimitError within seconds", async () => {
    const { renter, ai, sent } = await renterClient();
    await srv.sql`UPDATE renter_quota SET monthly_spend_limit_halala = 20 WHERE renter_id = ${renter.id}`;
    const started = Date.now();
    const outcome = await Promise.race([
      ai.chat.completions.create({ model: MODEL, messages: msgs, max_tokens: 1000 }).then(
        () => "answered",
        (e) => e,
      ),
      new Promise((r) => setTimeout(() => r("still waiting after 5 s"), 5000).unref()),
    ]);
    // What happened on the wire: the gateway's 429 carried Retry-After(-ms) = until the next UTC month, and the
    // SDK's retry logic obeys retry-after-ms with no upper bound (openai/client.js retryRequest), so it sleeps.
    expect(outcome).toBeInstanceOf(OpenAI.RateLimitError);
    expect((outcome as InstanceType<typeof OpenAI.RateLimitError>).code).toBe("spend_limit_exceeded");
    expect(Date.now() - started).toBeLessThan(5000);
    expect(sent).toHaveLength(1);
  });
});

describe("an endpoint failing before anything was delivered: the SDK retries, the renter pays for the answer once", () => {
  it("an endpoint that breaks after its first event (non-streaming): one answer, billed once", async () => {
    const { ai, sent, billed } = await renterClient(); // maxRetries: the SDK's default, 2
    engine.breakOn.add(engine.requests.length + 1); // the next request breaks after its first word
    const r = await ai.chat.completions.create({ model: MODEL, messages: msgs });
    expect(r.choices[0].message.content).toBe(WORDS.join(""));
    expect(sent.map((s) => s.retry)).toEqual(["0", "1"]); // the SDK retried the 502 on its own
    const b = await billed();
    // OpenAI does not bill a request it answered with a 5xx: the user got one answer and should pay for one.
    expect(b).toMatchObject({ requests: 1, halala: ONE_ANSWER });
  });

  it("the 502 alone (no retries): charged nothing, and marked retryable (x-should-retry: true)", async () => {
    const { ai, billed } = await renterClient({ maxRetries: 0 });
    engine.breakOn.add(engine.requests.length + 1);
    const err = await ai.chat.completions.create({ model: MODEL, messages: msgs }).catch((e) => e);
    expect(err).toBeInstanceOf(OpenAI.InternalServerError);
    expect(err.status).toBe(502);
    expect(err.headers.get("x-should-retry")).toBe("true");
    expect(await billed()).toMatchObject({ requests: 0, halala: 0 });
  });
});

describe("the SDK's timeouts, aborts and mid-stream errors", () => {
  it("an SDK timeout on a non-streamed request: each attempt the client gave up on is billed as a client leaving (its prompt)", async () => {
    const { ai, sent, billed } = await renterClient({ timeout: 400, maxRetries: 2 });
    engine.delayMs = 150; // 6 words: ~900 ms to answer
    const err = await ai.chat.completions.create({ model: MODEL, messages: msgs }).catch((e) => e);
    expect(err).toBeInstanceOf(OpenAI.APIConnectionTimeoutError);
    expect(sent).toHaveLength(3);
    await expect.poll(async () => (await billed()).requests, { timeout: 5_000 }).toBe(3);
    for (const row of (await billed()).rows) expect(Number(row.completion_tokens)).toBeLessThan(WORDS.length);
  });

  it("stream.controller.abort() mid-stream: billed what was delivered", async () => {
    const { ai, billed } = await renterClient({ maxRetries: 0 });
    engine.delayMs = 100;
    const stream = await ai.chat.completions.create({ model: MODEL, messages: msgs, stream: true, stream_options: { include_usage: true } });
    let text = "";
    for await (const c of stream) {
      text += c.choices[0]?.delta?.content ?? "";
      if (text.split(" ").length >= 3) stream.controller.abort();
    }
    await expect.poll(async () => (await billed()).requests, { timeout: 5_000 }).toBe(1);
    expect((await billed()).halala).toBeLessThan(ONE_ANSWER);
  });

  it("an error event mid-stream surfaces as an APIError from the iterator (no hang)", async () => {
    const { ai } = await renterClient({ maxRetries: 0 });
    engine.breakOn.add(engine.requests.length + 1);
    const stream = await ai.chat.completions.create({ model: MODEL, messages: msgs, stream: true });
    let text = "";
    const err = await (async () => {
      for await (const c of stream) text += c.choices[0]?.delta?.content ?? "";
    })().catch((e) => e);
    expect(text).toBe("The");
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect(err.error).toMatchObject({ code: "provider_unavailable" });
  });

  it("503 no_capacity_available is retried by the SDK, charged nothing", async () => {
    const { ai, sent, billed } = await renterClient({ maxRetries: 1 });
    const err = await ai.chat.completions.create({ model: "meta-llama/Llama-3.1-8B-Instruct", messages: msgs }).catch((e) => e);
    expect(err.status).toBe(503);
    expect(sent).toHaveLength(2);
    expect((await billed()).requests).toBe(0);
  });
});
