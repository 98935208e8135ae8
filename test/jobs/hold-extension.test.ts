// A running job pays for the time it runs: its hold grows from the renter's
// available balance before its paid time runs out, and when the balance cannot
// pay for more the job is stopped (out_of_funds, the renter's fault) and
// settled for the time used; the monthly spend limit bounds it the same way. Over real HTTP, the sweep driven by the test.
import { beforeEach, describe, expect, it, vi } from "vitest";
import { ADMIN_TOKEN, useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { credit, ledgerProblems } from "../../src/domain/money/ledger.js";
import { fundRunningJob } from "../../src/domain/money/hold-extension.js";
import { releaseTokenBudget, reserveTokenBudget } from "../../src/domain/money/usage-billing.js";
import { sweepJobs } from "../../src/workers/job-timeouts.js";
import { CANCEL_CHANNEL } from "../../src/domain/notify/job-notices.js";
import { clearMarketplace, pickUp } from "./helpers.js";
import { restoreClockAfterEach, skewAppClock } from "../helpers/clock.js";

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0" });
const api = client(srv);
beforeEach(() => clearMarketplace(srv));

const balance = async (key: string) => (await api.get("/api/renters/balance", { "x-renter-key": key })).body;
/** As if the job had been running for `seconds` (the database clock decides billing). */
const ranFor = (jobId: string, seconds: number) =>
  srv.sql`UPDATE jobs SET started_at = now() - make_interval(secs => ${seconds}) WHERE job_id = ${jobId}`;

async function runningJob(renter: { headers: Record<string, string> }, provider: { key: string }, body: Record<string, unknown>) {
  const r = await api.post("/api/jobs/submit", body, renter.headers);
  expect(r.status, r.text).toBe(201);
  const jobId = r.body.job.job_id as string;
  expect((await pickUp(api, provider.key))?.job_id).toBe(jobId);
  return { jobId, rate: (await srv.sql`SELECT rate_halala_per_minute AS r FROM jobs WHERE job_id = ${jobId}`)[0].r as number };
}

describe("paying as a job runs", () => {
  it("bills a job that ran 70 s for 2 minutes and pays the provider for both, though it held 1 halala at submit", async () => {
    const renter = await makeRenter(srv, 10_000);
    const provider = await makeProvider(srv);
    const { jobId, rate } = await runningJob(renter, provider, { job_type: "llm-inference", duration_minutes: 0.01, max_duration_seconds: 86_400 });
    expect((await api.get(`/api/jobs/${jobId}`, renter.headers)).body).toMatchObject({ cost_halala: 1, held_halala: 1 });
    await ranFor(jobId, 70);
    const swept = await sweepJobs(srv.sql);
    expect(swept.extended).toBe(1);
    const view = (await api.get(`/api/jobs/${jobId}`, renter.headers)).body;
    // Whole paid minutes again, EXTEND_MINUTES (5) of them; the running cost shows the 2 minutes used.
    expect(view).toMatchObject({ status: "running", cost_halala: 1, held_halala: 5 * rate, running_cost_halala: 2 * rate });
    expect(await balance(renter.key)).toMatchObject({ held_halala: 5 * rate, balance_halala: 10_000 });

    const done = await api.post("/api/providers/job-result", { api_key: provider.key, job_id: jobId, success: true, result: { response: "hi" } });
    expect(done.status, done.text).toBe(200);
    const j = (await api.get(`/api/jobs/${jobId}`, renter.headers)).body;
    const cost = 2 * rate;
    expect(j).toMatchObject({ status: "completed", actual_cost_halala: cost, provider_earned_halala: Math.floor((cost * 75) / 100) });
    expect(await balance(renter.key)).toMatchObject({ balance_halala: 10_000 - cost, held_halala: 0 });
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("bills a run that ended before the sweep grew its hold for the minutes it ran, as far as the renter's balance and monthly limit go", async () => {
    const provider = await makeProvider(srv);
    // 40 s on a 1-halala hold (duration_minutes 0.01), no sweep in between: a minute, 15 halala.
    const rich = await makeRenter(srv, 10_000);
    const a = await runningJob(rich, provider, { job_type: "llm-inference", duration_minutes: 0.01 });
    await ranFor(a.jobId, 40);
    const done = await api.post("/api/providers/job-result", { api_key: provider.key, job_id: a.jobId, success: true, result: { response: "hi" } });
    expect(done.status, done.text).toBe(200);
    expect(done.body).toMatchObject({ actual_minutes: 1, cost_halala: a.rate, provider_earned_halala: Math.floor((a.rate * 75) / 100) });
    expect(await balance(rich.key)).toMatchObject({ balance_halala: 10_000 - a.rate, held_halala: 0 });
    // A renter with 6 halala: the hold grows to all of it, no further.
    const poor = await makeRenter(srv, 6);
    const b = await runningJob(poor, provider, { job_type: "llm-inference", duration_minutes: 0.01 });
    await ranFor(b.jobId, 40);
    expect((await api.post("/api/providers/job-result", { api_key: provider.key, job_id: b.jobId, success: true, result: { response: "hi" } })).body.cost_halala).toBe(6);
    expect(await balance(poor.key)).toMatchObject({ balance_halala: 0, held_halala: 0 });
    // A renter failing its own job (the renter's fault bills the time used) within a monthly limit of 10.
    const capped = await makeRenter(srv, 10_000);
    await srv.sql`UPDATE renter_quota SET monthly_spend_limit_halala = 10 WHERE renter_id = ${capped.id}`;
    const c = await runningJob(capped, provider, { job_type: "llm-inference", duration_minutes: 0.01 });
    await ranFor(c.jobId, 40);
    const failed = await api.post("/api/providers/job-result", {
      api_key: provider.key, job_id: c.jobId, success: false, error: "bad input", fault: "renter", end_reason: "runtime_error",
    });
    expect(failed.body).toMatchObject({ status: "failed", cost_halala: 10 });
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("stops a job its renter cannot pay for any longer, as the paid time runs out, and bills the minutes held", async () => {
    const renter = await makeRenter(srv, 0);
    const provider = await makeProvider(srv);
    // Funds for the 1-minute estimate of a benchmark (10 halala/min) plus one more minute.
    const rate = 10;
    await srv.sql.begin((tx) => credit(tx, renter.id, 2 * rate, `test-fund:${renter.id}:two-minutes`));
    const { jobId } = await runningJob(renter, provider, { job_type: "benchmark", duration_minutes: 1 });
    // 30 s in: within a minute of the end, the hold grows by the one minute the balance covers.
    await ranFor(jobId, 30);
    expect((await sweepJobs(srv.sql)).extended).toBe(1);
    expect(await balance(renter.key)).toMatchObject({ held_halala: 2 * rate, available_halala: 0 });
    // 90 s in: no more funds, but paid time is left: the job runs on (a top-up could still come).
    await ranFor(jobId, 90);
    const mid = await sweepJobs(srv.sql);
    expect(mid).toMatchObject({ extended: 0, outOfFunds: 0 });
    // 116 s in: its paid time is about to end: stopped, the provider told, both minutes billed 75/25.
    const stops: string[] = [];
    const l = await srv.sql.listen(CANCEL_CHANNEL, (p) => stops.push(JSON.parse(p).job_id));
    await ranFor(jobId, 116);
    expect((await sweepJobs(srv.sql)).outOfFunds).toBe(1);
    await expect.poll(() => stops).toEqual([jobId]);
    await l.unlisten();
    const j = (await api.get(`/api/jobs/${jobId}`, renter.headers)).body;
    expect(j).toMatchObject({ status: "failed", end_reason: "out_of_funds", fault: "renter", actual_cost_halala: 2 * rate, provider_earned_halala: 15, platform_fee_halala: 5 });
    expect(j.error).toMatch(/cannot pay for more than the 2 minutes held/);
    expect(await balance(renter.key)).toMatchObject({ balance_halala: 0, held_halala: 0 });
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("stops a vllm_serve job that never reported its endpoint when its renter cannot pay for more, and charges none of it; one that did is billed as before", async () => {
    const renter = await makeRenter(srv, 0);
    const provider = await makeProvider(srv);
    // Funds for 2 minutes of vllm_serve (20 halala/min): the 1-minute estimate and one more.
    const rate = 20;
    await srv.sql.begin((tx) => credit(tx, renter.id, 2 * rate, `test-fund:${renter.id}:two-serving-minutes`));
    const silent = await runningJob(renter, provider, { job_type: "vllm_serve", duration_minutes: 1 });
    expect(silent.rate).toBe(rate);
    // Its hold grows all the same: an endpoint reported later would bill the whole run.
    await ranFor(silent.jobId, 30);
    expect((await sweepJobs(srv.sql)).extended).toBe(1);
    expect((await api.get(`/api/jobs/${silent.jobId}`, renter.headers)).body).toMatchObject({ held_halala: 2 * rate, running_cost_halala: 0 });
    await ranFor(silent.jobId, 116);
    expect((await sweepJobs(srv.sql)).outOfFunds).toBe(1);
    const j1 = (await api.get(`/api/jobs/${silent.jobId}`, renter.headers)).body;
    expect(j1).toMatchObject({ status: "failed", end_reason: "out_of_funds", fault: "renter", actual_cost_halala: 0, provider_earned_halala: 0 });
    expect(await balance(renter.key)).toMatchObject({ balance_halala: 2 * rate, held_halala: 0, total_spent_halala: 0 });

    const served = await runningJob(renter, provider, { job_type: "vllm_serve", duration_minutes: 1 });
    expect((await api.post(`/api/jobs/${served.jobId}/endpoint-ready`, { api_key: provider.key, endpoint_url: "http://203.0.113.7:8000" })).status).toBe(200);
    await ranFor(served.jobId, 30);
    expect((await sweepJobs(srv.sql)).extended).toBe(1);
    expect((await api.get(`/api/jobs/${served.jobId}`, renter.headers)).body.running_cost_halala).toBe(rate);
    await ranFor(served.jobId, 116);
    expect((await sweepJobs(srv.sql)).outOfFunds).toBe(1);
    const j2 = (await api.get(`/api/jobs/${served.jobId}`, renter.headers)).body;
    expect(j2).toMatchObject({ status: "failed", end_reason: "out_of_funds", fault: "renter", actual_cost_halala: 2 * rate, provider_earned_halala: 30, platform_fee_halala: 10 });
    expect(await balance(renter.key)).toMatchObject({ balance_halala: 0, held_halala: 0, total_spent_halala: 2 * rate });
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("does not grow a hold into what the renter's /v1 requests in flight reserved", async () => {
    const renter = await makeRenter(srv, 0);
    const provider = await makeProvider(srv);
    const rate = 10;
    await srv.sql.begin((tx) => credit(tx, renter.id, 4 * rate, `test-fund:${renter.id}:four-minutes`));
    const { jobId } = await runningJob(renter, provider, { job_type: "benchmark", duration_minutes: 1 });
    // A request in flight reserved the three minutes left.
    const requestId = `test-${renter.id}`;
    await srv.sql.begin((tx) =>
      reserveTokenBudget(tx, { requestId, renterId: renter.id, model: "m", stream: false, rate: { input: 1_000_000, output: 1_000_000 }, promptTokens: 10, maxTokens: 20, choices: 1, ttlSeconds: 60 }),
    );
    await ranFor(jobId, 30);
    expect((await sweepJobs(srv.sql)).extended).toBe(0);
    expect(await balance(renter.key)).toMatchObject({ held_halala: rate, available_halala: 3 * rate });
    // Once it ended, the hold grows by what is free again.
    expect(await releaseTokenBudget(srv.sql, requestId)).toBe(true);
    expect((await sweepJobs(srv.sql)).extended).toBe(1);
    expect(await balance(renter.key)).toMatchObject({ held_halala: 4 * rate, available_halala: 0 });
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("grows a hold only within the renter's monthly spend limit, and stops the job (spend_limit) when it leaves no minute", async () => {
    const renter = await makeRenter(srv, 10_000);
    const provider = await makeProvider(srv);
    const rate = 10;
    // The balance pays for hours; the limit for 3 minutes of the benchmark's 10 halala/min.
    await srv.sql`UPDATE renter_quota SET monthly_spend_limit_halala = ${3 * rate} WHERE renter_id = ${renter.id}`;
    const { jobId } = await runningJob(renter, provider, { job_type: "benchmark", duration_minutes: 1 });
    await ranFor(jobId, 30);
    expect((await sweepJobs(srv.sql)).extended).toBe(1);
    expect((await api.get(`/api/jobs/${jobId}`, renter.headers)).body.held_halala).toBe(3 * rate);
    // 176 s in, its 3 paid minutes about to end and the limit reached: stopped, the renter's doing, billed.
    await ranFor(jobId, 176);
    expect((await sweepJobs(srv.sql)).outOfFunds).toBe(1);
    const j = (await api.get(`/api/jobs/${jobId}`, renter.headers)).body;
    expect(j).toMatchObject({ status: "failed", end_reason: "spend_limit", fault: "renter", actual_cost_halala: 3 * rate });
    expect(j.error).toMatch(/monthly_spend_limit_halala \(30\) leaves nothing for more than the 3 minutes held/);
    expect(await balance(renter.key)).toMatchObject({ balance_halala: 10_000 - 3 * rate, held_halala: 0 });
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("counts /v1 reservations in flight against the monthly spend limit at submit", async () => {
    const renter = await makeRenter(srv, 10_000);
    await makeProvider(srv);
    await srv.sql`UPDATE renter_quota SET monthly_spend_limit_halala = 100 WHERE renter_id = ${renter.id}`;
    const requestId = `test-limit-${renter.id}`;
    // 10 prompt + 85 completion tokens at 1 halala each: 95 of the 100 reserved.
    await srv.sql.begin((tx) =>
      reserveTokenBudget(tx, { requestId, renterId: renter.id, model: "m", stream: false, rate: { input: 1_000_000, output: 1_000_000 }, promptTokens: 10, maxTokens: 85, choices: 1, ttlSeconds: 60 }),
    );
    const job = { job_type: "benchmark", duration_minutes: 1 };
    const refused = await api.post("/api/jobs/submit", job, renter.headers);
    expect(refused.status, refused.text).toBe(429);
    expect(refused.body.error).toMatch(/monthly_spend_limit_halala is 100; 95 halala spent, held or reserved this UTC month and this job would hold 10 more/);
    expect(await releaseTokenBudget(srv.sql, requestId)).toBe(true);
    expect((await api.post("/api/jobs/submit", job, renter.headers)).status).toBe(201);
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("grows a hold only within a minute of its end, and never past max_duration_seconds", async () => {
    const renter = await makeRenter(srv, 10_000);
    const provider = await makeProvider(srv);
    await srv.sql`UPDATE providers SET gpu_count = 2, approved_gpu_count = 2 WHERE id = ${provider.id}`;
    // A 10-minute job 30 s in has minutes of paid time left: nothing to do.
    const long = await runningJob(renter, provider, { job_type: "benchmark", duration_minutes: 10 });
    await ranFor(long.jobId, 30);
    const [{ id }] = await srv.sql`SELECT id FROM jobs WHERE job_id = ${long.jobId}`;
    expect((await srv.sql.begin((tx) => fundRunningJob(tx, id))).kind).toBe("unchanged");
    expect((await sweepJobs(srv.sql)).extended).toBe(0);
    const { jobId, rate } = await runningJob(renter, provider, { job_type: "benchmark", duration_minutes: 1, max_duration_seconds: 150 });
    await ranFor(jobId, 30);
    await sweepJobs(srv.sql);
    // The cap is 150 s, 3 billable minutes: the hold grows to 3 minutes, not 6.
    expect((await api.get(`/api/jobs/${jobId}`, renter.headers)).body.held_halala).toBe(3 * rate);
    await ranFor(jobId, 125);
    expect((await sweepJobs(srv.sql)).extended).toBe(0);
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("keeps the books when extensions race the job's settlement", async () => {
    const renter = await makeRenter(srv, 100_000);
    const provider = await makeProvider(srv);
    await srv.sql`UPDATE providers SET gpu_count = 8, approved_gpu_count = 8 WHERE id = ${provider.id}`;
    const jobs: string[] = [];
    for (let i = 0; i < 8; i++) jobs.push((await runningJob(renter, provider, { job_type: "benchmark", duration_minutes: 0.5, max_duration_seconds: 3600 })).jobId);
    for (const j of jobs) await ranFor(j, 50);
    const ids = (await srv.sql`SELECT id FROM jobs WHERE job_id = ANY(${jobs})`).map((r) => r.id as number);
    await Promise.all([
      ...ids.map((id) => srv.sql.begin((tx) => fundRunningJob(tx, id))),
      ...jobs.map((j) => api.post("/api/providers/job-result", { api_key: provider.key, job_id: j, success: true, result: { ok: 1 } })),
      ...ids.map((id) => srv.sql.begin((tx) => fundRunningJob(tx, id))),
    ]);
    // Each settles once: for the minute it ran (10) when its hold grew first, within the 5 held when the result came first.
    const rows = await srv.sql`SELECT status, actual_cost_halala::int AS cost FROM jobs WHERE job_id = ANY(${jobs})`;
    expect(rows.map((r) => r.status)).toEqual(Array(8).fill("completed"));
    for (const r of rows) expect([5, 10]).toContain(r.cost);
    const charged = rows.reduce((sum, r) => sum + r.cost, 0);
    const [settlements] = await srv.sql`SELECT count(*)::int AS n FROM ledger_holds h JOIN jobs j ON j.id = h.job_id WHERE j.job_id = ANY(${jobs}) AND h.status = 'settled'`;
    expect(settlements.n).toBe(8);
    expect(await balance(renter.key)).toMatchObject({ balance_halala: 100_000 - charged, held_halala: 0 });
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });
});

describe("a running job's running_cost_halala is measured by the database's clock", () => {
  // The server runs in this process: its clock (Date only, still advancing) is moved while
  // PostgreSQL keeps the real time, which started_at and the billing are taken from.
  restoreClockAfterEach();
  const view = async (jobId: string, renter: { headers: Record<string, string> }) => {
    const one = (await api.get(`/api/jobs/${jobId}`, renter.headers)).body;
    const listed = (await api.get("/api/jobs?limit=5", renter.headers)).body.jobs.find((j: { job_id: string }) => j.job_id === jobId);
    const recent = (await api.get("/api/renters/me", renter.headers)).body.recent_jobs.find((j: { job_id: string }) => j.job_id === jobId);
    const admin = (await api.get("/api/admin/jobs?limit=5", { "x-admin-token": ADMIN_TOKEN })).body.jobs.find((j: { job_id: string }) => j.job_id === jobId);
    return [one.running_cost_halala, listed?.running_cost_halala, recent?.running_cost_halala, admin?.running_cost_halala];
  };

  it("a job that started just now shows its first minute at most, on a host 10 minutes ahead", async () => {
    const renter = await makeRenter(srv, 10_000);
    const provider = await makeProvider(srv);
    const { jobId, rate } = await runningJob(renter, provider, { job_type: "benchmark", duration_minutes: 60 });
    await srv.sql`UPDATE jobs SET started_at = now(), acked_at = now() WHERE job_id = ${jobId}`;
    skewAppClock(10 * 60_000);
    const costs = await view(jobId, renter);
    vi.useRealTimers();
    for (const c of costs) expect(c).toBeLessThanOrEqual(rate);
  });

  it("a job that has run 290 s shows 5 minutes, on a host 10 minutes behind", async () => {
    const renter = await makeRenter(srv, 10_000);
    const provider = await makeProvider(srv);
    const { jobId, rate } = await runningJob(renter, provider, { job_type: "benchmark", duration_minutes: 60 });
    await srv.sql`UPDATE jobs SET started_at = now() - interval '290 seconds', acked_at = now() WHERE job_id = ${jobId}`;
    skewAppClock(-10 * 60_000);
    const costs = await view(jobId, renter);
    vi.useRealTimers();
    expect(costs).toEqual([5 * rate, 5 * rate, 5 * rate, 5 * rate]);
  });
});
