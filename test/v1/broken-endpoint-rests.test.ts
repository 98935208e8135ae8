// An endpoint that fails after its first event (its stream drops mid-answer) is not tried elsewhere for that
// request, but it rests like an endpoint that failed before its first event: the requests that follow go to
// the others first. Failing fast, it has the fewest requests in flight, which the picker otherwise prefers.
import { afterAll, expect, it } from "vitest";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import { makeRenter } from "../helpers/fixtures.js";
import { useTestServer } from "../helpers/server.js";
import { startFakeVllm } from "./fake-vllm.js";
import { serveModel } from "./serving.js";

const srv = useTestServer({
  SVC_V1_TOKEN_RATES: JSON.stringify({ "*": { input: 1_000_000, output: 2_000_000 } }),
  SVC_JOB_SWEEP_MS: "60000",
  SVC_LIVENESS_SWEEP_SECONDS: "0",
});
const cleanup: (() => Promise<unknown>)[] = [];
afterAll(async () => {
  for (const f of cleanup) await f();
  expect(await ledgerProblems(srv.sql)).toEqual([]);
});

async function ask(key: string, model: string, stream: boolean) {
  const r = await fetch(`${srv.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({ model, messages: [{ role: "user", content: "hi" }], max_tokens: 20, stream }),
  });
  const text = await r.text();
  return { status: r.status, ok: r.status === 200 && !text.includes('"error"') };
}

for (const stream of [false, true]) {
  it(`${stream ? "streaming" : "non-streaming"}: once an endpoint broke off mid-answer, the next requests go to the endpoint that answers`, async () => {
    const model = stream ? "google/gemma-2-9b-it" : "meta-llama/Llama-3.1-8B-Instruct";
    const broken = await startFakeVllm(`broken-${stream}`, "break-stream");
    const good = await startFakeVllm(`good-${stream}`, "ok");
    cleanup.push(broken.close, good.close);
    await serveModel(srv, model, broken.url);
    await serveModel(srv, model, good.url);
    const renter = await makeRenter(srv, 1_000_000);
    // Until the broken endpoint was picked once (random among idle endpoints).
    for (let i = 0; i < 40 && broken.requests.length === 0; i++) await ask(renter.key, model, stream);
    expect(broken.requests).toHaveLength(1);
    const answers = [];
    for (let i = 0; i < 12; i++) answers.push(await ask(renter.key, model, stream));
    expect(answers.every((a) => a.ok)).toBe(true);
    expect(broken.requests).toHaveLength(1);
  });
}
