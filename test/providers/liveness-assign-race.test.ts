// The liveness sweep racing an assignment. The sweep moves a silent provider offline and then
// re-queues its work (requeueJobsOfProvider 'silent'). Moving it offline marks the provider's
// provider_load row away (migration 060), so it waits for an assignment in flight that read the
// provider as live: that job is on the provider when the re-queue looks, and one that locks the
// row later sees it away. A job pinned to the provider that it never picked up goes back to the
// queue to wait for it, by the sweep's re-queue or the job sweep's lost-jobs safety net, rather
// than failing as the provider's silence. Deterministic: the load row is held from a second connection.
import { beforeEach, describe, expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { dispatchForProvider, requeueJobsOfProvider } from "../../src/domain/dispatch/dispatch.js";
import { markSilentProvidersOffline } from "../../src/domain/dispatch/liveness-sweep.js";
import { markJobAccepted } from "../../src/domain/jobs/job-reports.js";
import { sweepJobs } from "../../src/workers/job-timeouts.js";
import { clearMarketplace } from "../helpers/isolation.js";
import { loadRowHolder, waitingOn as waitingOnLock } from "../helpers/lock-races.js";

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0" });
const api = client(srv);
beforeEach(() => clearMarketplace(srv));
const holdLoadRow = loadRowHolder(() => srv.sql);

const waitingOn = (pattern: string, n = 1) => waitingOnLock(srv.sql, pattern, n);

/** The platform has been up long enough for the sweeps to judge silences. */
const platformUp = () => srv.sql`
  INSERT INTO platform_pulse (id, last_at, up_since) VALUES (1, now(), now() - interval '1 hour')
  ON CONFLICT (id) DO UPDATE SET last_at = now(), up_since = now() - interval '1 hour'`;

/** A renter's job pinned to `provider`, submitted while the provider was paused (queued), the provider back online. */
async function pinnedJob(provider: { id: number }) {
  const renter = await makeRenter(srv, 10_000);
  await srv.sql`UPDATE providers SET is_paused = true, status = 'paused' WHERE id = ${provider.id}`;
  const r = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 10, provider_id: provider.id }, renter.headers);
  expect(r.body.job?.status, r.text).toBe("queued");
  await srv.sql`UPDATE providers SET is_paused = false, status = 'online', last_heartbeat = now() WHERE id = ${provider.id}`;
  return { renter, jobId: r.body.job.job_id as string };
}

const jobRow = async (jobId: string) =>
  (await srv.sql<{ status: string; provider_id: number | null; attempt: number; end_reason: string | null }[]>`
    SELECT status, provider_id, attempt, end_reason FROM jobs WHERE job_id = ${jobId}`)[0];

const attempts = async (jobId: string) =>
  srv.sql<{ attempt: number; status: string; end_reason: string | null }[]>`
    SELECT attempt, status, end_reason FROM job_attempts WHERE job_id = (SELECT id FROM jobs WHERE job_id = ${jobId}) ORDER BY attempt`;

describe("the liveness sweep racing an assignment", () => {
  it("the sweep waits for an assignment in flight, and its re-queue puts the pinned job back in the queue", async () => {
    await platformUp();
    const provider = await makeProvider(srv);
    const { renter, jobId } = await pinnedJob(provider);

    const release = await holdLoadRow(provider.id);

    // The assignment reads the provider live, then waits for the load row.
    const assigning = dispatchForProvider(srv.sql, provider.id);
    await waitingOn("%FOR UPDATE OF l%");
    // Meanwhile its heartbeats stop: the sweep's move offline waits for the assignment.
    await srv.sql`UPDATE providers SET last_heartbeat = now() - interval '10 minutes' WHERE id = ${provider.id}`;
    const sweeping = markSilentProvidersOffline(srv.sql);
    const first = await Promise.race([sweeping.then(() => "answered"), waitingOn("%SET status = 'offline'%").then(() => "waiting")]);
    expect(first).toBe("waiting");
    await release();
    expect(await assigning).toHaveLength(1);
    expect(await sweeping).toEqual([provider.id]);

    // The re-queue finds the job the assignment landed: never picked up, it waits for its provider.
    expect(await requeueJobsOfProvider(srv.sql, provider.id, "silent", "provider went offline (no heartbeat within 120 s)")).toEqual({ requeued: [jobId], failed: [] });
    // The job sweep with its lost-jobs safety net, as the worker runs it: nothing left to do.
    await sweepJobs(srv.sql, { lostJobs: true });
    expect(await jobRow(jobId)).toEqual({ status: "queued", provider_id: null, attempt: 2, end_reason: null });
    expect(await attempts(jobId)).toEqual([{ attempt: 1, status: "requeued", end_reason: "provider_silent" }]);
    const reason = (await api.get(`/api/jobs/${jobId}`, renter.headers)).body;
    expect(reason.queue_reason_code ?? reason.job?.queue_reason_code).toBe("provider_offline");
    // Offline: offered nothing.
    expect(await dispatchForProvider(srv.sql, provider.id)).toEqual([]);
  });

  it("the lost-jobs safety net re-queues a pinned job its silent provider never picked up, and fails one it ran", async () => {
    await platformUp();
    const provider = await makeProvider(srv);
    const { jobId: notPickedUp } = await pinnedJob(provider);
    const { jobId: ran } = await pinnedJob(provider);
    await srv.sql`UPDATE providers SET gpu_count = 2 WHERE id = ${provider.id}`;
    expect(await dispatchForProvider(srv.sql, provider.id)).toHaveLength(2);
    await markJobAccepted(srv.sql, provider.id, { jobId: ran });
    // Silent, not yet moved offline (the liveness sweep's re-queue did not finish).
    await srv.sql`UPDATE providers SET last_heartbeat = now() - interval '10 minutes' WHERE id = ${provider.id}`;
    await sweepJobs(srv.sql, { lostJobs: true });
    expect(await jobRow(notPickedUp)).toEqual({ status: "queued", provider_id: null, attempt: 2, end_reason: null });
    expect(await jobRow(ran)).toMatchObject({ status: "failed", end_reason: "provider_silent" });
  });
});
