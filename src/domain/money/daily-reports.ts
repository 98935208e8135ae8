// Figures per UTC day for the console's charts. Money comes from the ledger
// (the same transfer kinds the dashboard sums), so a chart and the dashboard
// never disagree. Each series has every day of the window, zeros included.
import type { Sql } from "../../db/index.js";
import { CHARGE_KIND, CHARGE_KINDS, PLATFORM_FEE_KINDS } from "./ledger.js";
import { checkRange } from "../shared/validate.js";

export const REPORT_DAYS = { default: 14, max: 90 } as const;

export function reportDays(days: number | undefined): number {
  return days === undefined || days === 0 ? REPORT_DAYS.default : checkRange(days, 1, REPORT_DAYS.max, "days", true);
}

// The window's days as [start, end) timestamps, today (UTC) last.
const windowCte = (days: number) => `
  SELECT d::date AS day, d AT TIME ZONE 'UTC' AS start, (d + interval '1 day') AT TIME ZONE 'UTC' AS stop
  FROM generate_series(date_trunc('day', now() AT TIME ZONE 'UTC') - ${days - 1} * interval '1 day',
                       date_trunc('day', now() AT TIME ZONE 'UTC'), interval '1 day') AS d`;

const n = (v: unknown) => BigInt(Math.trunc(Number(v ?? 0)));
const dayText = (d: Date | string) => (typeof d === "string" ? d.slice(0, 10) : d.toISOString().slice(0, 10));

const PROVIDER_EARNING_KINDS = [CHARGE_KIND.jobProvider, CHARGE_KIND.v1Provider];

export async function providerEarningsByDay(sql: Sql, providerId: number, days: number) {
  const rows = await sql<{ day: Date; jobs: string; earned: string }[]>`
    WITH w AS (${sql.unsafe(windowCte(days))}),
         acct AS (SELECT id FROM ledger_accounts WHERE kind = 'provider_earnings' AND owner_id = ${providerId})
    SELECT w.day,
           count(DISTINCT t.job_id) FILTER (WHERE t.kind = ${CHARGE_KIND.jobProvider}) AS jobs,
           coalesce(sum(t.amount), 0) AS earned
    FROM w LEFT JOIN ledger_transfers t
      ON t.credit_account_id IN (SELECT id FROM acct) AND t.kind = ANY(${PROVIDER_EARNING_KINDS})
     AND t.created_at >= w.start AND t.created_at < w.stop
    GROUP BY w.day ORDER BY w.day`;
  const out = rows.map((r) => ({ day: dayText(r.day), jobs: n(r.jobs), earnedHalala: n(r.earned) }));
  return { days: out, totalEarnedHalala: out.reduce((s, d) => s + d.earnedHalala, 0n) };
}

export async function renterUsageByDay(sql: Sql, renterId: number, days: number) {
  const perDay = await sql<{ day: Date; requests: string; prompt: string; completion: string; cost: string }[]>`
    WITH w AS (${sql.unsafe(windowCte(days))})
    SELECT w.day, count(u.request_id) AS requests, coalesce(sum(u.prompt_tokens), 0) AS prompt,
           coalesce(sum(u.completion_tokens), 0) AS completion, coalesce(sum(u.cost_halala), 0) AS cost
    FROM w LEFT JOIN v1_usage u
      ON u.renter_id = ${renterId} AND u.state = 'settled' AND u.created_at >= w.start AND u.created_at < w.stop
    GROUP BY w.day ORDER BY w.day`;
  const perModel = await sql<{ model: string; requests: string; prompt: string; completion: string; cost: string }[]>`
    SELECT model, count(*) AS requests, sum(prompt_tokens) AS prompt, sum(completion_tokens) AS completion, sum(cost_halala) AS cost
    FROM v1_usage
    WHERE renter_id = ${renterId} AND state = 'settled'
      AND created_at >= date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' - ${days - 1} * interval '1 day'
    GROUP BY model ORDER BY count(*) DESC, model`;
  const tokens = (r: { requests: string; prompt: string; completion: string; cost: string }) => ({
    requests: n(r.requests), promptTokens: n(r.prompt), completionTokens: n(r.completion), costHalala: n(r.cost),
  });
  return {
    days: perDay.map((r) => ({ day: dayText(r.day), ...tokens(r) })),
    models: perModel.map((r) => ({ model: r.model, ...tokens(r) })),
  };
}

// One pass over each table (grouped by day), not one scan per day of the window.
export async function platformByDay(sql: Sql, days: number) {
  const rows = await sql<{ day: Date; jobs: string; completed: string; revenue: string; fees: string }[]>`
    WITH w AS (${sql.unsafe(windowCte(days))}),
    since AS (SELECT min(start) AS t FROM w),
    submitted AS (
      SELECT (submitted_at AT TIME ZONE 'UTC')::date AS day, count(*) AS c FROM jobs, since WHERE submitted_at >= since.t GROUP BY 1),
    completed AS (
      SELECT (completed_at AT TIME ZONE 'UTC')::date AS day, count(*) AS c FROM jobs, since
      WHERE status = 'completed' AND completed_at >= since.t GROUP BY 1),
    money AS (
      SELECT (created_at AT TIME ZONE 'UTC')::date AS day,
             sum(amount) FILTER (WHERE kind = ANY(${[...CHARGE_KINDS]})) AS revenue,
             sum(amount) FILTER (WHERE kind = ANY(${[...PLATFORM_FEE_KINDS]})) AS fees
      FROM ledger_transfers, since WHERE created_at >= since.t AND kind = ANY(${[...CHARGE_KINDS]}) GROUP BY 1)
    SELECT w.day, coalesce(s.c, 0) AS jobs, coalesce(c.c, 0) AS completed,
           coalesce(m.revenue, 0) AS revenue, coalesce(m.fees, 0) AS fees
    FROM w LEFT JOIN submitted s USING (day) LEFT JOIN completed c USING (day) LEFT JOIN money m USING (day)
    ORDER BY w.day`;
  return {
    days: rows.map((r) => ({ day: dayText(r.day), jobs: n(r.jobs), completedJobs: n(r.completed), revenueHalala: n(r.revenue), svcFeesHalala: n(r.fees) })),
  };
}
