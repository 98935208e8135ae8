// The database pool under steady load: independent statements kept in flight
// on the service's pool (src/db), as concurrent reads of many requests are.
// Each is a primary-key read of a small table. It shows what one statement
// costs the process at the pool, the layer every request goes through.
//
//   npm run bench:pool [-- --in-flight 64 --pool 20 --seconds 8 --rounds 2]
//
// A fresh database on DATABASE_URL (dropped afterwards), otherwise an
// embedded PostgreSQL. The last line is one JSON object: statements per
// second and CPU per statement (this process) in each round.
import { parseArgs } from "node:util";
import { connect } from "../src/db/index.js";
import { benchDatabase, machine, noter } from "./lib.js";

const { values: args } = parseArgs({
  options: {
    "in-flight": { type: "string", default: "64" },
    pool: { type: "string", default: "20" },
    seconds: { type: "string", default: "8" },
    rounds: { type: "string", default: "2" },
  },
});
const IN_FLIGHT = Number(args["in-flight"]);
const POOL = Number(args.pool);
const SECONDS = Number(args.seconds);
const note = noter("bench:pool");

async function main() {
  const db = await benchDatabase("svc_bench_pool", note);
  const sql = connect(db.url, POOL);
  try {
    await sql`CREATE TABLE t (id int PRIMARY KEY, v text)`;
    await sql`INSERT INTO t SELECT g, 'row ' || g FROM generate_series(1, 1000) g`;
    const rounds: { statements_per_s: number; cpu_us_per_statement: number }[] = [];
    for (let r = 0; r < Number(args.rounds); r++) {
      let n = 0;
      const started = performance.now();
      const cpu = process.cpuUsage();
      await Promise.all(
        Array.from({ length: IN_FLIGHT }, async (_, k) => {
          while (performance.now() - started < SECONDS * 1000) {
            await sql`SELECT v FROM t WHERE id = ${1 + ((n + k) % 1000)}`;
            n++;
          }
        }),
      );
      const used = process.cpuUsage(cpu);
      rounds.push({
        statements_per_s: Math.round(n / ((performance.now() - started) / 1000)),
        cpu_us_per_statement: Math.round(((used.user + used.system) / n) * 10) / 10,
      });
      note(`round ${r + 1}: ${JSON.stringify(rounds[r])}`);
    }
    console.log(JSON.stringify({ benchmark: "pool", in_flight: IN_FLIGHT, pool: POOL, seconds: SECONDS, rounds, machine: machine(), database: db.kind }));
  } finally {
    await sql.end();
    await db.close();
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
