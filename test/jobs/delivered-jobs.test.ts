// What a daemon stream remembers of the jobs it pushed: enough that none is
// pushed twice, bounded by what its daemon runs and the last jobs to end, so a
// stream open for months does not grow with every job it ever carried.
import { describe, expect, it } from "vitest";
import { ACTIVE_KEPT, DeliveredJobs, ENDED_KEPT } from "../../src/domain/jobs/delivered-jobs.js";

describe("the jobs a stream has delivered", () => {
  it("keeps a job until it ends, then the last ENDED_KEPT ended ones, whatever the number run", () => {
    const d = new DeliveredJobs();
    for (let i = 0; i < 10_000; i++) {
      d.add(`job-${i}`);
      expect(d.has(`job-${i}`)).toBe(true);
      d.end(`job-${i}`);
    }
    expect(d.size).toBe(ENDED_KEPT);
    // The last ones to end are still not pushed again; older ones are forgotten.
    expect(d.has("job-9999")).toBe(true);
    expect(d.has(`job-${10_000 - ENDED_KEPT}`)).toBe(true);
    expect(d.has(`job-${10_000 - ENDED_KEPT - 1}`)).toBe(false);
  });

  it("a job that ended stays ended: accepting it again does not make it active", () => {
    const d = new DeliveredJobs();
    d.add("a");
    d.end("a");
    d.add("a");
    for (let i = 0; i < ENDED_KEPT; i++) d.end(`other-${i}`);
    expect(d.has("a")).toBe(false);
  });

  it("forgets a cancelled or re-queued job, active or ended, so a new attempt is pushed", () => {
    const d = new DeliveredJobs();
    d.add("running");
    d.add("ended");
    d.end("ended");
    d.forget("running");
    d.forget("ended");
    expect(d.has("running")).toBe(false);
    expect(d.has("ended")).toBe(false);
    expect(d.size).toBe(0);
  });

  it("keeps at most ACTIVE_KEPT jobs that never ended on the stream, forgetting the oldest", () => {
    const d = new DeliveredJobs();
    for (let i = 0; i < ACTIVE_KEPT + 10; i++) d.add(`job-${i}`);
    expect(d.size).toBe(ACTIVE_KEPT);
    expect(d.has("job-9")).toBe(false);
    expect(d.has("job-10")).toBe(true);
    expect(d.has(`job-${ACTIVE_KEPT + 9}`)).toBe(true);
  });
});
