// A job refused by one new provider after another until SVC_JOB_MAX_ATTEMPTS (3, the tests'
// setting) fails it: the attempt-limit checks of the admin re-queue and the paused hand-back.
import { expect } from "vitest";
import { dispatchForProvider } from "../../src/domain/dispatch/dispatch.js";
import { markJobRejected } from "../../src/domain/jobs/job-reports.js";
import { makeProvider } from "./fixtures.js";
import type { TestServer } from "./server.js";

/** Three refusals from attempt `first` on: the first two re-queue the job, the third fails it for the limit. */
export async function refusedToTheLimit(srv: TestServer, jobId: string, first: number): Promise<void> {
  const outcomes: string[] = [];
  for (let attempt = first; attempt < first + 3; attempt++) {
    const other = await makeProvider(srv);
    await dispatchForProvider(srv.sql, other.id);
    const [row] = await srv.sql<{ status: string; provider_id: number; attempt: number }[]>`
      SELECT status, provider_id, attempt FROM jobs WHERE job_id = ${jobId}`;
    expect(row).toMatchObject({ status: "pending", provider_id: other.id, attempt });
    outcomes.push(await markJobRejected(srv.sql, other.id, { jobId, reason: "not enough free VRAM", attempt }));
  }
  expect(outcomes).toEqual(["requeued", "requeued", "failed"]);
  const [job] = await srv.sql<{ status: string; end_reason: string; error: string }[]>`SELECT status, end_reason, error FROM jobs WHERE job_id = ${jobId}`;
  expect(job).toMatchObject({ status: "failed", end_reason: "provider_refused" });
  expect(job!.error).toMatch(/gave up after 3 attempts/);
}
