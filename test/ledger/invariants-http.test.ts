// The money invariants again, this time entirely over the public HTTP API:
// top-ups (direct, with Idempotency-Key retries, and sandbox payments), job
// submits (with Idempotency-Key retries), daemon results (success, failure,
// retried), renter cancels, and races of all three on one job, from many
// concurrent clients. Afterwards every renter's books must match the jobs'
// final figures exactly.
import crypto from "node:crypto";
import fc from "fast-check";
import { beforeAll, describe, expect, it } from "vitest";
import { accountBalance, accountId, ledgerProblems } from "../../src/domain/money/ledger.js";
import { useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";

const RENTERS = 4;
const PROVIDERS = 6;
const CONCURRENCY = 10;

let providers: { id: number; key: string }[];
let admin: Record<string, string>;

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000", ...(process.env.INV_LOG ? { LOG_LEVEL: "error" } : {}) });
const api = client(srv);
beforeAll(async () => {
  admin = { "x-admin-token": srv.config.adminToken };
  providers = await Promise.all(Array.from({ length: PROVIDERS }, () => makeProvider(srv)));
});

type Action = "success" | "fail" | "cancel" | "success-retry" | "race";

const taskArb = fc.oneof(
  {
    weight: 2,
    arbitrary: fc.record({
      kind: fc.constant("topup" as const),
      renter: fc.nat(RENTERS - 1),
      amount: fc.integer({ min: 1, max: 2000 }),
      keyed: fc.boolean(),
      copies: fc.integer({ min: 1, max: 3 }),
      viaPayment: fc.boolean(),
    }),
  },
  {
    weight: 3,
    arbitrary: fc.record({
      kind: fc.constant("job" as const),
      renter: fc.nat(RENTERS - 1),
      minutes: fc.integer({ min: 1, max: 50 }).map((x) => x / 10),
      keyedCopies: fc.integer({ min: 0, max: 3 }),
      actions: fc.array(fc.constantFrom<Action>("success", "fail", "cancel", "success-retry", "race"), { maxLength: 3 }),
    }),
  },
);

async function pool<T>(items: T[], limit: number, run: (item: T) => Promise<void>) {
  let next = 0;
  await Promise.all(
    Array.from({ length: limit }, async () => {
      while (next < items.length) await run(items[next++]);
    }),
  );
}

describe("ledger invariants over the HTTP API", () => {
  it("top-ups, submits, results, failures, cancels and their retries keep every renter's books exact", async () => {
    const seed = process.env.FC_SEED ? Number(process.env.FC_SEED) : undefined;
    await fc.assert(
      fc.asyncProperty(fc.array(taskArb, { minLength: 15, maxLength: 45 }), async (tasks) => {
        const run = crypto.randomBytes(3).toString("hex");
        const renters = await Promise.all(Array.from({ length: RENTERS }, () => makeRenter(srv)));
        const providerKey = new Map(providers.map((p) => [p.id, p.key]));
        const platform = await accountId(srv.sql, "platform_fees");
        const feesBefore = await accountBalance(srv.sql, platform);
        const earningsBefore = await Promise.all(providers.map(async (p) => accountBalance(srv.sql, await accountId(srv.sql, "provider_earnings", p.id))));

        // Most renters start funded, so most submits get through; one starts empty so 402s happen too.
        const credited = new Array(RENTERS).fill(0);
        for (let i = 1; i < RENTERS; i++) {
          expect((await api.post("/api/renters/topup", { amount_halala: 1500 }, renters[i].headers)).status).toBe(200);
          credited[i] = 1500;
        }
        const jobs: { renter: number; jobId: string }[] = [];
        const resultFigures = new Map<string, Set<string>>();
        const problems: string[] = [];
        const expectStatus = (what: string, r: { status: number; text: string }, ok: number[]) => {
          if (!ok.includes(r.status)) problems.push(`${what} answered ${r.status}: ${r.text}`);
        };

        await pool(tasks, CONCURRENCY, async (t) => {
          const r = renters[t.renter];
          if (t.kind === "topup") {
            if (t.viaPayment) {
              const init = await api.post("/api/payments/topup", { amount_halala: t.amount, source_type: "sandbox" }, r.headers);
              expectStatus("payment topup", init, [201]);
              await Promise.all(Array.from({ length: t.copies }, () => api.post(init.body.checkout_url, {}, r.headers)));
            } else {
              const headers = t.keyed ? { ...r.headers, "idempotency-key": `${run}-${crypto.randomUUID()}` } : r.headers;
              const replies = await Promise.all(Array.from({ length: t.keyed ? t.copies : 1 }, () => api.post("/api/renters/topup", { amount_halala: t.amount }, headers)));
              for (const rep of replies) expectStatus("topup", rep, [200]);
            }
            credited[t.renter] += t.amount;
            return;
          }
          const body = { job_type: "benchmark", duration_minutes: t.minutes };
          const headers = t.keyedCopies > 0 ? { ...r.headers, "idempotency-key": `${run}-${crypto.randomUUID()}` } : r.headers;
          const subs = await Promise.all(Array.from({ length: Math.max(1, t.keyedCopies) }, () => api.post("/api/jobs/submit", body, headers)));
          for (const s of subs) expectStatus("submit", s, [201, 402]);
          const ids = new Set(subs.filter((s) => s.status === 201).map((s) => s.body.job.job_id as string));
          if (ids.size > 1) problems.push(`one Idempotency-Key made ${ids.size} jobs`);
          const jobId = [...ids][0];
          if (!jobId) return;
          jobs.push({ renter: t.renter, jobId });

          const result = async (success: boolean) => {
            const job = (await api.get(`/api/jobs/${jobId}`, r.headers)).body;
            const key = job.provider_id ? providerKey.get(job.provider_id) : undefined;
            if (!key) return;
            const res = await api.post("/api/providers/job-result", { api_key: key, job_id: jobId, success, ...(success ? { result: { response: "ok" } } : { error: "boom" }) });
            expectStatus("job-result", res, [200, 403, 409]);
            if (res.status === 200) {
              const f = JSON.stringify(res.body);
              resultFigures.set(`${jobId}:${res.body.status}`, new Set([...(resultFigures.get(`${jobId}:${res.body.status}`) ?? []), f]));
            }
          };
          const cancel = async () => expectStatus("cancel", await api.post(`/api/jobs/${jobId}/cancel`, {}, r.headers), [200, 409]);
          for (const a of t.actions) {
            if (a === "success") await result(true);
            else if (a === "fail") await result(false);
            else if (a === "cancel") await cancel();
            else if (a === "success-retry") await Promise.all([result(true), result(true)]);
            else await Promise.all([result(true), result(false), cancel(), result(true)]);
          }
        });

        for (const [k, figures] of resultFigures) if (figures.size > 1) problems.push(`job-result ${k} answered different figures: ${[...figures].join(" | ")}`);

        // Every job's final state, then each renter's books against it.
        const charged = new Array(RENTERS).fill(0);
        const held = new Array(RENTERS).fill(0);
        let earned = 0;
        let fees = 0;
        for (const j of jobs) {
          const job = (await api.get(`/api/jobs/${j.jobId}`, renters[j.renter].headers)).body;
          if (job.status === "completed") {
            charged[j.renter] += job.actual_cost_halala;
            earned += job.provider_earned_halala;
            fees += job.platform_fee_halala;
            if (job.provider_earned_halala + job.platform_fee_halala !== job.actual_cost_halala) problems.push(`job ${j.jobId}: split does not add up`);
            if (job.actual_cost_halala > job.cost_halala) problems.push(`job ${j.jobId}: charged above its estimate`);
          } else if (["queued", "pending", "running"].includes(job.status)) {
            held[j.renter] += job.cost_halala;
          } else if (job.actual_cost_halala) {
            problems.push(`job ${j.jobId} ${job.status} but charged ${job.actual_cost_halala}`);
          }
        }
        for (let i = 0; i < RENTERS; i++) {
          const b = (await api.get("/api/renters/balance", renters[i].headers)).body;
          if (b.balance_halala !== credited[i] - charged[i]) problems.push(`renter ${i}: balance ${b.balance_halala}, expected ${credited[i]} - ${charged[i]}`);
          if (b.held_halala !== held[i]) problems.push(`renter ${i}: held ${b.held_halala}, active jobs hold ${held[i]}`);
          if (b.available_halala < 0 || b.available_halala !== b.balance_halala - b.held_halala) problems.push(`renter ${i}: available ${b.available_halala}`);
          if (b.total_spent_halala !== charged[i]) problems.push(`renter ${i}: total_spent ${b.total_spent_halala}, charged ${charged[i]}`);
        }
        const feesNow = (await accountBalance(srv.sql, platform)) - feesBefore;
        const earningsNow = (await Promise.all(providers.map(async (p) => accountBalance(srv.sql, await accountId(srv.sql, "provider_earnings", p.id))))).reduce((a, b, i) => a + b - earningsBefore[i], 0);
        if (feesNow !== fees || earningsNow !== earned) problems.push(`ledger fees ${feesNow}/earnings ${earningsNow}, jobs say ${fees}/${earned}`);
        const twice = await srv.sql`
          SELECT job_id, kind FROM ledger_transfers WHERE kind IN ('hold', 'charge_provider', 'charge_platform') AND job_id IS NOT NULL
          GROUP BY job_id, kind HAVING count(*) > 1`;
        if (twice.length > 0) problems.push(`moved twice: ${JSON.stringify(twice)}`);
        problems.push(...(await ledgerProblems(srv.sql)));

        if (process.env.INV_DEBUG) console.log(JSON.stringify({ jobs: jobs.length, charged, held, credited, results: resultFigures.size }));
        // Free the providers for the next run.
        for (const j of jobs) await api.post(`/api/jobs/${j.jobId}/cancel`, {}, admin);
        expect(problems).toEqual([]);
      }),
      { numRuns: Number(process.env.FC_RUNS ?? 4), seed, endOnFailure: true },
    );
  }, 60_000);
});
