// Figures per UTC day for the console's charts. Money comes from the ledger
// (the same transfer kinds the dashboard sums), so a chart and the dashboard
// never disagree. Each series has every day of the window, zeros included.
import type { Sql } from "../../db/index.js";
import { CHARGE_KIND, CHARGE_KINDS_SQL, PLATFORM_FEE_KINDS_SQL } from "./ledger.js";
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

const PROVIDER_EARNING_KINDS = [CHARGE_KIND.jobProvider, CHARGE_KIND.v1Provider];

/**
 * A provider's earnings and settled jobs per day. A job counts on the day its hold was settled on
 * this provider, whatever its share came to: a share that rounds down to 0 halala moves no money,
 * so the job is found by the settlement (the provider's attempts that ended in the window, by their
 * index, and each one's hold), not by the ledger's transfers. providers.total_jobs counts the same.
 */
export async function providerEarningsByDay(sql: Sql, providerId: number, days: number) {
  const rows = await sql<{ day: Date; jobs: string; earned: string }[]>`
    WITH w AS (${sql.unsafe(windowCte(days))}),
         acct AS (SELECT id FROM ledger_accounts WHERE kind = 'provider_earnings' AND owner_id = ${providerId}),
         earned AS (
           SELECT w.day, coalesce(sum(t.amount), 0) AS earned
           FROM w LEFT JOIN ledger_transfers t
             ON t.credit_account_id IN (SELECT id FROM acct) AND t.kind = ANY(${PROVIDER_EARNING_KINDS})
            AND t.created_at >= w.start AND t.created_at < w.stop
           GROUP BY w.day),
         settled AS (
           SELECT (h.closed_at AT TIME ZONE 'UTC')::date AS day, count(DISTINCT h.job_id) AS jobs
           FROM job_attempts a
           JOIN ledger_holds h ON h.job_id = a.job_id AND h.status = 'settled' AND h.provider_id = ${providerId}
           WHERE a.provider_id = ${providerId} AND a.fault IS NOT NULL
             AND a.ended_at >= (SELECT min(start) FROM w) AND a.ended_at < (SELECT max(stop) FROM w)
           GROUP BY 1)
    SELECT e.day, coalesce(s.jobs, 0) AS jobs, e.earned
    FROM earned e LEFT JOIN settled s ON s.day = e.day
    ORDER BY e.day`;
  const out = rows.map((r) => ({ day: dayText(r.day), jobs: n(r.jobs), earnedHalala: n(r.earned) }));
  return { days: out, totalEarnedHalala: out.reduce((s, d) => s + d.earnedHalala, 0n) };
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
