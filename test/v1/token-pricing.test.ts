// Per-token prices: SVC_V1_TOKEN_RATES parsing (bad config refused at start),
// which rate a model gets (its own entry over "*" over the built-in table),
// the cost rounding, and, through the gateway, a model entry that differs from
// "*" billed at its own rate while another model pays "*".
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ConfigError, loadConfig } from "../../src/config.js";
import {
  affordableCompletionTokens,
  DEFAULT_TOKEN_RATE,
  parseTokenRates,
  TOKEN_RATES,
  tokenCostHalala,
  tokenRate,
} from "../../src/domain/money/token-pricing.js";
import { makeRenter } from "../helpers/fixtures.js";
import { useTestServer } from "../helpers/server.js";
import { PROMPT_TOKENS, REPLY_WORDS, startFakeVllm, type FakeVllm } from "./fake-vllm.js";
import { serveModel } from "./serving.js";

describe("parseTokenRates", () => {
  it("reads model entries and '*', and nothing when unset", () => {
    expect(parseTokenRates(undefined)).toEqual({});
    expect(parseTokenRates("")).toEqual({});
    expect(parseTokenRates("{}")).toEqual({});
    expect(parseTokenRates('{"m/a": {"input": 5, "output": 7}, "*": {"input": 0, "output": 1000000000000}}')).toEqual({
      "m/a": { input: 5, output: 7 },
      "*": { input: 0, output: 1e12 },
    });
    // Extra fields are ignored, only input and output are kept.
    expect(parseTokenRates('{"m": {"input": 1, "output": 2, "note": "x"}}')).toEqual({ m: { input: 1, output: 2 } });
  });

  it.each([
    ["not JSON", "{nope", /must be a JSON object/],
    ["an array", "[]", /must be a JSON object/],
    ["a number", "5", /must be a JSON object/],
    ["null", "null", /must be a JSON object/],
  ])("refuses %s", (_what, raw, message) => {
    expect(() => parseTokenRates(raw)).toThrow(message);
  });

  it.each([
    ["a missing output", { input: 1 }],
    ["a negative rate", { input: -1, output: 2 }],
    ["a fractional rate", { input: 1.5, output: 2 }],
    ["a rate given as a string", { input: "1", output: 2 }],
    ["a rate over 1e12", { input: 1, output: 1e12 + 1 }],
    ["a null rate", { input: 1, output: null }],
    ["an entry that is not an object", 5],
    ["a null entry", null],
  ])("refuses %s, naming the entry", (_what, entry) => {
    expect(() => parseTokenRates(JSON.stringify({ "ok/model": { input: 1, output: 1 }, "bad/model": entry }))).toThrow(/SVC_V1_TOKEN_RATES\["bad\/model"\]/);
  });

  it("a bad SVC_V1_TOKEN_RATES stops the service from starting (ConfigError)", () => {
    const env = { SVC_ADMIN_TOKEN: "t".repeat(32), SVC_HMAC_SECRET: "s".repeat(32), DATABASE_URL: "postgres://x@127.0.0.1/x" };
    expect(loadConfig({ ...env, SVC_V1_TOKEN_RATES: JSON.stringify({ "*": { input: 3, output: 4 } }) }).v1.tokenRates).toEqual({ "*": { input: 3, output: 4 } });
    for (const raw of ["{nope", JSON.stringify({ "*": { input: -3, output: 4 } })]) {
      expect(() => loadConfig({ ...env, SVC_V1_TOKEN_RATES: raw })).toThrow(ConfigError);
    }
  });
});

describe("tokenRate", () => {
  const builtIn = "google/gemma-2-9b-it";
  const own = { input: 1, output: 2 };
  const star = { input: 30, output: 40 };

  it("takes the model's own entry over '*', '*' over the built-in table, the built-in table over the default", () => {
    expect(tokenRate(builtIn, { [builtIn]: own, "*": star })).toEqual(own);
    expect(tokenRate("other/model", { [builtIn]: own, "*": star })).toEqual(star);
    expect(tokenRate(builtIn, { "*": star })).toEqual(star);
    expect(tokenRate(builtIn, { "other/model": own })).toEqual(TOKEN_RATES[builtIn]);
    expect(tokenRate(builtIn)).toEqual(TOKEN_RATES[builtIn]);
    expect(tokenRate("unknown/model")).toEqual(DEFAULT_TOKEN_RATE);
  });

  it("a zero rate is a rate, not a missing one", () => {
    expect(tokenRate(builtIn, { [builtIn]: { input: 0, output: 0 }, "*": star })).toEqual({ input: 0, output: 0 });
  });
});

describe("tokenCostHalala", () => {
  it("is the exact price rounded up to a whole halala, 0 only for no tokens", () => {
    const rate = { input: 100, output: 300 }; // halala per million tokens
    expect(tokenCostHalala(rate, 0, 0)).toBe(0);
    expect(tokenCostHalala(rate, 1, 0)).toBe(1); // 0.0001 halala
    expect(tokenCostHalala(rate, 0, 1)).toBe(1);
    expect(tokenCostHalala(rate, 10_000, 0)).toBe(1); // exactly 1
    expect(tokenCostHalala(rate, 10_001, 0)).toBe(2);
    expect(tokenCostHalala(rate, 10_000, 10_000)).toBe(4); // 1 + 3, exact
    expect(tokenCostHalala(rate, 5_000, 5_000)).toBe(2); // 0.5 + 1.5: rounded once, on the sum
    expect(tokenCostHalala(rate, 1_000_000, 1_000_000)).toBe(400);
    expect(tokenCostHalala({ input: 0, output: 0 }, 1_000_000, 1_000_000)).toBe(0);
    expect(tokenCostHalala({ input: 1_000_000, output: 2_000_000 }, PROMPT_TOKENS, REPLY_WORDS.length)).toBe(PROMPT_TOKENS + 2 * REPLY_WORDS.length);
  });

  it("never exceeds what affordableCompletionTokens promised the balance pays for", () => {
    const rate = { input: 137, output: 911 };
    for (const available of [1, 7, 100, 12_345]) {
      for (const prompt of [0, 1, 999, 50_000]) {
        const n = affordableCompletionTokens(rate, available, prompt);
        if (n < 0) {
          expect(tokenCostHalala(rate, prompt, 0)).toBeGreaterThan(available); // the prompt alone is too dear
          continue;
        }
        expect(tokenCostHalala(rate, prompt, n)).toBeLessThanOrEqual(available);
        expect(tokenCostHalala(rate, prompt, n + 1)).toBeGreaterThan(available); // and it is the most
      }
    }
    expect(affordableCompletionTokens({ input: 1, output: 0 }, 1, 1)).toBe(Number.MAX_SAFE_INTEGER);
  });
});

describe("through the gateway", () => {
  const OWN_MODEL = "TinyLlama/TinyLlama-1.1B-Chat-v1.0";
  const STAR_MODEL = "google/gemma-2-9b-it"; // has a built-in rate too; "*" replaces it
  const OWN = { input: 1_000_000, output: 2_000_000 }; // 1 and 2 halala per token
  const STAR = { input: 5_000_000, output: 7_000_000 }; // 5 and 7 halala per token
  let vllm: FakeVllm;

  const srv = useTestServer({ SVC_V1_TOKEN_RATES: JSON.stringify({ "*": STAR, [OWN_MODEL]: OWN }) });
  beforeAll(async () => {
    vllm = await startFakeVllm("pricing");
    await serveModel(srv, OWN_MODEL, vllm.url);
    await serveModel(srv, STAR_MODEL, vllm.url);
  });
  afterAll(() => vllm?.close());

  it("bills a model with its own entry at that rate, not at '*', and another model at '*'", async () => {
    const renter = await makeRenter(srv, 10_000);
    const ai = new OpenAI({ apiKey: renter.key, baseURL: `${srv.url}/v1`, maxRetries: 0 });
    const cost = async (model: string) => {
      const { response } = await ai.chat.completions.create({ model, messages: [{ role: "user", content: "hi" }] }).withResponse();
      return Number(response.headers.get("x-svc-cost-halala"));
    };
    expect(await cost(OWN_MODEL)).toBe(PROMPT_TOKENS * 1 + REPLY_WORDS.length * 2); // 23
    expect(await cost(STAR_MODEL)).toBe(PROMPT_TOKENS * 5 + REPLY_WORDS.length * 7); // 97

    const rows = await srv.sql<{ model: string; cost_halala: number }[]>`
      SELECT model, cost_halala FROM v1_usage WHERE renter_id = ${renter.id} ORDER BY created_at`;
    expect(rows).toEqual([
      { model: OWN_MODEL, cost_halala: 23 },
      { model: STAR_MODEL, cost_halala: 97 },
    ]);

    // GET /v1/models shows the same rates.
    const models = (await ai.models.list()).data as unknown as { id: string; pricing: unknown }[];
    expect(models.find((m) => m.id === OWN_MODEL)?.pricing).toEqual({ input_halala_per_million_tokens: OWN.input, output_halala_per_million_tokens: OWN.output });
    expect(models.find((m) => m.id === STAR_MODEL)?.pricing).toEqual({ input_halala_per_million_tokens: STAR.input, output_halala_per_million_tokens: STAR.output });
  });
});
