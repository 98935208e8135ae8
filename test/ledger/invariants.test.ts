// Property test of the money rules: a randomized concurrent workload of
// top-ups over HTTP (direct with Idempotency-Key retries, or sandbox payments
// confirmed several times at once), and job holds, settles
// and releases through the ledger functions inside transactions (with
// retries and settle/release races), run from many connections at once;
// then the books must balance exactly.
//
// fast-check (already a dev dependency) generates the workloads and prints
// the seed of a failing one; FC_SEED=<seed> replays it.
import crypto from "node:crypto";
import fc from "fast-check";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { connect, type Sql } from "../../src/db/index.js";
import { accountBalance, accountId, hold, ledgerProblems, release, renterFunds, settle } from "../../src/domain/money/ledger.js";
import { useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";

const RENTERS = 5;
const PROVIDERS = 3;
const CONCURRENCY = 14;

let sql: Sql;

const srv = useTestServer();
beforeAll(async () => {
  sql = connect(srv.databaseUrl, CONCURRENCY);
});
afterAll(() => sql?.end());

type Step = "settle" | "release" | "settle-retry" | "release-retry" | "race";

const topupArb = fc.record({
  renter: fc.nat(RENTERS - 1),
  amount: fc.integer({ min: 1, max: 3000 }),
  /** Same small number = same Idempotency-Key within a renter (a retry, or a conflicting reuse). */
  key: fc.option(fc.nat(4), { nil: undefined }),
  copies: fc.integer({ min: 1, max: 3 }),
  /** Through the payments flow (sandbox checkout confirmed `copies` times at once) instead of the direct topup. */
  viaPayment: fc.boolean(),
});
const jobArb = fc.record({
  renter: fc.nat(RENTERS - 1),
  provider: fc.nat(PROVIDERS - 1),
  estimate: fc.integer({ min: 1, max: 1500 }),
  costPct: fc.integer({ min: 0, max: 100 }),
  steps: fc.array(fc.constantFrom<Step>("settle", "release", "settle-retry", "release-retry", "race"), { maxLength: 4 }),
});
const workloadArb = fc.record({
  tasks: fc.array(fc.oneof({ arbitrary: topupArb.map((t) => ({ kind: "topup" as const, ...t })), weight: 2 }, { arbitrary: jobArb.map((j) => ({ kind: "job" as const, ...j })), weight: 3 }), {
    minLength: 20,
    maxLength: 70,
  }),
});

/** Runs tasks with at most `limit` in flight. */
async function pool<T>(items: T[], limit: number, run: (item: T) => Promise<void>) {
  let next = 0;
  await Promise.all(
    Array.from({ length: limit }, async () => {
      while (next < items.length) await run(items[next++]);
    }),
  );
}

describe("ledger invariants under a randomized concurrent workload", () => {
  it("balance = top-ups - charges, available >= 0, held = open holds, earnings + fees = charges, no job settled twice, all balances sum to 0", async () => {
    const api = client(srv.url);
    const seed = process.env.FC_SEED ? Number(process.env.FC_SEED) : undefined;
    await fc.assert(
      fc.asyncProperty(workloadArb, async ({ tasks }) => {
        const run = crypto.randomBytes(3).toString("hex");
        const renters = await Promise.all(Array.from({ length: RENTERS }, () => makeRenter(srv)));
        const providers = await Promise.all(Array.from({ length: PROVIDERS }, () => makeProvider(srv)));
        const platform = await accountId(sql, "platform_fees");
        const feesBefore = await accountBalance(sql, platform);

        const credited = new Array(RENTERS).fill(0);
        const charged = new Array(RENTERS).fill(0);
        const openHeld = new Array(RENTERS).fill(0);
        const keyed = new Map<string, { amount: number; body: string }[]>();
        let settledJobs = 0;
        const problems: string[] = [];

        await pool(tasks, CONCURRENCY, async (t) => {
          if (t.kind === "topup") {
            const r = renters[t.renter];
            if (t.viaPayment) {
              const init = await api.post("/api/payments/topup", { amount_halala: t.amount, source_type: "sandbox" }, r.headers);
              if (init.status !== 201) problems.push(`payment topup answered ${init.status}: ${init.text}`);
              const confirms = await Promise.all(Array.from({ length: t.copies }, () => api.post(init.body.checkout_url, {}, r.headers)));
              for (const c of confirms) if (c.status !== 200 || c.body.status !== "paid") problems.push(`sandbox confirm answered ${c.status}: ${c.text}`);
              credited[t.renter] += t.amount;
              return;
            }
            const headers: Record<string, string> = { ...r.headers };
            if (t.key !== undefined) headers["idempotency-key"] = `${run}-${t.key}`;
            const replies = await Promise.all(Array.from({ length: t.key === undefined ? 1 : t.copies }, () => api.post("/api/renters/topup", { amount_halala: t.amount }, headers)));
            for (const rep of replies) {
              if (rep.status === 200) {
                if (t.key === undefined) credited[t.renter] += t.amount;
                else {
                  const k = `${t.renter}:${t.key}`;
                  keyed.set(k, [...(keyed.get(k) ?? []), { amount: rep.body.topped_up_halala, body: rep.text }]);
                }
              } else if (!(rep.status === 409 && t.key !== undefined)) {
                problems.push(`topup answered ${rep.status}: ${rep.text}`);
              }
            }
            return;
          }
          // A job: submit (insert + hold), then its closing steps in order.
          const r = renters[t.renter];
          const p = providers[t.provider];
          const cost = Math.floor((t.estimate * t.costPct) / 100);
          const jobId = await sql.begin(async (tx) => {
            const [j] = await tx<{ id: number }[]>`
              INSERT INTO jobs (job_id, renter_id, job_type, status, duration_minutes, max_duration_seconds, rate_halala_per_minute, cost_halala)
              VALUES (${`job-${run}-${crypto.randomUUID()}`}, ${r.id}, 'training', 'queued', 1, 600, 25, ${t.estimate}) RETURNING id`;
            try {
              await hold(tx, r.id, j.id, t.estimate);
              return j.id;
            } catch (err) {
              if (!/insufficient balance/.test((err as Error).message)) throw err;
              return undefined; // refused at submit: nothing held (the job row is rolled back with the tx)
            }
          });
          if (jobId === undefined) return;
          let closed = 0;
          const doSettle = () => sql.begin((tx) => settle(tx, r.id, p.id, jobId, t.estimate, cost)).then((s) => (s.moved ? 1 : 0));
          const doRelease = () => sql.begin((tx) => release(tx, r.id, jobId, t.estimate)).then((m) => (m ? 1 : 0));
          let settledHere = 0;
          for (const step of t.steps) {
            if (step === "settle" || step === "settle-retry") {
              const n = (await doSettle()) + (step === "settle-retry" ? await doSettle() : 0);
              closed += n;
              settledHere += n;
            } else if (step === "release" || step === "release-retry") {
              closed += (await doRelease()) + (step === "release-retry" ? await doRelease() : 0);
            } else {
              const [a, b, c] = await Promise.all([doSettle(), doRelease(), doSettle()]);
              closed += a + b + c;
              settledHere += a + c;
            }
          }
          if (closed > 1) problems.push(`job ${jobId} closed ${closed} times`);
          if (t.steps.length > 0 && closed !== 1) problems.push(`job ${jobId} was never closed`);
          if (settledHere === 1) {
            charged[t.renter] += cost;
            settledJobs++;
          }
          if (closed === 0) openHeld[t.renter] += t.estimate;
        });

        for (const [k, oks] of keyed) {
          const renter = Number(k.split(":")[0]);
          if (new Set(oks.map((o) => o.body)).size !== 1) problems.push(`key ${k} answered different bodies: ${oks.map((o) => o.body).join(" | ")}`);
          credited[renter] += oks[0].amount;
        }

        // Per renter: balance = top-ups - charges; available >= 0; held = open holds; spent = charges.
        for (let i = 0; i < RENTERS; i++) {
          const f = await renterFunds(sql, renters[i].id);
          if (f.balance !== credited[i] - charged[i]) problems.push(`renter ${i}: balance ${f.balance}, expected ${credited[i]} - ${charged[i]}`);
          if (f.available < 0 || f.held < 0) problems.push(`renter ${i}: negative funds ${JSON.stringify(f)}`);
          if (f.held !== openHeld[i]) problems.push(`renter ${i}: held ${f.held}, open holds ${openHeld[i]}`);
          const [row] = await sql<{ total_spent_halala: number }[]>`SELECT total_spent_halala FROM renters WHERE id = ${renters[i].id}`;
          if (row.total_spent_halala !== charged[i]) problems.push(`renter ${i}: total_spent ${row.total_spent_halala}, charged ${charged[i]}`);
          const topups = await sql<{ n: number }[]>`
            SELECT coalesce(sum(t.amount), 0)::bigint AS n FROM ledger_transfers t
            JOIN ledger_accounts a ON a.id = t.credit_account_id
            WHERE a.kind = 'renter_available' AND a.owner_id = ${renters[i].id} AND t.kind IN ('topup', 'payment')`;
          if (Number(topups[0].n) !== credited[i]) problems.push(`renter ${i}: top-up transfers ${topups[0].n}, credited ${credited[i]}`);
        }
        // Provider earnings + platform fees = charges.
        let earnings = 0;
        for (const p of providers) earnings += await accountBalance(sql, await accountId(sql, "provider_earnings", p.id));
        const fees = (await accountBalance(sql, platform)) - feesBefore;
        const totalCharged = charged.reduce((a, b) => a + b, 0);
        if (earnings + fees !== totalCharged) problems.push(`earnings ${earnings} + fees ${fees} != charges ${totalCharged}`);
        // No job settled twice, in the ledger itself.
        const twice = await sql`
          SELECT job_id, kind, count(*)::int AS n FROM ledger_transfers
          WHERE kind IN ('charge_provider', 'charge_platform', 'hold') AND job_id IS NOT NULL
          GROUP BY job_id, kind HAVING count(*) > 1`;
        if (twice.length > 0) problems.push(`jobs moved twice: ${JSON.stringify(twice)}`);
        const [settledRows] = await sql<{ n: number }[]>`
          SELECT count(*)::int AS n FROM ledger_holds h JOIN jobs j ON j.id = h.job_id WHERE h.status = 'settled' AND j.job_id LIKE ${`job-${run}-%`}`;
        if (settledRows.n !== settledJobs) problems.push(`${settledRows.n} settled holds, ${settledJobs} settlements`);
        problems.push(...(await ledgerProblems(sql)));
        expect(problems).toEqual([]);
      }),
      { numRuns: Number(process.env.FC_RUNS ?? 6), seed, endOnFailure: true },
    );
  }, 60_000);
});
