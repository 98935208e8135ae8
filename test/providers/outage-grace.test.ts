// After an outage of the platform's own (the database away, every process
// down), providers are not blamed for the heartbeats and pickups it could not
// take: for one live window after the platform is up again, the liveness
// sweep marks no provider offline, re-queues no job as provider_silent and
// releases no polled job as not_picked_up. Then the rules apply as before.
import { beforeEach, describe, expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { clearMarketplace } from "../helpers/isolation.js";
import { pulse, PULSE_GAP_SECONDS } from "../../src/domain/shared/platform-pulse.js";
import { LIVE_WINDOW_SECONDS } from "../../src/domain/shared/liveness.js";
import { sweepOnce } from "../../src/workers/liveness-sweep.js";
import { sweepJobs } from "../../src/workers/job-timeouts.js";

const srv = useTestServer({ SVC_LIVENESS_SWEEP_SECONDS: "0", SVC_JOB_SWEEP_MS: "60000" });
const api = client(srv);
beforeEach(() => clearMarketplace(srv));

/** The platform's pulse stopped `seconds` ago (an outage that long, or longer). */
const pulseStopped = (seconds: number) => srv.sql`UPDATE platform_pulse SET last_at = now() - make_interval(secs => ${seconds})`;
/** The platform has been up for `seconds` (its pulse steady since). */
const upFor = (seconds: number) => srv.sql`UPDATE platform_pulse SET up_since = now() - make_interval(secs => ${seconds}), last_at = now()`;

async function polledJob() {
  const renter = await makeRenter(srv, 1_000);
  const provider = await makeProvider(srv);
  const r = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 1 }, renter.headers);
  expect(r.status, r.text).toBe(201);
  const jobId = r.body.job.job_id as string;
  expect((await api.get(`/api/providers/${provider.key}/jobs`)).body.job.job_id).toBe(jobId);
  return { provider, jobId };
}
const jobRow = async (jobId: string) => (await srv.sql`SELECT status, attempt, end_reason FROM jobs WHERE job_id = ${jobId}`)[0];
const attemptEnd = async (jobId: string) =>
  (await srv.sql`SELECT a.end_reason FROM job_attempts a JOIN jobs j ON j.id = a.job_id WHERE j.job_id = ${jobId} AND a.attempt = 1`)[0].end_reason;

describe("the platform's pulse", () => {
  it("moves up_since to now after a gap, and keeps it while the pulse is steady", async () => {
    await upFor(500);
    expect(await pulse(srv.sql)).toBeGreaterThanOrEqual(499);
    await pulseStopped(PULSE_GAP_SECONDS + 5);
    expect(await pulse(srv.sql)).toBeLessThan(2);
    await upFor(500);
  });
});

describe("after an outage of the platform's own", () => {
  it("marks no provider offline and re-queues nothing for one live window, then does", async () => {
    const { provider, jobId } = await polledJob();
    await api.post(`/api/jobs/${jobId}/progress`, { api_key: provider.key, progress_pct: 1, phase: "x" });
    // Nothing heard from the provider for two minutes and more, across an outage of a minute.
    await srv.sql`UPDATE providers SET last_heartbeat = now() - make_interval(secs => ${LIVE_WINDOW_SECONDS + 80}) WHERE id = ${provider.id}`;
    await pulseStopped(60);
    const during = await sweepOnce(srv.app.deps);
    expect(during.offline).toEqual([]);
    expect((await sweepJobs(srv.sql)).requeued).toBe(0);
    expect(await jobRow(jobId)).toMatchObject({ status: "running", attempt: 1 });

    // A live window after the platform came back: the provider's silence is its own.
    await upFor(LIVE_WINDOW_SECONDS + 1);
    expect((await sweepOnce(srv.app.deps)).offline).toEqual([provider.id]);
    expect(await jobRow(jobId)).toMatchObject({ status: "queued", attempt: 2 });
    expect(await attemptEnd(jobId)).toBe("provider_silent");
  });

  it("releases no polled job as not_picked_up for one pickup window, then does", async () => {
    const { jobId } = await polledJob();
    // Polled long ago, no report since; its provider is live (heartbeats got through once the platform was back).
    await srv.sql`UPDATE jobs SET started_at = now() - make_interval(secs => ${LIVE_WINDOW_SECONDS + 30}) WHERE job_id = ${jobId}`;
    await pulseStopped(60);
    expect((await sweepJobs(srv.sql)).requeued).toBe(0);
    expect(await jobRow(jobId)).toMatchObject({ status: "running", attempt: 1 });

    await upFor(LIVE_WINDOW_SECONDS + 1);
    expect((await sweepJobs(srv.sql)).requeued).toBe(1);
    expect(await attemptEnd(jobId)).toBe("not_picked_up");
  });
});
