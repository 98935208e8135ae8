// A provider that can take more work is offered the queue at once, not at the job sweep's next
// pass (slowed down here, so only the wake-up paths place jobs): a change of its preferences
// that widens what it takes, and a slot freed by a job it handed back. A slot freed while a
// submit that found it busy is committing cannot see that job yet: the sweep's next pass places it.
import { beforeEach, describe, expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { markJobAccepted, markJobRejected, reportResult } from "../../src/domain/jobs/job-reports.js";
import { prepareSubmit, submitMany } from "../../src/domain/jobs/submit.js";
import { sweepJobs } from "../../src/workers/job-timeouts.js";
import { clearMarketplace } from "./helpers.js";

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0" });
const api = client(srv);
beforeEach(() => clearMarketplace(srv));

const hhmm = (hours: number) => {
  const d = new Date(Date.now() + hours * 3600_000);
  return `${String(d.getUTCHours()).padStart(2, "0")}:${String(d.getUTCMinutes()).padStart(2, "0")}`;
};

const jobRow = async (jobId: string) =>
  (await srv.sql<{ status: string; provider_id: number | null }[]>`SELECT status, provider_id FROM jobs WHERE job_id = ${jobId}`)[0];

describe("wake-ups", () => {
  it("a provider that switches from a closed schedule to always-on is offered the queued job at once (as resume does)", async () => {
    const renter = await makeRenter(srv, 10_000);
    const p = await makeProvider(srv);
    const sched = await api.post("/api/providers/preferences", { key: p.key, run_mode: "scheduled", scheduled_start: hhmm(2), scheduled_end: hhmm(3) });
    expect(sched.status, sched.text).toBe(200);
    const r = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 1 }, renter.headers);
    expect(r.body.job?.status, r.text).toBe("queued");
    expect(r.body.job.queue_reason_code).toBe("providers_paused");
    const always = await api.post("/api/providers/preferences", { key: p.key, run_mode: "always-on", scheduled_start: "", scheduled_end: "" });
    expect(always.status, always.text).toBe(200);
    expect(await jobRow(r.body.job.job_id)).toEqual({ status: "pending", provider_id: p.id });
  });

  it("a slot freed by a job its provider handed back takes the next queued job it can run", async () => {
    const renter = await makeRenter(srv, 10_000);
    const p = await makeProvider(srv);
    const a = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 1 }, renter.headers);
    expect(a.body.job?.status, a.text).toBe("pending");
    const b = await api.post("/api/jobs/submit", { job_type: "rendering", duration_minutes: 1 }, renter.headers);
    expect(b.body.job?.status, b.text).toBe("queued");
    // The provider declines the benchmark (its daemon does not run that type): requeued, not to come back here.
    expect(await markJobRejected(srv.sql, p.id, { jobId: a.body.job.job_id, reason: "no benchmark here", endReason: "unsupported_on_provider" })).toBe("requeued");
    expect(await jobRow(a.body.job.job_id)).toEqual({ status: "queued", provider_id: null });
    expect(await jobRow(b.body.job.job_id)).toEqual({ status: "pending", provider_id: p.id });
  });

  it("a GPU freed while a submit that found it busy is committing takes that submit's job at the sweep's next pass", async () => {
    const renterA = await makeRenter(srv, 10_000);
    const renterB = await makeRenter(srv, 10_000);
    const p = await makeProvider(srv);
    // Idle, more reliable providers that cannot run the job fill the candidate window.
    for (let i = 0; i < 32; i++) {
      const f = await makeProvider(srv);
      await srv.sql`UPDATE providers SET reliability_score = 0.99, supported_job_types = '{rendering}' WHERE id = ${f.id}`;
    }
    // The provider's only GPU runs renter A's job.
    const x = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 1 }, renterA.headers);
    expect(x.body.job, x.text).toMatchObject({ status: "pending", provider_id: p.id });
    const xId = x.body.job.job_id as string;
    await markJobAccepted(srv.sql, p.id, { jobId: xId });

    // Renter B's submit is written (placement finds the GPU busy: queued), and before its COMMIT
    // lands, the running job's result comes in on another connection: it settles, frees the
    // GPU and offers it the queue (dispatchForProvider), which cannot see the uncommitted job yet.
    const intent = await prepareSubmit(srv.sql, srv.config.hmacSecret, renterB.id, { jobType: "benchmark", durationMinutes: 1 });
    const yId = await srv.sql.begin(async (tx) => {
      const [o] = await submitMany(tx, [intent]);
      if (!o.ok) throw o.error;
      expect(o.submitted.job.status).toBe("queued");
      const ack = await reportResult(srv.sql, p.id, { jobId: xId, success: true, result: { ok: true } });
      expect(ack.status).toBe("completed");
      return o.submitted.job.job_id;
    });
    expect(await jobRow(yId)).toEqual({ status: "queued", provider_id: null });
    // One pass of the job sweep: the free GPU does not sit idle beside the job it fits.
    await sweepJobs(srv.sql);
    const [{ active }] = await srv.sql<{ active: number }[]>`SELECT active FROM provider_load WHERE provider_id = ${p.id}`;
    expect({ job: await jobRow(yId), active }).toEqual({ job: { status: "pending", provider_id: p.id }, active: 1 });
  });
});
