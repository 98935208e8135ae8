// The TypeScript daemon and a job result nested deep: one as deep as the stream takes (the server holds a
// message to the depth of its JSON form, MAX_JSON_DEPTH, and the message and its result report are the
// first two levels) is reported and taken, also from the daemon's kept results after a restart; a deeper
// one is the job's own failure (runtime_error), reported small, rather than a message that ends the stream
// after every reconnect. The server refused results nested some 50 levels, and the daemon crashed building
// one past about 100.
import fs from "node:fs";
import path from "node:path";
import { describe, expect, it } from "vitest";
import { MAX_JSON_DEPTH } from "../../src/shared/json-nesting.js";
import { RESULT_MAX_DEPTH } from "../../src/daemon/ts/daemon.js";
import { startTestServer } from "../helpers/server.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { endedJob, realPython, tempDir, waitFor, writeExecutable } from "./helpers.js";
import { useTsDaemonServer } from "./ts-harness.js";

const h = useTsDaemonServer();

/** `depth` arrays around a string. */
const nest = (depth: number): unknown => {
  let v: unknown = "deep";
  for (let i = 0; i < depth; i++) v = [v];
  return v;
};

/** A runner whose result file nests as many levels as the job's prompt says, once `gate` exists (when given). */
function deepRunner(gate?: string): string {
  const dir = tempDir("tsd-deep");
  const file = writeExecutable(dir, "deep.py", [
    "import json, os, sys, time",
    "depth = int(json.load(sys.stdin)['task_spec']['inputs']['prompt'])",
    ...(gate ? [`while not os.path.exists(${JSON.stringify(gate)}):`, "    time.sleep(0.05)"] : []),
    `open(os.environ["SVC_RESULT_FILE"], "w").write("[" * depth + '"deep"' + "]" * depth)`,
    "",
  ].join("\n"));
  return `llm-inference=${realPython()} ${file}`;
}

describe("svc-daemon (TypeScript): a result nested deep", { timeout: 150_000 }, () => {
  it(`reports a result ${RESULT_MAX_DEPTH} levels deep, and fails a deeper one as the job's own without ending its stream`, async () => {
    expect(RESULT_MAX_DEPTH).toBe(MAX_JSON_DEPTH - 2);
    const p = await makeProvider(h.srv);
    const renter = await makeRenter(h.srv, 10_000);
    const d = h.startDaemon(p.key, ["--runner", deepRunner()]);
    await waitFor(async () => (await h.srv.sql`SELECT readiness_status FROM providers WHERE id = ${p.id}`)[0].readiness_status, 45_000, "daemon up");
    const run = async (depth: number) => {
      const j = await h.submit(renter, { job_type: "llm-inference", params: { prompt: String(depth), max_tokens: 32 }, provider_id: p.id });
      return endedJob(h.srv.sql, j.job_id, `the job of ${depth} levels ended (${d.output()})`);
    };
    for (const depth of [60, RESULT_MAX_DEPTH]) {
      const done = await run(depth);
      expect(done.status, `${depth} levels: ${done.error}`).toBe("completed");
      expect(done.result).toEqual(nest(depth));
    }
    // One level deeper, and far deeper (past what a recursive reading of it could take).
    for (const depth of [RESULT_MAX_DEPTH + 1, 200_000]) {
      const done = await run(depth);
      expect(done, `${depth} levels`).toMatchObject({ status: "failed", end_reason: "runtime_error", fault: "renter", attempt: 1 });
      expect(done.error).toBe(`the job's result nests objects and arrays more than ${RESULT_MAX_DEPTH} levels deep, the most a result may`);
      expect(done.result).toBeNull();
    }
    expect(d.output()).not.toMatch(/stream closed/);
  });

  it("sends a deep result it kept while the server was away from its next start", async () => {
    const p = await makeProvider(h.srv);
    const renter = await makeRenter(h.srv, 1_000);
    const dir = tempDir("tsd-deep-kept");
    const gate = path.join(dir, "go");
    const runner = deepRunner(gate);
    const stateDir = path.join(dir, "state");
    const d = h.startDaemon(p.key, ["--runner", runner], {}, { stateDir });
    await waitFor(async () => (await h.srv.sql`SELECT readiness_status FROM providers WHERE id = ${p.id}`)[0].readiness_status, 45_000, "daemon up");
    const j = await h.submit(renter, { job_type: "llm-inference", params: { prompt: String(RESULT_MAX_DEPTH), max_tokens: 32 }, provider_id: p.id });
    await waitFor(async () => (await h.job(j.job_id)).status === "running", 45_000, `running (${d.output()})`);

    // The job ends while no server is up, and the daemon is stopped before one is: its result is on disk only.
    await h.srv.app.close();
    fs.writeFileSync(gate, "");
    const results = path.join(stateDir, "results");
    const kept = () => (fs.existsSync(results) ? fs.readdirSync(results, { recursive: true }).filter((f) => String(f).endsWith(".result")) : []);
    await waitFor(() => kept().length > 0, 20_000, `the result kept (${d.output()})`);
    expect(await h.stopDaemon(d)).toBe(0);

    h.srv = await startTestServer({ PORT: String(h.port), SVC_JOB_SWEEP_MS: "60000" }, h.srv.databaseUrl);
    const again = h.startDaemon(p.key, ["--runner", runner], {}, { stateDir });
    const done = await endedJob(h.srv.sql, j.job_id, `the job's end after the restarts (${again.output()})`);
    expect(done.status, done.error).toBe("completed");
    expect(done.result).toEqual(nest(RESULT_MAX_DEPTH));
    expect(again.output()).not.toMatch(/could not read the kept result/);
  });
});
