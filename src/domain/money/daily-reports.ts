// Figures per UTC day for the console's charts. Money comes from the ledger
// (the same transfer kinds the dashboard sums), so a chart and the dashboard
// never disagree. Each series has every day of the window, zeros included.
import type { Db, Sql } from "../../db/index.js";
import { CHARGE_KINDS_SQL, PLATFORM_FEE_KINDS_SQL } from "./ledger.js";
import { checkRange } from "../shared/validate.js";

export const REPORT_DAYS = { default: 14, max: 90 } as const;

/** The window asked for: the default when absent; 0, like any number out of range, is 400 naming it. */
export function reportDays(days: number | undefined): number {
  return days === undefined ? REPORT_DAYS.default : checkRange(days, 1, REPORT_DAYS.max, "days", true);
}

// The window's days as [start, end) timestamps, today (UTC) last.
const windowCte = (days: number) => `
  SELECT d::date AS day, d AT TIME ZONE 'UTC' AS start, (d + interval '1 day') AT TIME ZONE 'UTC' AS stop
  FROM generate_series(date_trunc('day', now() AT TIME ZONE 'UTC') - ${days - 1} * interval '1 day',
                       date_trunc('day', now() AT TIME ZONE 'UTC'), interval '1 day') AS d`;

const n = (v: unknown) => BigInt(Math.trunc(Number(v ?? 0)));
const dayText = (d: Date | string) => (typeof d === "string" ? d.slice(0, 10) : d.toISOString().slice(0, 10));

// The window's first instant as SQL text (days is a checked integer): a bound every plan can read an index range from.
const windowStartSql = (days: number) => `(date_trunc('day', now() AT TIME ZONE 'UTC') - ${days - 1} * interval '1 day') AT TIME ZONE 'UTC'`;

/**
 * A provider's earnings and settled jobs per day. A job counts on the day its hold was settled on
 * this provider, whatever its share came to: a share that rounds down to 0 halala moves no money,
 * so the job is found by its settled hold, not by the ledger's transfers. providers.total_jobs counts
 * the same. Both read the window's rows only (its account's credits, by the credit index, and its
 * settled holds, migration 065, from the window's start), not the provider's history.
 */
export async function providerEarningsByDay(sql: Sql, providerId: number, days: number) {
  const start = sql.unsafe(windowStartSql(days));
  const rows = await sql<{ day: Date; jobs: string; earned: string }[]>`
    WITH w AS (${sql.unsafe(windowCte(days))}),
         earned AS (
           SELECT (t.created_at AT TIME ZONE 'UTC')::date AS day, sum(t.amount) AS earned
           FROM ledger_accounts a JOIN ledger_transfers t ON t.credit_account_id = a.id
           -- Every credit of a provider's earnings account is the provider's leg of a charge (CHARGE_KIND in ledger.ts):
           -- no kind filter, which would lead the plan to every provider's charges of the window (by kind).
           WHERE a.kind = 'provider_earnings' AND a.owner_id = ${providerId} AND t.created_at >= ${start}
           GROUP BY 1),
         settled AS (
           SELECT (closed_at AT TIME ZONE 'UTC')::date AS day, count(*) AS jobs
           FROM ledger_holds
           WHERE provider_id = ${providerId} AND status = 'settled' AND closed_at >= ${start}
           GROUP BY 1)
    SELECT w.day, coalesce(s.jobs, 0) AS jobs, coalesce(e.earned, 0) AS earned
    FROM w LEFT JOIN earned e ON e.day = w.day LEFT JOIN settled s ON s.day = w.day
    ORDER BY w.day`;
  const out = rows.map((r) => ({ day: dayText(r.day), jobs: n(r.jobs), earnedHalala: n(r.earned) }));
  return { days: out, totalEarnedHalala: out.reduce((s, d) => s + d.earnedHalala, 0n) };
}

/**
 * What the provider earned today (UTC) and in the last 7 days (the dashboard's additions): its
 * ledger credits of those windows, read from its account's transfers of the older window only.
 */
export async function providerRecentEarnings(db: Db, providerId: number): Promise<{ today: number; week: number }> {
  const [row] = await db<{ today: string; week: string }[]>`
    SELECT coalesce(sum(t.amount) FILTER (WHERE t.created_at >= date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'), 0)::bigint AS today,
           coalesce(sum(t.amount) FILTER (WHERE t.created_at >= now() - interval '7 days'), 0)::bigint AS week
    FROM ledger_transfers t JOIN ledger_accounts a ON a.id = t.credit_account_id
    WHERE a.kind = 'provider_earnings' AND a.owner_id = ${providerId}
      AND t.created_at >= least(date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC', now() - interval '7 days')`;
  return { today: Number(row.today), week: Number(row.week) };
}

/** A renter's settled /v1 requests by UTC day and by model, each dated when it was charged (as the ledger's transfers are). */
export async function renterUsageByDay(sql: Sql, renterId: number, days: number) {
  const perDay = await sql<{ day: Date; requests: string; prompt: string; completion: string; cost: string }[]>`
    WITH w AS (${sql.unsafe(windowCte(days))})
    SELECT w.day, count(u.request_id) AS requests, coalesce(sum(u.prompt_tokens), 0) AS prompt,
           coalesce(sum(u.completion_tokens), 0) AS completion, coalesce(sum(u.cost_halala), 0) AS cost
    FROM w LEFT JOIN v1_usage u
      ON u.renter_id = ${renterId} AND u.state = 'settled' AND u.ended_at >= w.start AND u.ended_at < w.stop
    GROUP BY w.day ORDER BY w.day`;
  const perModel = await sql<{ model: string; requests: string; prompt: string; completion: string; cost: string }[]>`
    SELECT model, count(*) AS requests, sum(prompt_tokens) AS prompt, sum(completion_tokens) AS completion, sum(cost_halala) AS cost
    FROM v1_usage
    WHERE renter_id = ${renterId} AND state = 'settled'
      AND ended_at >= date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' - ${days - 1} * interval '1 day'
    GROUP BY model ORDER BY count(*) DESC, model`;
  const tokens = (r: { requests: string; prompt: string; completion: string; cost: string }) => ({
    requests: n(r.requests), promptTokens: n(r.prompt), completionTokens: n(r.completion), costHalala: n(r.cost),
  });
  return {
    days: perDay.map((r) => ({ day: dayText(r.day), ...tokens(r) })),
    models: perModel.map((r) => ({ model: r.model, ...tokens(r) })),
  };
}

/** A day's figures are final this long after it ended: a transaction that began before midnight dates its rows then. */
export const DAY_FINAL_AFTER_MINUTES = 10;

interface PlatformDay {
  day: string;
  jobs: string;
  completed_jobs: string;
  revenue_halala: string;
  fees_halala: string;
}

/**
 * One UTC day's platform figures from the rows: jobs submitted, jobs completed, what renters paid
 * and the platform's part of it. The day is SQL text (a date the database gave), so every plan sees
 * the day's range and reads it from the indexes (submitted_at, completed jobs' completed_at,
 * the ledger's (kind, created_at)) rather than the history.
 */
function dayFiguresSql(sql: Sql, day: string) {
  if (!/^\d{4}-\d{2}-\d{2}$/.test(day)) throw new Error(`not a day: ${day}`);
  const start = `'${day}'::date::timestamp AT TIME ZONE 'UTC'`;
  const stop = `('${day}'::date + 1)::timestamp AT TIME ZONE 'UTC'`;
  return sql.unsafe(`
    SELECT '${day}'::date AS day,
           (SELECT count(*) FROM jobs WHERE submitted_at >= ${start} AND submitted_at < ${stop})::bigint AS jobs,
           (SELECT count(*) FROM jobs WHERE status = 'completed' AND completed_at >= ${start} AND completed_at < ${stop})::bigint AS completed_jobs,
           m.revenue_halala, m.fees_halala
    FROM (SELECT coalesce(sum(amount), 0)::bigint AS revenue_halala,
                 coalesce(sum(amount) FILTER (WHERE kind IN (${PLATFORM_FEE_KINDS_SQL})), 0)::bigint AS fees_halala
          FROM ledger_transfers WHERE kind IN (${CHARGE_KINDS_SQL}) AND created_at >= ${start} AND created_at < ${stop}) m`);
}

/**
 * The platform's figures for each day of the window. A day that is over (DAY_FINAL_AFTER_MINUTES
 * past its end) is read from platform_days, where the first report that asks for it writes it;
 * the days still open (today, and yesterday just after midnight) are read from the rows each time.
 * So a report reads at most two days of the history, however long the window (the operator
 * console asks for 14 days every 30 s; read whole, they took 11 s at 10,000,000 jobs).
 */
export async function platformByDay(sql: Sql, days: number) {
  const window = await sql<{ day: string; final: boolean; stored: PlatformDay | null }[]>`
    WITH w AS (${sql.unsafe(windowCte(days))})
    SELECT to_char(w.day, 'YYYY-MM-DD') AS day,
           w.stop <= now() - ${`${DAY_FINAL_AFTER_MINUTES} minutes`}::interval AS final,
           CASE WHEN pd.day IS NOT NULL THEN to_jsonb(pd) END AS stored
    FROM w LEFT JOIN platform_days pd ON pd.day = w.day
    ORDER BY w.day`;
  const out: PlatformDay[] = [];
  for (const w of window) {
    if (w.stored) {
      out.push(w.stored);
      continue;
    }
    const figures = dayFiguresSql(sql, w.day);
    const [row] = w.final
      ? await sql<PlatformDay[]>`
          WITH f AS (${figures})
          INSERT INTO platform_days (day, jobs, completed_jobs, revenue_halala, fees_halala)
          SELECT day, jobs, completed_jobs, revenue_halala, fees_halala FROM f
          ON CONFLICT (day) DO UPDATE SET day = EXCLUDED.day
          RETURNING *`
      : await sql<PlatformDay[]>`${figures}`;
    out.push(row);
  }
  return {
    days: out.map((r) => ({
      day: dayText(r.day),
      jobs: n(r.jobs),
      completedJobs: n(r.completed_jobs),
      revenueHalala: n(r.revenue_halala),
      svcFeesHalala: n(r.fees_halala),
    })),
  };
}
