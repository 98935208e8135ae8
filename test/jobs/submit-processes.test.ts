// Group commit across server processes: two servers on one database (each its
// own pool and batcher, as two processes would have) take a burst of submits
// from renters with limited funds. Each renter gets exactly what its funds
// cover, no GPU takes two jobs, and the books balance.
import { afterAll, beforeAll, expect, it } from "vitest";
import { startTestServer, type TestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { ledgerProblems, renterFunds } from "../../src/domain/money/ledger.js";

let a: TestServer;
let b: TestServer;

beforeAll(async () => {
  // The job sweep is slowed down so that only the submits place jobs.
  const env = { SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0" };
  a = await startTestServer(env);
  b = await startTestServer(env, a.databaseUrl);
});
afterAll(async () => {
  await b?.close();
  await a?.close();
});

it("concurrent submits through two servers: each renter gets what its funds cover, one job per GPU, books balanced", async () => {
  const GPUS = [2, 3, 1];
  const providers = await Promise.all(GPUS.map(() => makeProvider(a)));
  for (const [i, p] of providers.entries()) await a.sql`UPDATE providers SET gpu_count = ${GPUS[i]}, approved_gpu_count = ${GPUS[i]} WHERE id = ${p.id}`;
  // benchmark, 3 minutes: 30 halala each. Funds for 7, 4, 0 and 20 jobs; each renter sends 12.
  const funds = [7 * 30 + 29, 4 * 30, 0, 20 * 30];
  const renters = await Promise.all(funds.map((f) => makeRenter(a, f)));
  const sent = renters.flatMap((r, i) => Array.from({ length: 12 }, (_, k) => ({ renter: i, server: (i + k) % 2 === 0 ? a : b })));
  const answers = await Promise.all(
    sent.map(({ renter, server }) =>
      client(server.url).post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 3 }, renters[renter].headers).then((r) => ({ renter, r })),
    ),
  );

  const expected = [7, 4, 0, 12];
  for (const [i, want] of expected.entries()) {
    const mine = answers.filter((x) => x.renter === i);
    expect(mine.filter((x) => x.r.status === 201)).toHaveLength(want);
    for (const x of mine.filter((x) => x.r.status !== 201)) {
      expect(x.r.status).toBe(402);
      expect(x.r.body.error).toMatch(/insufficient balance/);
    }
    const f = await renterFunds(a.sql, renters[i].id);
    expect(f.held).toBe(want * 30);
    expect(f.available).toBe(funds[i] - want * 30);
    const [row] = await a.sql<{ total_jobs: number; n: number }[]>`
      SELECT r.total_jobs, (SELECT count(*)::int FROM jobs WHERE renter_id = r.id) AS n FROM renters r WHERE r.id = ${renters[i].id}`;
    expect(row).toEqual({ total_jobs: want, n: want });
  }

  // Six GPUs: six jobs pending, at most one per GPU, the counter agreeing; the rest queued.
  const accepted = expected.reduce((s, n) => s + n, 0);
  for (const [i, p] of providers.entries()) {
    const [{ n, active }] = await a.sql<{ n: number; active: number }[]>`
      SELECT (SELECT count(*)::int FROM jobs WHERE provider_id = ${p.id} AND status IN ('pending', 'running')) AS n,
             (SELECT active FROM provider_load WHERE provider_id = ${p.id}) AS active`;
    expect(n).toBe(GPUS[i]);
    expect(active).toBe(n);
  }
  const [{ queued }] = await a.sql<{ queued: number }[]>`SELECT count(*)::int AS queued FROM jobs WHERE status = 'queued'`;
  expect(queued).toBe(accepted - 6);
  expect(await ledgerProblems(a.sql)).toEqual([]);
});
