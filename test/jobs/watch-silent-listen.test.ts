// The job-watch hub's LISTEN connection can go silent without an error (its
// host gone without a reset) until TCP's keepalive notices, minutes later; no
// notice arrives meanwhile. The hub probes it (src/workers/listen-probe.ts):
// while a probe goes unanswered past its grace, every watched job is read at
// each probe interval, so watchers still get the job's events and its outcome.
// The pool reaches PostgreSQL through a TCP proxy that can hold back what the
// LISTEN connection is sent.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { freshDatabase, startTestServer, type TestServer } from "../helpers/server.js";
import { DbProxy } from "../helpers/db-proxy.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { PROBE_GRACE_MS, PROBE_INTERVAL_MS } from "../../src/workers/listen-probe.js";
import { openSse } from "./watch-helpers.js";

let db: Awaited<ReturnType<typeof freshDatabase>>;
let proxy: DbProxy;
let srv: TestServer;
beforeAll(async () => {
  db = await freshDatabase();
  const front = await DbProxy.inFrontOf(db.url);
  proxy = front.proxy;
  srv = await startTestServer({ SVC_JOB_SWEEP_MS: "60000" }, front.url);
}, 60_000);
afterAll(async () => {
  proxy?.releaseAnswers();
  await srv?.close();
  await proxy?.close();
  await db?.drop();
});

const within = <T>(p: Promise<T>, ms: number, what: string) =>
  Promise.race([p, new Promise<never>((_, reject) => setTimeout(() => reject(new Error(`${what} within ${ms} ms`)), ms))]);

/** At most a probe interval until the next probe, its grace, and the read. */
const BOUND_MS = PROBE_INTERVAL_MS + PROBE_GRACE_MS + 5_000;

describe("a silent job-watch LISTEN connection", () => {
  it("still brings a watched job's changes, and its outcome, within a probe interval and its grace", async () => {
    const api = client(srv.url);
    const renter = await makeRenter(srv, 10_000);
    const provider = await makeProvider(srv);
    const r = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 3 }, renter.headers);
    expect(r.status, r.text).toBe(201);
    const jobId = r.body.job.job_id as string;
    expect((await api.get(`/api/providers/${provider.key}/jobs`)).body.job.job_id).toBe(jobId); // now running
    const sse = await openSse(`${srv.url}/api/jobs/${jobId}/events`, renter.headers);
    expect(sse.status).toBe(200);
    await within(sse.until((es) => es.some((e) => e.event === "snapshot")), 5_000, "the snapshot");
    proxy.holdListeners();
    try {
      const p = await api.post(`/api/jobs/${jobId}/progress`, { api_key: provider.key, progress_pct: 40, phase: "silent" });
      expect(p.status, p.text).toBe(200);
      await within(sse.until((es) => es.some((e) => e.event === "progress")), BOUND_MS, "the progress while the connection is silent");
      // Still silent: the next interval reads again.
      const done = await api.post("/api/providers/job-result", { api_key: provider.key, job_id: jobId, success: true, result: { response: "ok" } });
      expect(done.status, done.text).toBe(200);
      await within(sse.ended, BOUND_MS, "the end of the stream while the connection is silent");
      expect(sse.events.at(-1)).toMatchObject({ event: "outcome", data: { outcome: { status: "completed" } } });
    } finally {
      proxy.releaseAnswers();
      sse.cut();
    }
  }, 60_000);
});
