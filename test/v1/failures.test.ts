// Upstream timeouts, streams that break off, and the price-cap reservation
// that keeps concurrent requests within the renter's balance.
import OpenAI from "openai";
import { afterAll, expect, it } from "vitest";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import { promptTokensBound } from "../../src/domain/money/token-pricing.js";
import { reserveTokenBudget } from "../../src/domain/money/usage-billing.js";
import { makeRenter } from "../helpers/fixtures.js";
import { client } from "../helpers/http.js";
import { startTestServer, useTestServer } from "../helpers/server.js";
import { startFakeVllm } from "./fake-vllm.js";
import { serveModel } from "./serving.js";

const RATE = { input: 1_000_000, output: 2_000_000 }; // 1 halala per prompt token, 2 per completion token
const cleanup: (() => Promise<unknown>)[] = [];

const srv = useTestServer({ SVC_V1_UPSTREAM_TIMEOUT_MS: "300", SVC_V1_TOKEN_RATES: JSON.stringify({ "*": RATE }) });
afterAll(async () => {
  expect(await ledgerProblems(srv.sql)).toEqual([]);
  for (const f of cleanup) await f();
});

const openai = (apiKey: string) => new OpenAI({ apiKey, baseURL: `${srv.url}/v1`, maxRetries: 0 });
const usageRows = (renterId: number) =>
  srv.sql<{ state: string; cost_halala: number; completion_tokens: number; usage_estimated: boolean }[]>`
    SELECT state, cost_halala, completion_tokens, usage_estimated FROM v1_usage WHERE renter_id = ${renterId} ORDER BY created_at`;

it("answers upstream_timeout (504, timeout_error, retryable) when the endpoint does not answer in time, and charges nothing", async () => {
  const model = "google/gemma-2-9b-it";
  const hang = await startFakeVllm("hang", "hang");
  cleanup.push(hang.close);
  await serveModel(srv, model, hang.url);
  const renter = await makeRenter(srv, 10_000);
  const err = await openai(renter.key)
    .chat.completions.create({ model, messages: [{ role: "user", content: "hi" }] })
    .catch((e) => e);
  expect(err).toBeInstanceOf(OpenAI.APIError);
  expect(err.status).toBe(504);
  expect(err.error).toMatchObject({ type: "timeout_error", code: "upstream_timeout", status: 504, retryable: true });
  expect(await usageRows(renter.id)).toMatchObject([{ state: "released", cost_halala: 0 }]);
});

it("ends a stream that breaks off with an error event in the envelope, and bills the chunks delivered", async () => {
  const model = "meta-llama/Llama-3.1-8B-Instruct";
  const broken = await startFakeVllm("broken", "break-stream");
  cleanup.push(broken.close);
  await serveModel(srv, model, broken.url);
  const renter = await makeRenter(srv, 10_000);
  const stream = await openai(renter.key).chat.completions.create({ model, messages: [{ role: "user", content: "hi" }], stream: true });
  let text = "";
  const err = await (async () => {
    for await (const c of stream) text += c.choices[0]?.delta?.content ?? "";
  })().catch((e) => e);
  expect(text).toBe("Hello from a");
  expect(err).toBeInstanceOf(OpenAI.APIError);
  expect(err.error).toMatchObject({ code: "provider_unavailable", retryable: true });
  const [row] = await usageRows(renter.id);
  expect(row).toMatchObject({ state: "settled", usage_estimated: true, completion_tokens: 3 });
  expect(row.cost_halala).toBeGreaterThanOrEqual(3 * 2);
});

it("reserves each request's price cap, so concurrent requests cannot promise more than the balance", async () => {
  const model = "humain-ai/ALLaM-7B-Instruct-preview";
  const slow = await startFakeVllm("slow", "slow-stream");
  cleanup.push(slow.close);
  await serveModel(srv, model, slow.url);
  const messages = [{ role: "user" as const, content: "hi" }];
  const maxTokens = 100;
  const cap = promptTokensBound({ messages }) * 1 + maxTokens * 2;
  const renter = await makeRenter(srv, cap + Math.floor(cap / 2)); // one cap fits, two do not
  const ai = openai(renter.key);

  const first = await ai.chat.completions.create({ model, messages, max_tokens: maxTokens, stream: true });
  const it = first[Symbol.asyncIterator]();
  await it.next(); // in flight
  const second = await ai.chat.completions.create({ model, messages, max_tokens: maxTokens }).catch((e) => e);
  expect(second.status).toBe(402);
  expect(second.error.code).toBe("insufficient_quota");
  expect(second.message).toMatch(/reserved by requests in flight/);
  while (!(await it.next()).done);

  // Once the first has settled (a small actual cost), the same request fits again.
  const third = await ai.chat.completions.create({ model, messages, max_tokens: maxTokens });
  expect(third.choices[0].message.content).toBeTruthy();
  expect((await usageRows(renter.id)).map((r) => r.state)).toEqual(["settled", "settled"]);
});

it("counts the price caps of requests in flight against a job's hold, so the two cannot promise the same funds", async () => {
  const model = "humain-ai/ALLaM-7B-Instruct-preview";
  const slow = await startFakeVllm("slow-jobs", "slow-stream");
  cleanup.push(slow.close);
  await serveModel(srv, model, slow.url);
  const messages = [{ role: "user" as const, content: "hi" }];
  const maxTokens = 100;
  const cap = promptTokensBound({ messages }) * 1 + maxTokens * 2;
  const renter = await makeRenter(srv, cap + 100);
  const api = client(srv.url);
  // 37 minutes of benchmark at 10 halala a minute: within the balance, not within what the request leaves free.
  const job = { job_type: "benchmark", duration_minutes: 37, params: { suite: "quick", iterations: 1 } };

  const first = await openai(renter.key).chat.completions.create({ model, messages, max_tokens: maxTokens, stream: true });
  const it = first[Symbol.asyncIterator]();
  await it.next(); // in flight, its cap reserved
  const refused = await api.post("/api/jobs/submit", job, renter.headers);
  expect(refused.status, refused.text).toBe(402);
  expect(refused.body.error).toMatch(/reserved by \/v1 requests in flight/);
  while (!(await it.next()).done);

  const [row] = await srv.sql<{ cost_halala: number; shortfall_halala: number }[]>`SELECT cost_halala, shortfall_halala FROM v1_usage WHERE renter_id = ${renter.id}`;
  expect(row.shortfall_halala).toBe(0);
  expect(row.cost_halala).toBeGreaterThan(0);
  // Once it settled, what is left is the job's to hold.
  const later = await api.post("/api/jobs/submit", { ...job, duration_minutes: Math.floor((cap + 100 - row.cost_halala) / 10) }, renter.headers);
  expect(later.status, later.text).not.toBe(402);
});

it("makes a job submit wait for a reservation being made for the same renter, then count it", async () => {
  const renter = await makeRenter(srv, 500);
  const job = { job_type: "benchmark", duration_minutes: 31, params: { suite: "quick", iterations: 1 } }; // holds 310
  let commit!: () => void;
  const committed = new Promise<void>((r) => (commit = r));
  let reservedNow!: () => void;
  const reserved = new Promise<void>((r) => (reservedNow = r));
  const reservation = srv.sql.begin(async (tx) => {
    const r = await reserveTokenBudget(tx, {
      requestId: `test-${renter.id}`, renterId: renter.id, model: "m", stream: false, rate: RATE, promptTokens: 100, maxTokens: 50, choices: 1, ttlSeconds: 60,
    });
    expect(r.reserved).toBe(200);
    reservedNow();
    await committed;
  });
  await reserved;
  let answered = false;
  const submit = client(srv.url).post("/api/jobs/submit", job, renter.headers).finally(() => (answered = true));
  await new Promise((r) => setTimeout(r, 300));
  expect(answered).toBe(false);
  commit();
  await reservation;
  const r = await submit;
  expect(r.status, r.text).toBe(402);
  expect(r.body.error).toMatch(/200 is reserved by \/v1 requests in flight/);
});

it("with private upstreams off (the production default) refuses endpoints on loopback, by address and by name", async () => {
  const strict = await startTestServer({ SVC_V1_PRIVATE_UPSTREAMS: "off" });
  const up = await startFakeVllm("private");
  try {
    const model = "TinyLlama/TinyLlama-1.1B-Chat-v1.0";
    await serveModel(strict, model, up.url); // http://127.0.0.1:port
    await serveModel(strict, model, up.url.replace("127.0.0.1", "localhost"));
    const renter = await makeRenter(strict, 10_000);
    const err = await new OpenAI({ apiKey: renter.key, baseURL: `${strict.url}/v1`, maxRetries: 0 }).chat.completions
      .create({ model, messages: [{ role: "user", content: "hi" }] })
      .catch((e) => e);
    expect(err.status).toBe(502);
    expect(err.error.code).toBe("provider_unavailable");
    expect(err.message).toMatch(/private address/);
    expect(up.requests).toHaveLength(0);
  } finally {
    await up.close();
    await strict.close();
  }
});
