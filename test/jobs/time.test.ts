// Server-side time over real HTTP: max_duration_seconds enforced by the
// sweep (the job fails as the renter's fault: it pays the time used, the rest
// of the hold comes back, the provider is told to stop),
// a silent provider's job re-queued as a new attempt up to the limit, and both
// paths settling exactly once while a result arrives at the same moment.
import { beforeEach, describe, expect, it } from "vitest";
import { startTestServer, useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import { requeueJobsOfProvider } from "../../src/domain/dispatch/dispatch.js";
import { sweepJobs } from "../../src/workers/job-timeouts.js";
import { recordTaskKeyCheck } from "../../src/domain/dispatch/task-key.js";
import { CANCEL_CHANNEL } from "../../src/domain/notify/job-notices.js";
import { refreshReputation } from "../../src/domain/providers/reputation.js";
import { clearMarketplace, pickUp } from "./helpers.js";
import { ADMIN, flushHeartbeats, heartbeat } from "../providers/helpers.js";

// The test drives the sweep itself; the server's own sweep is far away.
const LOAD_GRACE = 90;
const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0", SVC_JOB_MAX_ATTEMPTS: "3", SVC_SERVING_LOAD_GRACE_SECONDS: String(LOAD_GRACE) });
const api = client(srv);
beforeEach(() => clearMarketplace(srv));

const submit = (headers: Record<string, string>, body: Record<string, unknown> = {}) =>
  api.post("/api/jobs/submit", { job_type: "benchmark", ...body }, headers);
const balance = async (key: string) => (await api.get("/api/renters/balance", { "x-renter-key": key })).body;
/** Moves a job's deadline into the past, as if max_duration_seconds had run out. */
const expire = (jobId: string) => srv.sql`UPDATE jobs SET timeout_at = now() - interval '1 second' WHERE job_id = ${jobId}`;
/** As if the job had been assigned `seconds` ago (and so submitted no later). */
const assignedAgo = (jobId: string, seconds: number) => srv.sql`
  UPDATE jobs SET assigned_at = now() - make_interval(secs => ${seconds}), submitted_at = least(submitted_at, now() - make_interval(secs => ${seconds}))
  WHERE job_id = ${jobId}`;
/** As if the job had run `seconds` and its max_duration_seconds had run out. */
const ranOut = (jobId: string, seconds: number) =>
  srv.sql`UPDATE jobs SET started_at = now() - make_interval(secs => ${seconds}), timeout_at = now() - interval '1 second' WHERE job_id = ${jobId}`;
const reliability = async (id: number) => {
  await refreshReputation(srv.sql, [id]);
  return Number((await srv.sql`SELECT reliability_score FROM providers WHERE id = ${id}`)[0].reliability_score);
};
const silence = (providerId: number) => srv.sql`UPDATE providers SET last_heartbeat = now() - interval '10 minutes' WHERE id = ${providerId}`;

describe("max_duration_seconds", () => {
  it("bills no minute past the limit, however late the timeout is noticed or reported", async () => {
    const renter = await makeRenter(srv, 10_000);
    const provider = await makeProvider(srv);
    // Benchmark jobs cost 10 halala a minute; the 10-minute estimate holds 100.
    const swept = (await submit(renter.headers, { duration_minutes: 10, max_duration_seconds: 60 })).body.job.job_id;
    expect((await pickUp(api, provider.key))?.job_id).toBe(swept);
    // The sweep finds it 0.2 s after its deadline: 60.2 s run, 1 minute billed (not 2).
    await srv.sql`UPDATE jobs SET started_at = now() - interval '60.2 seconds', timeout_at = now() - interval '0.2 seconds' WHERE job_id = ${swept}`;
    expect((await sweepJobs(srv.sql)).timedOut).toBe(1);
    expect((await api.get(`/api/jobs/${swept}`, renter.headers)).body).toMatchObject({ end_reason: "timeout", actual_cost_halala: 10, provider_earned_halala: 7 });
    const receipt = (await api.get(`/api/jobs/${swept}/receipt`, renter.headers)).body;
    expect(receipt.receipt.billing).toMatchObject({ billed_seconds: 60, billed_minutes: 1, charged_halala: 10 });

    // The daemon reports its own timeout 1 s after a 300 s limit: 5 minutes, not 6.
    const reported = (await submit(renter.headers, { duration_minutes: 10, max_duration_seconds: 300 })).body.job.job_id;
    expect((await pickUp(api, provider.key))?.job_id).toBe(reported);
    await srv.sql`UPDATE jobs SET started_at = now() - interval '301 seconds', timeout_at = now() - interval '1 second' WHERE job_id = ${reported}`;
    const rep = await api.post("/api/providers/job-result", { api_key: provider.key, job_id: reported, success: false, end_reason: "timeout", error: "killed at max_duration_seconds" });
    expect(rep.status, rep.text).toBe(200);
    expect(rep.body).toMatchObject({ actual_minutes: 5, cost_halala: 50 });
    expect(await balance(renter.key)).toMatchObject({ total_spent_halala: 60, held_halala: 0 });
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("limits run time only: a job its provider never picked up is re-queued after the pickup window, not timed out", async () => {
    const renter = await makeRenter(srv, 10_000);
    const first = await makeProvider(srv);
    const job = (await submit(renter.headers, { max_duration_seconds: 60 })).body.job.job_id;
    // Assigned (pending) long ago, past both its deadline and the 120 s pickup window; never picked up.
    await srv.sql`UPDATE jobs SET timeout_at = now() - interval '1 second' WHERE job_id = ${job}`;
    await assignedAgo(job, 200);
    await srv.sql`UPDATE providers SET is_paused = true WHERE id = ${first.id}`;
    const second = await makeProvider(srv);
    const swept = await sweepJobs(srv.sql);
    expect(swept.timedOut).toBe(0);
    expect(swept.requeued).toBe(1);
    const j = (await api.get(`/api/jobs/${job}`, renter.headers)).body;
    expect(j).toMatchObject({ status: "pending", provider_id: second.id, attempt: 2 });
    const hist = (await api.get(`/api/jobs/${job}/history`, renter.headers)).body.attempts;
    expect(hist[0]).toMatchObject({ attempt: 1, provider_id: first.id, end_reason: "not_picked_up", fault: "provider", cost_halala: 0 });
    expect(await balance(renter.key)).toMatchObject({ balance_halala: 10_000, held_halala: 100 }); // the 10-minute estimate, still held: nothing charged
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("fails a running job past its limit, bills the time used, tells the provider, and refuses the late result", async () => {
    const renter = await makeRenter(srv, 10_000);
    const provider = await makeProvider(srv);
    const job = (await submit(renter.headers, { max_duration_seconds: 1 })).body.job.job_id;
    await pickUp(api, provider.key);
    const stops: string[] = [];
    const l = await srv.sql.listen(CANCEL_CHANNEL, (p) => stops.push(JSON.parse(p).job_id));
    await new Promise((r) => setTimeout(r, 1100));
    const swept = await sweepJobs(srv.sql);
    expect(swept.timedOut).toBe(1);
    await expect.poll(() => stops).toEqual([job]);
    await l.unlisten();

    const j = (await api.get(`/api/jobs/${job}`, renter.headers)).body;
    // Its time ran out: the renter's fault, so the minute it ran is billed (benchmark: 10 halala), 75/25.
    expect(j).toMatchObject({ status: "failed", end_reason: "timeout", fault: "renter", actual_cost_halala: 10, provider_earned_halala: 7, platform_fee_halala: 3 });
    expect(j.error).toMatch(/max_duration_seconds/);
    expect((await api.get(`/api/jobs/${job}/output`, renter.headers)).status).toBe(410);
    expect(await balance(renter.key)).toMatchObject({ balance_halala: 9_990, held_halala: 0 });
    const late = await api.post("/api/providers/job-result", { api_key: provider.key, job_id: job, success: true, result: {} });
    expect(late.status).toBe(409);
    expect(await balance(renter.key)).toMatchObject({ balance_halala: 9_990, held_halala: 0, total_spent_halala: 10 });
    const hist = (await api.get(`/api/jobs/${job}/history`, renter.headers)).body.attempts;
    expect(hist).toEqual([expect.objectContaining({ attempt: 1, status: "failed", end_reason: "timeout", fault: "renter", cost_halala: 10 })]);
    expect(await ledgerProblems(srv.sql)).toEqual([]);
    expect((await sweepJobs(srv.sql)).timedOut).toBe(0);
  });

  it("a vllm_serve job whose provider never reported its endpoint is, at its deadline, the provider's failure: re-queued at no charge, docked", async () => {
    const renter = await makeRenter(srv, 10_000);
    const provider = await makeProvider(srv);
    await srv.sql`UPDATE providers SET first_heartbeat_at = now() - interval '40 days' WHERE id = ${provider.id}`;
    const before = await reliability(provider.id);
    // vllm_serve: 20 halala a minute; 3 minutes held (60).
    const job = (await submit(renter.headers, { job_type: "vllm_serve", duration_minutes: 3, max_duration_seconds: 1800 })).body.job.job_id;
    expect((await pickUp(api, provider.key))?.job_id).toBe(job);
    await ranOut(job, 1801);
    const stops: string[] = [];
    const l = await srv.sql.listen(CANCEL_CHANNEL, (p) => stops.push(JSON.parse(p).job_id));
    const swept = await sweepJobs(srv.sql);
    expect(swept).toMatchObject({ timedOut: 0, requeued: 1 });
    await expect.poll(() => stops).toEqual([job]);
    await l.unlisten();
    // No other provider fits it (this one failed it): back in the queue, its hold intact for the next attempt.
    expect((await api.get(`/api/jobs/${job}`, renter.headers)).body).toMatchObject({ status: "queued", attempt: 2, actual_cost_halala: null });
    const hist = (await api.get(`/api/jobs/${job}/history`, renter.headers)).body.attempts;
    expect(hist).toEqual([expect.objectContaining({ attempt: 1, provider_id: provider.id, status: "requeued", end_reason: "provider_error", fault: "provider", cost_halala: 0 })]);
    const [attempt] = await srv.sql`SELECT a.error FROM job_attempts a JOIN jobs j ON j.id = a.job_id WHERE j.job_id = ${job}`;
    expect(attempt.error).toMatch(/max_duration_seconds \(1800 s\) ran out, and the provider never reported the job's endpoint/);
    expect(await balance(renter.key)).toMatchObject({ balance_halala: 10_000, held_halala: 60, total_spent_halala: 0 });
    expect((await api.get(`/api/providers/me?key=${provider.key}`)).body.provider.total_earnings_halala).toBe(0);
    expect(await reliability(provider.id)).toBeLessThan(before);

    // Pinned to its provider: failed with the fault shown, the hold back in full.
    const pinned = (await submit(renter.headers, { job_type: "vllm_serve", duration_minutes: 3, provider_id: provider.id })).body.job.job_id;
    expect((await pickUp(api, provider.key))?.job_id).toBe(pinned);
    await ranOut(pinned, 1801);
    expect(await sweepJobs(srv.sql)).toMatchObject({ timedOut: 0, failed: 1 });
    expect((await api.get(`/api/jobs/${pinned}`, renter.headers)).body).toMatchObject({ status: "failed", end_reason: "provider_error", fault: "provider", actual_cost_halala: 0 });
    expect(await balance(renter.key)).toMatchObject({ balance_halala: 10_000, held_halala: 60, total_spent_halala: 0 });
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("a vllm_serve job whose limit was shorter than an engine is given to start times out as the renter's: nothing billed, nothing against the provider", async () => {
    const renter = await makeRenter(srv, 10_000);
    const provider = await makeProvider(srv);
    const before = await reliability(provider.id);
    const job = (await submit(renter.headers, { job_type: "vllm_serve", duration_minutes: 3, max_duration_seconds: LOAD_GRACE - 30, provider_id: provider.id })).body.job.job_id;
    expect((await pickUp(api, provider.key))?.job_id).toBe(job);
    await ranOut(job, LOAD_GRACE - 29);
    expect(await sweepJobs(srv.sql)).toMatchObject({ timedOut: 1, requeued: 0 });
    expect((await api.get(`/api/jobs/${job}`, renter.headers)).body).toMatchObject({ status: "failed", end_reason: "timeout", fault: "renter", actual_cost_halala: 0 });
    expect(await balance(renter.key)).toMatchObject({ balance_halala: 10_000, held_halala: 0 });
    expect(await reliability(provider.id)).toBeGreaterThanOrEqual(before);
    // The daemon's own report of that timeout is judged the same way.
    const reported = (await submit(renter.headers, { job_type: "vllm_serve", duration_minutes: 3, max_duration_seconds: LOAD_GRACE - 30, provider_id: provider.id })).body.job.job_id;
    expect((await pickUp(api, provider.key))?.job_id).toBe(reported);
    await ranOut(reported, LOAD_GRACE - 29);
    const rep = await api.post("/api/providers/job-result", { api_key: provider.key, job_id: reported, success: false, end_reason: "timeout", error: "killed at max_duration_seconds" });
    expect(rep.body).toMatchObject({ status: "failed", end_reason: "timeout", fault: "renter", cost_halala: 0 });
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("a vllm_serve job that reported its endpoint times out as the renter's, billed for the time used", async () => {
    const renter = await makeRenter(srv, 10_000);
    const provider = await makeProvider(srv);
    const job = (await submit(renter.headers, { job_type: "vllm_serve", duration_minutes: 3, max_duration_seconds: 60 })).body.job.job_id;
    expect((await pickUp(api, provider.key))?.job_id).toBe(job);
    const ready = await api.post(`/api/jobs/${job}/endpoint-ready`, { api_key: provider.key, endpoint_url: "http://203.0.113.7:8000" });
    expect(ready.status, ready.text).toBe(200);
    await ranOut(job, 90);
    expect(await sweepJobs(srv.sql)).toMatchObject({ timedOut: 1, requeued: 0 });
    // Found 30 s past its 60 s limit: billed the limit's 1 minute at 20 halala, 75/25.
    expect((await api.get(`/api/jobs/${job}`, renter.headers)).body).toMatchObject({
      status: "failed", end_reason: "timeout", fault: "renter", actual_cost_halala: 20, provider_earned_halala: 15, platform_fee_halala: 5,
    });
    expect(await balance(renter.key)).toMatchObject({ balance_halala: 9_980, held_halala: 0, total_spent_halala: 20 });
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("bills a vllm_serve job's run before its endpoint report no longer than the load grace; its deadline stays, and the daemon's timeout there is the renter's", async () => {
    const renter = await makeRenter(srv, 10_000);
    const provider = await makeProvider(srv);
    const late = (await submit(renter.headers, { job_type: "vllm_serve", duration_minutes: 60, max_duration_seconds: 3600 })).body.job.job_id;
    expect((await pickUp(api, provider.key))?.job_id).toBe(late);
    const sinceStart = async (jobId: string) =>
      (
        await srv.sql<{ job: number; attempt: number; left: number }[]>`
          SELECT extract(epoch FROM now() - j.started_at)::float8 AS job, extract(epoch FROM now() - a.started_at)::float8 AS attempt,
                 extract(epoch FROM j.timeout_at - now())::float8 AS left
          FROM jobs j JOIN job_attempts a ON a.job_id = j.id AND a.attempt = j.attempt WHERE j.job_id = ${jobId}`
      )[0];
    /** As if `minutes` had passed: the run's start and its deadline both that much earlier. */
    const passes = (jobId: string, minutes: number) => srv.sql`
      WITH j AS (UPDATE jobs SET started_at = started_at - make_interval(mins => ${minutes}), timeout_at = timeout_at - make_interval(mins => ${minutes})
                 WHERE job_id = ${jobId} RETURNING id, attempt)
      UPDATE job_attempts a SET started_at = a.started_at - make_interval(mins => ${minutes}) FROM j WHERE a.job_id = j.id AND a.attempt = j.attempt`;
    // The engine took 30 minutes to report its endpoint.
    await passes(late, 30);
    const ready = await api.post(`/api/jobs/${late}/endpoint-ready`, { api_key: provider.key, endpoint_url: "http://203.0.113.7:8000" });
    expect(ready.status, ready.text).toBe(200);
    // Its billed run now starts the grace before the report, on the job and the attempt; its deadline stays where the run's start put it.
    const moved = await sinceStart(late);
    expect(moved.job).toBeGreaterThanOrEqual(LOAD_GRACE);
    expect(moved.job).toBeLessThan(LOAD_GRACE + 5);
    expect(moved.attempt).toBeCloseTo(moved.job, 3);
    expect(moved.left).toBeGreaterThan(1800 - 5);
    expect(moved.left).toBeLessThan(1800 + 1);
    // The endpoint reported again (the engine restarted) moves nothing.
    await passes(late, 20);
    expect((await api.post(`/api/jobs/${late}/endpoint-ready`, { api_key: provider.key, endpoint_url: "http://203.0.113.7:8001" })).status).toBe(200);
    expect((await sinceStart(late)).job).toBeGreaterThan(20 * 60);
    // The rest of the hour passes; the daemon's own kill timer ends it at its deadline: the renter's timeout,
    // billed the 30 served minutes and the grace (31.5 minutes: 32 at 20 halala), not the 30 of loading.
    await passes(late, 10);
    const rep = await api.post("/api/providers/job-result", { api_key: provider.key, job_id: late, success: false, end_reason: "timeout", error: "killed at max_duration_seconds" });
    expect(rep.body).toMatchObject({ status: "failed", end_reason: "timeout", fault: "renter", cost_halala: 640, provider_earned_halala: 480 });
    const billing = (await api.get(`/api/jobs/${late}/receipt`, renter.headers)).body.receipt.billing;
    expect(billing).toMatchObject({ billed_minutes: 32, charged_halala: 640 });

    // An endpoint reported within the grace bills the whole run, as before.
    const prompt = (await submit(renter.headers, { job_type: "vllm_serve", duration_minutes: 60, max_duration_seconds: 3600 })).body.job.job_id;
    expect((await pickUp(api, provider.key))?.job_id).toBe(prompt);
    await srv.sql`UPDATE jobs SET started_at = now() - interval '60 seconds' WHERE job_id = ${prompt}`;
    expect((await api.post(`/api/jobs/${prompt}/endpoint-ready`, { api_key: provider.key, endpoint_url: "http://203.0.113.7:8000" })).status).toBe(200);
    expect((await sinceStart(prompt)).job).toBeGreaterThanOrEqual(60);
    expect((await sinceStart(prompt)).job).toBeLessThan(LOAD_GRACE);
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("bills a custom_container's run from its start however late its published port (expose_port) is reported, and shows the renter its endpoint_url", async () => {
    const renter = await makeRenter(srv, 10_000);
    const provider = await makeProvider(srv);
    const r = await submit(renter.headers, { job_type: "custom_container", duration_minutes: 60, max_duration_seconds: 3600, params: { command: ["python", "-m", "http.server", "8080"], expose_port: 8080 } });
    expect(r.status, r.text).toBe(201);
    const jobId = r.body.job.job_id;
    expect((await pickUp(api, provider.key))?.job_id).toBe(jobId);
    await srv.sql`UPDATE jobs SET started_at = started_at - interval '30 minutes', timeout_at = timeout_at - interval '30 minutes' WHERE job_id = ${jobId}`;
    const [before] = await srv.sql`SELECT started_at FROM jobs WHERE job_id = ${jobId}`;
    const ready = await api.post(`/api/jobs/${jobId}/endpoint-ready`, { api_key: provider.key, endpoint_url: "http://203.0.113.7:9100" });
    expect(ready.status, ready.text).toBe(200);
    const [after] = await srv.sql`SELECT started_at FROM jobs WHERE job_id = ${jobId}`;
    expect(after.started_at).toEqual(before.started_at);
    expect((await api.get(`/api/jobs/${jobId}`, renter.headers)).body.endpoint_url).toBe("http://203.0.113.7:9100");
  });

  it("is enforced by the server's own worker", async () => {
    const fast = await startTestServer({ SVC_JOB_SWEEP_MS: "100", SVC_LIVENESS_SWEEP_SECONDS: "0" }, srv.databaseUrl);
    try {
      const renter = await makeRenter(srv, 10_000);
      const provider = await makeProvider(srv);
      const job = (await submit(renter.headers, { max_duration_seconds: 1 })).body.job.job_id;
      await pickUp(api, provider.key);
      await expect.poll(async () => (await api.get(`/api/jobs/${job}`, renter.headers)).body.status, { timeout: 5000 }).toBe("failed");
      expect(await balance(renter.key)).toMatchObject({ held_halala: 0, balance_halala: 9_990 });
    } finally {
      await fast.app.close();
    }
  });

  it("settles exactly once when the result and the timeout race", async () => {
    const renter = await makeRenter(srv, 100_000);
    const provider = await makeProvider(srv);
    await srv.sql`UPDATE providers SET gpu_count = 30, approved_gpu_count = 30 WHERE id = ${provider.id}`;
    const ids: string[] = [];
    for (let i = 0; i < 24; i++) ids.push((await submit(renter.headers)).body.job.job_id);
    for (let i = 0; i < 24; i++) await pickUp(api, provider.key);
    for (const id of ids) await expire(id);
    // Results arrive newest first while sweeps walk the deadlines oldest first: they meet in the middle.
    const report = (id: string) => api.post("/api/providers/job-result", { api_key: provider.key, job_id: id, success: true, result: { scores: {} } });
    const [, reversed] = await Promise.all([Promise.all([sweepJobs(srv.sql), sweepJobs(srv.sql), sweepJobs(srv.sql)]), Promise.all([...ids].reverse().map(report))]);
    const results = reversed.reverse();
    const rows = await srv.sql<{ job_id: string; status: string; end_reason: string; actual_cost_halala: number }[]>`
      SELECT job_id, status, end_reason, actual_cost_halala FROM jobs WHERE job_id IN ${srv.sql(ids)}`;
    // Either way the minute run is billed once: by the result, or by the timeout (the renter's fault).
    let spent = 0;
    for (const [i, id] of ids.entries()) {
      const row = rows.find((r) => r.job_id === id)!;
      if (row.status === "completed") {
        expect(results[i].status).toBe(200);
        expect(results[i].body.cost_halala).toBe(10);
      } else {
        expect(row).toMatchObject({ status: "failed", end_reason: "timeout", actual_cost_halala: 10 });
        expect(results[i].status).toBe(409);
      }
      spent += 10;
    }
    const charges = await srv.sql<{ n: number }[]>`
      SELECT count(*)::int AS n FROM ledger_transfers t JOIN jobs j ON j.id = t.job_id WHERE j.job_id IN ${srv.sql(ids)} AND t.kind = 'charge_platform'`;
    expect(charges[0].n).toBe(spent / 10);
    expect(await balance(renter.key)).toMatchObject({ held_halala: 0, balance_halala: 100_000 - spent, total_spent_halala: spent });
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });
});

describe("silent providers", () => {
  it("re-queues a running job as a new attempt on another provider, with history", async () => {
    const renter = await makeRenter(srv, 10_000);
    const lost = await makeProvider(srv);
    const job = (await submit(renter.headers)).body.job.job_id;
    await api.get(`/api/providers/${lost.key}/jobs`);
    await api.post(`/api/jobs/${job}/logs`, { api_key: lost.key, logs: ["attempt one"] });
    const rescue = await makeProvider(srv);
    await silence(lost.id);
    const swept = await sweepJobs(srv.sql);
    expect(swept.requeued).toBe(1);

    const j = (await api.get(`/api/jobs/${job}`, renter.headers)).body;
    expect(j).toMatchObject({ status: "pending", provider_id: rescue.id, attempt: 2, started_at: null });
    const hist = (await api.get(`/api/jobs/${job}/history`, renter.headers)).body.attempts;
    expect(hist).toEqual([
      expect.objectContaining({ attempt: 1, provider_id: lost.id, status: "requeued", end_reason: "provider_silent", fault: "provider", cost_halala: 0 }),
      expect.objectContaining({ attempt: 2, provider_id: rescue.id, status: "pending", end_reason: null }),
    ]);
    // The lost provider may still read what it ran, but no longer report on it.
    expect((await api.get(`/api/jobs/${job}/logs?attempt=1`, lost.headers)).body.logs[0].message).toBe("attempt one");
    expect((await api.get(`/api/jobs/${job}/logs`, renter.headers)).body).toEqual({ logs: [], attempt: 2 });
    expect((await api.post("/api/providers/job-result", { api_key: lost.key, job_id: job, success: true, result: {} })).status).toBe(403);

    const poll = await api.get(`/api/providers/${rescue.key}/jobs`);
    expect(poll.body.job.job_id).toBe(job);
    const done = await api.post("/api/providers/job-result", { api_key: rescue.key, job_id: job, success: true, result: {} });
    expect(done.body).toMatchObject({ status: "completed", cost_halala: 10 });
    expect(await balance(renter.key)).toMatchObject({ balance_halala: 9_990, held_halala: 0 });
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("moves a job its live provider never picked up to another provider, skipping the first from then on", async () => {
    const renter = await makeRenter(srv, 10_000);
    const idle = await makeProvider(srv);
    const job = (await submit(renter.headers)).body.job.job_id;
    const other = await makeProvider(srv);
    await assignedAgo(job, 121);
    expect((await sweepJobs(srv.sql)).requeued).toBe(1);
    const j = (await api.get(`/api/jobs/${job}`, renter.headers)).body;
    expect(j).toMatchObject({ status: "pending", provider_id: other.id, attempt: 2 });
    const hist = (await api.get(`/api/jobs/${job}/history`, renter.headers)).body.attempts;
    expect(hist[0]).toMatchObject({ provider_id: idle.id, status: "requeued", end_reason: "not_picked_up" });
    // Back to the first provider only if the second lets it go too: it is skipped for this job.
    await assignedAgo(job, 121);
    await sweepJobs(srv.sql);
    expect((await api.get(`/api/jobs/${job}`, renter.headers)).body).toMatchObject({ status: "queued", attempt: 3, queue_reason_code: "providers_declined" });
  });

  it("fails and refunds after the attempt limit", async () => {
    const renter = await makeRenter(srv, 10_000);
    let provider = await makeProvider(srv);
    const job = (await submit(renter.headers)).body.job.job_id;
    for (let attempt = 1; attempt <= 3; attempt++) {
      expect((await api.get(`/api/providers/${provider.key}/jobs`)).body.job.job_id).toBe(job);
      await silence(provider.id);
      if (attempt < 3) provider = await makeProvider(srv);
      await sweepJobs(srv.sql);
    }
    const j = (await api.get(`/api/jobs/${job}`, renter.headers)).body;
    expect(j).toMatchObject({ status: "failed", attempt: 3, actual_cost_halala: 0 });
    expect(j.error).toMatch(/gave up after 3 attempts/);
    const hist = (await api.get(`/api/jobs/${job}/history`, renter.headers)).body.attempts;
    expect(hist.map((a: { status: string; end_reason: string }) => [a.status, a.end_reason])).toEqual([
      ["requeued", "provider_silent"],
      ["requeued", "provider_silent"],
      ["failed", "provider_silent"],
    ]);
    expect(await balance(renter.key)).toMatchObject({ balance_halala: 10_000, held_halala: 0 });
  });

  it("keeps a provider's jobs on it when it beats again between being found silent and their re-queue", async () => {
    const renter = await makeRenter(srv, 10_000);
    const provider = await makeProvider(srv);
    const job = (await submit(renter.headers)).body.job.job_id;
    expect((await pickUp(api, provider.key))?.job_id).toBe(job);
    await silence(provider.id);
    // Found silent by a sweep, it beats before the sweep's re-queue runs: the job stays with it.
    expect((await heartbeat(srv, provider.key)).status).toBe(200);
    await flushHeartbeats(srv);
    expect(await requeueJobsOfProvider(srv.sql, provider.id, "silent", "test: provider went silent")).toEqual({ requeued: [], failed: [] });
    expect((await api.get(`/api/jobs/${job}`, renter.headers)).body).toMatchObject({ status: "running", provider_id: provider.id, attempt: 1 });
    // Silent for real: re-queued.
    await silence(provider.id);
    expect(await requeueJobsOfProvider(srv.sql, provider.id, "silent", "test: provider went silent")).toEqual({ requeued: [job], failed: [] });
  });

  it("records an admin's suspension of a provider as the platform's doing on the attempts it took away", async () => {
    const renter = await makeRenter(srv, 10_000);
    const provider = await makeProvider(srv);
    const job = (await submit(renter.headers)).body.job.job_id;
    expect((await pickUp(api, provider.key))?.job_id).toBe(job);
    expect((await api.post(`/api/admin/providers/${provider.id}/suspend`, { reason: "chargeback" }, ADMIN)).status).toBe(200);
    const hist = (await api.get(`/api/jobs/${job}/history`, renter.headers)).body.attempts;
    expect(hist[0]).toMatchObject({ provider_id: provider.id, status: "requeued", end_reason: "admin_requeued", fault: "platform", cost_halala: 0 });
    expect((await api.get(`/api/jobs/${job}`, renter.headers)).body).toMatchObject({ status: "queued", attempt: 2 });
    expect(await balance(renter.key)).toMatchObject({ balance_halala: 10_000 });
  });

  it("hands back the attempts of a provider whose daemon pinned another task key as provider_interrupted", async () => {
    const renter = await makeRenter(srv, 10_000);
    const provider = await makeProvider(srv);
    const job = (await submit(renter.headers)).body.job.job_id;
    expect((await pickUp(api, provider.key))?.job_id).toBe(job);
    await recordTaskKeyCheck(srv.sql, provider.id, "test: the daemon pinned another key");
    const hist = (await api.get(`/api/jobs/${job}/history`, renter.headers)).body.attempts;
    expect(hist[0]).toMatchObject({ status: "requeued", end_reason: "provider_interrupted", fault: "provider" });
  });

  it("suspends a provider and takes its jobs off it in one transaction: never suspended with jobs still on it", async () => {
    const renter = await makeRenter(srv, 100_000);
    const provider = await makeProvider(srv);
    await srv.sql`UPDATE providers SET gpu_count = 2, approved_gpu_count = 2 WHERE id = ${provider.id}`;
    const first = (await submit(renter.headers)).body.job.job_id;
    const second = (await submit(renter.headers)).body.job.job_id;
    for (let i = 0; i < 2; i++) await pickUp(api, provider.key);
    // Hold one of its jobs, as a result being settled would.
    let release!: () => void;
    const held = new Promise<void>((r) => (release = r));
    let locked!: () => void;
    const isLocked = new Promise<void>((r) => (locked = r));
    const holder = srv.sql.begin(async (tx) => {
      await tx`SELECT 1 FROM jobs WHERE job_id = ${first} FOR UPDATE`;
      locked();
      await held;
    });
    await isLocked;
    const suspending = api.post(`/api/admin/providers/${provider.id}/suspend`, { reason: "fraud" }, ADMIN);
    // While its jobs cannot be taken off, the suspension does not commit: no moment shows the provider
    // suspended with jobs it could still report on.
    await new Promise((r) => setTimeout(r, 500));
    const [mid] = await srv.sql`SELECT status FROM providers WHERE id = ${provider.id}`;
    expect(mid.status).not.toBe("suspended");
    release();
    await holder;
    expect((await suspending).status).toBe(200);
    const [after] = await srv.sql`SELECT status FROM providers WHERE id = ${provider.id}`;
    expect(after.status).toBe("suspended");
    for (const id of [first, second]) expect((await api.get(`/api/jobs/${id}`, renter.headers)).body).toMatchObject({ status: "queued", attempt: 2 });
    const refused = await api.post("/api/providers/job-result", { api_key: provider.key, job_id: second, success: true, result: {} });
    expect(refused.status).toBe(403);
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("moves money once when a re-queue and a result race", async () => {
    const renter = await makeRenter(srv, 100_000);
    const provider = await makeProvider(srv);
    await srv.sql`UPDATE providers SET gpu_count = 30, approved_gpu_count = 30 WHERE id = ${provider.id}`;
    const ids: string[] = [];
    for (let i = 0; i < 24; i++) ids.push((await submit(renter.headers)).body.job.job_id);
    for (let i = 0; i < 24; i++) await pickUp(api, provider.key);
    await silence(provider.id);
    const [, , results] = await Promise.all([
      requeueJobsOfProvider(srv.sql, provider.id, "silent", "test: provider went silent"),
      sweepJobs(srv.sql),
      Promise.all(ids.map((id) => api.post("/api/providers/job-result", { api_key: provider.key, job_id: id, success: true, result: {} }))),
    ]);
    const rows = await srv.sql<{ job_id: string; status: string }[]>`SELECT job_id, status FROM jobs WHERE job_id IN ${srv.sql(ids)}`;
    let spent = 0;
    let held = 0;
    for (const [i, id] of ids.entries()) {
      const row = rows.find((r) => r.job_id === id)!;
      if (row.status === "completed") {
        expect(results[i].status).toBe(200);
        spent += 10;
      } else {
        // Back in the queue (no other provider is online) with its hold intact for the next attempt.
        expect(row.status).toBe("queued");
        expect(results[i].status).toBe(403);
        held += 100;
      }
    }
    expect(await balance(renter.key)).toMatchObject({ held_halala: held, balance_halala: 100_000 - spent, total_spent_halala: spent });
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });
});
