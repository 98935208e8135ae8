// The admin dashboard: every figure read from the database in one snapshot
// (a REPEATABLE READ transaction, so the counts agree with each other).
// "today" is the current UTC day.
// Nothing here reads the history whole (the console reads it every 10 s): the
// job counts are the ended jobs' counter (job_ends) plus the active
// jobs; all-time revenue is what renters were charged (renters.total_spent_halala)
// and the fees what of it providers did not earn (providers.total_earnings_halala),
// both written by the two charging paths (settle, chargeTokenUsage) with their
// ledger entries; today's figures read today's rows.
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { GetDashboardResponseSchema } from "../../../gen/svc/v1/admin_pb.js";
import type { Sql, Tx } from "../../db/index.js";
import { CHARGE_KINDS_SQL, PLATFORM_FEE_KINDS_SQL } from "../money/ledger.js";
import { LIVE_WINDOW_SECONDS } from "../shared/liveness.js";
import { iso } from "../shared/validate.js";

export const RECENT_LIMIT = 10;


interface StatsRow {
  total_providers: number;
  online_now: number;
  total_renters: number;
  active_renters: number;
  total_renter_balance_halala: number;
  total_jobs: number;
  completed_jobs: number;
  failed_jobs: number;
  active_jobs: number;
  today_jobs: number;
  total_revenue_halala: number;
  total_svc_fees_halala: number;
  today_revenue_halala: number;
  today_svc_fees_halala: number;
  now: Date;
}

const num = (v: unknown) => BigInt(Math.trunc(Number(v ?? 0)));
const maybeNumber = (v: unknown): number | undefined => {
  const n = typeof v === "string" ? Number(v) : v;
  return typeof n === "number" && Number.isFinite(n) ? n : undefined;
};

export function dashboard(sql: Sql): Promise<MessageInitShape<typeof GetDashboardResponseSchema>> {
  return sql.begin("ISOLATION LEVEL REPEATABLE READ READ ONLY", (tx) => dashboardIn(tx));
}

/** The dashboard read in the caller's transaction (dashboard() gives it a snapshot of its own). */
export async function dashboardIn(tx: Tx): Promise<MessageInitShape<typeof GetDashboardResponseSchema>> {
  const live = `${LIVE_WINDOW_SECONDS} seconds`;
  // An expression, not a CTE's column: the planner then knows today's range is small and reads it from
  // the indexes on submitted_at and (kind, created_at); joined with a CTE it read the ledger whole.
  const todayStart = tx`date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'`;
  const [s] = await tx<StatsRow[]>`
    SELECT
      p.total AS total_providers, p.online AS online_now,
      r.total AS total_renters, r.active AS active_renters,
      (SELECT coalesce(sum(balance), 0) FROM ledger_accounts
        WHERE kind IN ('renter_available', 'renter_held'))::bigint AS total_renter_balance_halala,
      e.ended + a.n AS total_jobs, e.completed AS completed_jobs, e.failed AS failed_jobs, a.n AS active_jobs,
      (SELECT count(*) FROM jobs WHERE submitted_at >= ${todayStart})::bigint AS today_jobs,
      r.spent AS total_revenue_halala, r.spent - p.earned AS total_svc_fees_halala,
      t.revenue AS today_revenue_halala, t.fees AS today_svc_fees_halala,
      now() AS now
    FROM (SELECT count(*)::bigint AS total,
                 count(*) FILTER (WHERE status = 'online' AND last_heartbeat > now() - ${live}::interval)::bigint AS online,
                 coalesce(sum(total_earnings_halala), 0)::bigint AS earned
          FROM providers) p,
         (SELECT count(*)::bigint AS total, count(*) FILTER (WHERE status = 'active')::bigint AS active,
                 coalesce(sum(total_spent_halala), 0)::bigint AS spent
          FROM renters) r,
         (SELECT coalesce(sum(jobs), 0)::bigint AS ended,
                 coalesce(sum(jobs) FILTER (WHERE status = 'completed'), 0)::bigint AS completed,
                 coalesce(sum(jobs) FILTER (WHERE status = 'failed'), 0)::bigint AS failed
          FROM job_ends) e,
         (SELECT count(*)::bigint AS n FROM jobs WHERE status IN ('queued', 'pending', 'running')) a,
         (SELECT coalesce(sum(amount), 0)::bigint AS revenue,
                 coalesce(sum(amount) FILTER (WHERE kind IN (${tx.unsafe(PLATFORM_FEE_KINDS_SQL)})), 0)::bigint AS fees
          FROM ledger_transfers WHERE kind IN (${tx.unsafe(CHARGE_KINDS_SQL)}) AND created_at >= ${todayStart}) t`;

  const gpus = await tx<{ gpu_model: string; providers: number; online: number; total_vram_mib: number }[]>`
    SELECT gpu_model,
           count(*)::bigint AS providers,
           count(*) FILTER (WHERE status = 'online' AND last_heartbeat > now() - ${live}::interval)::bigint AS online,
           coalesce(sum(coalesce(gpu_vram_mib, 0) * greatest(gpu_count, 1)), 0)::bigint AS total_vram_mib
    FROM providers GROUP BY gpu_model ORDER BY count(*) DESC, gpu_model`;

  const signups = await tx<{ kind: string; id: number; name: string; email: string; created_at: Date }[]>`
    (SELECT 'provider' AS kind, id, name, email, created_at FROM providers ORDER BY created_at DESC, id DESC LIMIT ${RECENT_LIMIT})
    UNION ALL
    (SELECT 'renter' AS kind, id, name, email, created_at FROM renters ORDER BY created_at DESC, id DESC LIMIT ${RECENT_LIMIT})
    ORDER BY created_at DESC, kind, id DESC LIMIT ${RECENT_LIMIT}`;

  const beats = await tx<
    { id: number; name: string; gpu_model: string; status: string; last_heartbeat: Date; gpu_telemetry: Record<string, unknown> | null }[]
  >`
    SELECT id, name, gpu_model, status, last_heartbeat, gpu_telemetry FROM providers
    WHERE last_heartbeat IS NOT NULL ORDER BY last_heartbeat DESC, id DESC LIMIT ${RECENT_LIMIT}`;

  return {
    stats: {
      totalProviders: num(s.total_providers),
      onlineNow: num(s.online_now),
      offline: num(s.total_providers - s.online_now),
      totalRenters: num(s.total_renters),
      activeRenters: num(s.active_renters),
      totalRenterBalanceHalala: num(s.total_renter_balance_halala),
      totalJobs: num(s.total_jobs),
      completedJobs: num(s.completed_jobs),
      failedJobs: num(s.failed_jobs),
      activeJobs: num(s.active_jobs),
      totalRevenueHalala: num(s.total_revenue_halala),
      totalSvcFeesHalala: num(s.total_svc_fees_halala),
      todayRevenueHalala: num(s.today_revenue_halala),
      todaySvcFeesHalala: num(s.today_svc_fees_halala),
      todayJobs: num(s.today_jobs),
      timestamp: iso(s.now)!,
    },
    gpuBreakdown: gpus.map((g) => ({
      gpuModel: g.gpu_model,
      providers: num(g.providers),
      online: num(g.online),
      totalVramMib: num(g.total_vram_mib),
    })),
    recentSignups: signups.map((r) => ({ kind: r.kind, id: num(r.id), name: r.name, email: r.email, createdAt: iso(r.created_at)! })),
    recentHeartbeats: beats.map((p) => {
      const t = p.gpu_telemetry ?? {};
      return {
        providerId: num(p.id),
        name: p.name,
        gpuModel: p.gpu_model,
        status: p.status,
        lastHeartbeat: iso(p.last_heartbeat),
        gpuUtilPct: maybeNumber(t.gpu_util_pct),
        tempC: maybeNumber(t.temp_c),
      };
    }),
  };
}
