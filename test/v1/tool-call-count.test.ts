// The completion bound allows COMPLETION_TOKENS_PER_TOOL_CALL per tool call: once per call, by its
// choice and call index, however many streamed deltas name it (an endpoint may repeat the name, or
// send it a character at a time), so a streamed answer is bounded as the same answer unstreamed.
// Only a request that offers tools and lets the model call them gets the allowance: vLLM parses no
// tool calls for any other (none offered, or tool_choice / function_call "none").
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import { COMPLETION_TOKENS_PER_CHOICE, COMPLETION_TOKENS_PER_TOOL_CALL, StreamedText } from "../../src/domain/money/token-pricing.js";
import { makeRenter } from "../helpers/fixtures.js";
import { client } from "../helpers/http.js";
import { useTestServer } from "../helpers/server.js";
import { chunk, startEvil, usageChunk, type Evil } from "./evil-upstream.js";
import { serveModel } from "./serving.js";

describe("StreamedText", () => {
  it("counts each tool call once, by choice and call index, whatever its deltas repeat", () => {
    const s = new StreamedText();
    const call = (index: number, name: string, args = "") => ({ index, function: { name, arguments: args } });
    s.add([{ index: 0, delta: { tool_calls: [call(0, "get"), call(1, "set")] } }]);
    s.add([{ index: 0, delta: { tool_calls: [call(0, "get", '{"a":1}')] } }]); // the same call named again
    s.add([{ index: 0, delta: { tool_calls: [{ index: 1, function: { arguments: "{}" } }] } }]);
    s.add([{ index: 1, delta: { tool_calls: [call(0, "g")] } }, { index: 1, delta: { tool_calls: [call(0, "et")] } }]); // another choice's call 0, its name in pieces
    s.add([{ index: 2, delta: { function_call: { name: "legacy", arguments: "" } } }, { index: 2, delta: { function_call: { name: "x" } } }]);
    s.add([{ index: 0, delta: { tool_calls: [call(2, "")] } }]); // no name: no call
    s.add(null);
    expect(s.delivered).toEqual({ bytes: 3 + 3 + 3 + 7 + 2 + 1 + 2 + 6 + 1, toolCalls: 4 });
  });
});

describe("through the gateway", () => {
  const MODEL = "Qwen/Qwen2.5-7B-Instruct";
  const DELTAS = 200;
  const CLAIMED = 100_000; // completion tokens the endpoint reports
  const TOOLS = [{ type: "function", function: { name: "f", parameters: { type: "object" } } }];
  const srv = useTestServer({
    SVC_V1_TOKEN_RATES: JSON.stringify({ "*": { input: 1_000_000, output: 1_000_000 } }), // 1 halala a token: visible figures
    SVC_JOB_SWEEP_MS: "60000",
    SVC_LIVENESS_SWEEP_SECONDS: "0",
  });
  let evil: Evil;

  beforeAll(async () => {
    evil = await startEvil((body) => [
      chunk(body.model, { role: "assistant", content: null, tool_calls: [{ index: 0, id: "call_1", type: "function", function: { name: "f", arguments: "" } }] }),
      // the same call (index 0), its name sent again in every delta: one byte each
      ...Array.from({ length: DELTAS - 1 }, () => chunk(body.model, { tool_calls: [{ index: 0, function: { name: "f" } }] })),
      chunk(body.model, {}, "tool_calls"),
      usageChunk(body.model, 20, CLAIMED),
    ]);
    await serveModel(srv, MODEL, evil.url);
  });
  afterAll(async () => {
    expect(await ledgerProblems(srv.sql)).toEqual([]);
    await evil?.close();
  });

  const completionTokens = async (renterId: number) =>
    (await srv.sql<{ completion_tokens: number }[]>`SELECT completion_tokens::int FROM v1_usage WHERE renter_id = ${renterId}`)[0].completion_tokens;

  async function billed(stream: boolean, tools: boolean | Record<string, unknown>): Promise<number> {
    const renter = await makeRenter(srv, 100_000);
    const offered = tools === true ? { tools: TOOLS } : tools === false ? {} : tools;
    const body = { model: MODEL, messages: [{ role: "user", content: "x" }], max_tokens: 5000, stream, ...offered };
    const r = await client(srv.url).post("/v1/chat/completions", body, { authorization: `Bearer ${renter.key}` });
    expect(r.status).toBe(200);
    if (stream) {
      expect(r.text.match(/"name":"f"/g)).toHaveLength(DELTAS); // 200 one-byte name pieces, no arguments
    } else {
      expect(r.body.choices[0].message.tool_calls).toHaveLength(1);
      expect(r.body.choices[0].message.tool_calls[0].function.name).toBe("f".repeat(DELTAS));
    }
    return completionTokens(renter.id);
  }

  it("bounds a streamed call as the same call unstreamed: its bytes, one choice, one call", async () => {
    const expected = DELTAS + COMPLETION_TOKENS_PER_CHOICE + COMPLETION_TOKENS_PER_TOOL_CALL;
    expect(await billed(true, true)).toBe(expected);
    expect(await billed(false, true)).toBe(expected);
  });

  it("gives no per-call allowance to calls in an answer to a request that offered no tools", async () => {
    const expected = DELTAS + COMPLETION_TOKENS_PER_CHOICE;
    expect(await billed(true, false)).toBe(expected);
    expect(await billed(false, false)).toBe(expected);
  });

  it("gives no per-call allowance when the request forbids calling the tools it lists", async () => {
    const expected = DELTAS + COMPLETION_TOKENS_PER_CHOICE;
    expect(await billed(true, { tools: TOOLS, tool_choice: "none" })).toBe(expected);
    expect(await billed(false, { functions: [TOOLS[0].function], function_call: "none" })).toBe(expected);
    // "auto" (or naming the tool) lets the model call it
    expect(await billed(false, { tools: TOOLS, tool_choice: "auto" })).toBe(expected + COMPLETION_TOKENS_PER_TOOL_CALL);
  });
});
