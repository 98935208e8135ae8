// GET /api/providers/me answers figures of one moment: a job settling while the dashboard is read is
// in every figure (total earnings, the week's earnings, the job count, recent_jobs, active_job) or in none.
import { describe, expect, it } from "vitest";
import { hold, settle } from "../../src/domain/money/ledger.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { client } from "../helpers/http.js";
import { useTestServer } from "../helpers/server.js";

const srv = useTestServer({ SVC_LIVENESS_SWEEP_SECONDS: "0" });
const api = client(srv);

describe("the provider dashboard under settlements", () => {
  it("each read is one snapshot: earnings, job count, recent and active jobs agree while jobs settle", { timeout: 120_000 }, async () => {
    const r = await makeRenter(srv, 1_000_000);
    const p = await makeProvider(srv);
    const JOBS = 40;
    let settling = true;
    const settler = (async () => {
      try {
        for (let i = 0; i < JOBS; i++) {
          const cost = 40 + i; // 75% of it, rounded down: 30 + ...
          const [j] = await srv.sql<{ id: number }[]>`
            INSERT INTO jobs (job_id, renter_id, provider_id, job_type, status, started_at, duration_minutes, max_duration_seconds, rate_halala_per_minute, cost_halala)
            VALUES (${`me-snapshot-${p.id}-${i}`}, ${r.id}, ${p.id}, 'training', 'running', now(), 1, 600, 25, 100) RETURNING id`;
          await srv.sql.begin((tx) => hold(tx, r.id, j.id, 100));
          await srv.sql.begin(async (tx) => {
            const s = await settle(tx, r.id, p.id, j.id, 100, cost);
            await tx`UPDATE jobs SET status = 'completed', completed_at = now(), actual_cost_halala = ${s.cost},
                       provider_earned_halala = ${s.providerEarned}, platform_fee_halala = ${s.platformFee}
                     WHERE id = ${j.id}`;
          });
        }
      } finally {
        settling = false;
      }
    })();
    const torn: unknown[] = [];
    let reads = 0;
    while (settling) {
      for (const me of await Promise.all(Array.from({ length: 4 }, () => api.get(`/api/providers/me?key=${p.key}`)))) {
        expect(me.status, me.text).toBe(200);
        reads++;
        const d = me.body.provider;
        const recent = me.body.recent_jobs as { job_id: string; status: string; provider_earned_halala: number | null }[];
        const completedRecent = recent.filter((j) => j.status === "completed");
        const problems: string[] = [];
        // Every earning of this provider is from the last minutes: the week's figure is all of it.
        if (d.total_earnings_halala !== d.week_earnings_halala) problems.push("total vs week earnings");
        // While every job of the provider is among recent_jobs (10 at most), they add up to its totals.
        const allListed = recent.length < 10;
        if (allListed && d.total_jobs !== completedRecent.length) problems.push("total_jobs vs recent_jobs");
        if (allListed && d.total_earnings_halala !== completedRecent.reduce((s, j) => s + (j.provider_earned_halala ?? 0), 0))
          problems.push("total earnings vs recent jobs' earnings");
        const running = recent.find((j) => j.status === "running");
        if ((running?.job_id ?? null) !== (d.active_job?.job_id ?? null)) problems.push("active_job vs recent_jobs");
        if (problems.length) torn.push({ problems, d: { ...d, active_job: d.active_job?.job_id }, recent: recent.map((j) => `${j.job_id}:${j.status}`) });
      }
    }
    await settler;
    expect(reads).toBeGreaterThan(0);
    expect(torn.slice(0, 3)).toEqual([]);
    const end = (await api.get(`/api/providers/me?key=${p.key}`)).body;
    // 75% of each charge, rounded down, credited in the ledger and counted on the provider.
    const earned = Array.from({ length: JOBS }, (_, i) => Math.floor(((40 + i) * 75) / 100)).reduce((s, x) => s + x, 0);
    expect(end.provider).toMatchObject({ total_jobs: JOBS, total_earnings_halala: earned, week_earnings_halala: earned, active_job: null });
    const [acct] = await srv.sql<{ balance: string }[]>`SELECT balance FROM ledger_accounts WHERE kind = 'provider_earnings' AND owner_id = ${p.id}`;
    expect(Number(acct.balance)).toBe(earned);
  });
});
