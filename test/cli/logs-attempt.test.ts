// `svc jobs logs --attempt N`, read and followed (-f): only that attempt's
// lines, as a real subprocess against a real server; the watch sends every
// attempt's lines, each with its attempt.
import { describe, expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { tempDir } from "../daemon/helpers.js";
import { completedJob } from "./completed-job.js";
import { runSvc } from "./run-svc.js";

const srv = useTestServer();

/** A completed job of a fresh renter with log lines of two attempts. */
async function jobWithTwoAttempts() {
  const { env, jobId } = await completedJob(srv);
  // As if the first attempt had failed and a second one had run the job to its end.
  await srv.sql`
    INSERT INTO job_attempts (job_id, attempt, provider_id, status, assigned_at, started_at, ended_at, end_reason, fault, cost_halala)
    SELECT job_id, 2, provider_id, status, assigned_at, started_at, ended_at, end_reason, fault, cost_halala
    FROM job_attempts WHERE attempt = 1 AND job_id = (SELECT id FROM jobs WHERE job_id = ${jobId})`;
  await srv.sql`UPDATE jobs SET attempt = 2 WHERE job_id = ${jobId}`;
  await srv.sql`
    INSERT INTO job_logs (job_id, attempt, level, message)
    SELECT j.id, l.attempt, 'info', l.message FROM jobs j,
      (VALUES (1, 'first one'), (2, 'second one'), (1, 'first two'), (2, 'second two')) AS l(attempt, message)
    WHERE j.job_id = ${jobId}`;
  return { env, jobId };
}

const messages = (stdout: string) => stdout.trim().split("\n").map((l) => l.replace(/^\S+\s+/, ""));

describe("svc jobs logs --attempt", { timeout: 120_000 }, () => {
  it("with -f follows only that attempt's lines, as without -f", async () => {
    const { env, jobId } = await jobWithTwoAttempts();
    const home = tempDir("svc-logs-attempt");
    for (const [attempt, lines] of [["1", ["first one", "first two"]], ["2", ["second one", "second two"]]] as const) {
      const followed = await runSvc(["jobs", "logs", "-f", "--attempt", attempt, jobId], { home, env, limitMs: 60_000 });
      expect(followed.code, followed.stderr).toBe(0);
      expect(messages(followed.stdout), attempt).toEqual(lines);
      const read = await runSvc(["jobs", "logs", "--attempt", attempt, jobId], { home, env });
      expect(read.code, read.stderr).toBe(0);
      expect(messages(read.stdout), attempt).toEqual(lines);
    }
    // --json: only that attempt's log events.
    const json = await runSvc(["--json", "jobs", "logs", "-f", "--attempt", "2", jobId], { home, env, limitMs: 60_000 });
    expect(json.code, json.stderr).toBe(0);
    const logs = json.stdout.trim().split("\n").map((l) => JSON.parse(l)).filter((e) => e.log);
    expect(logs.map((e) => e.log.message)).toEqual(["second one", "second two"]);
    // Without --attempt, -f prints every attempt's lines.
    const all = await runSvc(["jobs", "logs", "-f", jobId], { home, env, limitMs: 60_000 });
    expect(messages(all.stdout)).toEqual(["first one", "second one", "first two", "second two"]);
  });
});
