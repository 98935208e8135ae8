// A request to the renter's own serving job is free (its GPU is paid by the
// minute) and reserves nothing, so one that names no max_tokens is forwarded
// without one: the model's own limit applies, not the 4,096 tokens a paid
// request is given for its price cap. A limit the request names is forwarded.
import { afterAll, beforeAll, expect, it } from "vitest";
import { makeRenter } from "../helpers/fixtures.js";
import { useTestServer } from "../helpers/server.js";
import { startFakeVllm, type FakeVllm } from "./fake-vllm.js";
import { serveModel, type Serving } from "./serving.js";

const OWN_MODEL = "google/gemma-2-9b-it";
const PAID_MODEL = "TinyLlama/TinyLlama-1.1B-Chat-v1.0";
const srv = useTestServer({
  SVC_V1_TOKEN_RATES: JSON.stringify({ "*": { input: 1_000_000, output: 2_000_000 } }),
  SVC_JOB_SWEEP_MS: "60000",
  SVC_LIVENESS_SWEEP_SECONDS: "0",
});

let own: FakeVllm;
let paid: FakeVllm;
let serving: Serving;
beforeAll(async () => {
  own = await startFakeVllm("own");
  paid = await startFakeVllm("paid");
  serving = await serveModel(srv, OWN_MODEL, `${own.url}/v1`, { public: false, owner: await makeRenter(srv, 100_000) });
  await serveModel(srv, PAID_MODEL, `${paid.url}/v1`);
});
afterAll(async () => {
  await own?.close();
  await paid?.close();
});

const ask = async (model: string, extra: Record<string, unknown> = {}) => {
  const res = await fetch(`${srv.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${serving.owner.key}`, "content-type": "application/json" },
    body: JSON.stringify({ model, messages: [{ role: "user", content: "hi" }], ...extra }),
  });
  expect(res.status, await res.text()).toBe(200);
};

it("forwards a request to the renter's own endpoint without max_tokens when it names none", async () => {
  await ask(OWN_MODEL);
  expect(own.requests.at(-1)).not.toHaveProperty("max_tokens");
  expect(own.requests.at(-1)).not.toHaveProperty("max_completion_tokens");
  const [row] = await srv.sql`SELECT state, reserved_halala, cost_halala FROM v1_usage WHERE renter_id = ${serving.owner.id} AND model = ${OWN_MODEL}`;
  expect(row).toMatchObject({ state: "settled", reserved_halala: 0, cost_halala: 0 });
});

it("forwards the limit a request to its own endpoint names", async () => {
  await ask(OWN_MODEL, { max_completion_tokens: 50_000 });
  expect(own.requests.at(-1)).toMatchObject({ max_tokens: 50_000, max_completion_tokens: 50_000 });
});

it("still gives a paid request without max_tokens the default limit its price cap is reserved for", async () => {
  await ask(PAID_MODEL);
  expect(paid.requests.at(-1)).toMatchObject({ max_tokens: 4096 });
});
