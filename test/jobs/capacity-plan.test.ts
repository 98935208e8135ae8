// A submit batch plans its account locks, its capacity check and its ids
// generically, once per connection: PostgreSQL would plan them again on most
// batches (their custom plans always look cheaper), and the capacity check
// cost more to plan than to run. The quota read and the batch's later
// statements keep the connection's own plan_cache_mode, here an operator's
// force_custom_plan set on the database.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { connect, type Sql } from "../../src/db/index.js";
import { capacitySql, prepareSubmit, submitMany } from "../../src/domain/jobs/submit.js";
import { HMAC_SECRET, startTestServer, type TestServer } from "../helpers/server.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { genericPlanOf } from "../helpers/plans.js";

let srv: TestServer;
let sql: Sql;

beforeAll(async () => {
  srv = await startTestServer({ SVC_JOB_SWEEP_MS: "60000" });
  await srv.sql.unsafe(`ALTER DATABASE ${new URL(srv.databaseUrl).pathname.slice(1)} SET plan_cache_mode = force_custom_plan`);
  // One connection, opened after that: the prepared statements below are its own.
  sql = connect(srv.databaseUrl, 1);
});
afterAll(async () => {
  await sql?.end();
  await srv?.close();
});

/** Plans of this connection's prepared statements whose text matches `pattern`. */
const plansOf = async (pattern: string) =>
  sql<{ generic_plans: number; custom_plans: number }[]>`
    SELECT generic_plans::int, custom_plans::int FROM pg_prepared_statements
    WHERE statement LIKE ${pattern} AND statement NOT LIKE '%pg_prepared_statements%'`;

describe("the plans of a submit batch", () => {
  it("are generic for the locks, the capacity check and the ids; the rest keep the connection's setting", async () => {
    const renters = [await makeRenter(srv, 1_000_000), await makeRenter(srv, 1_000_000)];
    const provider = await makeProvider(srv);
    await srv.sql`UPDATE providers SET gpu_count = 64, approved_gpu_count = 64 WHERE id = ${provider.id}`;
    for (let batch = 0; batch < 8; batch++) {
      const { outcomes, mode } = await sql.begin(async (tx) => {
        const intents = [];
        for (const r of renters) intents.push(await prepareSubmit(tx, HMAC_SECRET, r.id, { jobType: "benchmark", durationMinutes: 1, params: { suite: "quick", iterations: 1 } }));
        const outcomes = await submitMany(tx, intents);
        const [{ plan_cache_mode }] = await tx<{ plan_cache_mode: string }[]>`SHOW plan_cache_mode`;
        return { outcomes, mode: plan_cache_mode };
      });
      expect(outcomes.map((o) => o.ok && o.submitted.placement.providerId)).toEqual([provider.id, provider.id]);
      expect(mode).toBe("force_custom_plan");
    }
    const generic = [{ generic_plans: 8, custom_plans: 0 }];
    expect(await plansOf("%FROM ledger_accounts%FOR NO KEY UPDATE%")).toEqual(generic);
    expect(await plansOf("%AS capable%")).toEqual(generic);
    expect(await plansOf("%nextval%generate_series%")).toEqual(generic);
    // The quota read, and the renters' counters after the reset, are planned for each batch as the connection's setting says.
    expect(await plansOf("%renter_daily_jobs%")).toEqual([{ generic_plans: 0, custom_plans: 8 }]);
    expect(await plansOf("UPDATE renters SET total_jobs%")).toEqual([{ generic_plans: 0, custom_plans: 8 }]);
  });

  it("finds a provider through providers_live_idx in a fleet that is mostly offline, under the generic plan", async () => {
    await srv.sql`
      INSERT INTO providers (name, email, gpu_model, os, status, approval_status, last_heartbeat)
      SELECT 'Offline ' || g, 'offline-' || g || '@example.test', 'NVIDIA L4', 'linux', 'offline', 'approved', now() - interval '2 days'
      FROM generate_series(1, 5000) g`;
    await srv.sql`ANALYZE providers`;
    const plan = await genericPlanOf(srv.sql, capacitySql(srv.sql, [{ gpuRequirements: { min_vram_gb: 16 }, requestedProvider: null, jobType: "benchmark" }]));
    expect(plan).toContain("providers_live_idx");
    expect(plan).not.toMatch(/Seq Scan on providers/);
  });
});
