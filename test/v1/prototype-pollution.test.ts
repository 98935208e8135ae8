// An endpoint's chunks are JSON.parse'd, which keeps a "__proto__" key as an own key: assembling a
// non-streamed answer must never follow or assign it (it would reach Object.prototype, and a "*"
// there becomes every model's rate in tokenRate), lookups by a client's string read own entries
// only, and counting metrics never fails a request (or leaves a rejection that ends the process).
import http from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import { DEFAULT_TOKEN_RATE, TOKEN_RATES, tokenRate } from "../../src/domain/money/token-pricing.js";
import { CompletionBuilder } from "../../src/http/v1/assemble.js";
import { createV1Handler } from "../../src/http/v1/router.js";
import type { NodeRequest, NodeResponse } from "../../src/http/rest.js";
import { createLogger } from "../../src/log.js";
import type { Metrics } from "../../src/metrics/metrics.js";
import { makeRenter } from "../helpers/fixtures.js";
import { client } from "../helpers/http.js";
import { useTestServer } from "../helpers/server.js";
import { chunk, startEvil, usageChunk, type Evil } from "./evil-upstream.js";
import { startFakeVllm, type FakeVllm } from "./fake-vllm.js";
import { serveModel } from "./serving.js";

const RATE = { input: 100_000_000, output: 100_000_000 };
const POLLUTION = `{"*":${JSON.stringify(RATE)},"polluted":true}`;
/** A chunk of the answer "ok" with "__proto__" keys wherever the assembly merges objects. */
const poisoned = (model: unknown) =>
  JSON.stringify(
    chunk(model, { role: "assistant", content: "ok", tool_calls: [{ index: 0, id: "c1", type: "function", function: { name: "f", arguments: "{}" } }] }, null, {
      logprobs: { content: [] },
    }),
  )
    .replace('"content":"ok"', `"content":"ok","__proto__":${POLLUTION},"meta":{"__proto__":${POLLUTION}},"constructor":{"prototype":${POLLUTION}}`)
    .replace('"logprobs":{', `"logprobs":{"__proto__":${POLLUTION},`)
    .replace('"finish_reason":null', `"finish_reason":null,"__proto__":${POLLUTION}`)
    .replace('"name":"f"', `"name":"f","__proto__":${POLLUTION}`)
    .replace('"id":"c1"', `"id":"c1","__proto__":${POLLUTION}`)
    .replace('"created":1', `"created":1,"__proto__":${POLLUTION}`);

const baseline = Object.getOwnPropertyNames(Object.prototype);
/** Keys added to Object.prototype since the file loaded (removed after each test, so one failure does not spread). */
const pollution = () => Object.getOwnPropertyNames(Object.prototype).filter((k) => !baseline.includes(k));
afterEach(() => {
  for (const k of pollution()) delete (Object.prototype as Record<string, unknown>)[k];
});

describe("assembling an answer", () => {
  it("never writes through a chunk's __proto__ keys, and builds the answer it would without them", () => {
    const b = new CompletionBuilder(1 << 20);
    expect(b.add(JSON.parse(poisoned("m")))).toBe(true);
    expect(b.add(JSON.parse(poisoned("m").replace('"content":"ok"', '"content":"!"')))).toBe(true);
    expect(pollution()).toEqual([]);
    expect(({} as Record<string, unknown>)["*"]).toBeUndefined();
    const json = b.build();
    expect(json).toMatchObject({ id: "chatcmpl-evil", object: "chat.completion", created: 1, model: "m" });
    const [choice] = json.choices as Record<string, unknown>[];
    const message = choice.message as Record<string, unknown>;
    expect(message.content).toBe("ok!");
    expect(message.tool_calls).toEqual([{ id: "c1", type: "function", function: { name: "ff", arguments: "{}{}" } }]);
    expect(Object.getPrototypeOf(message)).toBe(Object.prototype);
    expect(Object.getPrototypeOf(json)).toBe(Object.prototype);
    expect(JSON.stringify(json)).not.toContain("polluted");
  });

  it("tokenRate reads only a table's own entries", () => {
    const inherited = Object.create({ "*": RATE, "some/model": RATE });
    expect(tokenRate("some/model", inherited)).toEqual(DEFAULT_TOKEN_RATE);
    expect(tokenRate("Qwen/Qwen2.5-7B-Instruct", inherited)).toEqual(TOKEN_RATES["Qwen/Qwen2.5-7B-Instruct"]);
    for (const model of ["constructor", "__proto__", "toString", "hasOwnProperty"]) expect(tokenRate(model, {})).toEqual(DEFAULT_TOKEN_RATE);
  });
});

describe("through the gateway", () => {
  const MODEL = "TinyLlama/TinyLlama-1.1B-Chat-v1.0"; // built-in rate 20/60: no SVC_V1_TOKEN_RATES
  const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0" });
  let evil: Evil;
  beforeAll(async () => {
    evil = await startEvil((body) => [poisoned(body.model), chunk(body.model, {}, "stop"), usageChunk(body.model, 1, 1)]);
    await serveModel(srv, MODEL, evil.url);
  });
  afterAll(async () => {
    expect(await ledgerProblems(srv.sql)).toEqual([]);
    await evil?.close();
  });

  it("answers a poisoned answer as the answer it is, at the model's own rate, and keeps serving", async () => {
    const renter = await makeRenter(srv, 100_000);
    const auth = { authorization: `Bearer ${renter.key}` };
    for (let i = 0; i < 2; i++) {
      const r = await client(srv.url).post("/v1/chat/completions", { model: MODEL, messages: [{ role: "user", content: "hi" }] }, auth);
      expect(r.status).toBe(200);
      expect(r.body.choices[0].message.content).toBe("ok");
      expect(r.headers.get("x-svc-cost-micro-halala")).toBe(String(1 * 20 + 1 * 60));
      expect(pollution()).toEqual([]);
    }
    const rows = await srv.sql<{ state: string; cost_micro: string }[]>`SELECT state, cost_micro::text FROM v1_usage WHERE renter_id = ${renter.id}`;
    expect(rows).toEqual([
      { state: "settled", cost_micro: "80" },
      { state: "settled", cost_micro: "80" },
    ]);
    const streamed = await fetch(`${srv.url}/v1/chat/completions`, {
      method: "POST",
      headers: { ...auth, "content-type": "application/json" },
      body: JSON.stringify({ model: MODEL, messages: [{ role: "user", content: "hi" }], stream: true }),
    });
    expect(streamed.status).toBe(200);
    expect(await streamed.text()).toContain('"content":"ok"');
    expect(pollution()).toEqual([]);
  });

  describe("with metrics that throw", () => {
    let fake: FakeVllm;
    let gateway: http.Server;
    let url = "";
    /** What each call of the handler returned: a rejection there would be unhandled in the server. */
    const handled: Promise<boolean>[] = [];
    beforeAll(async () => {
      fake = await startFakeVllm("metrics");
      await serveModel(srv, "Qwen/Qwen2.5-7B-Instruct", fake.url);
      const broken = () => {
        throw new Error("metrics broke");
      };
      const failing = new Proxy({}, { get: () => broken }) as Metrics;
      const handleV1 = createV1Handler({ config: srv.config, sql: srv.sql, log: createLogger("silent"), metrics: failing });
      gateway = http.createServer((req, res) => {
        handled.push(handleV1(req as NodeRequest, res as NodeResponse, new URL(req.url ?? "/", "http://localhost")));
      });
      await new Promise<void>((r) => gateway.listen(0, "127.0.0.1", r));
      url = `http://127.0.0.1:${(gateway.address() as AddressInfo).port}`;
    });
    afterAll(async () => {
      await new Promise((r) => gateway?.close(r));
      await fake?.close();
    });

    it("answers and bills the request all the same, and the handler resolves", async () => {
      const renter = await makeRenter(srv, 100_000);
      const auth = { authorization: `Bearer ${renter.key}` };
      const r = await client(url).post("/v1/chat/completions", { model: "Qwen/Qwen2.5-7B-Instruct", messages: [{ role: "user", content: "hi" }] }, auth);
      expect(r.status).toBe(200);
      expect(r.body.choices[0].message.content).toBe("Hello from a provider GPU.");
      const failed = await client(url).post("/v1/chat/completions", { model: "no/such-model", messages: [{ role: "user", content: "hi" }] }, auth);
      expect(failed.status).toBe(404);
      expect(await Promise.allSettled(handled)).toEqual(handled.map(() => ({ status: "fulfilled", value: true })));
      const rows = await srv.sql<{ state: string }[]>`SELECT state FROM v1_usage WHERE renter_id = ${renter.id}`;
      expect(rows).toEqual([{ state: "settled" }]);
    });
  });
});
