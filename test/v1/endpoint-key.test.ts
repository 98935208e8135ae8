// A serving endpoint's own secret. A provider's daemon starts vLLM with a key
// made for the job (VLLM_API_KEY) and reports it with endpoint-ready
// (`endpoint_api_key`); the /v1 gateway sends it upstream as a Bearer token, so
// the published port serves nobody else. The key is in no read of the job (its
// renter's, its provider's, an admin's, the lists, history, events, receipt,
// webhook) and in no log line of the server, and it is forgotten when the job's
// attempt ends however it ends. A report without one (a daemon from before
// per-job keys) is served as before, with no credential.
import crypto from "node:crypto";
import os from "node:os";
import path from "node:path";
import { Writable } from "node:stream";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { loadConfig } from "../../src/config.js";
import { connect } from "../../src/db/index.js";
import { startApp } from "../../src/server.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { client } from "../helpers/http.js";
import { ADMIN_TOKEN, HMAC_SECRET, freshDatabase, type TestServer } from "../helpers/server.js";
import { REPLY_WORDS, startFakeVllm, type FakeVllm } from "./fake-vllm.js";

const MODEL = "TinyLlama/TinyLlama-1.1B-Chat-v1.0";
const ADMIN = { "x-admin-token": ADMIN_TOKEN };

let srv: TestServer;
/** Everything the server logged, at every level, unredacted: the key must not be in it at all. */
let logs = "";
const fakes: FakeVllm[] = [];

beforeAll(async () => {
  const db = await freshDatabase();
  const sink = new Writable({
    write(chunk, _enc, cb) {
      logs += chunk;
      cb();
    },
  });
  const config = loadConfig({
    SVC_ADMIN_TOKEN: ADMIN_TOKEN, SVC_HMAC_SECRET: HMAC_SECRET, DATABASE_URL: db.url, PORT: "0", HOST: "127.0.0.1",
    SVC_DATA_DIR: path.join(os.tmpdir(), "svc-test-data"), SVC_RATE_LIMITS: "off",
    // The sweeps stay off: nothing but the test ends these jobs.
    SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0",
  });
  const app = await startApp(config, { log: pino({ level: "trace" }, sink) });
  const sql = connect(db.url, 4);
  srv = {
    app, url: app.url, port: app.port, sql, config, databaseUrl: db.url,
    async close() {
      await sql.end();
      await app.close();
      await db.drop();
    },
  };
});
afterAll(async () => {
  for (const f of fakes) await f.close();
  await srv?.close();
});

const api = () => client(srv.url);
const newKey = () => crypto.randomBytes(32).toString("base64url");

async function fakeVllm(apiKey?: string) {
  const f = await startFakeVllm("keyed", "ok", { apiKey });
  fakes.push(f);
  return f;
}

/** A renter's own vllm_serve job on a fresh provider, not yet reported. */
async function servingJob(renterOpts: { webhook?: boolean } = {}) {
  const provider = await makeProvider(srv, { vramMib: 81920, gpuModel: "NVIDIA H100 80GB HBM3" });
  const renter = await makeRenter(srv, 100_000);
  if (renterOpts.webhook) await srv.sql`UPDATE renters SET webhook_url = 'https://hooks.invalid/svc', webhook_secret = 'whsec-test' WHERE id = ${renter.id}`;
  const submit = await api().post(
    "/api/jobs/submit",
    { job_type: "vllm_serve", params: { model: MODEL }, provider_id: provider.id, duration_minutes: 60, max_duration_seconds: 3600 },
    renter.headers,
  );
  expect(submit.status, submit.text).toBe(201);
  const jobId = submit.body.job.job_id as string;
  expect((await api().get(`/api/providers/${provider.key}/jobs`)).body.job?.job_id).toBe(jobId);
  return { provider, renter, jobId };
}

async function reportReady(s: { provider: { key: string }; jobId: string }, endpointUrl: string, apiKey?: string) {
  const r = await api().post(`/api/jobs/${s.jobId}/endpoint-ready`, { api_key: s.provider.key, endpoint_url: endpointUrl, model: MODEL, ...(apiKey ? { endpoint_api_key: apiKey } : {}) });
  expect(r.status, r.text).toBe(200);
  expect(r.text).not.toContain(apiKey ?? "\u0000");
  return r;
}

async function storedKey(jobId: string): Promise<string | null> {
  const [row] = await srv.sql<{ endpoint_api_key: string | null }[]>`SELECT endpoint_api_key FROM jobs WHERE job_id = ${jobId}`;
  return row.endpoint_api_key;
}

function chat(renterKey: string, stream = false) {
  return fetch(`${srv.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${renterKey}`, "content-type": "application/json" },
    body: JSON.stringify({ model: MODEL, messages: [{ role: "user", content: "Hi" }], max_tokens: 16, stream }),
  });
}

/** A response's status, headers and body as one text, to search for the key. */
async function whole(res: Response): Promise<{ status: number; text: string }> {
  const body = await res.text();
  return { status: res.status, text: `${res.status}\n${[...res.headers].map(([k, v]) => `${k}: ${v}`).join("\n")}\n\n${body}` };
}

describe("a serving endpoint's key", () => {
  it("is what the gateway sends upstream (Bearer); the endpoint refuses anyone without it", async () => {
    const key = newKey();
    const vllm = await fakeVllm(key);
    // The fake checks, as vLLM does: no key, a wrong key, the key.
    const direct = (authorization?: string) =>
      fetch(`${vllm.url}/v1/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json", ...(authorization ? { authorization } : {}) },
        body: JSON.stringify({ model: MODEL, messages: [{ role: "user", content: "free GPU?" }] }),
      });
    expect((await direct()).status).toBe(401);
    expect((await direct(`Bearer ${newKey()}`)).status).toBe(401);
    expect((await direct(`Bearer ${key}`)).status).toBe(200);
    vllm.authorizations.length = 0;
    vllm.refused = 0;

    const s = await servingJob();
    await reportReady(s, `${vllm.url}/v1`, key);
    expect(await storedKey(s.jobId)).toBe(key);

    const res = await whole(await chat(s.renter.key));
    expect(res.status, res.text).toBe(200);
    expect(res.text).toContain(REPLY_WORDS.join(""));
    const streamed = await whole(await chat(s.renter.key, true));
    expect(streamed.status, streamed.text).toBe(200);
    expect(streamed.text).toContain("[DONE]");
    expect(vllm.authorizations).toEqual([`Bearer ${key}`, `Bearer ${key}`]);
    expect(vllm.refused).toBe(0);
    // Nothing of it reaches the renter.
    expect(res.text).not.toContain(key);
    expect(streamed.text).not.toContain(key);
  });

  it("absent (a daemon from before per-job keys), the gateway sends no credential, and a keyed endpoint refuses it", async () => {
    const key = newKey();
    const vllm = await fakeVllm(key);
    const s = await servingJob();
    await reportReady(s, `${vllm.url}/v1`);
    expect(await storedKey(s.jobId)).toBeNull();
    const refused = await whole(await chat(s.renter.key));
    expect(refused.status).toBeGreaterThanOrEqual(500);
    expect(vllm.authorizations).toEqual([undefined]);
    expect(vllm.refused).toBe(1);

    // Reported again with the key, the same endpoint serves.
    await reportReady(s, `${vllm.url}/v1`, key);
    const served = await whole(await chat(s.renter.key));
    expect(served.status, served.text).toBe(200);
    expect(vllm.authorizations.at(-1)).toBe(`Bearer ${key}`);

    // An endpoint that wants no key is served as before: the gateway sends none.
    const open = await fakeVllm();
    const t = await servingJob();
    await reportReady(t, `${open.url}/v1`);
    expect((await chat(t.renter.key)).status).toBe(200);
    expect(open.authorizations).toEqual([undefined]);
  });

  it("a report whose key could not be a header value is refused, naming the field", async () => {
    const s = await servingJob();
    for (const bad of ["with space", "line\nbreak", "x".repeat(513), "caf\u00e9"]) {
      const r = await api().post(`/api/jobs/${s.jobId}/endpoint-ready`, { api_key: s.provider.key, endpoint_url: "http://127.0.0.1:9/v1", endpoint_api_key: bad });
      expect(r.status, r.text).toBe(400);
      expect(r.body.error).toMatch(/endpoint_api_key/);
    }
    expect(await storedKey(s.jobId)).toBeNull();
  });

  it("is in no read of the job, no list, history, event, receipt or webhook, and in no log line of the server", async () => {
    const key = newKey();
    const vllm = await fakeVllm(key);
    const s = await servingJob({ webhook: true });
    const logsBefore = logs.length;
    await reportReady(s, `${vllm.url}/v1`, key);
    expect((await chat(s.renter.key)).status).toBe(200);
    expect(vllm.authorizations).toEqual([`Bearer ${key}`]); // the key was reported and used
    expect(await storedKey(s.jobId)).toBe(key);

    const reads: [string, Record<string, string>][] = [
      [`/api/jobs/${s.jobId}`, s.renter.headers],
      [`/api/jobs/${s.jobId}`, s.provider.headers],
      [`/api/jobs/${s.jobId}`, ADMIN],
      ["/api/jobs", s.renter.headers],
      ["/api/jobs", s.provider.headers],
      ["/api/admin/jobs", ADMIN],
      [`/api/admin/jobs?job_type=vllm_serve`, ADMIN],
      [`/api/jobs/${s.jobId}/history`, s.renter.headers],
      [`/api/jobs/${s.jobId}/history`, s.provider.headers],
      [`/api/jobs/${s.jobId}/logs`, s.renter.headers],
      [`/api/providers/me`, s.provider.headers],
      [`/api/admin/dashboard`, ADMIN],
    ];
    const seen: string[] = [];
    for (const [route, headers] of reads) {
      const r = await api().get(route, headers);
      expect(r.status, `${route}: ${r.text}`).toBe(200);
      seen.push(r.text);
    }
    // The running job's event stream: its first event.
    const ctl = new AbortController();
    const events = await fetch(`${srv.url}/api/jobs/${s.jobId}/events`, { headers: s.renter.headers, signal: ctl.signal });
    expect(events.status).toBe(200);
    const first = await events.body!.getReader().read();
    seen.push(Buffer.from(first.value ?? []).toString("utf8"));
    ctl.abort();
    expect(seen.join("\n")).toContain(s.jobId);

    // Ended: its receipt and the renter's webhook.
    const cancel = await api().post(`/api/jobs/${s.jobId}/cancel`, {}, s.renter.headers);
    expect(cancel.status, cancel.text).toBe(200);
    seen.push(cancel.text);
    const receipt = await api().get(`/api/jobs/${s.jobId}/receipt`, s.renter.headers);
    expect(receipt.status, receipt.text).toBe(200);
    seen.push(receipt.text);
    seen.push((await api().get(`/api/jobs/${s.jobId}`, ADMIN)).text);
    const hooks = await srv.sql<{ body: string }[]>`SELECT body FROM webhook_outbox WHERE renter_id = ${s.renter.id}`;
    expect(hooks.length).toBeGreaterThan(0);
    seen.push(...hooks.map((h) => h.body));

    for (const text of seen) expect(text).not.toContain(key);
    // The server logged these calls (the /v1 request among them), and the key nowhere.
    const logged = logs.slice(logsBefore);
    expect(logged).toContain("/v1/chat/completions");
    expect(logged).toContain("endpoint-ready");
    expect(logged).not.toContain(key);
  });
});

describe("the stored key is forgotten when the attempt ends", () => {
  async function keyedRunning() {
    const s = await servingJob();
    const key = newKey();
    await reportReady(s, "http://127.0.0.1:9/v1", key);
    // Kept while the job runs: a progress report or a log line does not touch it.
    await api().post(`/api/jobs/${s.jobId}/progress`, { api_key: s.provider.key, progress_pct: 100, phase: "serving" });
    await api().post(`/api/jobs/${s.jobId}/logs`, { api_key: s.provider.key, logs: ["serving"] });
    expect(await storedKey(s.jobId)).toBe(key);
    return s;
  }

  it("cancelled by its renter", async () => {
    const s = await keyedRunning();
    expect((await api().post(`/api/jobs/${s.jobId}/cancel`, {}, s.renter.headers)).status).toBe(200);
    expect(await storedKey(s.jobId)).toBeNull();
  });

  it("ended by its provider's result, a success or a failure", async () => {
    const s = await keyedRunning();
    const done = await api().post("/api/providers/job-result", { api_key: s.provider.key, job_id: s.jobId, success: true, result: { served: true } });
    expect(done.status, done.text).toBe(200);
    expect(await storedKey(s.jobId)).toBeNull();

    const f = await keyedRunning();
    const failed = await api().post("/api/providers/job-result", { api_key: f.provider.key, job_id: f.jobId, success: false, error: "engine died", fault: "renter" });
    expect(failed.status, failed.text).toBe(200);
    expect(await storedKey(f.jobId)).toBeNull();
  });

  it("re-queued (an admin's hand, or its provider handing it back): the next attempt starts without it", async () => {
    const s = await keyedRunning();
    const r = await api().post(`/api/admin/jobs/${s.jobId}/requeue`, { reason: "maintenance" }, ADMIN);
    expect(r.status, r.text).toBe(200);
    expect(await storedKey(s.jobId)).toBeNull();

    const t = await keyedRunning();
    const back = await api().post("/api/providers/job-result", {
      api_key: t.provider.key, job_id: t.jobId, success: false, error: "stopping", fault: "provider", end_reason: "provider_interrupted",
    });
    expect(back.status, back.text).toBe(200);
    expect(await storedKey(t.jobId)).toBeNull();
  });

  it("by the admin's cancel too, and the gateway no longer routes to it", async () => {
    const key = newKey();
    const vllm = await fakeVllm(key);
    const s = await servingJob();
    await reportReady(s, `${vllm.url}/v1`, key);
    expect((await chat(s.renter.key)).status).toBe(200);
    expect((await api().post(`/api/admin/jobs/${s.jobId}/cancel`, { reason: "done" }, ADMIN)).status).toBe(200);
    expect(await storedKey(s.jobId)).toBeNull();
    expect((await chat(s.renter.key)).status).not.toBe(200);
    expect(vllm.authorizations).toEqual([`Bearer ${key}`]);
  });
});
