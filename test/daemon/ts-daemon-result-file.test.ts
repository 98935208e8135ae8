// The TypeScript daemon and what a renter's container leaves at
// /svc-output/result.json (helpers.ts fakeDocker's renter behaviours): a file
// over the size cap, a FIFO, a symbolic link to a file of the host, or a
// result whose encoding is over the stream's 16 MiB message limit is the
// job's own failure (runtime_error, billed to the renter), reported small;
// none of them stops the daemon's heartbeats, blocks its event loop, or
// reads a host file as the job's output.
import { describe, expect, it } from "vitest";
import { makeRenter } from "../helpers/fixtures.js";
import { endedJob, waitFor } from "./helpers.js";
import { dockerDaemon, useTsDaemonServer } from "./ts-harness.js";

const h = useTsDaemonServer();

const dockerProvider = () => dockerDaemon(h);

/** Waits for a heartbeat of the provider written after this moment (by the database clock): the daemon still beats. */
async function beatsOn(id: number, what: string) {
  const [{ t0 }] = await h.srv.sql<{ t0: Date }[]>`SELECT now() AS t0`;
  await waitFor(async () => (await h.srv.sql`SELECT last_heartbeat > ${t0} AS newer FROM providers WHERE id = ${id}`)[0].newer, 10_000, what);
}

describe("svc-daemon (TypeScript): a renter's result file", { timeout: 150_000 }, () => {
  it("fails the job as the renter's for a result too large, for the file or for the stream, and keeps beating", async () => {
    const { p, d } = await dockerProvider();
    const renter = await makeRenter(h.srv, 10_000);
    // A 20 MB file: over the 8 MiB cap, not read. A 7 MB array of zeros: under the cap, over 16 MiB encoded.
    for (const [command, error] of [
      ["big-result", /result file is 20000002 bytes, over the 8388608-byte limit/],
      ["zeros-result", /result is \d+ bytes once encoded, over the 16711680 bytes a result may take of a report/],
    ] as const) {
      const job = await h.submit(renter, { job_type: "custom_container", duration_minutes: 5, params: { command: [command] } });
      expect(job.provider_id).toBe(p.id);
      const done = await endedJob(h.srv.sql, job.job_id, `${command}: job end (${d.output()})`);
      expect(done, command).toMatchObject({ status: "failed", end_reason: "runtime_error", fault: "renter", attempt: 1 });
      expect(done.error).toMatch(error);
      expect(done.result).toBeNull();
      expect(done.actual_cost_halala).toBeGreaterThan(0);
    }
    expect(d.output()).not.toMatch(/stream closed/);
    // Still beating (every second).
    await beatsOn(p.id, `a heartbeat after the jobs (${d.output()})`);
  });

  it("refuses a FIFO or a symbolic link as the result file without blocking or following it", async () => {
    const { p, d } = await dockerProvider();
    const renter = await makeRenter(h.srv, 10_000);
    for (const [command, error] of [
      ["fifo-result", /result file is not a regular file \(a FIFO\)/],
      ["symlink-result", /result file is a symbolic link/],
    ] as const) {
      const job = await h.submit(renter, { job_type: "custom_container", duration_minutes: 5, params: { command: [command] } });
      expect(job.provider_id).toBe(p.id);
      const done = await endedJob(h.srv.sql, job.job_id, `${command}: job end (${d.output()})`);
      expect(done, command).toMatchObject({ status: "failed", end_reason: "runtime_error", fault: "renter" });
      expect(done.error).toMatch(error);
      // The host's file is not the job's output.
      expect(JSON.stringify(done.result ?? null)).not.toContain("a file of the host");
    }
    await beatsOn(p.id, `a heartbeat after the jobs (${d.output()})`);
  });
});
