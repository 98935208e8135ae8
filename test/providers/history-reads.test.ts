// A provider's own reads (GET /api/providers/me, /status/{key}, /earnings, GET /api/jobs) of a long
// history: what they visit grows with the window they answer, not with the provider's whole history
// (each statement that reads the history run again under EXPLAIN ANALYZE, its rows counted).
import { beforeAll, describe, expect, it } from "vitest";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { client } from "../helpers/http.js";
import { useTestServer } from "../helpers/server.js";
import { workOf } from "./statement-work.js";

const srv = useTestServer({ SVC_LIVENESS_SWEEP_SECONDS: "0", SVC_RETENTION_SWEEP_SECONDS: "0" });
const api = client(srv);

const OLD_JOBS = 3000;
const RECENT_JOBS = 12;
let p: Awaited<ReturnType<typeof makeProvider>>;
let other: Awaited<ReturnType<typeof makeProvider>>;

/** `n` completed jobs of provider `providerId`, each settled (cost 100: 75 earned) `ageDays(i)` days ago, with its attempt, hold and ledger legs. */
async function seedSettled(providerId: number, renterId: number, tag: string, n: number, ageSql: string) {
  await srv.sql.begin(async (tx) => {
    const [acct] = await tx<{ earnings: number; held: number; fees: number }[]>`
      SELECT ledger_account('provider_earnings', ${providerId}::bigint) AS earnings, ledger_account('renter_held', ${renterId}::bigint) AS held,
             ledger_account('platform_fees', NULL) AS fees`;
    await tx.unsafe(`
      WITH j AS (
        INSERT INTO jobs (job_id, renter_id, provider_id, job_type, status, submitted_at, started_at, completed_at, duration_minutes,
                          max_duration_seconds, rate_halala_per_minute, cost_halala, actual_cost_halala, provider_earned_halala, platform_fee_halala)
        SELECT '${tag}-' || i, ${renterId}, ${providerId}, 'training', 'completed', t - interval '5 minutes', t - interval '4 minutes', t, 4, 600, 25, 100, 100, 75, 25
        FROM (SELECT i, now() - (${ageSql}) AS t FROM generate_series(1, ${n}) AS i) s
        RETURNING id, completed_at),
      a AS (
        INSERT INTO job_attempts (job_id, attempt, provider_id, status, assigned_at, started_at, ended_at, end_reason, fault, cost_halala)
        SELECT id, 1, ${providerId}, 'completed', completed_at - interval '5 minutes', completed_at - interval '4 minutes', completed_at, 'completed', 'none', 100 FROM j),
      h AS (
        INSERT INTO ledger_holds (job_id, renter_id, amount, status, provider_id, cost, provider_earned, platform_fee, created_at, closed_at)
        SELECT id, ${renterId}, 100, 'settled', ${providerId}, 100, 75, 25, completed_at - interval '5 minutes', completed_at FROM j)
      INSERT INTO ledger_transfers (debit_account_id, credit_account_id, amount, kind, idempotency_key, job_id, created_at)
      SELECT ${acct.held}, x.credit, x.amount, x.kind, 'settle:job:' || j.id || ':' || x.leg, j.id, j.completed_at
      FROM j CROSS JOIN (VALUES (${acct.earnings}::bigint, 75, 'charge_provider', 'provider'), (${acct.fees}::bigint, 25, 'charge_platform', 'platform')) AS x(credit, amount, kind, leg)`);
    await tx`UPDATE providers SET total_jobs = total_jobs + ${n}, total_earnings_halala = total_earnings_halala + ${75 * n} WHERE id = ${providerId}`;
    await tx`UPDATE ledger_accounts SET balance = balance + ${75 * n} WHERE id = ${acct.earnings}`;
  });
  await srv.sql`ANALYZE`;
}

beforeAll(async () => {
  const r = await makeRenter(srv, 0);
  p = await makeProvider(srv);
  other = await makeProvider(srv);
  // Another provider's long history: none of it is this provider's to read.
  await seedSettled(other.id, r.id, `hist-other-${other.id}`, OLD_JOBS, `(i % 120) * interval '1 day' + interval '1 hour'`);
  await seedSettled(p.id, r.id, `hist-old-${p.id}`, OLD_JOBS, `interval '20 days' + (i % 100) * interval '1 day'`);
  await seedSettled(p.id, r.id, `hist-new-${p.id}`, RECENT_JOBS, `interval '2 days' + i * interval '1 minute'`);
}, 120_000);

describe("a provider's reads of a long history", () => {
  it("answers the provider's own figures", async () => {
    const me = await api.get(`/api/providers/me?key=${p.key}`);
    expect(me.status, me.text).toBe(200);
    expect(me.body.provider).toMatchObject({ total_jobs: OLD_JOBS + RECENT_JOBS, total_earnings_halala: 75 * (OLD_JOBS + RECENT_JOBS), week_earnings_halala: 75 * RECENT_JOBS });
    expect(me.body.recent_jobs).toHaveLength(10);
    expect(new Set(me.body.recent_jobs.map((j: { provider_id: number }) => j.provider_id))).toEqual(new Set([p.id]));
    const st = await api.get(`/api/providers/status/${p.key}`);
    expect(st.body).toMatchObject({ provider_id: p.id, total_jobs: OLD_JOBS + RECENT_JOBS, total_earnings: 75 * (OLD_JOBS + RECENT_JOBS) });
    const e = await api.get("/api/providers/earnings", p.headers);
    expect(e.status, e.text).toBe(200);
    expect(e.body.total_earned_halala).toBe(75 * RECENT_JOBS);
    expect(e.body.days.reduce((s: number, d: { jobs: number }) => s + d.jobs, 0)).toBe(RECENT_JOBS);
  });

  it("a provider with no jobs reads zeros, an empty list and no active job", async () => {
    const fresh = await makeProvider(srv);
    const me = await api.get(`/api/providers/me?key=${fresh.key}`);
    expect(me.status, me.text).toBe(200);
    expect(me.body.recent_jobs).toEqual([]);
    expect(me.body.provider).toMatchObject({ total_jobs: 0, total_earnings_halala: 0, today_earnings_halala: 0, week_earnings_halala: 0, active_job: null });
    const st = await api.get(`/api/providers/status/${fresh.key}`);
    expect(st.body).toMatchObject({ provider_id: fresh.id, total_jobs: 0, total_earnings: 0, uptime_percent: 0 });
    const e = await api.get("/api/providers/earnings?days=3", fresh.headers);
    expect(e.body).toMatchObject({ total_earned_halala: 0 });
    expect(e.body.days.map((d: { jobs: number; earned_halala: number }) => [d.jobs, d.earned_halala])).toEqual([[0, 0], [0, 0], [0, 0]]);
    expect((await api.get("/api/jobs", fresh.headers)).body).toMatchObject({ jobs: [], total: 0 });
  });

  it.each(["jobs", "ledger_transfers", "job_attempts", "ledger_holds"])("reads of %s visit the window's rows, not the history", async (table) => {
    const reads = async () => {
      expect((await api.get(`/api/providers/me?key=${p.key}`)).status).toBe(200);
      expect((await api.get(`/api/providers/status/${p.key}`)).status).toBe(200);
      expect((await api.get("/api/providers/earnings", p.headers)).status).toBe(200);
      expect((await api.get("/api/jobs?limit=20", p.headers)).status).toBe(200);
      expect((await api.get("/api/jobs?limit=20&status=completed", p.headers)).status).toBe(200);
    };
    const work = await workOf(srv, table, reads, true);
    const report = work.statements.map((s) => s.string.replace(/\s+/g, " ").slice(0, 160));
    expect(work.rows, report.join("\n")).toBeLessThan(500);
  });
});
