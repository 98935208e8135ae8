// Reports that end an attempt name it: a job re-queued and assigned back to
// the same provider is a new attempt, and the result (or hand-back) of the
// run it was taken from is refused, over JSON and over the gRPC stream, so
// that it never settles the new one. A report that names no attempt is taken
// for the current one, as older daemons send it.
import { describe, expect, it } from "vitest";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import { openStream, useStreamServer } from "../daemon/grpc-stream.js";
import { admin, pickUp } from "./helpers.js";

const { srv, streams } = useStreamServer();
const api = client(srv);

/** A job pinned to provider `p`: an admin's re-queue sends it back there as a new attempt. */
const submit = async (renter: { headers: Record<string, string> }, p: { id: number }) => {
  const r = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 1, params: { suite: "quick", iterations: 1 }, provider_id: p.id }, renter.headers);
  expect(r.status, r.text).toBe(201);
  return r.body.job.job_id as string;
};
const requeue = async (jobId: string) => {
  const r = await api.post(`/api/admin/jobs/${jobId}/requeue`, { reason: "moved" }, admin(srv));
  expect(r.status, r.text).toBe(200);
};
const row = async (jobId: string) => (await srv.sql`SELECT status, attempt, provider_id FROM jobs WHERE job_id = ${jobId}`)[0];

describe("reports name the attempt they end", () => {
  it("over JSON: the poll names the attempt, and the result of an earlier one is refused", async () => {
    const p = await makeProvider(srv);
    const renter = await makeRenter(srv, 1_000);
    const jobId = await submit(renter, p);
    const first = await pickUp(api, p.key);
    expect(first).toMatchObject({ job_id: jobId, attempt: 1 });
    // Re-queued, and back to the provider it is pinned to as attempt 2.
    await requeue(jobId);
    const second = await pickUp(api, p.key);
    expect(second).toMatchObject({ job_id: jobId, attempt: 2 });

    const stale = await api.post("/api/providers/job-result", { api_key: p.key, job_id: jobId, attempt: 1, success: true, result: { response: "old" } });
    expect(stale.status, stale.text).toBe(409);
    expect(stale.body.error).toMatch(/attempt 1 .* on attempt 2/);
    expect(await row(jobId)).toMatchObject({ status: "running", attempt: 2 });

    const current = await api.post("/api/providers/job-result", { api_key: p.key, job_id: jobId, attempt: 2, success: true, result: { response: "new" } });
    expect(current.status, current.text).toBe(200);
    expect((await api.get(`/api/jobs/${jobId}/output`, renter.headers)).body).toMatchObject({ response: "new" });
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("over JSON: a result that names no attempt is taken for the current one", async () => {
    const p = await makeProvider(srv);
    const renter = await makeRenter(srv, 1_000);
    const jobId = await submit(renter, p);
    await pickUp(api, p.key);
    const r = await api.post("/api/providers/job-result", { api_key: p.key, job_id: jobId, success: true, result: { response: "ok" } });
    expect(r.status, r.text).toBe(200);
    expect(await row(jobId)).toMatchObject({ status: "completed", attempt: 1 });
  });

  it("over the stream: each push names its attempt; a stale hand-back and result are refused, the current ones taken", async () => {
    const p = await makeProvider(srv);
    const renter = await makeRenter(srv, 1_000);
    const s = openStream(srv.port, p.key);
    streams.push(s);
    s.send({ case: "hello", value: { daemonVersion: "5.0.0", runningJobIds: [], gpus: [{ name: "NVIDIA GeForce RTX 4090", vram_mib: 24564 }] } });
    await s.next("welcome");
    const jobId = await submit(renter, p);
    expect(await s.next("job")).toMatchObject({ jobId, attempt: 1 });
    s.send({ case: "jobAccepted", value: { jobId } });
    await expect.poll(async () => (await row(jobId)).status).toBe("running");

    await requeue(jobId);
    expect((await s.next("cancel")).jobId).toBe(jobId);
    expect(await s.next("job")).toMatchObject({ jobId, attempt: 2 });
    s.send({ case: "jobAccepted", value: { jobId } });
    await expect.poll(async () => (await row(jobId)).status).toBe("running");

    // The first run, stopping, hands its attempt back: refused, attempt 2 runs on.
    s.send({ case: "jobRejected", value: { jobId, reason: "stopped", interrupted: true, attempt: 1 } });
    expect(await s.next("error")).toMatchObject({ jobId, code: "already_exists" });
    s.send({ case: "result", value: { jobId, attempt: 1, success: true } });
    expect(await s.next("error")).toMatchObject({ jobId, report: "result", code: "already_exists" });
    expect(await row(jobId)).toMatchObject({ status: "running", attempt: 2 });

    s.send({ case: "result", value: { jobId, attempt: 2, success: true } });
    expect(await s.next("resultAck")).toMatchObject({ jobId, status: "completed" });
    expect(await ledgerProblems(srv.sql)).toEqual([]);
    s.end();
  });
});
