// The plan PostgreSQL gives a statement as a prepared statement's generic plan
// (what postgres.js runs after a few executions): its parameters unknown.
import type { Sql } from "../../src/db/index.js";

/** EXPLAIN of `query` (a postgres.js fragment) under plan_cache_mode = force_generic_plan. */
export async function genericPlanOf(sql: Sql, query: { describe(): Promise<unknown> }): Promise<string> {
  const { string, types } = (await query.describe()) as { string: string; types: number[] };
  return sql.begin(async (tx) => {
    await tx`SET LOCAL plan_cache_mode = force_generic_plan`;
    await tx.unsafe(`PREPARE generic_plan AS ${string}`);
    const rows = await tx.unsafe(`EXPLAIN EXECUTE generic_plan(${types.map(() => "NULL").join(", ")})`);
    await tx.unsafe("DEALLOCATE generic_plan");
    return rows.map((r) => r["QUERY PLAN"]).join("\n");
  });
}
