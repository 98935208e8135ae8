// The retention sweep (src/domain/providers/retention.ts) on a fleet's worth
// of reputation rows: every provider with the uptime hours and attempt days
// that are kept, plus `--backlog-hours` of expired hours and one expired day;
// and its deletion of spent login codes (src/domain/accounts/login.ts): a
// backlog of `--login-codes` spent over 90 days, and 1,000 of the last hour.
// Timed: the sweep that clears that backlog, then the steady hourly one (one
// hour of every provider's uptime expired since, no attempt day; the hour's
// login codes spent), then one with nothing to delete.
//
//   npm run bench:retention [-- --providers 100000 --backlog-hours 24 --login-codes 1000000]
//
// A fresh database on DATABASE_URL (dropped afterwards), otherwise an
// embedded PostgreSQL. The last line is one JSON object.
import { parseArgs } from "node:util";
import { connect } from "../src/db/index.js";
import { migrate } from "../src/db/migrate.js";
import { deleteSpentLoginCodes } from "../src/domain/accounts/login.js";
import { ATTEMPT_DAYS_KEPT, UPTIME_KEPT_HOURS, deleteExpiredReputationRows } from "../src/domain/providers/retention.js";
import { benchDatabase, machine, noter } from "./lib.js";

const { values: args } = parseArgs({
  options: {
    providers: { type: "string", default: "100000" },
    "backlog-hours": { type: "string", default: "24" },
    "login-codes": { type: "string", default: "1000000" },
  },
});
const PROVIDERS = Number(args.providers);
const BACKLOG_HOURS = Number(args["backlog-hours"]);
const LOGIN_CODES = Number(args["login-codes"]);
/** Login codes of the last hour, which the sweep keeps. */
const RECENT_CODES = 1_000;
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
    // Codes of every age up to 90 days, each lived its 10 minutes, spread over 100,000 accounts; then the last hour's.
    await sql`
      INSERT INTO login_codes (role, account_id, code_hash, attempts, created_at, sent_at, expires_at, used_at)
      SELECT 'renter', 1 + g % 100000, sha256(g::text::bytea), g % 3, t, t, t + interval '10 minutes', CASE WHEN g % 2 = 0 THEN t + interval '1 minute' END
      FROM generate_series(1, ${LOGIN_CODES}) g, LATERAL (SELECT now() - interval '71 minutes' - (interval '90 days' * g / ${LOGIN_CODES}) AS t) a`;
    await sql`
      INSERT INTO login_codes (role, account_id, code_hash, created_at, sent_at, expires_at)
      SELECT 'renter', 1 + g % 100000, sha256(g::text::bytea), t, t, t + interval '10 minutes'
      FROM generate_series(1, ${RECENT_CODES}) g, LATERAL (SELECT now() - (interval '59 minutes' * g / ${RECENT_CODES}) AS t) a`;
    await sql`VACUUM ANALYZE provider_uptime`;
    await sql`VACUUM ANALYZE provider_attempt_days`;
    await sql`VACUUM ANALYZE login_codes`;
    const [sizes] = await sql<{ uptime_rows: number; day_rows: number; login_codes: number }[]>`
      SELECT (SELECT count(*) FROM provider_uptime)::int AS uptime_rows, (SELECT count(*) FROM provider_attempt_days)::int AS day_rows,
             (SELECT count(*) FROM login_codes)::int AS login_codes`;
    note(`seeded ${PROVIDERS} providers, ${sizes.uptime_rows} uptime hours, ${sizes.day_rows} attempt days, ${sizes.login_codes} login codes in ${((performance.now() - t0) / 1000).toFixed(1)} s`);

    // The worker's sweep: the reputation rows, then the login codes, each timed.
    const timed = async () => {
      let started = performance.now();
      const deleted = await deleteExpiredReputationRows(sql);
      const seconds = Math.round(performance.now() - started) / 1000;
      started = performance.now();
      const loginCodes = await deleteSpentLoginCodes(sql);
      return { ...deleted, seconds, loginCodes, loginCodeSeconds: Math.round(performance.now() - started) / 1000 };
    };
    const backlog = await timed();
    note(`backlog: ${JSON.stringify(backlog)}`);
    await sql`VACUUM provider_uptime`;
    // An hour later: every provider's oldest kept hour has expired.
    await sql`
      UPDATE provider_uptime SET hour = hour - interval '1 hour'
      WHERE hour = date_trunc('hour', now()) - make_interval(hours => ${UPTIME_KEPT_HOURS})`;
    await sql`VACUUM ANALYZE provider_uptime`;
    // And the hour's login codes are spent.
    await sql`UPDATE login_codes SET created_at = created_at - interval '2 hours', sent_at = sent_at - interval '2 hours', expires_at = expires_at - interval '2 hours'`;
    await sql`VACUUM ANALYZE login_codes`;
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
