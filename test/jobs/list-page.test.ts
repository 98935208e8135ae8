// A page of jobs shows each job as its own read does. Pages select the
// summary's columns only (JOB_SUMMARY_COLUMNS): a job's specs and outputs
// are most of its row and no list shows them.
import { beforeAll, describe, expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { listJobs } from "../../src/domain/jobs/jobs.js";
import { admin, clearMarketplace, pickUp } from "./helpers.js";

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000" });
beforeAll(() => clearMarketplace(srv));

describe("a page of jobs", () => {
  it("shows every job as GET /api/jobs/:id does, for the renter, the provider and the admin, without reading the specs", async () => {
    const api = client(srv.url);
    const provider = await makeProvider(srv);
    const renter = await makeRenter(srv, 100_000);
    const submit = async (body: Record<string, unknown>) => {
      const r = await api.post("/api/jobs/submit", { duration_minutes: 2, ...body }, renter.headers);
      expect(r.status, r.text).toBe(201);
      return r;
    };

    // Completed with a result and metrics, failed with an error, running with progress, queued with a reason, cancelled.
    const done = await submit({ job_type: "benchmark", params: { suite: "quick" } });
    expect((await pickUp(api, provider.key))?.job_id).toBe(done.body.job.job_id);
    const result = await api.post("/api/providers/job-result", { api_key: provider.key, job_id: done.body.job.job_id, success: true, result: { text: "ok" }, metrics: { it_s: 2.5 } });
    expect(result.status, result.text).toBe(200);
    const failed = await submit({ job_type: "benchmark", params: { suite: "quick" } });
    await pickUp(api, provider.key);
    await api.post("/api/providers/job-result", { api_key: provider.key, job_id: failed.body.job.job_id, success: false, error: "CUDA out of memory" });
    const running = await submit({ job_type: "llm-inference", params: { model: "meta-llama/Llama-3.1-8B-Instruct", prompt: "hi" } });
    await pickUp(api, provider.key);
    await api.post(`/api/jobs/${running.body.job.job_id}/progress`, { api_key: provider.key, progress_pct: 40, phase: "generating" });
    // The provider's one GPU is taken: these wait.
    const queued = await submit({ job_type: "benchmark", params: { suite: "quick" } });
    const cancelled = await submit({ job_type: "benchmark", params: { suite: "quick" } });
    expect((await api.post(`/api/jobs/${cancelled.body.job.job_id}/cancel`, {}, renter.headers)).status).toBe(200);

    const page = await api.get("/api/jobs", renter.headers);
    expect(page.status).toBe(200);
    const statuses = Object.fromEntries(page.body.jobs.map((j: { job_id: string; status: string }) => [j.job_id, j.status]));
    expect(statuses).toEqual({
      [done.body.job.job_id]: "completed",
      [failed.body.job.job_id]: "failed",
      [running.body.job.job_id]: "running",
      [queued.body.job.job_id]: "queued",
      [cancelled.body.job.job_id]: "cancelled",
    });
    const single = async (jobId: string, headers: Record<string, string>) => (await api.get(`/api/jobs/${jobId}`, headers)).body;
    // A running job's cost so far moves with the clock between the two reads.
    const steady = (j: Record<string, unknown>) => ({ ...j, running_cost_halala: undefined });
    for (const j of page.body.jobs) expect(steady(j)).toEqual(steady(await single(j.job_id, renter.headers)));
    expect(page.body.jobs.find((j: { job_id: string }) => j.job_id === queued.body.job.job_id).queue_reason_code).toBe("providers_busy");

    const adminPage = await api.get(`/api/admin/jobs?renter_id=${renter.id}`, admin(srv));
    expect(adminPage.status).toBe(200);
    expect(adminPage.body.jobs).toHaveLength(5);
    // The admin's list leaves queue reasons out (a job's own read explains them).
    const unexplained = (j: Record<string, unknown>) => ({ ...steady(j), queue_reason: undefined, queue_reason_code: undefined });
    for (const j of adminPage.body.jobs) expect(unexplained(j)).toEqual(unexplained(await single(j.job_id, admin(srv))));

    const rows = await listJobs(srv.sql, { role: "provider", providerId: provider.id }, { limit: 10, offset: 0 });
    expect(rows.rows.map((r) => r.status).sort()).toEqual(["completed", "failed", "running"]);
    for (const r of rows.rows) for (const spec of ["params", "container_spec", "task_spec", "result", "metrics"]) expect(r).not.toHaveProperty(spec);
  });
});
