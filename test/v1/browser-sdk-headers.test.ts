// The official OpenAI JS SDK on a page of an allowed origin (dangerouslyAllowBrowser) sees only the response
// headers the answer exposes (CORS): the browser hides every other one. What the gateway says in headers for
// the SDK to act on (x-should-retry, which it obeys over the status; retry-after-ms) and what the docs tell a
// renter to read (what a request was charged, the per-key rate limit) is exposed on /v1 answers. Here the SDK
// runs with a fetch that does what a browser does with a cross-origin answer.
import OpenAI from "openai";
import { afterAll, beforeAll, expect, it } from "vitest";
import { makeRenter } from "../helpers/fixtures.js";
import { useTestServer } from "../helpers/server.js";
import { startFakeVllm, type FakeVllm } from "./fake-vllm.js";
import { serveModel } from "./serving.js";

const ORIGIN = "https://chat.example.org";
const MODEL = "Qwen/Qwen2.5-7B-Instruct";
const srv = useTestServer({
  CORS_ORIGINS: ORIGIN,
  SVC_V1_TOKEN_RATES: JSON.stringify({ "*": { input: 1_000_000, output: 2_000_000 } }),
  SVC_JOB_SWEEP_MS: "60000",
  SVC_LIVENESS_SWEEP_SECONDS: "0",
});
let vllm: FakeVllm;
beforeAll(async () => {
  vllm = await startFakeVllm("browser");
  await serveModel(srv, MODEL, vllm.url);
});
afterAll(() => vllm?.close());

/** Response headers a page may always read (the Fetch standard's CORS-safelisted response header names). */
const SAFELISTED = ["cache-control", "content-language", "content-length", "content-type", "expires", "last-modified", "pragma"];

/** A fetch as a page of ORIGIN makes one to the server: the Origin sent, and only the exposed headers shown. */
function browserFetch(sent: string[]) {
  return async (url: string | URL | Request, init?: RequestInit) => {
    const headers = new Headers(init?.headers);
    headers.set("origin", ORIGIN);
    sent.push(String(url));
    const res = await fetch(url, { ...init, headers });
    if (res.headers.get("access-control-allow-origin") !== ORIGIN) throw new TypeError("Failed to fetch (CORS)");
    const exposed = new Set([...SAFELISTED, ...(res.headers.get("access-control-expose-headers") ?? "").split(",").map((h) => h.trim().toLowerCase())]);
    const shown = new Headers();
    res.headers.forEach((v, k) => exposed.has(k) && shown.set(k, v));
    return new Response(res.body, { status: res.status, statusText: res.statusText, headers: shown });
  };
}

const pageClient = (key: string, sent: string[]) =>
  new OpenAI({ apiKey: key, baseURL: `${srv.url}/v1`, dangerouslyAllowBrowser: true, maxRetries: 2, fetch: browserFetch(sent) as typeof fetch });
const msgs = [{ role: "user" as const, content: "hi" }];

it("a spend-limit refusal, not retryable, is not retried by the SDK on a page (x-should-retry: false reaches it)", async () => {
  const renter = await makeRenter(srv, 10_000);
  await srv.sql`UPDATE renter_quota SET monthly_spend_limit_halala = 50 WHERE renter_id = ${renter.id}`;
  const sent: string[] = [];
  const err = await pageClient(renter.key, sent).chat.completions.create({ model: MODEL, messages: msgs, max_tokens: 1000 }).catch((e) => e);
  expect(err).toBeInstanceOf(OpenAI.APIError);
  expect(err.status).toBe(429);
  expect(err.error).toMatchObject({ code: "spend_limit_exceeded", retryable: false });
  expect(sent).toHaveLength(1);
});

it("a page reads what a request was charged from the answer's headers", async () => {
  const renter = await makeRenter(srv, 10_000);
  const sent: string[] = [];
  const { data, response } = await pageClient(renter.key, sent).chat.completions.create({ model: MODEL, messages: msgs }).withResponse();
  expect(data.choices[0].message.content).toBeTruthy();
  const [row] = await srv.sql<{ cost_halala: number }[]>`SELECT cost_halala FROM v1_usage WHERE renter_id = ${renter.id}`;
  expect(response.headers.get("x-svc-cost-halala")).toBe(String(row.cost_halala));
  expect(response.headers.get("x-svc-cost-micro-halala")).toMatch(/^\d+$/);
  expect(response.headers.get("x-request-id")).toMatch(/^req-/);
});
