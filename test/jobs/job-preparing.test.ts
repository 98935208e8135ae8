// A stream daemon preparing a job before it accepts it (pulling the job's
// image, which can take minutes): its JobPreparing notices keep the pending
// attempt from the pickup sweep (releaseUnclaimed) for a pickup window after
// each, up to PREPARE_LIMIT_SECONDS after the assignment, and the renter sees
// what it does as the job's progress phase. Nothing is billed until the
// accept. A legacy daemon does the same after its poll (POST
// /api/jobs/{id}/preparing): the run starts at its next report. Time passes
// by moving the job's timestamps back, never by sleeping.
import { describe, expect, it } from "vitest";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import { PICKUP_SECONDS, PREPARE_LIMIT_SECONDS, releaseUnclaimed } from "../../src/domain/dispatch/dispatch.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { client } from "../helpers/http.js";
import { openStream, useStreamServer } from "../daemon/grpc-stream.js";

const { srv, streams } = useStreamServer({ SVC_LIVENESS_SWEEP_SECONDS: "0", SVC_JOB_SWEEP_MS: "60000" });
const api = client(srv);

const row = async (jobId: string) =>
  (
    await srv.sql<{ status: string; attempt: number; provider_id: number | null; preparing: boolean; progress_phase: string | null; started_at: Date | null }[]>`
      SELECT status, attempt, provider_id, preparing_at IS NOT NULL AS preparing, progress_phase, started_at FROM jobs WHERE job_id = ${jobId}`
  )[0];
const firstAttempt = async (jobId: string) =>
  (await srv.sql`SELECT a.status, a.end_reason, a.error, a.cost_halala FROM job_attempts a JOIN jobs j ON j.id = a.job_id WHERE j.job_id = ${jobId} AND a.attempt = 1`)[0];
/** As if `seconds` went by since the assignment, and `sinceNotice` since the latest notice. */
const elapse = (jobId: string, seconds: number, sinceNotice: number) => srv.sql`
  UPDATE jobs SET submitted_at = submitted_at - make_interval(secs => ${seconds}), assigned_at = assigned_at - make_interval(secs => ${seconds}),
         preparing_at = now() - make_interval(secs => ${sinceNotice})
  WHERE job_id = ${jobId}`;

/** A provider with a stream open and a job pushed to it (not accepted). */
async function handedJob() {
  const p = await makeProvider(srv);
  const renter = await makeRenter(srv, 10_000);
  const s = openStream(srv.port, p.key);
  streams.push(s);
  s.send({ case: "hello", value: { daemonVersion: "5.3.0", runningJobIds: [], gpus: [{ name: "NVIDIA GeForce RTX 4090", vram_mib: 24564 }] } });
  await s.next("welcome");
  const sub = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 2 }, renter.headers);
  expect(sub.status, sub.text).toBe(201);
  const jobId = sub.body.job.job_id as string;
  expect(await s.next("job")).toMatchObject({ jobId, attempt: 1 });
  return { p, renter, s, jobId };
}

describe("a job its stream daemon prepares before accepting it", () => {
  it("stays assigned past the pickup window while notices come, shows what the daemon does, and bills from the accept", async () => {
    const { renter, s, jobId } = await handedJob();
    s.send({ case: "jobPreparing", value: { jobId, attempt: 1, detail: "pulling image nvidia/cuda:12.4.1-base-ubuntu22.04" } });
    await expect.poll(async () => (await row(jobId)).preparing).toBe(true);
    expect(await row(jobId)).toMatchObject({ status: "pending", progress_phase: "preparing: pulling image nvidia/cuda:12.4.1-base-ubuntu22.04", started_at: null });
    const seen = await api.get(`/api/jobs/${jobId}`, renter.headers);
    expect(seen.body).toMatchObject({ status: "pending", progress_phase: "preparing: pulling image nvidia/cuda:12.4.1-base-ubuntu22.04" });

    // Ten minutes since the assignment, the latest notice 30 s ago: kept.
    await elapse(jobId, 600, 30);
    expect(await releaseUnclaimed(srv.sql)).toEqual({ requeued: 0, failed: 0 });
    expect((await row(jobId)).status).toBe("pending");

    // The accept starts it: billed from now, the preparing phase over.
    s.send({ case: "jobAccepted", value: { jobId, attempt: 1 } });
    await expect.poll(async () => (await row(jobId)).status).toBe("running");
    const [{ billed_from_accept }] = await srv.sql`SELECT started_at > assigned_at + interval '9 minutes' AS billed_from_accept FROM jobs WHERE job_id = ${jobId}`;
    expect(billed_from_accept).toBe(true);
    expect(await row(jobId)).toMatchObject({ preparing: false, progress_phase: null });
    s.send({ case: "result", value: { jobId, success: true } });
    // One minute billed, not the ten it waited for its image.
    expect(await s.next("resultAck")).toMatchObject({ status: "completed", costHalala: 10n });
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("is taken back as never picked up a pickup window after the last notice, or at the limit however often they come", async () => {
    const quiet = await handedJob();
    quiet.s.send({ case: "jobPreparing", value: { jobId: quiet.jobId, detail: "pulling image x" } });
    await expect.poll(async () => (await row(quiet.jobId)).preparing).toBe(true);
    await elapse(quiet.jobId, 300, PICKUP_SECONDS + 1);
    expect(await releaseUnclaimed(srv.sql)).toMatchObject({ requeued: 1 });
    const a = await firstAttempt(quiet.jobId);
    expect(a).toMatchObject({ status: "requeued", end_reason: "not_picked_up", cost_halala: 0 });
    expect(a.error).toMatch(/said it was preparing the job, then nothing for 120 seconds/);
    expect(await row(quiet.jobId)).toMatchObject({ preparing: false, progress_phase: null, attempt: 2 });
    // Out of the way of the next provider and its job.
    expect((await api.post(`/api/jobs/${quiet.jobId}/cancel`, {}, quiet.renter.headers)).status).toBe(200);
    await srv.sql`UPDATE providers SET is_paused = true WHERE id = ${quiet.p.id}`;

    const slow = await handedJob();
    slow.s.send({ case: "jobPreparing", value: { jobId: slow.jobId, detail: "pulling image y" } });
    await expect.poll(async () => (await row(slow.jobId)).preparing).toBe(true);
    await elapse(slow.jobId, PREPARE_LIMIT_SECONDS + 1, 5);
    expect(await releaseUnclaimed(srv.sql)).toMatchObject({ requeued: 1 });
    expect((await firstAttempt(slow.jobId)).error).toMatch(/still preparing the job 30 minutes after it was assigned \(preparing: pulling image y\)/);
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("is refused for a job not pending on this provider at that attempt, and changes nothing", async () => {
    const { s, jobId } = await handedJob();
    s.send({ case: "jobPreparing", value: { jobId, attempt: 2, detail: "x" } });
    expect(await s.next("error")).toMatchObject({ jobId, report: "jobPreparing" });
    const other = await makeProvider(srv);
    const o = openStream(srv.port, other.key);
    streams.push(o);
    o.send({ case: "hello", value: { daemonVersion: "5.3.0", runningJobIds: [], gpus: [{ name: "NVIDIA GeForce RTX 4090", vram_mib: 24564 }] } });
    await o.next("welcome");
    o.send({ case: "jobPreparing", value: { jobId, detail: "not mine" } });
    expect(await o.next("error")).toMatchObject({ jobId, report: "jobPreparing" });
    expect(await row(jobId)).toMatchObject({ status: "pending", preparing: false, progress_phase: null });

    s.send({ case: "jobAccepted", value: { jobId } });
    await expect.poll(async () => (await row(jobId)).status).toBe("running");
    s.send({ case: "jobPreparing", value: { jobId, detail: "too late" } });
    const e = await s.next("error");
    expect(e).toMatchObject({ jobId, report: "jobPreparing" });
    expect(e.message).toMatch(/already running/);
    expect((await row(jobId)).progress_phase).toBeNull();
  });
});

describe("a job a legacy daemon prepares after its poll", () => {
  /** A job polled over the legacy JSON wire (running, not yet reported on). */
  async function polledJob() {
    const p = await makeProvider(srv);
    const renter = await makeRenter(srv, 10_000);
    const sub = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 2, max_duration_seconds: 300 }, renter.headers);
    expect(sub.status, sub.text).toBe(201);
    const jobId = sub.body.job.job_id as string;
    expect((await api.get(`/api/providers/${p.key}/jobs`)).body.job).toMatchObject({ job_id: jobId, attempt: 1 });
    const prepare = (body: Record<string, unknown> = {}) =>
      api.post(`/api/jobs/${jobId}/preparing`, { api_key: p.key, attempt: 1, detail: "pulling image nvidia/cuda:12.4.1-base-ubuntu22.04", ...body });
    return { p, renter, jobId, prepare };
  }
  /** As if `seconds` went by since the poll (and the assignment), and `sinceNotice` since the latest notice. */
  const elapsePolled = (jobId: string, seconds: number, sinceNotice: number) => srv.sql`
    UPDATE jobs SET submitted_at = submitted_at - make_interval(secs => ${seconds}), assigned_at = assigned_at - make_interval(secs => ${seconds}),
           started_at = started_at - make_interval(secs => ${seconds}), timeout_at = timeout_at - make_interval(secs => ${seconds}),
           preparing_at = now() - make_interval(secs => ${sinceNotice})
    WHERE job_id = ${jobId}`;

  it("is kept while notices come, and its run, billed time and deadline start at the next report, not at the poll", async () => {
    const { p, renter, jobId, prepare } = await polledJob();
    const r = await prepare();
    expect(r.status, r.text).toBe(200);
    expect((await api.get(`/api/jobs/${jobId}`, renter.headers)).body).toMatchObject({ status: "running", progress_phase: "preparing: pulling image nvidia/cuda:12.4.1-base-ubuntu22.04" });

    // A ten-minute pull, the latest notice 30 s ago: kept, and not timed out past its 300 s limit; it
    // has cost nothing so far.
    await elapsePolled(jobId, 600, 30);
    expect(await releaseUnclaimed(srv.sql)).toEqual({ requeued: 0, failed: 0 });
    expect((await row(jobId)).status).toBe("running");
    expect((await api.get(`/api/jobs/${jobId}`, renter.headers)).body.running_cost_halala).toBe(0);

    // The first report starts it: the run counts from here.
    const progress = await api.post(`/api/jobs/${jobId}/progress`, { api_key: p.key, attempt: 1, progress_pct: 5, phase: "loading" });
    expect(progress.status, progress.text).toBe(200);
    const [started] = await srv.sql`SELECT started_at > now() - interval '5 seconds' AS fresh, timeout_at > now() + interval '290 seconds' AS later, preparing_at FROM jobs WHERE job_id = ${jobId}`;
    expect(started).toEqual({ fresh: true, later: true, preparing_at: null });
    const [attempt] = await srv.sql`SELECT a.started_at > now() - interval '5 seconds' AS fresh FROM job_attempts a JOIN jobs j ON j.id = a.job_id WHERE j.job_id = ${jobId}`;
    expect(attempt.fresh).toBe(true);
    // Reported on: no more notices.
    const late = await prepare();
    expect(late.status, late.text).toBe(409);

    // Done a moment later: one minute billed, not the eleven since the poll.
    const done = await api.post("/api/providers/job-result", { api_key: p.key, job_id: jobId, attempt: 1, success: true, result: { ok: true } });
    expect(done.body).toMatchObject({ status: "completed", cost_halala: 10 });
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("a daemon event naming it starts it too", async () => {
    const { p, jobId, prepare } = await polledJob();
    expect((await prepare()).status).toBe(200);
    await elapsePolled(jobId, 400, 10);
    const ev = await api.post("/api/providers/daemon-event", { api_key: p.key, event_type: "job_started", severity: "info", job_id: jobId });
    expect(ev.status, ev.text).toBe(200);
    const [j] = await srv.sql`SELECT acked_at IS NOT NULL AS acked, started_at > now() - interval '5 seconds' AS fresh, preparing_at FROM jobs WHERE job_id = ${jobId}`;
    expect(j).toEqual({ acked: true, fresh: true, preparing_at: null });
  });

  it("is taken back a pickup window after the last notice, or at the limit however often they come", async () => {
    const quiet = await polledJob();
    expect((await quiet.prepare()).status).toBe(200);
    await elapsePolled(quiet.jobId, 300, PICKUP_SECONDS + 5);
    const limit = await polledJob();
    expect((await limit.prepare()).status).toBe(200);
    await elapsePolled(limit.jobId, PREPARE_LIMIT_SECONDS + 5, 5);
    expect(await releaseUnclaimed(srv.sql)).toEqual({ requeued: 2, failed: 0 });
    expect(await firstAttempt(quiet.jobId)).toMatchObject({ status: "requeued", end_reason: "not_picked_up", cost_halala: 0, error: expect.stringContaining("said it was preparing the job, then nothing") });
    expect(await firstAttempt(limit.jobId)).toMatchObject({ status: "requeued", end_reason: "not_picked_up", cost_halala: 0, error: expect.stringContaining("still preparing the job 30 minutes after") });
    // The job is no longer this provider's: its notice is refused.
    expect((await quiet.prepare()).status).toBe(403);
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });
});
