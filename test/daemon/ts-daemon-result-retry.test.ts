// The TypeScript daemon against a server whose database goes away while a job
// ends: the result is refused as unavailable, not judged, so the daemon sends
// it again on the same stream, and the job completes on its first attempt. So
// too with a result refused because the stream's budget of reports is spent. A
// later attempt's result gets its tries afresh.
import fs from "node:fs";
import path from "node:path";
import { fromBinary } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { DaemonMessageSchema } from "../../gen/svc/v1/daemon_pb.js";
import { ADMIN_TOKEN, startTestServer, type TestServer } from "../helpers/server.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { freePort, realPython, tempDir, waitFor, writeExecutable } from "./helpers.js";
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

describe("svc-daemon (TypeScript) result retries of a later attempt", { timeout: 150_000 }, () => {
  it("gives a later attempt's result its own retries: an earlier attempt's refusals do not count against them", async () => {
    const dir = tempDir("tsd-retry-attempts");
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
      'json.dump({"response": "run %d" % n}, open(os.environ["SVC_RESULT_FILE"], "w"))',
      "",
    ].join("\n"));
    const runs = () => fs.readdirSync(dir).filter((f) => f.startsWith("run-")).length;
    const resultsDir = path.join(dir, "state", "results");
    const keptAttempts = () =>
      fs.existsSync(resultsDir)
        ? fs.readdirSync(resultsDir, { recursive: true, withFileTypes: true }).filter((e) => e.isFile() && e.name.endsWith(".result")).map((e) => {
          const m = fromBinary(DaemonMessageSchema, fs.readFileSync(path.join(e.parentPath, e.name)));
          return m.kind.case === "result" ? m.kind.value.attempt : undefined;
        })
        : [];
    // The daemon's stream goes to a server of its own on the same database, whose stream budget (2
    // reports: the readiness and the accept) refuses every result as resource_exhausted; the test's
    // own requests go to the harness's server.
    const port = await freePort();
    const streamServer = (env: Record<string, string>) => startTestServer({ PORT: String(port), SVC_JOB_SWEEP_MS: "60000", ...env }, h.srv.databaseUrl);
    let limited: TestServer | undefined = await streamServer({ SVC_RATE_LIMITS: "on", SVC_RATE_LIMIT_OVERRIDES: "default=2/600,heartbeat=1000/60" });
    let open: TestServer | undefined;
    try {
      const p = await makeProvider(h.srv);
      const renter = await makeRenter(h.srv, 1_000);
      const d = h.startDaemon(p.key, ["--runner", `llm-inference=${realPython()} ${runner}`], { SVC_RESULT_RETRY_SECONDS: "0.25" }, {
        url: `http://127.0.0.1:${port}`,
        stateDir: path.join(dir, "state"),
      });
      await waitFor(async () => (await h.srv.sql`SELECT readiness_status FROM providers WHERE id = ${p.id}`)[0].readiness_status, 45_000, "daemon up");
      // Pinned: re-queued, it comes back to this provider.
      const j = await h.submit(renter, { job_type: "llm-inference", params: { prompt: "hi", max_tokens: 32 }, provider_id: p.id });
      await waitFor(async () => (await h.job(j.job_id)).status === "running" && runs() === 1, 45_000, `running (${d.output()})`);
      const refusals = () => d.output().split(`server refused a report about ${j.job_id}: too many reports on this stream (this one: result)`).length - 1;

      // Attempt 1's result is refused, and sent again, 50 times (of the 60 tries a result gets).
      fs.writeFileSync(gate, "");
      await waitFor(() => refusals() >= 50, 60_000, `attempt 1's result refused 50 times (${d.output()})`);
      // An admin re-queues the job; it comes back here as attempt 2, which ends at once.
      const rq = await h.api().post(`/api/admin/jobs/${j.job_id}/requeue`, { reason: "stuck" }, { "x-admin-token": ADMIN_TOKEN });
      expect(rq.status, rq.text).toBe(200);
      await waitFor(() => runs() === 2 && keptAttempts()[0] === 2, 20_000, `attempt 2's result kept (${d.output()})`);
      // Attempt 2's result is refused alike, more often than attempt 1's refusals left of the 60 tries.
      const before = refusals();
      await waitFor(() => refusals() - before >= 20 || d.output().includes("gave up sending the result"), 30_000, `attempt 2's result refused (${d.output()})`);
      // The stream's server is replaced by one that takes the result.
      await limited.close();
      limited = undefined;
      open = await streamServer({});
      const done = await waitFor(async () => {
        const r = await h.job(j.job_id);
        return r.status === "completed" || r.status === "failed" ? r : undefined;
      }, 45_000, `job end (${d.output()})`);
      expect(d.output()).not.toContain("gave up sending the result");
      expect({ status: done.status, attempt: done.attempt, result: done.result }).toEqual({ status: "completed", attempt: 2, result: { response: "run 2" } });
      expect(runs()).toBe(2);
    } finally {
      await h.killDaemons();
      await limited?.close();
      await open?.close();
    }
  });
});
