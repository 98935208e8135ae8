// The TypeScript daemon against a server whose database goes away while a job
// ends: the result is refused as unavailable, not judged, so the daemon sends
// it again on the same stream, and the job completes on its first attempt.
import { describe, expect, it } from "vitest";
import { waitFor } from "./helpers.js";
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
