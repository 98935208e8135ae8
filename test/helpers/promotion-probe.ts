// Run by test/foundation/young-closures.test.ts as its own process, with
// --trace-gc-nvp: each case prints a line before and after its work, so the
// young collections between them (their `promoted=`) belong to that case.
import v8 from "node:v8";
import vm from "node:vm";
import { connect } from "../../src/db/index.js";

v8.setFlagsFromString("--expose-gc");
const gc = vm.runInNewContext("gc") as (options?: { type: "minor" | "major" }) => void;

const sql = connect(process.env.PROBE_DATABASE_URL!, 2);
const STATEMENTS = 200;
/** About 40 KB of rows a statement: 8 MB over a case. */
const rowsOf = (i: number) => sql<{ s: string }[]>`SELECT repeat('x', 2000) || ${i}::text || n AS s FROM generate_series(1, 20) AS n`;

const cases: Record<string, () => Promise<number>> = {
  // The measure itself: rows that a closure written into a property keeps are promoted.
  async control() {
    let last: { rows?: () => unknown } = {};
    let n = 0;
    for (let i = 0; i < STATEMENTS; i++) {
      const rows = await rowsOf(i);
      const holder: { rows?: () => unknown } = {};
      holder.rows = () => rows;
      last = holder;
      n += rows.length;
    }
    return n + (last.rows ? 0 : 1);
  },
  async statements() {
    let n = 0;
    for (let i = 0; i < STATEMENTS; i++) n += (await rowsOf(i)).length;
    return n;
  },
  async transactions() {
    let n = 0;
    for (let i = 0; i < STATEMENTS / 2; i++) {
      const both = await sql.begin(async (tx) => [await tx`SELECT repeat('x', 4000) || n AS s FROM generate_series(1, 20) AS n`, await tx`SELECT 1`]);
      n += both.length;
    }
    return n;
  },
};

await rowsOf(0);
for (const [name, work] of Object.entries(cases)) {
  gc({ type: "major" });
  console.log(`probe ${name} begin`);
  const result = await work();
  // The second young collection moves what survived the first into the old generation.
  gc({ type: "minor" });
  gc({ type: "minor" });
  console.log(`probe ${name} end ${result}`);
}
await sql.end();
