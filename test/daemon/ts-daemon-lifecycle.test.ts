// The TypeScript daemon's job lifecycle against the real server: a cancelled
// job is stopped leaving no process, and a job survives a server restart (the
// stream reconnects and resumes; the job is not re-queued), also when it ended
// while no server was up.
import { describe, expect, it } from "vitest";
import { ADMIN_TOKEN, startTestServer } from "../helpers/server.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { waitFor } from "./helpers.js";
import { runGatedJob, useTsDaemonServer } from "./ts-harness.js";
import { jobProcesses } from "./procs.js";

const h = useTsDaemonServer();

describe("svc-daemon (TypeScript) lifecycle", { timeout: 90_000 }, () => {
  it("stops a cancelled job and leaves no process behind", async () => {
    const p = await makeProvider(h.srv);
    const renter = await makeRenter(h.srv, 1_000);
    const d = h.startDaemon(p.key);
    await waitFor(async () => (await h.srv.sql`SELECT readiness_status FROM providers WHERE id = ${p.id}`)[0].readiness_status, 45_000, "daemon up");
    const j = await h.submit(renter, { job_type: "benchmark", params: { suite: "memory", iterations: 1000 } });
    expect(j.provider_id).toBe(p.id);
    await waitFor(async () => (await h.job(j.job_id)).status === "running" && jobProcesses(j.job_id).length > 0, 45_000, `running (${d.output()})`);
    expect((await h.api().post(`/api/jobs/${j.job_id}/cancel`, {}, renter.headers)).status).toBe(200);
    await waitFor(() => jobProcesses(j.job_id).length === 0, 10_000, "job process gone");
    expect((await h.job(j.job_id)).status).toBe("cancelled");
    await waitFor(() => /cancelled by the server/.test(d.output()), 5_000, "daemon saw the cancel");
  });

  it("on SIGTERM mid-job stops the job, reports it interrupted (back to the queue) and leaves no process", async () => {
    const p = await makeProvider(h.srv);
    const renter = await makeRenter(h.srv, 1_000);
    const d = h.startDaemon(p.key);
    await waitFor(async () => (await h.srv.sql`SELECT readiness_status FROM providers WHERE id = ${p.id}`)[0].readiness_status, 45_000, "daemon up");
    const j = await h.submit(renter, { job_type: "benchmark", params: { suite: "memory", iterations: 1000 } });
    expect(j.provider_id).toBe(p.id);
    await waitFor(async () => (await h.job(j.job_id)).status === "running" && jobProcesses(j.job_id).length > 0, 45_000, `running (${d.output()})`);
    expect(await h.stopDaemon(d)).toBe(0);
    expect(jobProcesses(j.job_id)).toEqual([]);
    const row = await waitFor(async () => {
      const r = await h.job(j.job_id);
      return r.attempt === 2 ? r : undefined;
    }, 10_000, "re-queued");
    expect(row.status).toBe("queued");
    const [first] = await h.srv.sql`SELECT a.* FROM job_attempts a JOIN jobs j ON j.id = a.job_id WHERE j.job_id = ${j.job_id} AND a.attempt = 1`;
    expect(first.end_reason).toBe("provider_interrupted");
    expect(first.error).toMatch(/interrupted the job: the provider's daemon was stopped/);
  });

  it("names a job that ended while the server was away when it reconnects: its result is taken, not re-queued", async () => {
    // The job ends when the test says: here while no server is up.
    const { gate, daemon: d, job: j } = await runGatedJob(h);

    await h.srv.app.close();
    gate.open();
    await waitFor(() => jobProcesses(j.job_id).length === 0, 10_000, "job process gone");
    // The daemon reads the result file once the process is gone.
    await new Promise((r) => setTimeout(r, 1500));
    h.srv = await startTestServer({ PORT: String(h.port), SVC_JOB_SWEEP_MS: "60000" }, h.srv.databaseUrl);
    const done = await waitFor(async () => {
      const r = await h.job(j.job_id);
      return r.status === "completed" || r.status === "failed" ? r : undefined;
    }, 45_000, `job end after the server came back (${d.output()})`);
    expect(done.status, done.error).toBe("completed");
    expect(done.attempt).toBe(1);
    const attempts = await h.srv.sql`SELECT a.attempt, a.status FROM job_attempts a JOIN jobs j ON j.id = a.job_id WHERE j.job_id = ${j.job_id}`;
    expect(attempts).toEqual([{ attempt: 1, status: "completed" }]);
  });

  it("runs a job the operator re-queued back onto it: the new attempt waits for the stopped one", async () => {
    // Pinned to this provider: the re-queue sends it back here.
    const { gate, daemon: d, job: j } = await runGatedJob(h, { pinned: true });
    const r = await h.api().post(`/api/admin/jobs/${j.job_id}/requeue`, { reason: "moved" }, { "x-admin-token": ADMIN_TOKEN });
    expect(r.status, r.text).toBe(200);
    // The only provider: the new attempt comes straight back to it, while the first still stops.
    await waitFor(async () => (await h.job(j.job_id)).attempt === 2, 10_000, "second attempt");
    await waitFor(() => /cancelled by the server/.test(d.output()), 10_000, "the first attempt cancelled");
    gate.open();
    const done = await waitFor(async () => {
      const job = await h.job(j.job_id);
      return job.status === "completed" || job.status === "failed" ? job : undefined;
    }, 20_000, "the second attempt's end");
    expect(done.status, done.error).toBe("completed");
    expect(done.attempt).toBe(2);
    expect(done.provider_id).toBe(j.provider_id);
    // What the stopped run printed after its cancel is not taken for the new attempt's.
    const logs = await h.srv.sql<{ attempt: number; message: string }[]>`
      SELECT l.attempt, l.message FROM job_logs l JOIN jobs j ON j.id = l.job_id WHERE j.job_id = ${j.job_id} ORDER BY l.id`;
    expect(logs.filter((l) => l.attempt === 2).map((l) => l.message)).toEqual(["started"]);
  });

  // Last: the original server process is gone afterwards.
  it("keeps its running job across a server restart (stream resumed) and reports it to the new process", async () => {
    const p = await makeProvider(h.srv);
    const renter = await makeRenter(h.srv, 1_000);
    const d = h.startDaemon(p.key);
    await waitFor(async () => (await h.srv.sql`SELECT readiness_status FROM providers WHERE id = ${p.id}`)[0].readiness_status, 45_000, "daemon up");
    const j = await h.submit(renter, { job_type: "benchmark", params: { suite: "memory", iterations: 40 } });
    expect(j.provider_id).toBe(p.id);
    await waitFor(async () => (await h.job(j.job_id)).status === "running", 45_000, "running");

    // The server goes away mid-job (drain), and a new process takes the same port and database.
    await h.srv.app.close();
    const again = await startTestServer({ PORT: String(h.port), SVC_JOB_SWEEP_MS: "60000" }, h.srv.databaseUrl);
    try {
      const done = await waitFor(async () => {
        const [r] = await again.sql`SELECT * FROM jobs WHERE job_id = ${j.job_id}`;
        return r.status === "completed" || r.status === "failed" ? r : undefined;
      }, 60_000, `job end after restart (${d.output()})`);
      expect(done.status, done.error).toBe("completed");
      expect(done.attempt).toBe(1); // resumed, not re-queued
      expect(d.output()).toMatch(/draining/);
    } finally {
      await h.killDaemons();
      await again.close();
    }
  });

});
