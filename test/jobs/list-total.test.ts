// The total of GET /api/jobs: ended jobs from the counters kept by the write,
// active ones counted through the partial index of active jobs (migration 033),
// whatever plan PostgreSQL picks. Prepared statements switch to a generic plan,
// under which `status = ANY($n)` was a filter: a renter with a million ended
// jobs had each of them read to count its few active ones.
import { beforeAll, describe, expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { listJobs } from "../../src/domain/jobs/jobs.js";
import { jobCountSql } from "../../src/domain/shared/job-counts.js";
import { clearMarketplace } from "./helpers.js";
import { genericPlanOf } from "../helpers/plans.js";

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000" });
beforeAll(() => clearMarketplace(srv));

describe("GET /api/jobs total", () => {
  it("counts active and ended jobs, and counts the active ones on the active-jobs index under a generic plan", async () => {
    const api = client(srv.url);
    await makeProvider(srv);
    const renter = await makeRenter(srv, 10_000);
    const ids: string[] = [];
    for (let i = 0; i < 3; i++) {
      const r = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 1, params: { suite: "quick" } }, renter.headers);
      expect(r.status, r.text).toBe(201);
      ids.push(r.body.job.job_id);
    }
    expect((await api.post(`/api/jobs/${ids[0]}/cancel`, {}, renter.headers)).status).toBe(200);

    const all = await api.get("/api/jobs", renter.headers);
    expect(all.body.total).toBe(3);
    expect((await api.get("/api/jobs?status=cancelled", renter.headers)).body.total).toBe(1);
    expect((await api.get("/api/jobs?status=queued", renter.headers)).body.total + (await api.get("/api/jobs?status=pending", renter.headers)).body.total).toBe(2);

    const page = await listJobs(srv.sql, { role: "renter", renterId: renter.id }, { limit: 20, offset: 0 });
    expect(page.total).toBe(3);
    expect(page.rows.map((j) => j.job_id).sort()).toEqual([...ids].sort());
    // The count's plan as a prepared statement's generic plan: parameters unknown (NULLs), whatever they are.
    const plan = await genericPlanOf(srv.sql, srv.sql`SELECT ${jobCountSql(srv.sql, { renterId: renter.id })} AS n`);
    expect(plan).toContain("jobs_renter_active_idx");
  });

  it("a provider's total counts its ended jobs from its counter and its active ones on the active-jobs index", async () => {
    await clearMarketplace(srv); // the test before left jobs queued, which would go to this provider
    const api = client(srv.url);
    const provider = await makeProvider(srv);
    await srv.sql`UPDATE providers SET gpu_count = 4, approved_gpu_count = 4 WHERE id = ${provider.id}`; // room for the three at once
    const renter = await makeRenter(srv, 10_000);
    const ids: string[] = [];
    for (let i = 0; i < 3; i++) {
      const r = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 1, params: { suite: "quick" }, provider_id: provider.id }, renter.headers);
      expect(r.status, r.text).toBe(201);
      expect(r.body.job.provider_id).toBe(provider.id);
      ids.push(r.body.job.job_id);
    }
    expect((await api.post(`/api/jobs/${ids[0]}/cancel`, {}, renter.headers)).status).toBe(200);
    const asProvider = { "x-provider-key": provider.key };
    expect((await api.get("/api/jobs", asProvider)).body.total).toBe(3);
    expect((await api.get("/api/jobs?status=cancelled", asProvider)).body.total).toBe(1);
    expect((await api.get("/api/jobs?status=pending", asProvider)).body.total).toBe(2);
    expect((await api.get("/api/jobs?status=queued", asProvider)).body.total).toBe(0);
    expect((await api.get(`/api/admin/jobs?provider_id=${provider.id}&status=cancelled`, { "x-admin-token": srv.config.adminToken })).body.total).toBe(1);
    const plan = await genericPlanOf(srv.sql, srv.sql`SELECT ${jobCountSql(srv.sql, { providerId: provider.id })} AS n`);
    expect(plan).toContain("jobs_active_provider_idx");
    expect(plan).toContain("provider_job_ends");
  });
});
