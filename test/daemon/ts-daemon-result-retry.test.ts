// The TypeScript daemon against a server whose database goes away while a job
// ends: the result is refused as unavailable, not judged, so the daemon sends
// it again on the same stream, and the job completes on its first attempt. So
// too with a result refused because the stream's budget of reports is spent.
import { describe, expect, it } from "vitest";
import { startTestServer } from "../helpers/server.js";
import { freePort, waitFor } from "./helpers.js";
import { runGatedJob, useTsDaemonServer } from "./ts-harness.js";

const h = useTsDaemonServer({ dbLink: true });

describe("svc-daemon (TypeScript) result delivery", { timeout: 90_000 }, () => {
  it("sends again a result the server could not take while its database was away", async () => {
    const { gate, daemon: d, job: j } = await runGatedJob(h);
    h.link!.down();
    gate.open();
    await waitFor(() => d.output().includes(`server refused a report about ${j.job_id}`), 20_000, "the result refused");
    expect(d.output()).not.toMatch(/stream closed/);
    h.link!.up();
    const done = await waitFor(async () => {
      const r = await h.job(j.job_id);
      return r.status === "completed" || r.status === "failed" ? r : undefined;
    }, 30_000, "job end once the database is back");
    expect(done.status, done.error).toBe("completed");
    expect(done.attempt).toBe(1);
    expect(d.output()).not.toMatch(/stream closed/);
  });
});

describe("svc-daemon (TypeScript) result delivery under the stream's budget", { timeout: 90_000 }, () => {
  it("sends again a result refused as resource_exhausted, and it is taken in the next window", async () => {
    const shared = { srv: h.srv, port: h.port };
    h.port = await freePort();
    // 2 reports per 10 s besides heartbeats: its readiness and the job's acceptance spend them, so the result is refused.
    h.srv = await startTestServer({
      PORT: String(h.port),
      SVC_JOB_SWEEP_MS: "60000",
      SVC_RATE_LIMITS: "on",
      SVC_RATE_LIMIT_OVERRIDES: "default=2/10,heartbeat=1000/60",
    });
    try {
      const { gate, daemon: d, job: j } = await runGatedJob(h);
      gate.open();
      await waitFor(() => d.output().includes(`server refused a report about ${j.job_id}: too many reports on this stream (this one: result)`), 20_000, "the result refused");
      const done = await waitFor(async () => {
        const r = await h.job(j.job_id);
        return r.status === "completed" || r.status === "failed" ? r : undefined;
      }, 30_000, "job end in the next window");
      expect(done.status, done.error).toBe("completed");
      expect(d.output()).not.toMatch(/stream closed/);
    } finally {
      await h.killDaemons();
      await h.srv.close();
      Object.assign(h, shared);
    }
  });
});
