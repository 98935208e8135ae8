// The per-renter /v1 rate limit: the 429 envelope with its retry fields
// (inside `error` and at the top level) and Retry-After, seen through the
// official openai client and on the wire.
import OpenAI from "openai";
import { afterAll, beforeAll, expect, it } from "vitest";
import { makeRenter } from "../helpers/fixtures.js";
import { client } from "../helpers/http.js";
import { startTestServer, type TestServer } from "../helpers/server.js";
import { startFakeVllm, type FakeVllm } from "./fake-vllm.js";
import { serveModel } from "./serving.js";

const MODEL = "TinyLlama/TinyLlama-1.1B-Chat-v1.0";
let srv: TestServer;
let vllm: FakeVllm;

beforeAll(async () => {
  srv = await startTestServer({ SVC_RATE_LIMITS: "on", SVC_V1_RATE_LIMIT_PER_MINUTE: "2" });
  vllm = await startFakeVllm("a");
  await serveModel(srv, MODEL, vllm.url);
});
afterAll(async () => {
  await vllm?.close();
  await srv?.close();
});

it("answers the request over the limit with 429 rate_limit_exceeded and retry fields; other renters are unaffected", async () => {
  const renter = await makeRenter(srv, 10_000);
  const openai = new OpenAI({ apiKey: renter.key, baseURL: `${srv.url}/v1`, maxRetries: 0 });
  const ask = () => openai.chat.completions.create({ model: MODEL, messages: [{ role: "user", content: "hi" }] });
  const first = await ask().withResponse();
  expect(first.response.headers.get("x-ratelimit-limit-requests")).toBe("2");
  expect(first.response.headers.get("x-ratelimit-remaining-requests")).toBe("1");
  await ask();

  const err = await ask().catch((e) => e);
  expect(err).toBeInstanceOf(OpenAI.RateLimitError);
  expect(err.status).toBe(429);
  expect(err.code).toBe("rate_limit_exceeded");
  expect(err.type).toBe("rate_limit_error");
  expect(err.error).toMatchObject({ status: 429, retryable: true });
  expect(err.error.retry_after_seconds).toBeGreaterThanOrEqual(1);
  expect(err.error.retry_after_seconds).toBeLessThanOrEqual(60);
  expect(err.headers.get("retry-after")).toBe(String(err.error.retry_after_seconds));
  expect(vllm.requests).toHaveLength(2);

  // On the wire: the same two fields at the top level too, and the OpenAI retry header in ms.
  const raw = await client(srv.url).post("/v1/chat/completions", { model: MODEL, messages: [{ role: "user", content: "hi" }] }, { authorization: `Bearer ${renter.key}` });
  expect(raw.status).toBe(429);
  const { error, retry_after_seconds, retry_after_ms } = raw.body;
  expect(Object.keys(error).sort()).toEqual(["code", "message", "retry_after_ms", "retry_after_seconds", "retryable", "status", "type"]);
  expect(retry_after_seconds).toBe(error.retry_after_seconds);
  expect(retry_after_ms).toBe(error.retry_after_ms);
  expect(retry_after_ms).toBeGreaterThan(0);
  expect(retry_after_ms).toBeLessThanOrEqual(60_000);
  expect(Math.ceil(retry_after_ms / 1000)).toBe(retry_after_seconds);
  expect(raw.headers.get("retry-after")).toBe(String(retry_after_seconds));
  expect(raw.headers.get("retry-after-ms")).toBe(String(retry_after_ms));

  // The budget is per renter: another renter still gets through.
  const other = await makeRenter(srv, 10_000);
  const ok = await new OpenAI({ apiKey: other.key, baseURL: `${srv.url}/v1`, maxRetries: 0 }).models.list();
  expect(ok.data.map((m) => m.id)).toContain(MODEL);
});
