// Per-route body limits over real HTTP: the result routes (job-result and
// /complete, body_limit_kb 16384 in jobs.proto) accept a ~1.5 MiB body and
// keep it whole, while the same body on a route with the 64 KiB default
// (progress) or a 1 MiB limit (daemon-event), and twice it on submit (2 MiB),
// is 413 with {error}, moving nothing.
import { describe, expect, it } from "vitest";
import { DEFAULT_BODY_LIMIT_KB } from "../../src/http/body.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { useTestServer } from "../helpers/server.js";
import { clearMarketplace } from "../jobs/helpers.js";

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000" });
const api = client(srv);

/** ~1.5 MiB of printable text: well over the 64 KiB default and the 1 MiB daemon-event limit, well under 16 MiB. */
const BIG = "0123456789abcdef".repeat(96 * 1024);

/** A job submitted and polled by a fresh provider: running, its result not yet reported. */
async function runningJob() {
  await clearMarketplace(srv);
  const renter = await makeRenter(srv, 10_000);
  const provider = await makeProvider(srv);
  const sub = await api.post("/api/jobs/submit", { job_type: "llm-inference", duration_minutes: 2, provider_id: provider.id, params: { prompt: "hi" } }, renter.headers);
  expect(sub.status).toBe(201);
  const jobId: string = sub.body.job.job_id;
  const poll = await api.get(`/api/providers/${provider.key}/jobs`);
  expect(poll.body.job?.job_id).toBe(jobId);
  return { renter, provider, jobId };
}

describe("per-route body limits", () => {
  it("job-result accepts a ~1.5 MiB result and stores it whole", async () => {
    const { renter, provider, jobId } = await runningJob();
    const body = JSON.stringify({ api_key: provider.key, job_id: jobId, success: true, result: { data: BIG, format: "txt" } });
    expect(body.length).toBeGreaterThan(1.5 * 1024 * 1024);
    const res = await api.post("/api/providers/job-result", body);
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({ success: true, job_id: jobId, status: "completed" });
    const out = await api.get(`/api/jobs/${jobId}/output`, renter.headers);
    expect(out.status).toBe(200);
    expect(out.body.data).toBe(BIG);
  });

  it("/complete accepts a ~1.5 MiB response", async () => {
    const { renter, provider, jobId } = await runningJob();
    const res = await api.post(`/api/jobs/${jobId}/complete`, { api_key: provider.key, response: BIG, tokens: 3 });
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({ success: true, job_id: jobId, status: "completed" });
    const job = await api.get(`/api/jobs/${jobId}`, renter.headers);
    expect(job.body.status).toBe("completed");
  });

  it("answers 413 with {error} for the same body on a default-limit or 1 MiB route, and changes nothing", async () => {
    const { renter, provider, jobId } = await runningJob();
    const counts = () => srv.sql<{ jobs: number; events: number }[]>`
      SELECT (SELECT count(*) FROM jobs)::int AS jobs, (SELECT count(*) FROM daemon_events)::int AS events`.then((r) => r[0]);
    const before = await counts();
    const progress = await api.post(`/api/jobs/${jobId}/progress`, { api_key: provider.key, progress_pct: 10, phase: BIG });
    expect(progress.status).toBe(413);
    expect(progress.body).toEqual({ error: `request body too large (limit ${DEFAULT_BODY_LIMIT_KB} KiB)` });
    // Submit takes 2 MiB (room for the longest params GET /api/job-types advertises): twice BIG is past it.
    const submit = await api.post("/api/jobs/submit", { job_type: "llm-inference", duration_minutes: 2, params: { prompt: BIG + BIG } }, renter.headers);
    expect(submit.status).toBe(413);
    expect(submit.body).toEqual({ error: "request body too large (limit 2048 KiB)" });
    const event = await api.post("/api/providers/daemon-event", { api_key: provider.key, event_type: "crash_report", details: BIG });
    expect(event.status).toBe(413);
    expect(event.body).toEqual({ error: "request body too large (limit 1024 KiB)" });

    const job = await api.get(`/api/jobs/${jobId}`, renter.headers);
    expect(job.body.status).toBe("running");
    expect(job.body.progress_pct ?? null).toBeNull();
    expect(await counts()).toEqual(before);
    // A small body on the same route is fine.
    const small = await api.post(`/api/jobs/${jobId}/progress`, { api_key: provider.key, progress_pct: 10, phase: "x".repeat(100) });
    expect(small.status).toBe(200);
    expect((await api.get(`/api/jobs/${jobId}`, renter.headers)).body.progress_pct).toBe(10);
  });
});
