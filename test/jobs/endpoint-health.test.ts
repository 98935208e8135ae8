// The server's health probe of serving endpoints (src/domain/dispatch/endpoint-health.ts):
// a vllm_serve job's provider is paid by the minute once it reports its
// endpoint, so an endpoint that never serves (every /health a 500, nothing
// listening) must not earn it the run. The probe is driven directly
// (sweepEndpoints, as a 30 s worker would) against real HTTP endpoints; time
// passes by moving the job's timestamps back (elapse), never by sleeping;
// only the worker's own timing of its passes runs in real time, on short periods.
// An endpoint failing every probe for longer than the grace
// (ENDPOINT_FAILING_GRACE_SECONDS) ends the attempt as provider_error, the
// provider's fault: re-queued (or, pinned, failed with the hold back), nothing
// charged; a timeout or a renter's cancel judged on the same record.
import http from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeEach, describe, expect, it } from "vitest";
import { sweepEndpoints } from "../../src/domain/dispatch/endpoint-health.js";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import { refreshReputation } from "../../src/domain/providers/reputation.js";
import { ENDPOINT_FAILING_GRACE_SECONDS, ENDPOINT_PROBE_MAX_SECONDS } from "../../src/domain/shared/job-end.js";
import { chatCompletionsUrl, healthUrl, probeEndpointHealth } from "../../src/domain/shared/serving-endpoint.js";
import { servingEndpoints } from "../../src/http/v1/endpoints.js";
import { createLogger } from "../../src/log.js";
import { endpointHealthWorker } from "../../src/workers/endpoint-health.js";
import { sweepJobs } from "../../src/workers/job-timeouts.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { client } from "../helpers/http.js";
import { useTestServer } from "../helpers/server.js";
import { serveModel } from "../v1/serving.js";
import { clearMarketplace } from "./helpers.js";

const MODEL = "TinyLlama/TinyLlama-1.1B-Chat-v1.0";
const PERIOD = 30;
const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0", SVC_ENDPOINT_PROBE_SECONDS: "0", SVC_JOB_MAX_ATTEMPTS: "3" });
const api = client(srv);

/** A vLLM stand-in: GET /health answers `status` (changeable); it records each probe's Authorization. */
interface Engine {
  url: string;
  status: number;
  probes: (string | undefined)[];
  close(): Promise<void>;
}
const engines: Engine[] = [];
async function engine(status: number): Promise<Engine> {
  const e: Engine = { url: "", status, probes: [], close: async () => {} };
  const server = http.createServer((req, res) => {
    if (req.method === "GET" && req.url === "/health") {
      e.probes.push(req.headers.authorization);
      res.writeHead(e.status).end();
    } else res.writeHead(404).end();
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  e.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  e.close = () => new Promise((r) => server.close(() => r()));
  engines.push(e);
  return e;
}
/** An address where nothing listens: a port that was just closed. */
async function closedPort(): Promise<string> {
  const e = await engine(200);
  await e.close();
  engines.splice(engines.indexOf(e), 1);
  return e.url;
}

afterAll(async () => {
  for (const e of engines) await e.close();
});
beforeEach(async () => {
  await clearMarketplace(srv);
});

type Renter = Awaited<ReturnType<typeof makeRenter>>;
interface Serving {
  jobId: string;
  renter: Renter;
  provider: Awaited<ReturnType<typeof makeProvider>>;
}

/**
 * A renter's vllm_serve job (20 halala a minute, 60 minutes held: 1,200, or `minutes`) on a fresh provider, pinned
 * to it or not, polled by its daemon and its endpoint reported with a key.
 */
async function serving(url: string, opts: { pinned: boolean; minutes?: number }): Promise<Serving> {
  const renter = await makeRenter(srv, 10_000);
  const provider = await makeProvider(srv, { vramMib: 81920, gpuModel: "NVIDIA H100 80GB HBM3" });
  const submit = await api.post(
    "/api/jobs/submit",
    { job_type: "vllm_serve", params: { model: MODEL }, duration_minutes: opts.minutes ?? 60, max_duration_seconds: 3600, ...(opts.pinned ? { provider_id: provider.id } : {}) },
    renter.headers,
  );
  expect(submit.status, submit.text).toBe(201);
  const jobId: string = submit.body.job.job_id;
  expect((await api.get(`/api/providers/${provider.key}/jobs`)).body.job?.job_id).toBe(jobId);
  await report(jobId, provider.key, url);
  return { jobId, renter, provider };
}
async function report(jobId: string, providerKey: string, url: string) {
  const r = await api.post(`/api/jobs/${jobId}/endpoint-ready`, { api_key: providerKey, endpoint_url: url, model: MODEL, endpoint_api_key: "engine-key-1" });
  expect(r.status, r.text).toBe(200);
}

/** As if `seconds` went by for the job: its run, deadline and probe record move back. */
const elapse = (jobId: string, seconds: number) => srv.sql`
  UPDATE jobs SET started_at = started_at - make_interval(secs => ${seconds}), timeout_at = timeout_at - make_interval(secs => ${seconds}),
         endpoint_probed_at = endpoint_probed_at - make_interval(secs => ${seconds}),
         endpoint_healthy_at = endpoint_healthy_at - make_interval(secs => ${seconds}),
         endpoint_failing_since = endpoint_failing_since - make_interval(secs => ${seconds}),
         endpoint_failed_at = endpoint_failed_at - make_interval(secs => ${seconds})
  WHERE job_id = ${jobId}`;
/** One probe period goes by, then the probe's sweep (as the worker's, every PERIOD seconds). */
async function period(jobId: string) {
  await elapse(jobId, PERIOD);
  return sweepEndpoints(srv.sql, { periodSeconds: PERIOD, allowPrivate: true, timeoutMs: 2_000 });
}
const probe = () => sweepEndpoints(srv.sql, { periodSeconds: PERIOD, allowPrivate: true, timeoutMs: 2_000 });

const jobRow = async (jobId: string) => (await srv.sql`SELECT * FROM jobs WHERE job_id = ${jobId}`)[0];
const attempts = (jobId: string) => srv.sql`SELECT a.* FROM job_attempts a JOIN jobs j ON j.id = a.job_id WHERE j.job_id = ${jobId} ORDER BY a.attempt`;
const balance = async (r: Renter) => (await api.get("/api/renters/balance", r.headers)).body;
const earnings = async (providerId: number) => Number((await srv.sql`SELECT total_earnings_halala FROM providers WHERE id = ${providerId}`)[0].total_earnings_halala);
const reliability = async (id: number) => {
  await refreshReputation(srv.sql, [id]);
  return Number((await srv.sql`SELECT reliability_score FROM providers WHERE id = ${id}`)[0].reliability_score);
};
/** Probes one period apart until the grace has passed since the first failure: one per period, and one more. */
const PROBES_TO_END = ENDPOINT_FAILING_GRACE_SECONDS / PERIOD + 1;

describe("a dead endpoint", () => {
  it("answering every health check with 500: the attempt ends as the provider's failure at the grace, re-queued, nothing charged or earned", async () => {
    const dead = await engine(500);
    const s = await serving(dead.url, { pinned: false });
    await srv.sql`UPDATE providers SET first_heartbeat_at = now() - interval '40 days' WHERE id = ${s.provider.id}`;
    const before = await reliability(s.provider.id);
    expect(await probe()).toMatchObject({ probed: 1, failing: 1 });
    for (let i = 1; i < PROBES_TO_END - 1; i++) {
      expect(await period(s.jobId)).toMatchObject({ probed: 1, failing: 1, requeued: 0 });
      expect(await jobRow(s.jobId)).toMatchObject({ status: "running", attempt: 1 });
    }
    const job = await jobRow(s.jobId);
    expect(job.endpoint_failing_since).not.toBeNull();
    expect(job.endpoint_healthy_at).toBeNull();
    // The probe that finds it failing for the whole grace ends the attempt.
    expect(await period(s.jobId)).toMatchObject({ probed: 1, requeued: 1 });
    expect(dead.probes.length).toBe(PROBES_TO_END);
    expect(dead.probes.every((a) => a === "Bearer engine-key-1")).toBe(true);
    // Back in the queue (this provider is not offered it again), its probe record cleared with the attempt.
    expect(await jobRow(s.jobId)).toMatchObject({ status: "queued", attempt: 2, provider_id: null, endpoint_url: null, endpoint_failing_since: null, endpoint_probed_at: null });
    const [first] = await attempts(s.jobId);
    expect(first).toMatchObject({ status: "requeued", end_reason: "provider_error", fault: "provider", cost_halala: 0 });
    expect(first.error).toMatch(/endpoint failed every health check for 18\d s .*the last check: GET \/health answered HTTP 500/);
    // The renter paid nothing: the hold waits for the next attempt. The provider earned nothing and was docked.
    expect(await balance(s.renter)).toMatchObject({ balance_halala: 10_000, held_halala: 1_200, total_spent_halala: 0 });
    expect(await earnings(s.provider.id)).toBe(0);
    expect(await reliability(s.provider.id)).toBeLessThan(before);
    // Nothing more is probed.
    expect(await period(s.jobId)).toMatchObject({ probed: 0 });
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("with nothing listening, pinned to its provider: failed at the grace with the whole hold back", async () => {
    const s = await serving(await closedPort(), { pinned: true });
    expect(await probe()).toMatchObject({ probed: 1, failing: 1 });
    for (let i = 1; i < PROBES_TO_END - 1; i++) expect(await period(s.jobId)).toMatchObject({ failing: 1 });
    expect(await period(s.jobId)).toMatchObject({ probed: 1, failed: 1 });
    const job = await jobRow(s.jobId);
    expect(job).toMatchObject({ status: "failed", end_reason: "provider_error", fault: "provider", actual_cost_halala: 0, provider_earned_halala: 0 });
    expect(job.error).toMatch(/endpoint failed every health check .*the last check: GET \/health failed: ECONNREFUSED.*asked for this provider/);
    expect(await balance(s.renter)).toMatchObject({ balance_halala: 10_000, held_halala: 0, total_spent_halala: 0 });
    expect(await earnings(s.provider.id)).toBe(0);
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });
});

it("a healthy endpoint keeps running, and its owner pays for the time it served as before", async () => {
  const ok = await engine(200);
  const s = await serving(ok.url, { pinned: true });
  expect(await probe()).toMatchObject({ probed: 1, healthy: 1 });
  for (let i = 0; i < 20; i++) expect(await period(s.jobId)).toMatchObject({ probed: 1, healthy: 1 }); // ten minutes
  const job = await jobRow(s.jobId);
  expect(job).toMatchObject({ status: "running", attempt: 1, endpoint_failing_since: null, endpoint_failed_at: null });
  expect(job.endpoint_healthy_at).not.toBeNull();
  expect(ok.probes.length).toBe(21);
  // Not probed again within the period.
  expect(await probe()).toMatchObject({ probed: 0 });
  const cancel = await api.post(`/api/jobs/${s.jobId}/cancel`, {}, s.renter.headers);
  expect(cancel.status, cancel.text).toBe(200);
  const ended = await jobRow(s.jobId);
  // 600-odd seconds: 11 billable minutes at 20 halala, 75% to the provider.
  expect(ended).toMatchObject({ status: "cancelled", end_reason: "renter_cancelled", fault: "renter", actual_cost_halala: 220, provider_earned_halala: 165 });
  expect(await earnings(s.provider.id)).toBe(165);
  expect(await balance(s.renter)).toMatchObject({ balance_halala: 9_780, held_halala: 0, total_spent_halala: 220 });
  expect(await ledgerProblems(srv.sql)).toEqual([]);
});

it("an engine restarted and healthy after a report clears the failing clock", async () => {
  const e = await engine(500);
  const s = await serving(e.url, { pinned: true });
  await probe();
  for (let i = 1; i < PROBES_TO_END - 2; i++) await period(s.jobId);
  e.status = 200;
  await report(s.jobId, s.provider.key, e.url);
  expect(await probe()).toMatchObject({ healthy: 1 });
  expect(await jobRow(s.jobId)).toMatchObject({ status: "running", endpoint_failing_since: null, endpoint_failed_at: null });
});

it("a flapping endpoint that recovers within the grace is not ended: each healthy answer starts the clock again", async () => {
  const flaky = await engine(500);
  const s = await serving(flaky.url, { pinned: true });
  // Twenty minutes: six failed probes in a row (150 s, short of the grace), then a healthy one, over and over.
  await probe();
  for (let i = 1; i < 40; i++) {
    flaky.status = i % 7 === 6 ? 200 : 503;
    const r = await period(s.jobId);
    expect(r).toMatchObject({ probed: 1, requeued: 0, failed: 0 });
    if (flaky.status === 200) expect((await jobRow(s.jobId)).endpoint_failing_since).toBeNull();
  }
  expect(await jobRow(s.jobId)).toMatchObject({ status: "running", attempt: 1 });
  expect(flaky.probes.length).toBe(40);
  await api.post(`/api/jobs/${s.jobId}/cancel`, {}, s.renter.headers);
  expect(await jobRow(s.jobId)).toMatchObject({ status: "cancelled", end_reason: "renter_cancelled", fault: "renter" });
  expect(await earnings(s.provider.id)).toBeGreaterThan(0);
  expect(await ledgerProblems(srv.sql)).toEqual([]);
});

it("the gateway tries an endpoint the probe finds failing after the others, and as before once it answers again", async () => {
  const flaky = await engine(500);
  const s = await serving(flaky.url, { pinned: true });
  const id = Number((await jobRow(s.jobId)).id);
  const failing = async () => (await servingEndpoints(srv.sql, { model: MODEL })).find((u) => u.jobId === id)?.failing;
  expect(await failing()).toBeUndefined();
  await probe();
  expect(await failing()).toBe(true);
  flaky.status = 200;
  await period(s.jobId);
  expect(await failing()).toBeUndefined();
});

it("an endpoint reported again is probed at once; its failing clock runs on until a healthy answer (reporting again excuses nothing)", async () => {
  const dead = await engine(500);
  const s = await serving(dead.url, { pinned: true });
  await probe();
  for (let i = 1; i < PROBES_TO_END - 2; i++) await period(s.jobId); // failing for 120 s
  const before = await jobRow(s.jobId);
  // The daemon reports the endpoint again (a restarted engine, or a provider hoping to reset the clock).
  await report(s.jobId, s.provider.key, dead.url);
  const after = await jobRow(s.jobId);
  expect(after).toMatchObject({ status: "running", endpoint_probed_at: null });
  expect(after.endpoint_failing_since).toEqual(before.endpoint_failing_since);
  // Probed at once (not a period later), still failing: the clock runs on from the first failure.
  expect(await probe()).toMatchObject({ failing: 1 });
  expect(await period(s.jobId)).toMatchObject({ failing: 1 });
  expect(await period(s.jobId)).toMatchObject({ failed: 1 });
  expect(await jobRow(s.jobId)).toMatchObject({ status: "failed", end_reason: "provider_error", fault: "provider", actual_cost_halala: 0 });
  expect(await ledgerProblems(srv.sql)).toEqual([]);
});

it("failures further apart than the probe's gap do not make one failure: no probe, no proof", async () => {
  const dead = await engine(500);
  const s = await serving(dead.url, { pinned: true });
  await probe();
  // Five minutes with no probe taken (no process probing), then failing again: a new run begins.
  await elapse(s.jobId, 300);
  expect(await probe()).toMatchObject({ failing: 1 });
  const job = await jobRow(s.jobId);
  expect(new Date(job.endpoint_failing_since).getTime()).toBe(new Date(job.endpoint_failed_at).getTime());
  expect(job.status).toBe("running");
});

it("more serving jobs than one claim takes: every one is probed each period, so a dead endpoint still ends at the grace", async () => {
  // One claim takes a single job here (as 500 of many more would): a pass claims again until none is due.
  const sweep = () => sweepEndpoints(srv.sql, { periodSeconds: PERIOD, allowPrivate: true, timeoutMs: 2_000, batch: 1 });
  const ok = await engine(200);
  const healthy = await serving(ok.url, { pinned: true });
  const dead: Serving[] = [];
  for (let i = 0; i < 4; i++) dead.push(await serving((await engine(500)).url, { pinned: true }));
  const all = [healthy, ...dead];
  expect(await sweep()).toMatchObject({ probed: 5, healthy: 1, failing: 4 });
  for (let i = 1; i < PROBES_TO_END - 1; i++) {
    for (const j of all) await elapse(j.jobId, PERIOD);
    expect(await sweep()).toMatchObject({ probed: 5, healthy: 1, failing: 4, failed: 0 });
  }
  for (const j of all) await elapse(j.jobId, PERIOD);
  expect(await sweep()).toMatchObject({ probed: 5, healthy: 1, failed: 4 });
  for (const j of dead) expect(await jobRow(j.jobId)).toMatchObject({ status: "failed", end_reason: "provider_error", fault: "provider", actual_cost_halala: 0 });
  expect(await jobRow(healthy.jobId)).toMatchObject({ status: "running" });
  expect(ok.probes.length).toBe(PROBES_TO_END);
  expect(await ledgerProblems(srv.sql)).toEqual([]);
});

it("every endpoint failing at once (of three providers or more) is taken for the platform's outage: nobody is blamed; one healthy among them and the dead ones end", async () => {
  const dead = await Promise.all([engine(503), engine(503), engine(503)]);
  const jobs: Serving[] = [];
  for (const e of dead) jobs.push(await serving(e.url, { pinned: false }));
  const everyPeriod = async () => {
    for (const j of jobs) await elapse(j.jobId, PERIOD);
    return probe();
  };
  for (let i = 0; i < PROBES_TO_END + 2; i++) expect((await everyPeriod()).outage).toBe(true);
  for (const j of jobs) expect(await jobRow(j.jobId)).toMatchObject({ status: "running", endpoint_failing_since: null });
  // One endpoint answers: the others' failures are theirs.
  dead[0].status = 200;
  const swept: Awaited<ReturnType<typeof probe>>[] = [];
  for (let i = 0; i < PROBES_TO_END; i++) swept.push(await everyPeriod());
  expect(swept.every((s) => !s.outage)).toBe(true);
  expect((await jobRow(jobs[0].jobId)).status).toBe("running");
  for (const j of jobs.slice(1)) expect((await attempts(j.jobId))[0]).toMatchObject({ status: "requeued", end_reason: "provider_error", fault: "provider" });
  expect(await ledgerProblems(srv.sql)).toEqual([]);
});

it("one provider's dead endpoints, however many, are not taken for the platform's outage", async () => {
  const dead = await Promise.all([engine(503), engine(503), engine(503)]);
  const jobs: Serving[] = [];
  for (const e of dead) jobs.push(await serving(e.url, { pinned: true }));
  // All three on one provider (its GPUs), as a provider running three dead engines would have them.
  await srv.sql`UPDATE jobs SET provider_id = ${jobs[0].provider.id} WHERE job_id = ANY(${jobs.map((j) => j.jobId)})`;
  await srv.sql`UPDATE job_attempts SET provider_id = ${jobs[0].provider.id} WHERE job_id IN (SELECT id FROM jobs WHERE job_id = ANY(${jobs.map((j) => j.jobId)}))`;
  for (let i = 0; i < PROBES_TO_END; i++) {
    for (const j of jobs) await elapse(j.jobId, PERIOD);
    expect((await probe()).outage).toBe(false);
  }
  for (const j of jobs) expect(await jobRow(j.jobId)).toMatchObject({ status: "failed", end_reason: "provider_error" });
  expect(await ledgerProblems(srv.sql)).toEqual([]);
});

describe("a job's end judged on the probe's record: a timeout, a renter's cancel, a daemon's report, a stop for funds", () => {
  /** The record the probe leaves between two probes: failing since `since` s ago, the latest failure `last` s ago. */
  const failing = (jobId: string, since: number, last: number) => srv.sql`
    UPDATE jobs SET endpoint_failing_since = now() - make_interval(secs => ${since}),
           endpoint_failed_at = now() - make_interval(secs => ${last}), endpoint_probed_at = now() - make_interval(secs => ${last})
    WHERE job_id = ${jobId}`;

  it("cancelled after failing longer than the grace: the provider's failure, the whole hold back, not re-queued", async () => {
    const s = await serving(await closedPort(), { pinned: false });
    await elapse(s.jobId, 600);
    await failing(s.jobId, ENDPOINT_FAILING_GRACE_SECONDS + 20, 25);
    const r = await api.post(`/api/jobs/${s.jobId}/cancel`, {}, s.renter.headers);
    expect(r.status, r.text).toBe(200);
    const job = await jobRow(s.jobId);
    expect(job).toMatchObject({ status: "cancelled", end_reason: "provider_error", fault: "provider", actual_cost_halala: 0, provider_earned_halala: 0 });
    expect(job.error).toMatch(/^cancelled by renter; provider \d+ had failed the job: its endpoint failed every health check/);
    expect(await attempts(s.jobId)).toMatchObject([{ status: "cancelled", end_reason: "provider_error", fault: "provider", cost_halala: 0 }]);
    expect(await balance(s.renter)).toMatchObject({ balance_halala: 10_000, held_halala: 0, total_spent_halala: 0 });
    expect(await earnings(s.provider.id)).toBe(0);
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("cancelled while failing for less than the grace, or on a record gone stale: the renter's cancel, billed as before", async () => {
    for (const [since, last] of [
      [ENDPOINT_FAILING_GRACE_SECONDS - 30, 10],
      [400, 300], // the latest failure is five minutes old: nothing proves the time since
    ]) {
      const s = await serving(await closedPort(), { pinned: true });
      await elapse(s.jobId, 600);
      await failing(s.jobId, since, last);
      expect((await api.post(`/api/jobs/${s.jobId}/cancel`, {}, s.renter.headers)).status).toBe(200);
      expect(await jobRow(s.jobId)).toMatchObject({ status: "cancelled", end_reason: "renter_cancelled", fault: "renter", actual_cost_halala: 220 });
    }
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("a success reported after failing longer than the grace: the provider's failure, re-queued at no charge, nothing earned", async () => {
    const s = await serving(await closedPort(), { pinned: false });
    await elapse(s.jobId, 600);
    await failing(s.jobId, ENDPOINT_FAILING_GRACE_SECONDS + 20, 25);
    const r = await api.post("/api/providers/job-result", { api_key: s.provider.key, job_id: s.jobId, success: true, result: { response: "served" } });
    expect(r.status, r.text).toBe(200);
    expect(r.body).toMatchObject({ cost_halala: 0, provider_earned_halala: 0 });
    const [first] = await attempts(s.jobId);
    expect(first).toMatchObject({ status: "requeued", end_reason: "provider_error", fault: "provider", cost_halala: 0 });
    expect(first.error).toMatch(/the report claimed success, but its endpoint failed every health check/);
    expect(await balance(s.renter)).toMatchObject({ balance_halala: 10_000, total_spent_halala: 0 });
    expect(await earnings(s.provider.id)).toBe(0);
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("a failure the daemon puts on the renter, or a stop for funds, after failing longer than the grace: nothing billed or earned", async () => {
    const crashed = await serving(await closedPort(), { pinned: true });
    const broke = await serving(await closedPort(), { pinned: true, minutes: 10 });
    for (const s of [crashed, broke]) {
      await elapse(s.jobId, 600);
      await failing(s.jobId, ENDPOINT_FAILING_GRACE_SECONDS + 20, 25);
    }
    const r = await api.post("/api/providers/job-result", {
      api_key: crashed.provider.key, job_id: crashed.jobId, success: false, error: "your model crashed", fault: "renter", end_reason: "runtime_error",
    });
    expect(r.status, r.text).toBe(200);
    expect(await jobRow(crashed.jobId)).toMatchObject({ status: "failed", end_reason: "runtime_error", actual_cost_halala: 0, provider_earned_halala: 0 });
    // The rest of the renter's balance (10,000 less the 200 held) goes to another job, so the serving job's
    // hold cannot grow: at its 10 paid minutes it is stopped.
    const spend = await api.post("/api/jobs/submit", { job_type: "training", duration_minutes: 392, params: {} }, broke.renter.headers);
    expect(spend.status, spend.text).toBe(201);
    expect((await balance(broke.renter)).available_halala).toBe(0);
    await sweepJobs(srv.sql, { lostJobs: false });
    expect(await jobRow(broke.jobId)).toMatchObject({ status: "failed", end_reason: "out_of_funds", actual_cost_halala: 0, provider_earned_halala: 0 });
    for (const s of [crashed, broke]) expect(await earnings(s.provider.id)).toBe(0);
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("timed out after failing longer than the grace: the provider's failure, re-queued at no charge; a healthy one times out as the renter's", async () => {
    const dead = await serving(await closedPort(), { pinned: false });
    const ok = await serving((await engine(200)).url, { pinned: true });
    for (const s of [dead, ok]) await elapse(s.jobId, 3_700);
    await failing(dead.jobId, ENDPOINT_FAILING_GRACE_SECONDS + 20, 25);
    await srv.sql`UPDATE jobs SET endpoint_healthy_at = now() - interval '20 seconds', endpoint_probed_at = now() - interval '20 seconds' WHERE job_id = ${ok.jobId}`;
    const r = await sweepJobs(srv.sql, { lostJobs: false });
    expect(r).toMatchObject({ timedOut: 1, requeued: 1 });
    // Re-queued (and maybe handed at once to the other provider, freed by its own timeout): never to this one again.
    expect(await jobRow(dead.jobId)).toMatchObject({ attempt: 2 });
    expect((await jobRow(dead.jobId)).provider_id).not.toBe(dead.provider.id);
    const [first] = await attempts(dead.jobId);
    expect(first).toMatchObject({ status: "requeued", end_reason: "provider_error", fault: "provider", cost_halala: 0 });
    expect(first.error).toMatch(/max_duration_seconds \(3600 s\) ran out, and its endpoint failed every health check/);
    expect(await balance(dead.renter)).toMatchObject({ balance_halala: 10_000, total_spent_halala: 0 });
    expect(await earnings(dead.provider.id)).toBe(0);
    expect(await jobRow(ok.jobId)).toMatchObject({ status: "failed", end_reason: "timeout", fault: "renter" });
    expect(await earnings(ok.provider.id)).toBeGreaterThan(0);
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });
});

describe("the probe's request", () => {
  it("goes to the engine's /health at the server root of whatever form of URL was reported, as the gateway's chat route", () => {
    for (const reported of ["http://h:8000", "http://h:8000/", "http://h:8000/v1", "http://h:8000/v1/", "http://h:8000/v1/chat/completions"]) {
      expect(healthUrl(reported)).toBe("http://h:8000/health");
      expect(chatCompletionsUrl(reported)).toBe("http://h:8000/v1/chat/completions");
    }
    expect(healthUrl("https://gw.example/p/42/v1")).toBe("https://gw.example/p/42/health");
  });

  it("follows the gateway's address rules: a private address is refused without connecting unless private upstreams are allowed", async () => {
    const ok = await engine(200);
    expect(await probeEndpointHealth(ok.url, { allowPrivate: false, timeoutMs: 2_000 })).toEqual({ healthy: false, error: "endpoint host 127.0.0.1 is a private address" });
    expect(await probeEndpointHealth(`http://localhost:${new URL(ok.url).port}`, { allowPrivate: false, timeoutMs: 2_000 })).toMatchObject({
      healthy: false,
      error: expect.stringMatching(/resolves to a private address/),
    });
    expect(ok.probes).toEqual([]);
    expect(await probeEndpointHealth(ok.url, { allowPrivate: true, timeoutMs: 2_000 })).toEqual({ healthy: true });
    expect(ok.probes).toEqual([undefined]);
  });

  it("counts no answer within its time limit as a failure", async () => {
    const server = http.createServer(() => {}); // never answers
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    expect(await probeEndpointHealth(url, { allowPrivate: true, timeoutMs: 200 })).toEqual({ healthy: false, error: "GET /health did not answer within 200 ms" });
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
  });
});

describe("the worker's passes", () => {
  /** An engine whose /health (under any path) answers 200 after `delayMs`: when each probe came, and the most at once. */
  async function slowEngine(delayMs: number) {
    const e = { url: "", arrivals: [] as number[], inFlight: 0, maxInFlight: 0 };
    const server = http.createServer((req, res) => {
      if (req.method !== "GET" || !req.url?.endsWith("/health")) return void res.writeHead(404).end();
      e.arrivals.push(Date.now());
      e.maxInFlight = Math.max(e.maxInFlight, ++e.inFlight);
      setTimeout(() => {
        e.inFlight--;
        res.writeHead(200).end();
      }, delayMs);
    });
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    e.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    const close = () => {
      server.closeAllConnections();
      return new Promise((r) => server.close(r));
    };
    return Object.assign(e, { close });
  }
  const waitFor = async (done: () => boolean, ms: number) => {
    const until = Date.now() + ms;
    while (!done() && Date.now() < until) await new Promise((r) => setTimeout(r, 20));
    expect(done()).toBe(true);
  };
  const log = createLogger("silent");

  it("start a period after the pass before started, not after it ended: a job's probes stay a period apart however long its pass takes", async () => {
    const slow = await slowEngine(1_500);
    await serving(`${slow.url}/v1`, { pinned: true });
    const worker = endpointHealthWorker({ sql: srv.sql, log, periodSeconds: 2, allowPrivate: true });
    worker.start();
    try {
      await waitFor(() => slow.arrivals.length >= 4, 25_000);
    } finally {
      await worker.stop();
      await slow.close();
    }
    // Each pass takes 1.5 s (the probe): a period after a pass ended would put them 3.5 s apart.
    const gaps = slow.arrivals.slice(1).map((t, i) => t - slow.arrivals[i]);
    for (const gap of gaps) expect(gap).toBeLessThan(3_000);
    expect(slow.maxInFlight).toBe(1);
  });

  it("the first pass runs at start: an endpoint that went down while no process probed is found failing at once, not a period later", async () => {
    const e = await engine(200);
    const s = await serving(`${e.url}/v1`, { pinned: true });
    const id = Number((await jobRow(s.jobId)).id);
    const failing = async () => (await servingEndpoints(srv.sql, { model: MODEL })).find((u) => u.jobId === id)?.failing === true;
    expect(await probe()).toMatchObject({ probed: 1, healthy: 1 });
    // The engine stops while no process probes (the server restarting), for longer than a period.
    await e.close();
    engines.splice(engines.indexOf(e), 1);
    await elapse(s.jobId, ENDPOINT_PROBE_MAX_SECONDS);
    expect(await failing()).toBe(false);
    // A process starts with the longest period: its first pass does not wait for it.
    const worker = endpointHealthWorker({ sql: srv.sql, log, periodSeconds: ENDPOINT_PROBE_MAX_SECONDS, allowPrivate: true });
    const started = Date.now();
    worker.start();
    try {
      const until = Date.now() + 10_000;
      while (!(await failing()) && Date.now() < until) await new Promise((r) => setTimeout(r, 50));
      expect(await failing()).toBe(true);
      expect(Date.now() - started).toBeLessThan(10_000);
    } finally {
      await worker.stop();
    }
    const row = await jobRow(s.jobId);
    expect(row.status).toBe("running");
    expect(row.endpoint_failed_at).not.toBeNull();
  });

  it("stop() ends a long pass early: it starts no more probes, records those in flight and gives back the claims it did not probe", async () => {
    const slow = await slowEngine(2_500);
    // Two rounds of probes (32 in flight at once): a pass of 5 s.
    const jobs: Serving[] = [];
    for (let i = 0; i < 64; i += 8) {
      jobs.push(...(await Promise.all(Array.from({ length: 8 }, (_, k) => serving(`${slow.url}/e${i + k}/v1`, { pinned: true })))));
    }
    const worker = endpointHealthWorker({ sql: srv.sql, log, periodSeconds: 1, allowPrivate: true });
    worker.start();
    try {
      await waitFor(() => slow.arrivals.length >= 32, 15_000);
    } finally {
      await worker.stop();
    }
    // Only the first round's probes: the rest were never started, and stop() did not wait for them.
    expect(slow.arrivals.length).toBe(32);
    const ids = jobs.map((j) => j.jobId);
    const rows = await srv.sql<{ endpoint_probed_at: Date | null; endpoint_healthy_at: Date | null }[]>`
      SELECT endpoint_probed_at, endpoint_healthy_at FROM jobs WHERE job_id = ANY(${ids})`;
    expect(rows.filter((r) => r.endpoint_healthy_at !== null).length).toBe(32);
    // The claims not probed were given back as they were (never probed): the next pass probes them at once.
    expect(rows.filter((r) => r.endpoint_probed_at === null).length).toBe(32);
    expect(await sweepEndpoints(srv.sql, { periodSeconds: 30, allowPrivate: true })).toMatchObject({ probed: 32, healthy: 32 });
    expect(slow.arrivals.length).toBe(64);
    await slow.close();
  });
});

describe("the worker", () => {
  const live = useTestServer({ SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0", SVC_ENDPOINT_PROBE_SECONDS: "1" });

  it("probes each running serving job's endpoint every SVC_ENDPOINT_PROBE_SECONDS and records it healthy", async () => {
    const ok = await engine(200);
    const s = await serveModel(live, MODEL, `${ok.url}/v1`, { public: false });
    const until = Date.now() + 10_000;
    let row: Record<string, unknown> | undefined;
    while (Date.now() < until) {
      [row] = await live.sql`SELECT endpoint_healthy_at FROM jobs WHERE job_id = ${s.jobId}`;
      if (row?.endpoint_healthy_at) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    expect(row?.endpoint_healthy_at).not.toBeNull();
    expect(ok.probes.length).toBeGreaterThanOrEqual(1);
  });
});
