// A result the stream daemon could not deliver is kept on disk, in its state
// folder, until the server takes or refuses it: a daemon stopped (or killed)
// while the server was away sends it from its next start, and the job is not
// run a second time.
import fs from "node:fs";
import path from "node:path";
import { describe, expect, it } from "vitest";
import { startTestServer } from "../helpers/server.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { gatedRunner, tempDir, waitFor } from "./helpers.js";
import { useTsDaemonServer } from "./ts-harness.js";
import { jobProcesses } from "./procs.js";

const h = useTsDaemonServer();

/** The files under dir, recursively, with their modes. */
function filesUnder(dir: string): { file: string; mode: number }[] {
  if (!fs.existsSync(dir)) return [];
  return fs.readdirSync(dir, { recursive: true, withFileTypes: true }).filter((e) => e.isFile()).map((e) => {
    const file = path.join(e.parentPath, e.name);
    return { file, mode: fs.statSync(file).mode & 0o777 };
  });
}

describe("svc-daemon (TypeScript) keeps an undelivered result across its own restart", { timeout: 120_000 }, () => {
  it("sends the result of a job that ended while the server was away from its next start: taken, not run again", async () => {
    const p = await makeProvider(h.srv);
    const renter = await makeRenter(h.srv, 1_000);
    const gate = gatedRunner();
    const stateDir = path.join(tempDir("tsd-kept"), "state");
    const d = h.startDaemon(p.key, ["--runner", gate.runner], {}, { stateDir });
    await waitFor(async () => (await h.srv.sql`SELECT readiness_status FROM providers WHERE id = ${p.id}`)[0].readiness_status, 45_000, "daemon up");
    const j = await h.submit(renter, { job_type: "llm-inference", params: { prompt: "hi", max_tokens: 32 }, provider_id: p.id });
    await waitFor(async () => (await h.job(j.job_id)).status === "running" && gate.started(), 45_000, `running (${d.output()})`);

    // The job ends while no server is up, and the daemon is stopped before one is.
    await h.srv.app.close();
    gate.open();
    await waitFor(() => jobProcesses(j.job_id).length === 0, 10_000, "job process gone");
    await waitFor(() => filesUnder(path.join(stateDir, "results")).length > 0, 10_000, `the result kept (${d.output()})`);
    expect(await h.stopDaemon(d)).toBe(0);
    // The result (the renter's output) is the daemon's user's alone.
    const kept = filesUnder(path.join(stateDir, "results"));
    expect(kept.map((f) => f.mode)).toEqual([0o600]);
    expect((fs.statSync(path.dirname(kept[0].file)).mode & 0o777).toString(8)).toBe("700");

    h.srv = await startTestServer({ PORT: String(h.port), SVC_JOB_SWEEP_MS: "60000" }, h.srv.databaseUrl);
    const again = h.startDaemon(p.key, ["--runner", gate.runner], {}, { stateDir });
    const done = await waitFor(async () => {
      const r = await h.job(j.job_id);
      return r.status === "completed" || r.status === "failed" ? r : undefined;
    }, 45_000, `job end after the restarts (${again.output()})`);
    expect(done.status, done.error).toBe("completed");
    expect(done.attempt).toBe(1);
    const attempts = await h.srv.sql`SELECT a.attempt, a.status FROM job_attempts a JOIN jobs j ON j.id = a.job_id WHERE j.job_id = ${j.job_id}`;
    expect(attempts).toEqual([{ attempt: 1, status: "completed" }]);
    // Taken: no longer kept.
    await waitFor(() => filesUnder(path.join(stateDir, "results")).length === 0, 10_000, "the kept result removed once acknowledged");
  });
});
