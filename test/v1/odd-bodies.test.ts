// Odd but JSON-valid bodies are answered 2xx or a 4xx in the /v1 envelope, never 500: the gateway reads
// (and bounds, and forwards) whatever a client sends without throwing on a shape it did not expect.
import { afterAll, expect, it } from "vitest";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import { makeRenter } from "../helpers/fixtures.js";
import { useTestServer } from "../helpers/server.js";
import { useServedEngine } from "./serving.js";

const MODEL = "Qwen/Qwen2.5-7B-Instruct";
const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0" });
useServedEngine(srv, MODEL);
afterAll(async () => {
  expect(await ledgerProblems(srv.sql)).toEqual([]);
});

const m = [{ role: "user", content: "hi" }];
const bodies: [string, unknown][] = [
  ["messages [null]", { model: MODEL, messages: [null] }],
  ["content parts [null]", { model: MODEL, messages: [{ role: "user", content: [null] }] }],
  ["stop numbers", { model: MODEL, messages: m, stop: [1, 2] }],
  ["stop object", { model: MODEL, messages: m, stop: { a: "b" } }],
  ["tools string", { model: MODEL, messages: m, tools: "x" }],
  ["logit_bias __proto__", JSON.parse(`{"model":"${MODEL}","messages":[{"role":"user","content":"hi"}],"logit_bias":{"__proto__":5}}`)],
  ["kwargs __proto__", JSON.parse(`{"model":"${MODEL}","messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":{"__proto__":{"x":1}}}`)],
  ["stream_options array", { model: MODEL, messages: m, stream: true, stream_options: [] }],
  ["n 16 max_tokens 1e7", { model: MODEL, messages: m, n: 16, max_tokens: 10_000_000 }],
  ["model __proto__", { model: "__proto__", messages: m }],
  ["model constructor", { model: "constructor", messages: m }],
  ["max_tokens 1.5", { model: MODEL, messages: m, max_tokens: 1.5 }],
  ["n 0", { model: MODEL, messages: m, n: 0 }],
  ["best_of string", { model: MODEL, messages: m, best_of: "1" }],
  ["messages object", { model: MODEL, messages: { 0: m[0], length: 1 } }],
  ["huge number", JSON.parse(`{"model":"${MODEL}","messages":[{"role":"user","content":"hi"}],"max_tokens":1e400}`)],
  ["logit_bias array", { model: MODEL, messages: m, logit_bias: [1] }],
  ["model lone surrogate", { model: "Qwen\ud800", messages: m }],
  ["tool_calls [null]", { model: MODEL, messages: [...m, { role: "assistant", content: "", tool_calls: [null] }] }],
  ["tool_calls function string", { model: MODEL, messages: [...m, { role: "assistant", content: "", tool_calls: [{ id: "c", type: "function", function: "f" }] }] }],
  ["tool_calls arguments number", { model: MODEL, messages: [...m, { role: "assistant", content: "", tool_calls: [{ id: "c", type: "function", function: { name: "f", arguments: 5 } }] }] }],
  ["tool_calls arguments lone surrogate", { model: MODEL, messages: [...m, { role: "assistant", content: "", tool_calls: [{ id: "c", type: "function", function: { name: "f", arguments: '"\ud800"' } }] }] }],
  ["tool_calls object", { model: MODEL, messages: [...m, { role: "assistant", content: "", tool_calls: { 0: {} } }] }],
  ["tools [null]", { model: MODEL, messages: m, tools: [null] }],
  ["tools object", { model: MODEL, messages: m, tools: { a: 1 } }],
  ["tools function array", { model: MODEL, messages: m, tools: [{ type: "function", function: [] }] }],
  ["min_tokens object", { model: MODEL, messages: m, min_tokens: {} }],
  ["min_tokens 1e300", { model: MODEL, messages: m, min_tokens: 1e300 }],
];

it.each(bodies)("%s: no 500", async (_name, body) => {
  const renter = await makeRenter(srv, 100_000_000);
  const res = await fetch(`${srv.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${renter.key}`, "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  const text = await res.text();
  expect(res.status, text).toBeLessThan(500);
  if (res.status >= 400) expect(JSON.parse(text).error?.message, text).toEqual(expect.any(String));
});
