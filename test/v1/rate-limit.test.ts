// The per-key /v1 rate limit: the 429 envelope with its retry fields
// (inside `error` and at the top level) and Retry-After, seen through the
// official openai client and on the wire.
import OpenAI from "openai";
import { afterAll, beforeAll, expect, it } from "vitest";
import { makeRenter } from "../helpers/fixtures.js";
import { client } from "../helpers/http.js";
import { useTestServer } from "../helpers/server.js";
import { startFakeVllm, type FakeVllm } from "./fake-vllm.js";
import { serveModel } from "./serving.js";

const MODEL = "TinyLlama/TinyLlama-1.1B-Chat-v1.0";
let vllm: FakeVllm;

const srv = useTestServer({ SVC_RATE_LIMITS: "on", SVC_V1_RATE_LIMIT_PER_MINUTE: "2" });
beforeAll(async () => {
  vllm = await startFakeVllm("a");
  await serveModel(srv, MODEL, vllm.url);
});
afterAll(() => vllm?.close());

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

  // The budget is per API key: another renter still gets through.
  const other = await makeRenter(srv, 10_000);
  const ok = await new OpenAI({ apiKey: other.key, baseURL: `${srv.url}/v1`, maxRetries: 0 }).models.list();
  expect(ok.data.map((m) => m.id)).toContain(MODEL);
  // The store holds hashes of keys only, never a credential.
  const subjects = await srv.sql`SELECT key FROM rate_limits WHERE key LIKE 'v1:%'`;
  expect(subjects.length).toBeGreaterThan(0);
  for (const { key } of subjects) {
    expect(key).toMatch(/^v1:key:[0-9a-f]{40}$/);
    expect(key).not.toContain(renter.key.slice("svc-renter-".length, 20));
  }
});

it("counts each key on its own, also two keys of one renter, and ignores a decoy key sent beside the real one", async () => {
  const renter = await makeRenter(srv, 10_000);
  const login = await client(srv.url).post("/api/renters/login-email", { email: (await client(srv.url).get("/api/renters/me", renter.headers)).body.renter.email });
  const second: string = login.body.api_key;
  expect(second).toMatch(/^svc-renter-/);
  const models = (headers: Record<string, string>) => client(srv.url).get("/v1/models", headers);
  expect((await models({ authorization: `Bearer ${renter.key}` })).status).toBe(200);
  expect((await models({ authorization: `Bearer ${renter.key}` })).status).toBe(200);
  expect((await models({ authorization: `Bearer ${renter.key}` })).status).toBe(429);
  expect((await models({ authorization: `Bearer ${second}` })).status).toBe(200);
  // A decoy key first, the exhausted real key second: still the real key's budget.
  expect((await models({ "x-renter-key": "svc-renter-decoydecoydecoy", authorization: `Bearer ${renter.key}` })).status).toBe(429);
});
