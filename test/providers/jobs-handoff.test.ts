// Where the provider side meets dispatch, over real HTTP: the liveness sweep
// hands a silent provider's job back to the queue, a provider's first
// heartbeat (or resume) is offered queued work at once, and a scheduled
// provider outside its window gets nothing.
import { beforeEach, describe, expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeRenter } from "../helpers/fixtures.js";
import { takeProvidersOffline } from "../helpers/isolation.js";
import { sweepOnce } from "../../src/workers/liveness-sweep.js";
import { heardSecondsAgo, heartbeat, newProvider } from "./helpers.js";

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0" });
const api = client(srv);
// Each test starts with no provider online.
beforeEach(async () => {
  await takeProvidersOffline(srv);
  await srv.sql`UPDATE jobs SET status = 'cancelled' WHERE status IN ('queued', 'pending', 'running')`;
});

async function job(jobId: string) {
  const [j] = await srv.sql<{ status: string; provider_id: number | null; attempt: number }[]>`
    SELECT status, provider_id, attempt FROM jobs WHERE job_id = ${jobId}`;
  return j;
}

describe("jobs meet liveness", () => {
  it("the sweep re-queues the running job of a provider gone silent; the next provider's first beat takes it", async () => {
    const renter = await makeRenter(srv, 100_000);
    const a = await newProvider(srv);
    expect((await heartbeat(srv, a.key)).status).toBe(200);
    const submitted = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 1 }, renter.headers);
    expect(submitted.status).toBe(201);
    const jobId: string = submitted.body.job.job_id;
    expect(await job(jobId)).toMatchObject({ status: "pending", provider_id: a.id });
    const polled = await api.get(`/api/providers/${a.key}/jobs`);
    expect(polled.body.job.job_id).toBe(jobId);

    await heardSecondsAgo(srv, a.id, 121);
    const { offline } = await sweepOnce(srv.app.deps);
    expect(offline).toContain(a.id);
    const after = await job(jobId);
    expect(after.status).toBe("queued");
    expect(after.provider_id).not.toBe(a.id);
    expect(after.attempt).toBe(2);

    const b = await newProvider(srv);
    expect((await heartbeat(srv, b.key)).status).toBe(200);
    expect(await job(jobId)).toMatchObject({ status: "pending", provider_id: b.id });
  });

  it("resume offers queued work at once; a scheduled provider outside its window gets none", async () => {
    const renter = await makeRenter(srv, 100_000);
    const p = await newProvider(srv);
    await heartbeat(srv, p.key);
    await api.post("/api/providers/pause", { key: p.key });
    const now = new Date();
    const hhmm = (d: Date) => d.toISOString().slice(11, 16);
    // A window that closed an hour ago and opens in two hours.
    const start = hhmm(new Date(now.getTime() + 2 * 3600_000));
    const end = hhmm(new Date(now.getTime() - 3600_000));
    const pref = await api.post("/api/providers/preferences", { key: p.key, run_mode: "scheduled", scheduled_start: start, scheduled_end: end });
    expect(pref.status).toBe(200);
    // A paused provider is still supply that can come back: the job waits in the queue.
    const submitted = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 1 }, renter.headers);
    expect(submitted.status).toBe(201);
    const jobId: string = submitted.body.job.job_id;
    expect(submitted.body.job.status).toBe("queued");

    // Resumed but outside its window: offered nothing.
    await api.post("/api/providers/resume", { key: p.key });
    expect(await job(jobId)).toMatchObject({ status: "queued", provider_id: null });

    // Always-on again: the next resume hands it the job at once.
    await api.post("/api/providers/preferences", { key: p.key, run_mode: "always-on" });
    await api.post("/api/providers/pause", { key: p.key });
    await api.post("/api/providers/resume", { key: p.key });
    expect(await job(jobId)).toMatchObject({ status: "pending", provider_id: p.id });
  });
});
