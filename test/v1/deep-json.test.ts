// JSON nested deep enough overflows the stack of anything that walks it recursively (JSON.stringify,
// the answer's assembly, the prompt's bound), though JSON.parse reads it. An endpoint's chunk nested
// too deep is that endpoint's failure (tried elsewhere before its first event, settled for what was
// delivered after it); a renter's request nested too deep is refused before anything is reserved.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import { stringBytes } from "../../src/domain/money/token-pricing.js";
import { jsonDepthExceeds, MAX_JSON_DEPTH } from "../../src/http/json-depth.js";
import { makeRenter } from "../helpers/fixtures.js";
import { client } from "../helpers/http.js";
import { useTestServer } from "../helpers/server.js";
import { chunk, startEvil, usageChunk, type Evil } from "./evil-upstream.js";
import { serveModel } from "./serving.js";

const LATE = "Qwen/Qwen2.5-7B-Instruct"; // the deep chunk comes after the first
const FIRST = "google/gemma-2-9b-it"; // the deep chunk is the first
const DEPTH = 60_000; // 300 KB of {"a": ..., well under the 1 MiB event limit
const nested = (depth: number) => '{"a":'.repeat(depth) + "1" + "}".repeat(depth);
const deep = nested(DEPTH);
const withDeep = (model: unknown) => JSON.stringify(chunk(model, { content: "!" })).replace('"content":"!"', `"content":"!","x":${deep}`);

const srv = useTestServer({
  SVC_V1_TOKEN_RATES: JSON.stringify({ "*": { input: 1_000_000, output: 1_000_000 } }), // 1 halala a token
  SVC_JOB_SWEEP_MS: "60000",
  SVC_LIVENESS_SWEEP_SECONDS: "0",
});
let evil: Evil;

beforeAll(async () => {
  evil = await startEvil((body) =>
    body.model === FIRST
      ? [withDeep(body.model), chunk(body.model, {}, "stop"), usageChunk(body.model, 20, 10)]
      : [
          chunk(body.model, { role: "assistant", content: "Here is a long and useful answer." }),
          withDeep(body.model),
          chunk(body.model, {}, "stop"),
          usageChunk(body.model, 20, 10),
        ],
  );
  await serveModel(srv, LATE, evil.url);
  await serveModel(srv, FIRST, evil.url);
});
afterAll(async () => {
  expect(await ledgerProblems(srv.sql)).toEqual([]);
  await evil?.close();
});

const rows = (renterId: number) =>
  srv.sql<{ state: string; cost_halala: number; completion_tokens: number }[]>`
    SELECT state, cost_halala::int, completion_tokens::int FROM v1_usage WHERE renter_id = ${renterId}`;
const ask = (key: string, model: string, stream: boolean) =>
  fetch(`${srv.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({ model, messages: [{ role: "user", content: "x" }], stream, max_tokens: 2000 }),
  }).then(async (r) => ({ status: r.status, text: await r.text() }));

describe("nesting", () => {
  it("is measured without recursion, at any depth", () => {
    const value = JSON.parse(deep);
    expect(jsonDepthExceeds(value)).toBe(true);
    expect(jsonDepthExceeds(JSON.parse(nested(MAX_JSON_DEPTH)))).toBe(false);
    expect(jsonDepthExceeds(JSON.parse(nested(MAX_JSON_DEPTH + 1)))).toBe(true);
    expect(jsonDepthExceeds([[[1]]], 3)).toBe(false);
    expect(jsonDepthExceeds([[[1]]], 2)).toBe(true);
    expect(jsonDepthExceeds("text", 0)).toBe(false);
    expect(stringBytes({ messages: [value, "abc"] })).toBe(3);
  });
});

describe("an endpoint's chunk nested too deep", () => {
  it("after its first event, unstreamed: the endpoint's failure (502), charged nothing", async () => {
    const renter = await makeRenter(srv, 10_000);
    const r = await ask(renter.key, LATE, false);
    expect(r.status).toBe(502);
    expect(JSON.parse(r.text).error).toMatchObject({ code: "provider_unavailable", message: expect.stringContaining(`nested deeper than ${MAX_JSON_DEPTH}`) });
    // Nothing reached the client: the reservation is released.
    expect(await rows(renter.id)).toMatchObject([{ state: "released" }]);
  });

  it("after its first event, streamed: the text delivered, an error event, billed", async () => {
    const renter = await makeRenter(srv, 10_000);
    const r = await ask(renter.key, LATE, true);
    expect(r.status).toBe(200);
    expect(r.text).toContain("Here is a long and useful answer.");
    expect(r.text).toContain('"code":"provider_unavailable"');
    const [row] = await rows(renter.id);
    expect(row.state).toBe("settled");
    expect(row.cost_halala).toBeGreaterThan(0);
  });

  it("as its first event: left for the next endpoint (none here), the reservation released", async () => {
    const renter = await makeRenter(srv, 10_000);
    const r = await ask(renter.key, FIRST, false);
    expect(r.status).toBe(502);
    expect(await rows(renter.id)).toEqual([{ state: "released", cost_halala: 0, completion_tokens: 0 }]);
  });
});

describe("a renter's request nested too deep", () => {
  it("is refused (400, naming the nesting) before anything is reserved or forwarded", async () => {
    const renter = await makeRenter(srv, 10_000);
    const before = evil.requests.length;
    for (const body of [
      `{"model":"${LATE}","messages":[{"role":"user","content":"x","meta":${deep}}]}`,
      `{"model":"${LATE}","messages":[{"role":"user","content":"x"}],"tools":[${deep}]}`,
    ]) {
      const r = await client(srv.url).call("POST", "/v1/chat/completions", body, { authorization: `Bearer ${renter.key}`, "content-type": "application/json" });
      expect(r.status).toBe(400);
      expect(r.body.error).toMatchObject({ code: "invalid_request", message: expect.stringContaining(`more than ${MAX_JSON_DEPTH} levels deep`) });
    }
    expect(await rows(renter.id)).toEqual([]);
    expect(evil.requests.length).toBe(before);
  });
});
