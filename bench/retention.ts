// The retention sweep (src/domain/providers/retention.ts) on a fleet's worth
// of reputation rows: every provider with the uptime hours and attempt days
// that are kept, plus `--backlog-hours` of expired hours and one expired day.
// Timed: the sweep that clears that backlog, then the steady hourly one (one
// hour of every provider's uptime expired since, no attempt day), then one
// with nothing to delete.
//
//   npm run bench:retention [-- --providers 100000 --backlog-hours 24]
//
// A fresh database on DATABASE_URL (dropped afterwards), otherwise an
// embedded PostgreSQL. The last line is one JSON object.
import { parseArgs } from "node:util";
import { connect } from "../src/db/index.js";
import { migrate } from "../src/db/migrate.js";
import { ATTEMPT_DAYS_KEPT, UPTIME_KEPT_HOURS, deleteExpiredReputationRows } from "../src/domain/providers/retention.js";
import { benchDatabase, machine, noter } from "./lib.js";

const { values: args } = parseArgs({
  options: {
    providers: { type: "string", default: "100000" },
    "backlog-hours": { type: "string", default: "24" },
  },
});
const PROVIDERS = Number(args.providers);
const BACKLOG_HOURS = Number(args["backlog-hours"]);
const note = noter("bench:retention");

async function main() {
  const db = await benchDatabase("svc_bench_retention", note);
  const sql = connect(db.url, 4);
  try {
    await migrate(sql);
    const t0 = performance.now();
    await sql`
      INSERT INTO providers (name, email, gpu_model, os)
      SELECT 'rig ' || g, 'rig' || g || '@example.com', 'RTX 4090', 'linux' FROM generate_series(1, ${PROVIDERS}) g`;
    // Hours from 1 to the oldest kept, then the backlog past it.
    await sql`
      INSERT INTO provider_uptime (provider_id, hour, covered_seconds)
      SELECT p.id, date_trunc('hour', now()) - make_interval(hours => h), 3600
      FROM providers p CROSS JOIN generate_series(1, ${UPTIME_KEPT_HOURS + BACKLOG_HOURS}) h`;
    await sql`
      INSERT INTO provider_attempt_days (provider_id, day, carried, faults)
      SELECT p.id, (now() AT TIME ZONE 'UTC')::date - d, 5, 1
      FROM providers p CROSS JOIN generate_series(0, ${ATTEMPT_DAYS_KEPT}) d`;
    await sql`VACUUM ANALYZE provider_uptime`;
    await sql`VACUUM ANALYZE provider_attempt_days`;
    const [sizes] = await sql<{ uptime_rows: number; day_rows: number }[]>`
      SELECT (SELECT count(*) FROM provider_uptime)::int AS uptime_rows, (SELECT count(*) FROM provider_attempt_days)::int AS day_rows`;
    note(`seeded ${PROVIDERS} providers, ${sizes.uptime_rows} uptime hours, ${sizes.day_rows} attempt days in ${((performance.now() - t0) / 1000).toFixed(1)} s`);

    const timed = async () => {
      const started = performance.now();
      const deleted = await deleteExpiredReputationRows(sql);
      return { ...deleted, seconds: Math.round(performance.now() - started) / 1000 };
    };
    const backlog = await timed();
    note(`backlog: ${JSON.stringify(backlog)}`);
    await sql`VACUUM provider_uptime`;
    // An hour later: every provider's oldest kept hour has expired.
    await sql`
      UPDATE provider_uptime SET hour = hour - interval '1 hour'
      WHERE hour = date_trunc('hour', now()) - make_interval(hours => ${UPTIME_KEPT_HOURS})`;
    await sql`VACUUM ANALYZE provider_uptime`;
    const hourly = await timed();
    note(`hourly: ${JSON.stringify(hourly)}`);
    const idle = await timed();
    note(`nothing to delete: ${JSON.stringify(idle)}`);
    console.log(JSON.stringify({ benchmark: "retention", providers: PROVIDERS, seeded: sizes, backlog, hourly, nothing_to_delete: idle, machine: machine(), database: db.kind }));
  } finally {
    await sql.end();
    await db.close();
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
