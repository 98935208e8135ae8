// A model server's refusal (400, 413, 422) is the client's to fix only if the
// engine is right. An endpoint that refuses gets a second opinion from the next
// endpoint serving the model: served there, the refuser was wrong (a broken
// engine, another model behind the name) and rests like a failed one, so it no
// longer draws the requests it turns away; refused there too, the client gets
// the refusal, charged nothing.
import { afterAll, expect, it } from "vitest";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import { makeRenter } from "../helpers/fixtures.js";
import { client } from "../helpers/http.js";
import { useTestServer } from "../helpers/server.js";
import { REPLY_WORDS, startFakeVllm } from "./fake-vllm.js";
import { serveModel } from "./serving.js";

const cleanup: (() => Promise<unknown>)[] = [];
const srv = useTestServer({ SVC_V1_TOKEN_RATES: JSON.stringify({ "*": { input: 1_000_000, output: 2_000_000 } }) });
afterAll(async () => {
  expect(await ledgerProblems(srv.sql)).toEqual([]);
  for (const f of cleanup) await f();
});

const ask = (key: string, model: string) =>
  client(srv.url).post("/v1/chat/completions", { model, messages: [{ role: "user", content: "hi" }] }, { authorization: `Bearer ${key}` });

it("asks a second endpoint when one refuses a request: served there, the refuser rests; refused by both, the client gets the refusal", async () => {
  const model = "Qwen/Qwen2.5-7B-Instruct";
  const refuser = await startFakeVllm("refuser", "refuse400");
  const good = await startFakeVllm("good");
  cleanup.push(refuser.close, good.close);
  await serveModel(srv, model, refuser.url);
  const goodServing = await serveModel(srv, model, good.url);
  const renter = await makeRenter(srv, 100_000);

  // Whichever is tried first, every request is served by the good endpoint; once the refuser was
  // overruled it rests, so it sees one request while the good one serves all of them.
  for (let i = 0; i < 20; i++) {
    const a = await ask(renter.key, model);
    expect(a.status).toBe(200);
    expect(a.body.choices[0].message.content).toBe(REPLY_WORDS.join(""));
  }
  expect(refuser.requests.length).toBeLessThanOrEqual(1);
  expect(good.requests).toHaveLength(20);
  const settled = await srv.sql<{ provider_id: number }[]>`SELECT DISTINCT provider_id FROM v1_usage WHERE renter_id = ${renter.id} AND state = 'settled'`;
  expect(settled).toEqual([{ provider_id: goodServing.provider.id }]);

  // A model served only by refusers: the client gets the model server's refusal, and is charged nothing.
  const onlyRefusers = "microsoft/Phi-3-mini-4k-instruct";
  const r1 = await startFakeVllm("refuser-1", "refuse400");
  const r2 = await startFakeVllm("refuser-2", "refuse400");
  cleanup.push(r1.close, r2.close);
  await serveModel(srv, onlyRefusers, r1.url);
  await serveModel(srv, onlyRefusers, r2.url);
  const refused = await ask(renter.key, onlyRefusers);
  expect(refused.status).toBe(400);
  expect(refused.body).toMatchObject({ error: { message: "This model's maximum context length is 16 tokens", type: "invalid_request_error" } });
  // Both were asked, once each: a second opinion, not a search of every endpoint.
  expect(r1.requests.length + r2.requests.length).toBe(2);
  const [row] = await srv.sql<{ state: string; cost_halala: number | null }[]>`SELECT state, cost_halala FROM v1_usage WHERE request_id = ${refused.headers.get("x-request-id")}`;
  expect(row.state).toBe("released");
});
