// A request that can make the model generate special tokens (ignore_eos, a positive logit_bias, a
// positive min_tokens, which blocks the end of sequence until that many tokens exist) is forwarded
// with skip_special_tokens: false, so they are delivered and billed. vLLM's request model coerces
// what it is sent ("true" and 1 are True, "100" is 100.0, "1000" is 1000), so the gateway takes those
// fields only as JSON booleans and numbers (min_tokens: integers of 0 or more). include_reasoning is
// always forwarded as true: vLLM generates the reasoning anyway, and with false would leave it
// undelivered, so unbilled.
import { describe, expect, it } from "vitest";
import { makeRenter } from "../helpers/fixtures.js";
import { client } from "../helpers/http.js";
import { useTestServer } from "../helpers/server.js";
import { useServedEngine } from "./serving.js";

const MODEL = "Qwen/Qwen2.5-7B-Instruct";
const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0" });
const engine = useServedEngine(srv, MODEL);

async function ask(extra: Record<string, unknown>) {
  const renter = await makeRenter(srv, 100_000);
  const before = engine.fake.requests.length;
  const r = await client(srv.url).post("/v1/chat/completions", { model: MODEL, messages: [{ role: "user", content: "x" }], max_tokens: 1000, ...extra }, { authorization: `Bearer ${renter.key}` });
  const reserved = await srv.sql`SELECT 1 FROM v1_usage WHERE renter_id = ${renter.id}`;
  return { r, forwarded: engine.fake.requests.length > before ? engine.fake.requests.at(-1)! : undefined, reserved: reserved.length > 0 };
}

describe("fields that decide whether special tokens are delivered", () => {
  it.each([
    ["ignore_eos: true", false, { ignore_eos: true }],
    ["a positive logit_bias", false, { logit_bias: { "151643": 100 } }],
    // min_tokens blocks the end of sequence and stop tokens until that many tokens exist, as ignore_eos does past the end.
    ["min_tokens: 1000", false, { min_tokens: 1000 }],
    ["min_tokens: 1", false, { min_tokens: 1 }],
    ["min_tokens: 0", undefined, { min_tokens: 0 }],
    ["min_tokens: null", undefined, { min_tokens: null }],
    ["ignore_eos: false", undefined, { ignore_eos: false }],
    ["a negative logit_bias", undefined, { logit_bias: { "151643": -100 } }],
    ["neither", undefined, {}],
  ])("%s: forwarded with skip_special_tokens %s", async (_name, skip, extra) => {
    const { r, forwarded } = await ask(extra);
    expect(r.status).toBe(200);
    expect(forwarded?.skip_special_tokens).toBe(skip);
  });

  it.each([
    ['ignore_eos: "true"', { ignore_eos: "true" }, "ignore_eos must be a boolean"],
    ["ignore_eos: 1", { ignore_eos: 1 }, "ignore_eos must be a boolean"],
    ['ignore_eos: "false"', { ignore_eos: "false" }, "ignore_eos must be a boolean"],
    ['a logit_bias value "100"', { logit_bias: { "151643": "100" } }, 'logit_bias["151643"] is "100"'],
    ["a logit_bias value true", { logit_bias: { "1": 1, "151643": true } }, 'logit_bias["151643"] is true'],
    ["a logit_bias value null", { logit_bias: { "151643": null } }, "logit_bias values must be numbers"],
    ['min_tokens: "1000"', { min_tokens: "1000" }, 'min_tokens must be an integer of 0 or more ("1000" given)'],
    ["min_tokens: true", { min_tokens: true }, "min_tokens must be an integer of 0 or more (true given)"],
    ["min_tokens: 1.5", { min_tokens: 1.5 }, "min_tokens must be an integer of 0 or more (1.5 given)"],
    ["min_tokens: -1", { min_tokens: -1 }, "min_tokens must be an integer of 0 or more (-1 given)"],
    ["min_tokens: [1000]", { min_tokens: [1000] }, "min_tokens must be an integer of 0 or more ([1000] given)"],
  ])("%s (which vLLM would coerce): 400 naming the field, nothing reserved or forwarded", async (_name, extra, message) => {
    const { r, forwarded, reserved } = await ask(extra);
    expect(r.status).toBe(400);
    expect(r.body.error).toMatchObject({ code: "invalid_request", type: "invalid_request_error", message: expect.stringContaining(message) });
    expect(forwarded).toBeUndefined();
    expect(reserved).toBe(false);
  });
});

describe("include_reasoning", () => {
  it.each([false, "false", 0, null, true])("%j is forwarded as true", async (value) => {
    const { r, forwarded } = await ask({ include_reasoning: value });
    expect(r.status).toBe(200);
    expect(forwarded?.include_reasoning).toBe(true);
  });

  it("is not added to a request without it", async () => {
    const { r, forwarded } = await ask({});
    expect(r.status).toBe(200);
    expect(forwarded).not.toHaveProperty("include_reasoning");
  });
});
