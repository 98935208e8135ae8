// A job re-queued and assigned back to the same provider is a new attempt,
// pending there until it is handed out (the legacy poll, a stream's accept).
// Reports from the earlier attempt's run, still going on the daemon, must not
// start it: it would run on the record with nothing behind it and be billed to
// the renter at its deadline. Reports name their attempt (progress, logs,
// endpoint-ready, accept, a hello's running jobs); one naming none is taken for
// the current attempt, and refused while that attempt is pending.
import { describe, expect, it } from "vitest";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import { openStream, useStreamServer } from "../daemon/grpc-stream.js";
import { admin, pickUp } from "./helpers.js";

const { srv, streams } = useStreamServer({ SVC_LIVENESS_SWEEP_SECONDS: "0", SVC_JOB_SWEEP_MS: "60000" });
const api = client(srv);

const row = async (jobId: string) =>
  (await srv.sql<{ status: string; attempt: number; provider_id: number | null; acked: boolean; progress_pct: number | null; endpoint_url: string | null }[]>`
    SELECT status, attempt, provider_id, acked_at IS NOT NULL AS acked, progress_pct, endpoint_url FROM jobs WHERE job_id = ${jobId}`)[0];
const logAttempts = async (jobId: string) =>
  (await srv.sql<{ attempt: number; message: string }[]>`
    SELECT l.attempt, l.message FROM job_logs l JOIN jobs j ON j.id = l.job_id WHERE j.job_id = ${jobId} ORDER BY l.id`).map((l) => [l.attempt, l.message]);

/** A job pinned to provider `p`, run there (attempt 1), then re-queued by an admin back onto it: attempt 2, pending there. */
async function assignedBack(p: { id: number }, start: (jobId: string) => Promise<void>) {
  const renter = await makeRenter(srv, 100_000);
  const sub = await api.post("/api/jobs/submit", { job_type: "vllm_serve", duration_minutes: 30, max_duration_seconds: 1800, provider_id: p.id }, renter.headers);
  expect(sub.status, sub.text).toBe(201);
  const jobId = sub.body.job.job_id as string;
  await start(jobId);
  expect(await row(jobId)).toMatchObject({ status: "running", attempt: 1 });
  const rq = await api.post(`/api/admin/jobs/${jobId}/requeue`, { reason: "moved" }, admin(srv));
  expect(rq.status, rq.text).toBe(200);
  expect(await row(jobId)).toMatchObject({ status: "pending", attempt: 2, provider_id: p.id, acked: false });
  return jobId;
}

describe("reports from an earlier attempt's run (JSON)", () => {
  it("leave the pending attempt pending; the poll hands it out and its own reports confirm it", async () => {
    const p = await makeProvider(srv);
    const jobId = await assignedBack(p, async (id) => {
      expect(await pickUp(api, p.key)).toMatchObject({ job_id: id, attempt: 1 });
    });
    const post = (route: string, body: Record<string, unknown>) => api.post(`/api/jobs/${jobId}/${route}`, { api_key: p.key, ...body });

    // Naming no attempt: taken for attempt 2, which the daemon has not been handed.
    for (const [route, body] of [
      ["progress", { progress_pct: 50, phase: "half" }],
      ["endpoint-ready", { endpoint_url: "http://203.0.113.9:8000" }],
      ["logs", { logs: ["a line"] }],
    ] as const) {
      const r = await post(route, body);
      expect(r.status, `${route}: ${r.text}`).toBe(409);
      expect(r.body.error).toMatch(/attempt 2 of job .* has not been picked up by this provider yet/);
    }
    const result = await api.post("/api/providers/job-result", { api_key: p.key, job_id: jobId, success: true, result: { ok: true } });
    expect(result.status, result.text).toBe(409);
    // Naming attempt 1: refused as stale, except its log lines, kept with attempt 1.
    expect((await post("progress", { progress_pct: 60, attempt: 1 })).status).toBe(409);
    expect((await post("endpoint-ready", { endpoint_url: "http://203.0.113.9:8000", attempt: 1 })).status).toBe(409);
    const oldLines = await post("logs", { logs: ["attempt one's last line"], attempt: 1 });
    expect(oldLines.status, oldLines.text).toBe(200);
    expect(await row(jobId)).toMatchObject({ status: "pending", attempt: 2, acked: false, progress_pct: null, endpoint_url: null });
    // Another provider's attempt, or one that never was, is not this provider's to write.
    expect((await post("logs", { logs: ["x"], attempt: 7 })).status).toBe(403);

    // The daemon's status check sees the job on another attempt than it runs (docs/daemons.md).
    const seen = await api.get(`/api/jobs/${jobId}`, { "x-provider-key": p.key });
    expect(seen.body).toMatchObject({ status: "pending", attempt: 2 });

    // The poll hands attempt 2 out; its reports confirm it.
    expect(await pickUp(api, p.key)).toMatchObject({ job_id: jobId, attempt: 2 });
    const mine = await post("progress", { progress_pct: 10, attempt: 2 });
    expect(mine.status, mine.text).toBe(200);
    expect(await row(jobId)).toMatchObject({ status: "running", attempt: 2, acked: true, progress_pct: 10 });
    expect((await post("logs", { logs: ["attempt two"] })).status).toBe(200);
    expect(await logAttempts(jobId)).toEqual([[1, "attempt one's last line"], [2, "attempt two"]]);
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });
});

describe("reports from an earlier attempt's run (stream)", () => {
  const hello = (runningJobIds: string[], runningJobAttempts: Record<string, number> = {}) => ({
    case: "hello" as const,
    value: { daemonVersion: "5.2.1", runningJobIds, runningJobAttempts, gpus: [{ name: "NVIDIA GeForce RTX 4090", vram_mib: 24564 }] },
  });

  async function streamRun(p: { key: string }) {
    const s1 = openStream(srv.port, p.key);
    streams.push(s1);
    s1.send(hello([]));
    await s1.next("welcome");
    return s1;
  }

  it("a hello naming the old attempt: the old run is cancelled and the new attempt pushed, started only by its accept", async () => {
    const p = await makeProvider(srv);
    const s1 = await streamRun(p);
    const jobId = await assignedBack(p, async (id) => {
      expect(await s1.next("job")).toMatchObject({ jobId: id, attempt: 1 });
      s1.send({ case: "jobAccepted", value: { jobId: id, attempt: 1 } });
      await expect.poll(async () => (await row(id)).status).toBe("running");
      s1.cancel(); // the connection drops; the daemon runs attempt 1 on
    });

    const s2 = openStream(srv.port, p.key);
    streams.push(s2);
    s2.send(hello([jobId], { [jobId]: 1 }));
    await s2.next("welcome");
    expect(await s2.next("cancel")).toMatchObject({ jobId, reason: "re-queued: attempt 2 of the job follows" });
    expect(await s2.next("job")).toMatchObject({ jobId, attempt: 2 });
    expect(await row(jobId)).toMatchObject({ status: "pending", attempt: 2 });

    // The old run's reports are refused; an accept of attempt 1 too.
    s2.send({ case: "progress", value: { jobId, progressPct: 40, attempt: 1 } });
    expect(await s2.next("error")).toMatchObject({ jobId, report: "progress" });
    s2.send({ case: "jobAccepted", value: { jobId, attempt: 1 } });
    expect(await s2.next("error")).toMatchObject({ jobId, report: "jobAccepted" });
    expect(await row(jobId)).toMatchObject({ status: "pending", attempt: 2, progress_pct: null });

    s2.send({ case: "jobAccepted", value: { jobId, attempt: 2 } });
    await expect.poll(async () => (await row(jobId)).status).toBe("running");
    expect((await row(jobId)).attempt).toBe(2);
  });

  it("a hello naming the job's current attempt resumes it; one naming no attempt is treated as an earlier run", async () => {
    const p = await makeProvider(srv);
    const s1 = await streamRun(p);
    const renter = await makeRenter(srv, 100_000);
    const sub = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 5 }, renter.headers);
    const jobId = sub.body.job.job_id as string;
    expect(await s1.next("job")).toMatchObject({ jobId, attempt: 1 });
    // The accept is lost with the connection: the daemon runs attempt 1, the server has it pending.
    s1.cancel();
    expect(await row(jobId)).toMatchObject({ status: "pending", attempt: 1 });

    const s2 = openStream(srv.port, p.key);
    streams.push(s2);
    s2.send(hello([jobId], { [jobId]: 1 }));
    await s2.next("welcome");
    await expect.poll(async () => (await row(jobId)).status).toBe("running");
    s2.send({ case: "progress", value: { jobId, progressPct: 30, attempt: 1 } });
    await expect.poll(async () => (await row(jobId)).progress_pct).toBe(30);
    expect(s2.received.filter((m) => m.kind.case === "cancel" || m.kind.case === "job")).toEqual([]);

    s2.send({ case: "result", value: { jobId, attempt: 1, success: true } });
    const ack = await s2.next("resultAck").catch((e) => { throw new Error(`${e.message}: ${JSON.stringify(s2.received.filter((m) => m.kind.case === "error").map((m) => m.kind.value))}`); });
    expect(ack).toMatchObject({ jobId, status: "completed" });

    // Another job, its accept lost too, named by a daemon that sends no attempts (older than the field).
    const sub2 = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 5 }, renter.headers);
    const second = sub2.body.job.job_id as string;
    expect(await s2.next("job")).toMatchObject({ jobId: second });
    s2.cancel();
    const s3 = openStream(srv.port, p.key);
    streams.push(s3);
    s3.send(hello([second]));
    await s3.next("welcome");
    expect(await s3.next("cancel")).toMatchObject({ jobId: second });
    expect(await s3.next("job")).toMatchObject({ jobId: second, attempt: 1 });
    expect(await row(second)).toMatchObject({ status: "pending" });
  });
});
