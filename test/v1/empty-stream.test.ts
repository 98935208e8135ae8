// A stream that ends before its first event is the endpoint's failure, whether it ends bare or with
// `data: [DONE]`, and so is a first event that is JSON but not an object (`[]`): the next endpoint
// serving the model is asked, and with none left the reservation is released and the renter charged
// nothing (docs/v1.md). Before, an endpoint that answered 200 and sent only `data: [DONE]` was settled
// at the gateway's estimate (its provider paid for no token) and no other endpoint was tried.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import { makeRenter } from "../helpers/fixtures.js";
import { useTestServer } from "../helpers/server.js";
import { startEvil, type Evil } from "./evil-upstream.js";
import { PROMPT_TOKENS, REPLY_WORDS, startFakeVllm, type FakeVllm } from "./fake-vllm.js";
import { serveModel, type Serving } from "./serving.js";

const RATE = { input: 1_000_000, output: 2_000_000 }; // 1 halala per prompt token, 2 per completion token
const COST = PROMPT_TOKENS + 2 * REPLY_WORDS.length;
const srv = useTestServer({ SVC_V1_TOKEN_RATES: JSON.stringify({ "*": RATE }), SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0" });

/** Endpoints that answer 200 and then fail before a first event, by how. */
const FAILURES = {
  "only data: [DONE]": () => [],
  "a first event that is an array ([])": () => ["[]"],
  'a first event that is a string ("x")': () => ['"x"'],
} satisfies Record<string, () => string[]>;
type Failure = keyof typeof FAILURES;

const cleanup: (() => Promise<unknown>)[] = [];
afterAll(async () => {
  expect(await ledgerProblems(srv.sql)).toEqual([]);
  for (const f of cleanup) await f();
});

async function startBad(how: Failure): Promise<Evil> {
  const evil = await startEvil(FAILURES[how]);
  cleanup.push(evil.close);
  return evil;
}

async function balance(kind: "provider_earnings" | "renter_available", ownerId: number): Promise<number> {
  const [row] = await srv.sql<{ balance: number }[]>`SELECT balance FROM ledger_accounts WHERE kind = ${kind} AND owner_id = ${ownerId}`;
  return row?.balance ?? 0;
}

async function ask(key: string, model: string, stream: boolean) {
  const res = await fetch(`${srv.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({ model, messages: [{ role: "user", content: "x".repeat(400) }], stream }),
  });
  const text = await res.text();
  const requestId = res.headers.get("x-request-id")!;
  const [row] = await srv.sql<{ state: string; provider_id: number | null; cost_halala: number }[]>`
    SELECT state, provider_id, cost_halala FROM v1_usage WHERE request_id = ${requestId}`;
  return { status: res.status, text, row };
}

describe("the only endpoint serving the model fails before its first event", () => {
  const models: Record<Failure, string> = {
    "only data: [DONE]": "TinyLlama/TinyLlama-1.1B-Chat-v1.0",
    "a first event that is an array ([])": "microsoft/Phi-3-mini-4k-instruct",
    'a first event that is a string ("x")': "google/gemma-2-9b-it",
  };
  const serving = {} as Record<Failure, Serving>;
  beforeAll(async () => {
    for (const how of Object.keys(FAILURES) as Failure[]) serving[how] = await serveModel(srv, models[how], (await startBad(how)).url);
  });

  for (const how of Object.keys(FAILURES) as Failure[]) {
    for (const stream of [false, true]) {
      it(`${how} (stream ${stream}): 502 provider_unavailable, the reservation released, nothing charged or earned`, async () => {
        const renter = await makeRenter(srv, 100_000);
        const earned = await balance("provider_earnings", serving[how].provider.id);
        const a = await ask(renter.key, models[how], stream);
        expect(a.status, a.text).toBe(502);
        expect(JSON.parse(a.text).error).toMatchObject({ code: "provider_unavailable", retryable: true });
        expect(a.row).toMatchObject({ state: "released", cost_halala: 0 });
        expect((await balance("provider_earnings", serving[how].provider.id)) - earned).toBe(0);
        expect(await balance("renter_available", renter.id)).toBe(100_000);
      });
    }
  }
});

describe("an endpoint that fails before its first event is left for the next one", () => {
  const models: Record<Exclude<Failure, 'a first event that is a string ("x")'>, string> = {
    "only data: [DONE]": "Qwen/Qwen2.5-7B-Instruct",
    "a first event that is an array ([])": "meta-llama/Llama-3.1-8B-Instruct",
  };
  for (const [how, model] of Object.entries(models) as [Failure, string][]) {
    it(`${how}: the client gets the next endpoint's answer, billed once to its provider`, async () => {
      const bad = await startBad(how);
      const good: FakeVllm = await startFakeVllm("good");
      cleanup.push(good.close);
      await serveModel(srv, model, bad.url);
      const goodServing = await serveModel(srv, model, good.url);
      const renter = await makeRenter(srv, 100_000);
      // The picker's first choice is random among idle endpoints: ask until the bad one was tried (it then rests).
      const failedOver: Awaited<ReturnType<typeof ask>>[] = [];
      for (let i = 0; i < 30 && bad.requests.length === 0; i++) {
        for (const stream of [false, true]) {
          const before = bad.requests.length;
          const a = await ask(renter.key, model, stream);
          expect(a.status, a.text).toBe(200);
          expect(a.text).not.toContain('"error"');
          if (stream) expect(a.text.trimEnd().endsWith("data: [DONE]")).toBe(true);
          else expect(JSON.parse(a.text).choices[0].message.content).toBe(REPLY_WORDS.join(""));
          expect(a.row).toEqual({ state: "settled", provider_id: goodServing.provider.id, cost_halala: COST });
          if (bad.requests.length > before) failedOver.push(a);
        }
      }
      expect(failedOver, "the failing endpoint was never tried first").toHaveLength(1);
      expect(bad.requests).toHaveLength(1);
    });
  }
});
