// A legacy poll whose answer never reaches the daemon (the connection is cut
// after the server marked the job running): the job must not be billed to
// the renter for time no provider ran it. The daemon's first report on a job
// it polled (progress, logs, a daemon event naming it, endpoint-ready, the
// result) confirms it has it; a polled job with no report within the pickup
// window goes back to the queue as not_picked_up (the provider's fault, no
// charge), and until confirmed neither its deadline nor a cancel bills it.
import net from "node:net";
import { beforeEach, describe, expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import { sweepJobs } from "../../src/workers/job-timeouts.js";
import { clearMarketplace } from "./helpers.js";

// The test drives the sweep itself.
const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0", SVC_JOB_MAX_ATTEMPTS: "3" });
const api = client(srv);
beforeEach(() => clearMarketplace(srv));

const status = async (jobId: string) => (await srv.sql<{ status: string }[]>`SELECT status FROM jobs WHERE job_id = ${jobId}`)[0]?.status;
const balance = async (key: string) => (await api.get("/api/renters/balance", { "x-renter-key": key })).body;
/** As if the job had been running for `seconds`, its max_duration_seconds run out too. */
const ranFor = (jobId: string, seconds: number) =>
  srv.sql`UPDATE jobs SET started_at = now() - make_interval(secs => ${seconds}), timeout_at = now() - interval '1 second' WHERE job_id = ${jobId}`;

/**
 * A legacy daemon's poll whose answer is lost: the request reaches the server,
 * which marks the job running; the connection is reset before a byte of the
 * answer is read.
 */
async function pollAnswerLost(providerKey: string, jobId: string): Promise<void> {
  const socket = net.connect(srv.port, "127.0.0.1");
  socket.on("error", () => {});
  await new Promise((r) => socket.once("connect", r));
  socket.pause();
  socket.write(`GET /api/providers/${providerKey}/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n`);
  await expect.poll(() => status(jobId), { timeout: 10_000 }).toBe("running");
  socket.resetAndDestroy();
}

describe("a legacy poll whose answer never reached the daemon", () => {
  it("is re-queued after the pickup window as not_picked_up, not timed out, and the renter pays nothing", async () => {
    const renter = await makeRenter(srv, 10_000);
    const lost = await makeProvider(srv);
    const job = (await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 2, max_duration_seconds: 60 }, renter.headers)).body.job;
    expect(job).toMatchObject({ status: "pending", provider_id: lost.id });
    await pollAnswerLost(lost.key, job.job_id);

    // The provider stays live (it heartbeats); its daemon never heard of the job. Past its deadline and the pickup window:
    await ranFor(job.job_id, 121);
    await srv.sql`UPDATE providers SET is_paused = true WHERE id = ${lost.id}`;
    const rescue = await makeProvider(srv);
    const swept = await sweepJobs(srv.sql);
    expect(swept).toMatchObject({ timedOut: 0, requeued: 1 });
    expect((await api.get(`/api/jobs/${job.job_id}`, renter.headers)).body).toMatchObject({ status: "pending", provider_id: rescue.id, attempt: 2 });
    const hist = (await api.get(`/api/jobs/${job.job_id}/history`, renter.headers)).body.attempts;
    expect(hist[0]).toMatchObject({ attempt: 1, provider_id: lost.id, status: "requeued", end_reason: "not_picked_up", fault: "provider", cost_halala: 0 });
    expect(hist[0].error).toMatch(/no report/);
    // Nothing charged: the balance is whole, only the estimate is held for the new attempt.
    expect(await balance(renter.key)).toMatchObject({ balance_halala: 10_000, held_halala: 20, total_spent_halala: 0 });

    // The new provider runs it; the renter pays that attempt only.
    expect((await api.get(`/api/providers/${rescue.key}/jobs`)).body.job.job_id).toBe(job.job_id);
    const done = await api.post("/api/providers/job-result", { api_key: rescue.key, job_id: job.job_id, success: true, result: { ok: true } });
    expect(done.body).toMatchObject({ status: "completed", cost_halala: 10 });
    expect(await balance(renter.key)).toMatchObject({ balance_halala: 9_990, held_halala: 0 });
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("a renter's cancel before the daemon confirmed it is refunded in full", async () => {
    const renter = await makeRenter(srv, 10_000);
    const p = await makeProvider(srv);
    const job = (await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 2 }, renter.headers)).body.job;
    await pollAnswerLost(p.key, job.job_id);
    await srv.sql`UPDATE jobs SET started_at = now() - interval '90 seconds' WHERE job_id = ${job.job_id}`;
    const c = await api.post(`/api/jobs/${job.job_id}/cancel`, {}, renter.headers);
    expect(c.body).toMatchObject({ charged_halala: 0, refunded_halala: 20, job: { status: "cancelled", end_reason: "renter_cancelled", actual_cost_halala: 0 } });
    expect(await balance(renter.key)).toMatchObject({ balance_halala: 10_000, held_halala: 0 });
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });
});

describe("the daemon's first report confirms the pickup", () => {
  const reports: [string, (key: string, jobId: string) => Promise<{ status: number }>][] = [
    ["progress", (key, jobId) => api.post(`/api/jobs/${jobId}/progress`, { api_key: key, progress_pct: 5, phase: "starting" })],
    ["logs", (key, jobId) => api.post(`/api/jobs/${jobId}/logs`, { api_key: key, logs: ["pulling the image"] })],
    ["a daemon event naming the job", (key, jobId) => api.post("/api/providers/daemon-event", { api_key: key, event_type: "job_started", job_id: jobId })],
  ];
  for (const [what, report] of reports) {
    it(`${what}: the job then runs its course (its deadline fails it, billed as the renter's timeout)`, async () => {
      const renter = await makeRenter(srv, 10_000);
      const p = await makeProvider(srv);
      const job = (await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 2, max_duration_seconds: 120 }, renter.headers)).body.job;
      expect((await api.get(`/api/providers/${p.key}/jobs`)).body.job.job_id).toBe(job.job_id);
      expect((await report(p.key, job.job_id)).status).toBe(200);
      await ranFor(job.job_id, 121);
      const swept = await sweepJobs(srv.sql);
      expect(swept).toMatchObject({ timedOut: 1, requeued: 0 });
      // 121 s run on a 120 s limit: 2 billed minutes of 10 halala, the 2-minute hold (20).
      expect((await api.get(`/api/jobs/${job.job_id}`, renter.headers)).body).toMatchObject({ status: "failed", end_reason: "timeout", fault: "renter", actual_cost_halala: 20 });
      expect(await ledgerProblems(srv.sql)).toEqual([]);
    });
  }

  it("another provider's report on the job confirms nothing", async () => {
    const renter = await makeRenter(srv, 10_000);
    const p = await makeProvider(srv);
    const job = (await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 2, max_duration_seconds: 60 }, renter.headers)).body.job;
    await pollAnswerLost(p.key, job.job_id);
    await srv.sql`UPDATE providers SET is_paused = true WHERE id = ${p.id}`;
    const other = await makeProvider(srv);
    expect((await api.post("/api/providers/daemon-event", { api_key: other.key, event_type: "job_started", job_id: job.job_id })).status).toBe(200);
    await ranFor(job.job_id, 121);
    expect(await sweepJobs(srv.sql)).toMatchObject({ timedOut: 0, requeued: 1 });
  });
});
