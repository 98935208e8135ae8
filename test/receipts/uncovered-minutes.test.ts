// A run that outlasts what its renter can pay (the hold grown as far as the funds go at its end: a sweep
// running late, or a hold under a minute) is charged what the funds covered, and its receipt says so:
// billed_minutes x rate = charged_halala + uncovered_halala. Before, the receipt showed the minutes run
// beside a smaller charge and nothing that accounted for the difference.
import { beforeEach, expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { clearMarketplace, pickUp } from "../jobs/helpers.js";
import { receiptReads } from "./helpers.js";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import { verifyReceipt } from "../../src/shared/receipt.js";

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0" });
const api = client(srv);
const { keys, receiptOf } = receiptReads(api);
beforeEach(() => clearMarketplace(srv));

/** A benchmark job (10 halala a minute, a 1-halala hold) picked up and running for `minutes` already. */
async function runningFor(balance: number, minutes: number) {
  const renter = await makeRenter(srv, balance);
  const provider = await makeProvider(srv);
  const r = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 0.01 }, renter.headers);
  expect(r.status, r.text).toBe(201);
  const jobId = r.body.job.job_id as string;
  expect((await pickUp(api, provider.key))?.job_id).toBe(jobId);
  await srv.sql`UPDATE jobs SET started_at = now() - make_interval(secs => ${minutes * 60 - 30}), acked_at = coalesce(acked_at, now()) WHERE job_id = ${jobId}`;
  return { renter, provider, jobId };
}

it("completed past the renter's funds: charged what they covered, the rest uncovered_halala", async () => {
  const { renter, provider, jobId } = await runningFor(25, 5);
  const done = await api.post("/api/providers/job-result", { api_key: provider.key, job_id: jobId, success: true, result: { response: "ok" } });
  expect(done.status, done.text).toBe(200);
  const file = await receiptOf(jobId, renter.headers);
  expect(file.receipt.billing).toMatchObject({ rate_halala_per_minute: 10, billed_minutes: 5, held_halala: 25, charged_halala: 25, refunded_halala: 0, uncovered_halala: 25 });
  expect(verifyReceipt(file, await keys()).ok).toBe(true);
  expect(await ledgerProblems(srv.sql)).toEqual([]);
});

it("cancelled past the renter's funds: the same", async () => {
  const { renter, jobId } = await runningFor(12, 3);
  const cancel = await api.post(`/api/jobs/${jobId}/cancel`, {}, renter.headers);
  expect(cancel.status, cancel.text).toBe(200);
  const file = await receiptOf(jobId, renter.headers);
  expect(file.receipt.billing).toMatchObject({ billed_minutes: 3, charged_halala: 12, uncovered_halala: 18 });
  expect(await ledgerProblems(srv.sql)).toEqual([]);
});

it("a run the funds covered has uncovered_halala 0", async () => {
  const { renter, provider, jobId } = await runningFor(1_000, 2);
  const done = await api.post("/api/providers/job-result", { api_key: provider.key, job_id: jobId, success: true, result: { response: "ok" } });
  expect(done.status, done.text).toBe(200);
  const file = await receiptOf(jobId, renter.headers);
  expect(file.receipt.billing).toMatchObject({ billed_minutes: 2, charged_halala: 20, uncovered_halala: 0 });
});
