// A submit batch's capacity check runs under a generic plan, made once per
// connection: PostgreSQL would plan it again on every batch (its custom
// plans always look cheaper), and planning it cost more than running it. The
// batch's other statements keep the session's own plan_cache_mode, here an
// operator's force_custom_plan set on the database.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { connect, type Sql } from "../../src/db/index.js";
import { migrate } from "../../src/db/migrate.js";
import { capacityOf, capacitySql } from "../../src/domain/jobs/submit.js";
import { genericPlanOf } from "../helpers/plans.js";
import { freshDatabase } from "../helpers/server.js";

let db: Awaited<ReturnType<typeof freshDatabase>>;
let sql: Sql;

beforeAll(async () => {
  db = await freshDatabase();
  const setup = connect(db.url, 1);
  await migrate(setup);
  await setup.unsafe(`ALTER DATABASE ${new URL(db.url).pathname.slice(1)} SET plan_cache_mode = force_custom_plan`);
  await setup.end();
  // One connection: the prepared statements below are the session's own.
  sql = connect(db.url, 1);
});
afterAll(async () => {
  await sql?.end();
  await db?.drop();
});

const plans = () =>
  sql<{ generic_plans: number; custom_plans: number }[]>`
    SELECT generic_plans::int, custom_plans::int FROM pg_prepared_statements
    WHERE statement LIKE '%AS capable%' AND statement NOT LIKE '%pg_prepared_statements%'`;

describe("the capacity check of a submit batch", () => {
  it("is planned generically on every run, and leaves the session's plan_cache_mode to the rest of the batch", async () => {
    const intents = [
      { gpuRequirements: { min_vram_gb: 16 }, requestedProvider: null },
      { gpuRequirements: null, requestedProvider: 12345 },
    ];
    for (let i = 0; i < 8; i++) {
      const { capacity, mode } = await sql.begin(async (tx) => {
        const capacity = await capacityOf(tx, intents as never);
        const [{ plan_cache_mode }] = await tx<{ plan_cache_mode: string }[]>`SHOW plan_cache_mode`;
        return { capacity, mode: plan_cache_mode };
      });
      // No provider at all: the unknown one is not known, and nothing is capable.
      expect(capacity).toEqual([{ ord: 1, known: true, capable: false }, { ord: 2, known: false, capable: false }]);
      expect(mode).toBe("force_custom_plan");
    }
    expect(await plans()).toEqual([{ generic_plans: 8, custom_plans: 0 }]);
  });

  it("finds a provider through providers_live_idx in a fleet that is mostly offline, under that plan", async () => {
    await sql`
      INSERT INTO providers (name, email, gpu_model, os, status, approval_status, last_heartbeat)
      SELECT 'Offline ' || g, 'offline-' || g || '@example.test', 'NVIDIA L4', 'linux', 'offline', 'approved', now() - interval '2 days'
      FROM generate_series(1, 5000) g`;
    await sql`ANALYZE providers`;
    const plan = await genericPlanOf(sql, capacitySql(sql, [{ gpuRequirements: { min_vram_gb: 16 }, requestedProvider: null }]));
    expect(plan).toContain("providers_live_idx");
    expect(plan).not.toMatch(/Seq Scan on providers/);
  });
});
