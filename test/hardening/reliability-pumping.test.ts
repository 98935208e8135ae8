// Reliability cannot be bought: a provider that also holds a renter account
// could pin jobs to itself, or submit 1-halala jobs (duration_minutes 0.01,
// whose 75% share rounds to 0), and report each done at once. An attempt
// counts as carried only when its renter was charged at least one minute of
// its rate and is not the provider's own account (same email, any case),
// migration 048. Everything over real HTTP and PostgreSQL.
import { beforeEach, describe, expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { clearMarketplace } from "../helpers/isolation.js";
import { credit, ledgerProblems } from "../../src/domain/money/ledger.js";
import { refreshReputation, reliabilityScore } from "../../src/domain/providers/reputation.js";
import { RATE_HALALA_PER_MINUTE } from "../../src/domain/money/pricing.js";

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0" });
const api = client(srv);
beforeEach(() => clearMarketplace(srv));

type Provider = Awaited<ReturnType<typeof makeProvider>>;
const RATE = RATE_HALALA_PER_MINUTE["llm-inference"];

/** A renter account registered with `email`, funded. */
async function renterWithEmail(email: string, funds: number) {
  const r = await api.post("/api/renters/register", { name: "Renter", email });
  expect(r.status).toBe(201);
  const id: number = r.body.renter_id;
  await srv.sql.begin((tx) => credit(tx, id, funds, `test-fund:${id}`));
  return { id, headers: { "x-renter-key": r.body.api_key as string } };
}

/** A job pinned to `provider`, taken by its legacy daemon, which reports `report` at once; the report's answer. */
async function runJob(renter: { headers: Record<string, string> }, provider: Provider, durationMinutes: number, report: Record<string, unknown>) {
  const submit = await api.post(
    "/api/jobs/submit",
    { job_type: "llm-inference", duration_minutes: durationMinutes, params: { prompt: "hi", max_tokens: 32 }, provider_id: provider.id },
    renter.headers,
  );
  expect(submit.status, submit.text).toBe(201);
  const jobId: string = submit.body.job.job_id;
  expect((await api.get(`/api/providers/${provider.key}/jobs`)).body.job?.job_id).toBe(jobId);
  expect((await api.post(`/api/jobs/${jobId}/progress`, { api_key: provider.key, progress_pct: 0, phase: "starting" })).status).toBe(200);
  const r = await api.post("/api/providers/job-result", { api_key: provider.key, job_id: jobId, ...report });
  expect(r.status, r.text).toBe(200);
  return r.body as { status: string; fault: string; cost_halala: number };
}

/** A job completed at once; what it was charged. */
async function completedJob(renter: { headers: Record<string, string> }, provider: Provider, durationMinutes: number): Promise<number> {
  const done = await runJob(renter, provider, durationMinutes, { success: true, result: { text: "ok" } });
  expect(done).toMatchObject({ status: "completed", fault: "none" });
  return done.cost_halala;
}

/** The provider's carried attempts and faults as its score reads them. */
async function counted(providerId: number) {
  const [c] = await srv.sql<{ carried: number; faults: number }[]>`
    SELECT coalesce(sum(carried), 0)::int AS carried, coalesce(sum(faults), 0)::int AS faults
    FROM provider_attempt_days WHERE provider_id = ${providerId}`;
  return c;
}

/** Its reliability score, recomputed now, beside what the formula gives for `carried` and `faults`. */
async function score(providerId: number, carried: number, faults: number) {
  await refreshReputation(srv.sql, [providerId]);
  const [p] = await srv.sql<{ reliability_score: number; uptime_percent: number; age_days: number }[]>`
    SELECT reliability_score, uptime_percent, extract(epoch FROM now() - first_heartbeat_at) / 86400 AS age_days
    FROM providers WHERE id = ${providerId}`;
  const expected = reliabilityScore({ completedJobs: carried, failedJobs: faults, uptimePercent: Number(p.uptime_percent), ageDays: Number(p.age_days) });
  return { actual: Number(p.reliability_score), expected };
}

async function newProvider() {
  const p = await makeProvider(srv);
  await srv.sql`UPDATE providers SET first_heartbeat_at = now() - interval '1 day' WHERE id = ${p.id}`;
  return p;
}

describe("reliability pumping", () => {
  it("a provider's own jobs, pinned to it and completed, add nothing to its record", async () => {
    const provider = await newProvider();
    const [{ email }] = await srv.sql<{ email: string }[]>`SELECT email FROM providers WHERE id = ${provider.id}`;
    // The same person's renter account: its email differs from the provider's only in case.
    const self = await renterWithEmail(email.toUpperCase(), 10_000);
    const before = await score(provider.id, 0, 0);
    for (let i = 0; i < 3; i++) expect(await completedJob(self, provider, 1)).toBe(RATE); // a full minute's charge
    expect(await counted(provider.id)).toEqual({ carried: 0, faults: 0 });
    const after = await score(provider.id, 0, 0);
    expect(after.actual).toBe(after.expected);
    expect(after.actual).toBeLessThanOrEqual(before.actual);
    // Another renter's job on the same terms counts.
    const other = await makeRenter(srv, 10_000);
    expect(await completedJob(other, provider, 1)).toBe(RATE);
    expect(await counted(provider.id)).toEqual({ carried: 1, faults: 0 });
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("a job charged less than a minute of its rate does not count; one charged a minute does", async () => {
    const provider = await newProvider();
    const renter = await makeRenter(srv, 10_000);
    // duration_minutes 0.01 holds ceil(15 x 0.01) = 1 halala; a renter with nothing more is charged that alone
    // for the instant result (one with more pays the minute: settlement grows the hold first).
    for (let i = 0; i < 3; i++) expect(await completedJob(await makeRenter(srv, 1), provider, 0.01)).toBe(1);
    expect(await counted(provider.id)).toEqual({ carried: 0, faults: 0 });
    const cheap = await score(provider.id, 0, 0);
    expect(cheap.actual).toBe(cheap.expected);
    // A minute's estimate: charged the rate, the minimum, so it counts.
    expect(await completedJob(renter, provider, 1)).toBe(RATE);
    expect(await counted(provider.id)).toEqual({ carried: 1, faults: 0 });
    const paid = await score(provider.id, 1, 0);
    expect(paid.actual).toBe(paid.expected);
    expect(paid.actual).toBeGreaterThan(cheap.actual);
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("an ordinary renter's jobs count when paid, its own failures too; the provider's faults count whatever the job held", async () => {
    const provider = await newProvider();
    const renter = await makeRenter(srv, 10_000);
    expect(await completedJob(renter, provider, 2)).toBe(RATE); // ran well under a minute: one minute billed of the 30 held
    // The renter's fault after it ran: billed the time used, so carried when that is a minute, not when it is 1 halala.
    const renterFault = { success: false, error: "ValueError: bad prompt", fault: "renter" };
    expect(await runJob(renter, provider, 1, renterFault)).toMatchObject({ fault: "renter", cost_halala: RATE });
    expect(await runJob(await makeRenter(srv, 1), provider, 0.01, renterFault)).toMatchObject({ fault: "renter", cost_halala: 1 });
    expect(await counted(provider.id)).toEqual({ carried: 2, faults: 0 });
    // A 1-halala job the provider fails: its fault, docked as before.
    const failed = await runJob(renter, provider, 0.01, { success: false, error: "out of disk", end_reason: "provider_error" });
    expect(failed).toMatchObject({ fault: "provider", cost_halala: 0 });
    expect(await counted(provider.id)).toEqual({ carried: 2, faults: 1 });
    const s = await score(provider.id, 2, 1);
    expect(s.actual).toBe(s.expected);
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });
});
