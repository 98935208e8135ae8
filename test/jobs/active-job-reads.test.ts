// Reads of the active jobs that run every second in every process (the job
// sweep) or on every /v1 request: each visits the jobs it is after, not every
// running or pending job (migration 040; bench:sweeps measures them on a fleet
// of 100,000). The plans are checked as a prepared statement's generic plan,
// the one postgres.js runs after a few executions; the answers beside them.
// The safety net that visits every provider runs every LOST_JOBS_SWEEP_SECONDS.
import { afterEach, describe, expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { genericPlanOf } from "../helpers/plans.js";
import { jobsRunningOutOfPaidTime, paidMinutes, runningOutOfPaidTimeSql } from "../../src/domain/money/hold-extension.js";
import { unclaimedSql } from "../../src/domain/dispatch/dispatch.js";
import { servingEndpoints, servingEndpointsSql } from "../../src/http/v1/endpoints.js";
import { jobTimeoutsWorker, sweepJobs } from "../../src/workers/job-timeouts.js";
import { createLogger } from "../../src/log.js";

// The tests drive the sweep themselves; the server's own is far away.
const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0" });
// Rows written straight into jobs (no holds behind them) must not outlive their test.
afterEach(() => srv.sql`DELETE FROM jobs WHERE job_id LIKE 'reads-%'`);

/**
 * `count` jobs of one provider and renter, written as the service leaves them
 * (`status`, started `startedAgo` seconds ago and picked up, assigned
 * `assignedAgo` ago), then the table analyzed as autovacuum would.
 */
async function seedJobs(opts: { prefix: string; count: number; renterId: number; providerId: number; status: "running" | "pending"; startedAgo?: number; submittedAgo?: number; assignedAgo?: number; jobType?: string }) {
  const { prefix, count, renterId, providerId, status } = opts;
  const ago = (s: number | undefined) => (s === undefined ? null : srv.sql`now() - make_interval(secs => ${s})`);
  await srv.sql`
    INSERT INTO jobs (job_id, renter_id, provider_id, job_type, status, duration_minutes, max_duration_seconds,
                      rate_halala_per_minute, cost_halala, submitted_at, assigned_at, started_at, acked_at, timeout_at)
    SELECT ${prefix} || g, ${renterId}, ${providerId}, ${opts.jobType ?? "benchmark"}, ${status}, 120, 14400, 10, 1200,
           ${ago(opts.submittedAgo ?? opts.assignedAgo ?? opts.startedAgo ?? 0)}, ${ago(opts.assignedAgo ?? opts.startedAgo ?? 0)},
           ${status === "running" ? ago(opts.startedAgo ?? 0) : null}, ${status === "running" ? ago(opts.startedAgo ?? 0) : null},
           now() + interval '4 hours'
    FROM generate_series(1, ${count}) g`;
  await srv.sql`ANALYZE jobs`;
}

describe("svc_paid_until", () => {
  it("is the start plus the whole minutes the hold pays for, whatever the session's time zone", async () => {
    // 06:30 UTC on the day New York moves its clocks forward (07:00 UTC): the paid time crosses the change.
    const start = new Date("2026-03-08T06:30:00Z");
    const cases = [
      [1_200, 10],
      [1_205, 10],
      [9, 10],
      [86_400 * 3, 7],
    ] as const;
    for (const zone of ["UTC", "America/New_York", "Asia/Riyadh"]) {
      const got = await srv.sql.begin(async (tx) => {
        await tx`SELECT set_config('TimeZone', ${zone}, true)`;
        return Promise.all(cases.map(async ([held, rate]) => (await tx<{ t: Date }[]>`SELECT svc_paid_until(${start}, ${held}, ${rate}) AS t`)[0].t.getTime()));
      });
      expect(got, zone).toEqual(cases.map(([held, rate]) => start.getTime() + paidMinutes(held, rate) * 60_000));
    }
  });
});

describe("the job sweep's reads", () => {
  it("finds the running jobs whose paid time ends within the lead, soonest first, through jobs_paid_until_idx", async () => {
    const renter = await makeRenter(srv);
    const provider = await makeProvider(srv);
    // Paid for 120 minutes (1,200 halala at 10 a minute) of up to 240: 2,000 jobs 10 minutes in, nowhere near the end.
    await seedJobs({ prefix: "reads-far-", count: 2000, renterId: renter.id, providerId: provider.id, status: "running", startedAgo: 600 });
    // Three within the lead (60 s) of their end, or past it; one whose hold covers its whole
    // max_duration_seconds, which needs no more; one nobody confirmed (bills nothing yet).
    await seedJobs({ prefix: "reads-due-b-", count: 1, renterId: renter.id, providerId: provider.id, status: "running", startedAgo: 120 * 60 - 30 });
    await seedJobs({ prefix: "reads-due-a-", count: 1, renterId: renter.id, providerId: provider.id, status: "running", startedAgo: 120 * 60 + 10 });
    await seedJobs({ prefix: "reads-due-c-", count: 1, renterId: renter.id, providerId: provider.id, status: "running", startedAgo: 120 * 60 - 55 });
    await seedJobs({ prefix: "reads-capped-", count: 1, renterId: renter.id, providerId: provider.id, status: "running", startedAgo: 120 * 60 - 30 });
    await srv.sql`UPDATE jobs SET max_duration_seconds = 7200 WHERE job_id = 'reads-capped-1'`;
    await seedJobs({ prefix: "reads-unacked-", count: 1, renterId: renter.id, providerId: provider.id, status: "running", startedAgo: 120 * 60 - 30 });
    await srv.sql`UPDATE jobs SET acked_at = NULL WHERE job_id = 'reads-unacked-1'`;

    const ids = await jobsRunningOutOfPaidTime(srv.sql, 200);
    const names = await srv.sql<{ id: number; job_id: string }[]>`SELECT id, job_id FROM jobs WHERE id = ANY(${ids})`;
    const byId = new Map(names.map((n) => [n.id, n.job_id]));
    expect(ids.map((id) => byId.get(id))).toEqual(["reads-due-a-1", "reads-due-b-1", "reads-due-c-1"]);
    expect(await genericPlanOf(srv.sql, runningOutOfPaidTimeSql(srv.sql, 200))).toContain("jobs_paid_until_idx");
  });

  it("finds jobs never picked up through a range of pending jobs submitted before the window, not every pending job", async () => {
    const renter = await makeRenter(srv);
    const provider = await makeProvider(srv);
    await seedJobs({ prefix: "reads-fresh-", count: 2000, renterId: renter.id, providerId: provider.id, status: "pending", assignedAgo: 5 });
    // Queued for an hour, assigned a moment ago: within its pickup window.
    await seedJobs({ prefix: "reads-waited-", count: 1, renterId: renter.id, providerId: provider.id, status: "pending", submittedAgo: 3600, assignedAgo: 5 });
    await seedJobs({ prefix: "reads-unclaimed-", count: 1, renterId: renter.id, providerId: provider.id, status: "pending", submittedAgo: 200, assignedAgo: 130 });

    const found = await srv.sql<{ job_id: string }[]>`SELECT job_id FROM jobs WHERE id IN (SELECT id FROM (${unclaimedSql(srv.sql, 100)}) u)`;
    expect(found.map((f) => f.job_id)).toEqual(["reads-unclaimed-1"]);
    const plan = await genericPlanOf(srv.sql, unclaimedSql(srv.sql, 100));
    expect(plan).toContain("admin_jobs_status_idx");
    expect(plan).not.toContain("Seq Scan on jobs");
  });

  it("leaves the providers that are no longer live to the pass every LOST_JOBS_SWEEP_SECONDS, which the worker runs first", async () => {
    const api = client(srv.url);
    await srv.sql`UPDATE providers SET status = 'offline'`;
    const renter = await makeRenter(srv, 10_000);
    const first = await makeProvider(srv);
    const submitted = await api.post("/api/jobs/submit", { job_type: "benchmark" }, renter.headers);
    expect(submitted.status, submitted.text).toBe(201);
    const jobId = submitted.body.job.job_id as string;
    expect(submitted.body.job.provider_id).toBe(first.id);
    const pickUp = async (key: string) => {
      expect((await api.get(`/api/providers/${key}/jobs`)).body.job?.job_id).toBe(jobId);
      expect((await api.post(`/api/jobs/${jobId}/progress`, { api_key: key, progress_pct: 0 })).status).toBe(200);
    };
    /** Gone silent, and not (yet) marked offline: only the safety net finds its job. */
    const silence = (id: number) => srv.sql`UPDATE providers SET last_heartbeat = now() - interval '10 minutes' WHERE id = ${id}`;
    const job = async () => (await srv.sql<{ status: string; attempt: number; provider_id: number | null }[]>`
      SELECT status, attempt, provider_id FROM jobs WHERE job_id = ${jobId}`)[0];
    await pickUp(first.key);
    await silence(first.id);

    expect(await sweepJobs(srv.sql, { lostJobs: false })).toMatchObject({ requeued: 0 });
    expect(await job()).toMatchObject({ status: "running", attempt: 1 });

    const worker = jobTimeoutsWorker({ sql: srv.sql, log: createLogger("silent"), intervalMs: 20 });
    worker.start();
    try {
      await expect.poll(job, { timeout: 5000 }).toMatchObject({ status: "queued", attempt: 2 });
      // A provider comes: a steady pass places the job there; it runs, and its provider goes silent too.
      const second = await makeProvider(srv);
      await expect.poll(job, { timeout: 5000 }).toMatchObject({ status: "pending", attempt: 2, provider_id: second.id });
      await pickUp(second.key);
      await silence(second.id);
      // Twenty-odd steady passes later, the job is still there.
      await new Promise((r) => setTimeout(r, 500));
      expect(await job()).toMatchObject({ status: "running", attempt: 2, provider_id: second.id });
    } finally {
      await worker.stop();
    }
    // The whole pass, as the worker runs it every LOST_JOBS_SWEEP_SECONDS, re-queues it.
    expect(await sweepJobs(srv.sql)).toMatchObject({ requeued: 1 });
    expect(await job()).toMatchObject({ status: "queued", attempt: 3 });
  });
});

describe("the serving endpoints /v1 reads", () => {
  it("are read through jobs_serving_idx among thousands of running jobs", async () => {
    const renter = await makeRenter(srv);
    const provider = await makeProvider(srv);
    await seedJobs({ prefix: "reads-busy-", count: 2000, renterId: renter.id, providerId: provider.id, status: "running", startedAgo: 60 });
    await seedJobs({ prefix: "reads-serving-", count: 2, renterId: renter.id, providerId: provider.id, status: "running", startedAgo: 60, jobType: "vllm_serve" });
    await srv.sql`UPDATE jobs SET model = 'reads-model', endpoint_url = 'http://127.0.0.1:9/' || job_id WHERE job_id LIKE 'reads-serving-%'`;

    const found = await servingEndpoints(srv.sql, { model: "reads-model" });
    expect(found.map((u) => u.providerId)).toEqual([provider.id, provider.id]);
    expect(found.map((u) => u.url).sort()).toEqual(["http://127.0.0.1:9/reads-serving-1/v1/chat/completions", "http://127.0.0.1:9/reads-serving-2/v1/chat/completions"]);
    expect(await genericPlanOf(srv.sql, servingEndpointsSql(srv.sql, { model: "reads-model", renterId: 1 }))).toContain("jobs_serving_idx");
  });
});
