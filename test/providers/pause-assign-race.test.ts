// A provider's pause racing an assignment to it. Pause promises "the provider keeps heartbeating
// but gets no new jobs". An assignment reads the provider's availability on its statement's
// snapshot and then locks the provider's provider_load row; the pause marks that row away
// (migration 060), so the two are ordered: an assignment already holding the row lands first and
// the pause is answered after it, and one that locks the row after the pause sees it. The race is
// made deterministic by holding the load row from a second connection.
//
// A job that lands just before the pause reaches a daemon told it is paused, which refuses it
// (src/daemon/ts/daemon.ts refusal(): "the provider is paused"): the attempt ends as provider_paused,
// kept in the job's history, at no cost to the renter or the provider and spending none of the job's
// attempts, and a job pinned to the provider waits for it to resume.
import { beforeEach, describe, expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { refusedToTheLimit } from "../helpers/attempt-limit.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { dispatchForProvider } from "../../src/domain/dispatch/dispatch.js";
import { markJobRejected } from "../../src/domain/jobs/job-reports.js";
import { clearMarketplace } from "../helpers/isolation.js";
import { loadRowHolder, waitingOn as waitingOnLock } from "../helpers/lock-races.js";

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0" });
const api = client(srv);
beforeEach(() => clearMarketplace(srv));
const holdLoadRow = loadRowHolder(() => srv.sql);

const waitingOn = (pattern: string, n = 1) => waitingOnLock(srv.sql, pattern, n);

/** Whether `p` is still unsettled once `waiting` (a wait for a lock) is seen: it waits, or it answered first. */
async function waitsFor(p: Promise<unknown>, waiting: Promise<void>): Promise<"waiting" | "answered"> {
  return Promise.race([p.then(() => "answered" as const), waiting.then(() => "waiting" as const)]);
}

/** A queued job waiting for `provider` (pinned to it or not), the provider available again, and its load row held elsewhere. */
async function setUp(pinned: boolean) {
  const renter = await makeRenter(srv, 10_000);
  const provider = await makeProvider(srv);
  await srv.sql`UPDATE providers SET is_paused = true, status = 'paused' WHERE id = ${provider.id}`;
  const r = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 10, ...(pinned ? { provider_id: provider.id } : {}) }, renter.headers);
  expect(r.body.job?.status, r.text).toBe("queued");
  await srv.sql`UPDATE providers SET is_paused = false, status = 'online', last_heartbeat = now() WHERE id = ${provider.id}`;
  return { provider, renter, jobId: r.body.job.job_id as string, release: await holdLoadRow(provider.id) };
}

const jobRow = async (jobId: string) =>
  (await srv.sql<{ status: string; provider_id: number | null; attempt: number; end_reason: string | null }[]>`
    SELECT status, provider_id, attempt, end_reason FROM jobs WHERE job_id = ${jobId}`)[0];

const balance = async (key: string) => (await api.get("/api/renters/balance", { "x-renter-key": key })).body;

const pause = (key: string) => api.post("/api/providers/pause", { key });

describe("a pause racing an assignment", () => {
  it("a pause waits for an assignment in flight and is answered after that job landed", async () => {
    const { provider, jobId, release } = await setUp(false);
    // The assignment reads the provider as available, then waits for its load row.
    const assigning = dispatchForProvider(srv.sql, provider.id);
    await waitingOn("%FOR UPDATE OF l%");
    // The owner pauses: not answered while the assignment is in flight.
    const pausing = pause(provider.key);
    expect(await waitsFor(pausing, waitingOn("%SET is_paused = true%"))).toBe("waiting");
    await release();
    expect(await assigning).toHaveLength(1);
    const paused = await pausing;
    expect(paused.body, paused.text).toEqual({ success: true, status: "paused" });
    // The job landed before the pause took effect; nothing lands after it.
    expect(await jobRow(jobId)).toMatchObject({ status: "pending", provider_id: provider.id });
    expect(await dispatchForProvider(srv.sql, provider.id)).toEqual([]);
  });

  it("an assignment that read the provider before a pause committed, and locks it after, assigns nothing", async () => {
    const { provider, jobId, release } = await setUp(false);
    // The pause goes first and waits for the load row...
    const pausing = pause(provider.key);
    await waitingOn("%SET is_paused = true%");
    // ...then an assignment reads the provider, still available on its snapshot, and waits behind it.
    const assigning = dispatchForProvider(srv.sql, provider.id);
    await waitingOn("%FOR UPDATE OF l%");
    await release();
    expect((await pausing).body).toEqual({ success: true, status: "paused" });
    expect(await assigning).toEqual([]);
    expect(await jobRow(jobId)).toMatchObject({ status: "queued", provider_id: null });
  });

  it("a pinned job its paused provider refuses goes back to the queue, the hand-back kept in its history at no one's fault", async () => {
    const { provider, renter, jobId, release } = await setUp(true);
    const assigning = dispatchForProvider(srv.sql, provider.id);
    await waitingOn("%FOR UPDATE OF l%");
    const pausing = pause(provider.key);
    expect(await waitsFor(pausing, waitingOn("%SET is_paused = true%"))).toBe("waiting");
    await release();
    await assigning;
    expect((await pausing).status).toBe(200);
    expect(await jobRow(jobId)).toMatchObject({ status: "pending", provider_id: provider.id });
    // What a paused stream daemon does with a job pushed to it (daemon.ts refusal()).
    expect(await markJobRejected(srv.sql, provider.id, { jobId, reason: "the provider is paused", endReason: "provider_refused", attempt: 1 })).toBe("requeued");
    // The renter's pinned job waits for its provider to resume: not failed, nothing charged, nothing recorded against the provider.
    expect(await jobRow(jobId)).toEqual({ status: "queued", provider_id: null, attempt: 2, end_reason: null });
    expect(await srv.sql`SELECT * FROM provider_attempt_days WHERE provider_id = ${provider.id}`).toEqual([]);
    expect(await balance(renter.key)).toMatchObject({ balance_halala: 10_000, held_halala: 100, total_spent_halala: 0 });
    const reason = (await api.get(`/api/jobs/${jobId}`, renter.headers)).body;
    expect(reason.queue_reason_code ?? reason.job?.queue_reason_code).toBe("provider_paused");
    // The hand-back is in the job's history, to its renter and to the provider that held it.
    for (const headers of [renter.headers, provider.headers]) {
      const history = await api.get(`/api/jobs/${jobId}/history`, headers);
      expect(history.status, history.text).toBe(200);
      expect(history.body.attempts).toEqual([
        expect.objectContaining({
          attempt: 1, provider_id: provider.id, status: "requeued", end_reason: "provider_paused", fault: "none", cost_halala: 0,
          error: expect.stringMatching(/the provider is paused/),
        }),
      ]);
      expect(history.body.attempts[0].ended_at).toEqual(expect.any(String));
    }
    // Resumed: the provider is offered the job again, as its next attempt.
    expect((await api.post("/api/providers/resume", { key: provider.key })).status).toBe(200);
    expect(await jobRow(jobId)).toEqual({ status: "pending", provider_id: provider.id, attempt: 2, end_reason: null });
    expect(await srv.sql`SELECT * FROM provider_attempt_days WHERE provider_id = ${provider.id}`).toEqual([]);
  });

  it("a hand-back by a paused provider spends none of the job's attempts", async () => {
    const renter = await makeRenter(srv, 10_000);
    const paused = await makeProvider(srv);
    const r = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 10 }, renter.headers);
    const jobId: string = r.body.job?.job_id;
    expect(await jobRow(jobId), r.text).toMatchObject({ status: "pending", provider_id: paused.id, attempt: 1 });
    // Paused with the job assigned and not yet accepted; its daemon hands it back.
    expect((await pause(paused.key)).status).toBe(200);
    expect(await markJobRejected(srv.sql, paused.id, { jobId, reason: "the provider is paused", attempt: 1 })).toBe("requeued");
    // SVC_JOB_MAX_ATTEMPTS (3) provider failures after it: the last one, not the one before, fails the job.
    await refusedToTheLimit(srv, jobId, 2);
    const history = await api.get(`/api/jobs/${jobId}/history`, renter.headers);
    expect(history.body.attempts.map((a: { end_reason: string }) => a.end_reason)).toEqual(["provider_paused", "provider_refused", "provider_refused", "provider_refused"]);
    expect(await balance(renter.key)).toMatchObject({ balance_halala: 10_000, held_halala: 0, total_spent_halala: 0 });
  });

  it("a refusal by a provider that is not paused stays the provider's fault", async () => {
    const { provider, jobId, release } = await setUp(true);
    await release();
    expect(await dispatchForProvider(srv.sql, provider.id)).toHaveLength(1);
    expect(await markJobRejected(srv.sql, provider.id, { jobId, reason: "not enough free VRAM", attempt: 1 })).toBe("failed");
    expect(await jobRow(jobId)).toMatchObject({ status: "failed", end_reason: "provider_refused" });
  });
});
