// svc_v1_upstream_errors_total counts the upstream attempts that failed: a client that leaves mid-stream
// is no failure of the endpoint (which was streaming along), so it is not counted there, as a client that
// leaves before anything was sent is not.
import { afterAll, beforeAll, expect, it } from "vitest";
import { makeRenter } from "../helpers/fixtures.js";
import { useTestServer } from "../helpers/server.js";
import { startFakeVllm, type FakeVllm } from "./fake-vllm.js";
import { serveModel } from "./serving.js";

const METRICS_TOKEN = "metrics-token-0123456789abcdef";
const MODEL = "google/gemma-2-9b-it";
const srv = useTestServer({ SVC_METRICS_TOKEN: METRICS_TOKEN, SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0" });
let slow: FakeVllm;
beforeAll(async () => {
  slow = await startFakeVllm("slow", "slow-stream");
  await serveModel(srv, MODEL, slow.url);
});
afterAll(() => slow?.close());

/** svc_v1_upstream_errors_total, all codes together. */
async function upstreamErrors(): Promise<number> {
  const r = await fetch(`${srv.url}/metrics`, { headers: { authorization: `Bearer ${METRICS_TOKEN}` } });
  expect(r.status).toBe(200);
  let n = 0;
  for (const m of (await r.text()).matchAll(/^svc_v1_upstream_errors_total\{[^}]*\} (\S+)$/gm)) n += Number(m[1]);
  return n;
}

it("a client that leaves mid-stream is not counted as a failed upstream attempt", async () => {
  const renter = await makeRenter(srv, 10_000);
  const before = await upstreamErrors();
  const aborted = slow.nextAbort();
  const ctl = new AbortController();
  const res = await fetch(`${srv.url}/v1/chat/completions`, {
    method: "POST",
    signal: ctl.signal,
    headers: { authorization: `Bearer ${renter.key}`, "content-type": "application/json" },
    body: JSON.stringify({ model: MODEL, messages: [{ role: "user", content: "hi" }], stream: true }),
  });
  expect(res.status).toBe(200);
  const reader = res.body!.getReader();
  let text = "";
  while (!text.includes('"content"')) text += new TextDecoder().decode((await reader.read()).value);
  ctl.abort();
  await aborted;
  // The request is over once it is settled (billed what was delivered).
  await expect.poll(async () => (await srv.sql`SELECT state FROM v1_usage WHERE renter_id = ${renter.id}`)[0]?.state, { timeout: 10_000 }).toBe("settled");
  expect(await upstreamErrors()).toBe(before);
});
