// What a client is shown of its usage is what its request was billed. An endpoint that reports no usage
// at all is billed by the gateway's estimate (usage_estimated on the request's row), and the client is
// shown that estimate where it would have been shown the endpoint's usage: in a non-streamed answer's
// `usage`, in the usage chunk under include_usage, and otherwise on the finishing chunk. A client that
// asked for the usage chunk of an endpoint that reported usage only on its chunks gets one too.
import { afterAll, beforeAll, expect, it } from "vitest";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import { makeRenter } from "../helpers/fixtures.js";
import { useTestServer } from "../helpers/server.js";
import { chunk, startEvil, type Evil } from "./evil-upstream.js";
import { serveModel } from "./serving.js";

const MODEL = "Qwen/Qwen2.5-7B-Instruct";
const srv = useTestServer({
  SVC_V1_TOKEN_RATES: JSON.stringify({ "*": { input: 1_000_000, output: 2_000_000 } }),
  SVC_JOB_SWEEP_MS: "60000",
  SVC_LIVENESS_SWEEP_SECONDS: "0",
});

/** Reports usage on its chunks (continuous_usage_stats) but sends no usage chunk. */
const CHUNK_USAGE_MODEL = "google/gemma-2-9b-it";
let evil: Evil;
let chunkUsage: Evil;
beforeAll(async () => {
  // No usage on any chunk, whatever stream_options asked for.
  evil = await startEvil((body) => [chunk(body.model, { role: "assistant", content: "Hello" }), chunk(body.model, { content: " there" }), chunk(body.model, {}, "stop")]);
  await serveModel(srv, MODEL, evil.url);
  const usage = (completion: number) => ({ usage: { prompt_tokens: 12, completion_tokens: completion, total_tokens: 12 + completion } });
  chunkUsage = await startEvil((body) => [
    { ...chunk(body.model, { role: "assistant", content: "Hello" }), ...usage(1) },
    { ...chunk(body.model, { content: " there" }), ...usage(2) },
    { ...chunk(body.model, {}, "stop"), ...usage(3) },
  ]);
  await serveModel(srv, CHUNK_USAGE_MODEL, chunkUsage.url);
});
afterAll(async () => {
  expect(await ledgerProblems(srv.sql)).toEqual([]);
  await evil?.close();
  await chunkUsage?.close();
});

const post = (key: string, body: Record<string, unknown>) =>
  fetch(`${srv.url}/v1/chat/completions`, { method: "POST", headers: { authorization: `Bearer ${key}`, "content-type": "application/json" }, body: JSON.stringify(body) });

async function billed(renterId: number, estimated = true) {
  const [row] = await srv.sql<{ prompt_tokens: number; completion_tokens: number; usage_estimated: boolean; state: string }[]>`
    SELECT prompt_tokens, completion_tokens, usage_estimated, state FROM v1_usage WHERE renter_id = ${renterId}`;
  expect(row).toMatchObject({ state: "settled", usage_estimated: estimated });
  expect(row.completion_tokens).toBeGreaterThan(0);
  return { prompt_tokens: row.prompt_tokens, completion_tokens: row.completion_tokens, total_tokens: row.prompt_tokens + row.completion_tokens };
}

const messages = [{ role: "user", content: "hi" }];
const events = (text: string) =>
  text
    .split("\n\n")
    .filter((e) => e.startsWith("data: ") && e !== "data: [DONE]")
    .map((e) => JSON.parse(e.slice(6)));

it("a non-streamed answer carries the estimated usage it was billed", async () => {
  const renter = await makeRenter(srv, 100_000);
  const res = await post(renter.key, { model: MODEL, messages });
  const json = await res.json();
  expect(res.status, JSON.stringify(json)).toBe(200);
  expect(json.choices[0].message.content).toBe("Hello there");
  expect(json.usage).toEqual(await billed(renter.id));
});

it("a stream with include_usage ends with a usage chunk of the estimate it was billed", async () => {
  const renter = await makeRenter(srv, 100_000);
  const res = await post(renter.key, { model: MODEL, messages, stream: true, stream_options: { include_usage: true } });
  const text = await res.text();
  expect(text.endsWith("data: [DONE]\n\n")).toBe(true);
  const last = events(text).at(-1);
  expect(last.choices).toEqual([]);
  expect(last.usage).toEqual(await billed(renter.id));
});

it("a stream without include_usage shows the estimate on its finishing chunk", async () => {
  const renter = await makeRenter(srv, 100_000);
  const res = await post(renter.key, { model: MODEL, messages, stream: true });
  const all = events(await res.text());
  const finishing = all.find((e) => e.choices?.[0]?.finish_reason === "stop");
  expect(finishing.usage).toEqual(await billed(renter.id));
  expect(all.filter((e) => e.usage)).toHaveLength(1);
});

it("a stream with include_usage from an endpoint that reported usage only on its chunks ends with a usage chunk of what it was billed", async () => {
  const renter = await makeRenter(srv, 100_000);
  const res = await post(renter.key, { model: CHUNK_USAGE_MODEL, messages, stream: true, stream_options: { include_usage: true } });
  const all = events(await res.text());
  const last = all.at(-1);
  expect(last.choices).toEqual([]);
  expect(last.usage).toEqual(await billed(renter.id, false));
  expect(last.usage).toMatchObject({ prompt_tokens: 12, completion_tokens: 3 });
  // Usage on the other chunks only when the client asked for continuous_usage_stats.
  expect(all.filter((e) => e.usage)).toHaveLength(1);
});
