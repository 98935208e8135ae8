// Many running jobs and every way a job ends, at once: results (success and the renter's failure),
// renter and admin cancels, admin re-queues, hand-backs, a provider suspended, another's jobs taken
// off, and the sweeps (timeouts, hold extensions) running twice. Afterwards no request failed with a
// 5xx, the books balance, each job's recorded figures are its ledger entries, each provider's
// earnings total is its ledger's, and no job is left on the suspended provider.
import { beforeEach, describe, expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import { sweepJobs } from "../../src/workers/job-timeouts.js";
import { requeueJobsOfProvider } from "../../src/domain/dispatch/dispatch.js";
import { admin, clearMarketplace, pickUp } from "../jobs/helpers.js";

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0", SVC_JOB_MAX_ATTEMPTS: "3" });
const api = client(srv);
beforeEach(() => clearMarketplace(srv));

describe("every end of a job at once", () => {
  it("balances, and each job's and provider's figures are their ledger entries", async () => {
    // Each round offsets which end each job gets.
    for (let round = 0; round < 2; round++) {
      await clearMarketplace(srv);
      const renter = await makeRenter(srv, 3_000);
      const providers = await Promise.all([0, 1, 2].map(() => makeProvider(srv)));
      await srv.sql`UPDATE providers SET gpu_count = 10, approved_gpu_count = 10 WHERE id IN ${srv.sql(providers.map((p) => p.id))}`;
      const ids: string[] = [];
      for (let i = 0; i < 18; i++) {
        const r = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 0.5, max_duration_seconds: 600 }, renter.headers);
        expect(r.status, r.text).toBe(201);
        ids.push(r.body.job.job_id);
      }
      for (const p of providers) for (let i = 0; i < 10; i++) if (!(await pickUp(api, p.key))) break;
      // All near the end of their paid time, with little balance left for extensions.
      await srv.sql`UPDATE jobs SET started_at = now() - interval '50 seconds' WHERE job_id IN ${srv.sql(ids)} AND status = 'running'`;
      const rows = await srv.sql<{ job_id: string; provider_id: number | null }[]>`SELECT job_id, provider_id FROM jobs WHERE job_id IN ${srv.sql(ids)}`;
      const keyOf = new Map(providers.map((p) => [p.id, p.key]));
      const A = admin(srv);
      const ops: Promise<unknown>[] = [];
      ops.push(sweepJobs(srv.sql), sweepJobs(srv.sql));
      for (const [i, row] of rows.entries()) {
        const key = row.provider_id ? keyOf.get(row.provider_id)! : providers[0].key;
        const k = (i + round) % 6;
        ops.push(api.post("/api/providers/job-result", { api_key: key, job_id: row.job_id, success: k !== 1, ...(k === 1 ? { fault: "renter" } : {}), result: { ok: 1 } }));
        if (k === 2) ops.push(api.post(`/api/jobs/${row.job_id}/cancel`, {}, renter.headers));
        if (k === 3) ops.push(api.post(`/api/admin/jobs/${row.job_id}/requeue`, {}, A));
        if (k === 4) ops.push(api.post(`/api/admin/jobs/${row.job_id}/cancel`, {}, A));
        if (k === 5) ops.push(api.post("/api/providers/job-reject", { api_key: key, job_id: row.job_id, reason: "busy" }));
      }
      ops.push(api.post(`/api/admin/providers/${providers[1].id}/suspend`, { reason: "x" }, A));
      ops.push(requeueJobsOfProvider(srv.sql, providers[2].id, "admin", "x"));
      ops.push(sweepJobs(srv.sql));
      const settled = await Promise.allSettled(ops);
      const statuses = await Promise.all(settled.map(async (s) => (s.status === "fulfilled" ? ((s.value as { status?: number })?.status ?? "ok") : `rejected ${(s.reason as Error).message}`)));
      const failed = statuses.filter((s) => typeof s === "number" ? s >= 500 : String(s).startsWith("rejected"));
      expect(failed).toEqual([]);
      expect(await ledgerProblems(srv.sql)).toEqual([]);
      // Each job: its recorded figures are its ledger's.
      const mism = await srv.sql`
        SELECT j.job_id, j.status, j.actual_cost_halala, j.provider_earned_halala,
               coalesce(sum(t.amount) FILTER (WHERE t.kind IN ('charge_provider','charge_platform')), 0)::int AS charged,
               coalesce(sum(t.amount) FILTER (WHERE t.kind = 'charge_provider'), 0)::int AS earned
        FROM jobs j LEFT JOIN ledger_transfers t ON t.job_id = j.id
        WHERE j.job_id IN ${srv.sql(ids)}
        GROUP BY j.id
        HAVING coalesce(j.actual_cost_halala, 0) <> coalesce(sum(t.amount) FILTER (WHERE t.kind IN ('charge_provider','charge_platform')), 0)
            OR coalesce(j.provider_earned_halala, 0) <> coalesce(sum(t.amount) FILTER (WHERE t.kind = 'charge_provider'), 0)`;
      expect(mism).toEqual([]);
      const prov = await srv.sql`
        SELECT p.id, p.total_earnings_halala, coalesce((SELECT sum(t.amount) FROM ledger_transfers t JOIN ledger_accounts a ON a.id = t.credit_account_id
                                                         WHERE a.kind = 'provider_earnings' AND a.owner_id = p.id), 0)::bigint AS ledger
        FROM providers p WHERE p.id IN ${srv.sql(providers.map((p) => p.id))}`;
      for (const p of prov) expect(Number(p.total_earnings_halala)).toBe(Number(p.ledger));
      // No job is on a suspended provider.
      const onSuspended = await srv.sql`SELECT j.job_id FROM jobs j JOIN providers p ON p.id = j.provider_id WHERE p.status = 'suspended' AND j.status IN ('pending','running')`;
      expect(onSuspended).toEqual([]);
    }
  }, 120_000);
});
