// svc_daemon.py and what a job's program hands it: a result file whose JSON the server cannot take as it
// stands (NaN, Infinity, nesting past the server's depth limit), and output printed faster than the
// daemon can send it. The served file, run as a subprocess against the real server.
import fs from "node:fs";
import path from "node:path";
import { describe, expect, it } from "vitest";
import { useTestServer, type TestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { clearMarketplace } from "../helpers/isolation.js";
import { endedJob, killedAfterEach, realPython, runLegacyDaemon, tempDir, waitFor, writeExecutable } from "./helpers.js";

/** The served daemon file, written into a folder of its own. */
async function download(srv: TestServer, key: string): Promise<{ file: string; dir: string }> {
  const r = await client(srv.url).get(`/api/providers/download/daemon`, { "x-provider-key": key });
  expect(r.status, r.text).toBe(200);
  const dir = tempDir("legacy-output");
  const file = path.join(dir, "svc_daemon.py");
  fs.writeFileSync(file, r.text, { mode: 0o600 });
  return { file, dir };
}

/** An llm-inference runner (SVC_RUNNERS) running `body` (python, after `import json, os, sys` and reading the job). */
function runner(dir: string, body: string[]): string {
  const file = writeExecutable(dir, "job.py", ["import json, os, sys", "json.load(sys.stdin)", ...body, ""].join("\n"));
  return `llm-inference=${realPython()} ${file}`;
}

async function submit(srv: TestServer, renter: { headers: Record<string, string> }, providerId: number): Promise<string> {
  const r = await client(srv.url).post("/api/jobs/submit", { job_type: "llm-inference", duration_minutes: 1, params: { prompt: "hi", max_tokens: 32 } }, renter.headers);
  expect(r.status, r.text).toBe(201);
  expect(r.body.job.provider_id).toBe(providerId);
  return r.body.job.job_id as string;
}

describe("svc_daemon.py and a job's output", { timeout: 120_000 }, () => {
  const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000" });
  const daemons = killedAfterEach(() => clearMarketplace(srv));

  async function runJob(body: string[]) {
    const p = await makeProvider(srv);
    const renter = await makeRenter(srv, 1_000);
    const { file, dir } = await download(srv, p.key);
    const d = runLegacyDaemon(file, dir, { SVC_RUNNERS: runner(dir, body) }, realPython());
    daemons.push(d);
    await waitFor(async () => (await srv.sql`SELECT readiness_status FROM providers WHERE id = ${p.id}`)[0].readiness_status, 45_000, `daemon up (${d.output()})`);
    const jobId = await submit(srv, renter, p.id);
    return { d, dir, jobId };
  }

  for (const [what, text] of [
    ["NaN", '{"score": NaN}'],
    ["Infinity", '{"score": -Infinity}'],
    ["a number past a double's range", '{"score": 1e999}'],
  ] as const) {
    it(`fails a job whose result file holds ${what} (not JSON to the server) as its own, rather than leave it running`, async () => {
      const { d, jobId } = await runJob([`open(os.environ["SVC_RESULT_FILE"], "w").write(${JSON.stringify(text)})`]);
      const done = await endedJob(srv.sql, jobId, `the job's end (${d.output()})`);
      expect(done.status).toBe("failed");
      expect(done.end_reason).toBe("runtime_error");
      expect(done.error).toMatch(/invalid result file/);
    });
  }

  // A job-result body may nest 100 levels, its own object counted: its result 99.
  it("reports a result nested as deep as a job-result body's result may (99 levels)", async () => {
    const { d, jobId } = await runJob([`open(os.environ["SVC_RESULT_FILE"], "w").write("[" * 99 + '"deep"' + "]" * 99)`]);
    const done = await endedJob(srv.sql, jobId, `the job's end (${d.output()})`);
    expect(done.status, done.error).toBe("completed");
    let expected: unknown = "deep";
    for (let i = 0; i < 99; i++) expected = [expected];
    expect(done.result).toEqual(expected);
  });

  // 100 levels: one past the server's limit; 200,000: past what Python's parser reads without running out of stack.
  for (const depth of [100, 200_000]) {
    it(`fails a job whose result nests ${depth} levels deep (deeper than the server takes) as its own, rather than leave it running`, async () => {
      const { d, jobId } = await runJob([`open(os.environ["SVC_RESULT_FILE"], "w").write("[" * ${depth} + "]" * ${depth})`]);
      const done = await endedJob(srv.sql, jobId, `the job's end (${d.output()})`);
      expect(done.status).toBe("failed");
      expect(done.end_reason).toBe("runtime_error");
      expect(done.error).toMatch(/invalid result file: it nests objects and arrays deeper than 99 levels/);
    });
  }

  it("holds a bounded amount of a job's output however fast the job prints it", async () => {
    const dir = tempDir("legacy-output-flood");
    const printed = path.join(dir, "printed");
    // 4,000,000 short lines, as fast as the pipe takes them: far more than the server keeps (10,000 a job).
    const { d, jobId } = await runJob([
      'chunk = "".join("line %07d\\n" % i for i in range(100000))',
      "for _ in range(40):",
      "    sys.stdout.write(chunk)",
      "sys.stdout.flush()",
      `open(${JSON.stringify(printed)}, "w").close()`,
    ]);
    await waitFor(() => fs.existsSync(printed), 60_000, `the job's output written (${d.output()})`);
    const peakKib = () => Number(/VmHWM:\s+(\d+) kB/.exec(fs.readFileSync(`/proc/${d.pid}/status`, "utf8"))![1]);
    const done = await endedJob(srv.sql, jobId, `the job's end (${d.output()})`).catch(() => undefined);
    // The daemon peaks at some 40 MiB here; the output it read (52 MB of text, some 300 MB as Python strings) is never all held.
    expect(peakKib()).toBeLessThan(100 * 1024);
    expect(done?.status).toBe("completed");
    // Its result (it wrote no file): the first megabyte of what it printed, every line of it, in order.
    const lines = (done!.result.response as string).split("\n");
    expect(lines.length).toBeGreaterThan(70_000);
    expect(lines.every((l, i) => l === `line ${String(i).padStart(7, "0")}`)).toBe(true);
  });
});
