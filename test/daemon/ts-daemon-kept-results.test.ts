// A result the stream daemon could not deliver is kept on disk, in its state
// folder, until the server takes or refuses it: a daemon stopped (or killed)
// while the server was away sends it from its next start, and the job is not
// run a second time. The refusal of an earlier attempt's result leaves a later
// attempt's kept result alone.
import fs from "node:fs";
import path from "node:path";
import { fromBinary } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { DaemonMessageSchema } from "../../gen/svc/v1/daemon_pb.js";
import { connect, type Tx } from "../../src/db/index.js";
import { ADMIN_TOKEN, startTestServer } from "../helpers/server.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { gatedRunner, realPython, tempDir, waitFor, writeExecutable } from "./helpers.js";
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

  it("keeps a later attempt's result when the server refuses an earlier attempt's, and sends it after a server restart: not run a third time", async () => {
    const p = await makeProvider(h.srv);
    const renter = await makeRenter(h.srv, 1_000);
    const dir = tempDir("tsd-kept-attempts");
    // Each run is numbered (run-N files) and answers its number; every run after the gate opens ends at once.
    const gate = path.join(dir, "go");
    const runner = writeExecutable(dir, "numbered.py", [
      "#!/usr/bin/env python3",
      "import json, os, sys, time",
      "json.load(sys.stdin)",
      `d = ${JSON.stringify(dir)}`,
      "n = len([f for f in os.listdir(d) if f.startswith('run-')]) + 1",
      "open(os.path.join(d, 'run-%d' % n), 'w').close()",
      `while not os.path.exists(${JSON.stringify(gate)}):`,
      "    time.sleep(0.05)",
      "print('finishing run %d' % n, flush=True)",
      'json.dump({"response": "run %d" % n}, open(os.environ["SVC_RESULT_FILE"], "w"))',
      "",
    ].join("\n"));
    const runs = () => fs.readdirSync(dir).filter((f) => f.startsWith("run-")).length;
    const resultsDir = path.join(dir, "state", "results");
    const keptAttempts = () =>
      filesUnder(resultsDir).map(({ file }) => {
        const m = fromBinary(DaemonMessageSchema, fs.readFileSync(file));
        return m.kind.case === "result" ? m.kind.value.attempt : undefined;
      });
    const args = ["--runner", `llm-inference=${realPython()} ${runner}`];
    const d = h.startDaemon(p.key, args, {}, { stateDir: path.join(dir, "state") });
    await waitFor(async () => (await h.srv.sql`SELECT readiness_status FROM providers WHERE id = ${p.id}`)[0].readiness_status, 45_000, "daemon up");
    // Pinned: re-queued, it comes back to this provider.
    const j = await h.submit(renter, { job_type: "llm-inference", params: { prompt: "hi", max_tokens: 32 }, provider_id: p.id });
    await waitFor(async () => (await h.job(j.job_id)).status === "running" && runs() === 1, 45_000, `running (${d.output()})`);
    const [{ id }] = await h.srv.sql<{ id: number }[]>`SELECT id FROM jobs WHERE job_id = ${j.job_id}`;

    // The server is slow to take this stream's reports: held by locks of the test's own (the job's
    // log lock, job-reports.ts appendLogs, then the new attempt's row), never the job's row.
    const locker = connect(h.srv.databaseUrl, 2);
    const releases: (() => Promise<unknown>)[] = [];
    const held = async (lock: (tx: Tx) => Promise<unknown>) => {
      let release!: () => void;
      let taken!: () => void;
      const ready = new Promise<void>((r) => (taken = r));
      const done = locker.begin(async (tx) => {
        await lock(tx);
        taken();
        await new Promise<void>((r) => (release = r));
      });
      await ready;
      const free = () => (release(), done);
      releases.push(free);
      return { release: free };
    };
    try {
      const logLock = await held((tx) => tx`SELECT pg_advisory_xact_lock(${0x7633}, ${id % 2147483647}::int)`);
      // Attempt 1 ends: its last log line waits on the server, its result (kept) behind it.
      fs.writeFileSync(gate, "");
      await waitFor(() => keptAttempts()[0] === 1, 10_000, `attempt 1's result kept (${d.output()})`);
      // Meanwhile an admin re-queues the job, it comes back here as attempt 2, and that run ends too.
      const rq = await h.api().post(`/api/admin/jobs/${j.job_id}/requeue`, { reason: "stuck" }, { "x-admin-token": ADMIN_TOKEN });
      expect(rq.status, rq.text).toBe(200);
      await waitFor(() => runs() === 2 && keptAttempts()[0] === 2, 10_000, `attempt 2's result kept (${d.output()})`);

      // The server refuses attempt 1's result (the job is on attempt 2); attempt 2's waits behind its accept.
      const attemptLock = await held((tx) => tx`SELECT 1 FROM job_attempts WHERE job_id = ${id} AND attempt = 2 FOR UPDATE`);
      await logLock.release();
      await waitFor(() => d.output().includes(`this result is for attempt 1 of job ${j.job_id}, which is on attempt 2`), 10_000, `the refusal (${d.output()})`);
      expect((await h.job(j.job_id)).status).toBe("pending");
      expect(keptAttempts()).toEqual([2]);

      // The server restarts before it took attempt 2's result: the daemon sends it to the next one.
      await h.srv.app.close();
      await attemptLock.release();
      await h.srv.sql.end();
      h.srv = await startTestServer({ PORT: String(h.port), SVC_JOB_SWEEP_MS: "60000" }, h.srv.databaseUrl);
      const done = await waitFor(async () => {
        const r = await h.job(j.job_id);
        return r.status === "completed" || r.status === "failed" ? r : undefined;
      }, 45_000, `job end after the restart (${d.output()})`);
      expect(done.status, done.error).toBe("completed");
      expect({ attempt: done.attempt, result: done.result }).toEqual({ attempt: 2, result: { response: "run 2" } });
      expect(runs()).toBe(2);
      await waitFor(() => keptAttempts().length === 0, 10_000, "the kept result removed once acknowledged");
    } finally {
      for (const free of releases) await free();
      await locker.end();
    }
  });
});
