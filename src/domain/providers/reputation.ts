// Reputation: uptime_percent (heartbeat coverage over a sliding window) and
// reliability_score. The reliability formula lives here and nowhere else.
import type { Db } from "../../db/index.js";
import { LIVE_WINDOW_SECONDS } from "../shared/liveness.js";

/** The sliding window uptime is measured over. */
export const UPTIME_WINDOW_HOURS = 24;
/** A provider's figures are recomputed on a heartbeat at most this often (and by the sweep when silent). */
export const REPUTATION_REFRESH_SECONDS = 300;
/** The success rate counts attempts that ended on this many UTC days: today and the ones before it. */
export const SUCCESS_WINDOW_DAYS = 30;
/** Age at which a provider's track record counts in full. */
export const MATURITY_DAYS = 30;

export interface ReliabilityInputs {
  /** Attempts (last 30 UTC days) the provider carried through for a renter other than itself, charged at least a minute of their rate. */
  completedJobs: number;
  /** Attempts (last 30 UTC days) that ended by the provider's fault (job-end.ts: refused, silent, interrupted, its machine failed, ...). */
  failedJobs: number;
  /** 0-100. */
  uptimePercent: number;
  /** Days since the provider's first accepted heartbeat. */
  ageDays: number;
  /** /v1 requests (last 30 days) whose reported usage its endpoint overstated beyond what was delivered. */
  overstatedRequests?: number;
}

/**
 * reliability_score, 0-100 (one decimal):
 *
 *   100 × (0.50 × S + 0.35 × U + 0.15 × A)
 *
 *   S = (carried + 1) / (carried + provider_faults + overstated + 2)
 *       over the job attempts that ended on this provider in the last 30 UTC
 *       days (today and the 29 before; counted per day as they end, migration 034,
 *       by the rule of attempt_outcome, migration 048):
 *       carried = completed (fault none) or ended by the renter's fault after
 *       it ran (the provider did its part), and only when it was paid work
 *       for someone else: the renter was charged at least one minute of the
 *       job's rate (cost_halala >= rate_halala_per_minute), and the renter's
 *       account email is not the provider's (case-insensitive). An attempt
 *       that fails either counts neither way, so a provider cannot buy itself
 *       a record with jobs it pins to itself, nor with 1-halala jobs whose
 *       75% share rounds to nothing. The email is a cheap link between two
 *       accounts of one person, not proof that they are independent: one
 *       with a second email still pays the platform's 25% of a minute per attempt.
 *       provider_faults = attempts whose end was the provider's fault
 *       (refused, silent, not picked up, interrupted, its machine failed the
 *       job, a signature it could not verify, a job type it cannot run),
 *       whatever they were charged. Platform faults and unattributed
 *       failures count neither way. Laplace-smoothed so a new provider starts
 *       at 0.5, not 0 or 1; each /v1 request of the window whose usage the
 *       provider's endpoint overstated (reported more tokens than the
 *       gateway's bounds allow, token-pricing.ts) counts as one provider fault
 *   U = uptime_percent / 100                          heartbeat coverage, last 24 h
 *   A = min(1, age_days / 30)                         time since the first heartbeat
 *
 * Success weighs most (a renter's job finishing is what matters), uptime next
 * (a provider that is there when work arrives), age least (a short record is
 * less certain). A provider that never sent an accepted heartbeat has no score (null).
 */
export function reliabilityScore(i: ReliabilityInputs): number {
  const s = (i.completedJobs + 1) / (i.completedJobs + i.failedJobs + Math.max(0, i.overstatedRequests ?? 0) + 2);
  const u = Math.min(100, Math.max(0, i.uptimePercent)) / 100;
  const a = Math.min(1, Math.max(0, i.ageDays) / MATURITY_DAYS);
  return Math.round(1000 * (0.5 * s + 0.35 * u + 0.15 * a)) / 10;
}

interface ReputationRow {
  id: number;
  completed: number;
  failed: number;
  overstated: number;
  covered: number;
  window_seconds: number;
  age_days: number;
}

/**
 * Recomputes uptime_percent and reliability_score of the given providers in
 * two statements. Coverage counts the filed hours of the window
 * (provider_uptime), the current hour accumulating on the provider row, and
 * the still-open span since the last heartbeat (a live provider is covered up to now).
 */
export async function refreshReputation(db: Db, providerIds: number[]): Promise<void> {
  if (providerIds.length === 0) return;
  const rows = await db<ReputationRow[]>`
    WITH w AS (SELECT date_trunc('hour', now(), 'UTC') - make_interval(hours => ${UPTIME_WINDOW_HOURS - 1}) AS start)
    SELECT p.id,
           coalesce(j.completed, 0)::int AS completed,
           coalesce(j.failed, 0)::int AS failed,
           coalesce(o.overstated, 0)::int AS overstated,
           coalesce(c.covered, 0)
             + CASE WHEN p.uptime_hour >= w.start THEN p.uptime_hour_seconds ELSE 0 END
             + CASE WHEN p.last_heartbeat >= greatest(w.start, p.first_heartbeat_at)
                    THEN least(greatest(extract(epoch FROM now() - p.last_heartbeat), 0), ${LIVE_WINDOW_SECONDS})
                    ELSE 0 END AS covered,
           greatest(extract(epoch FROM now() - greatest(w.start, p.first_heartbeat_at)), 1) AS window_seconds,
           extract(epoch FROM now() - p.first_heartbeat_at) / 86400 AS age_days
    FROM providers p CROSS JOIN w
    LEFT JOIN LATERAL (
      SELECT sum(covered_seconds) AS covered FROM provider_uptime u WHERE u.provider_id = p.id AND u.hour >= w.start
    ) c ON true
    LEFT JOIN LATERAL (
      SELECT sum(carried) AS completed, sum(faults) AS failed FROM provider_attempt_days d
      WHERE d.provider_id = p.id AND d.day > (now() AT TIME ZONE 'UTC')::date - ${SUCCESS_WINDOW_DAYS}::int
    ) j ON true
    LEFT JOIN LATERAL (
      SELECT count(*) AS overstated FROM v1_usage
      WHERE provider_id = p.id AND overstated_tokens > 0 AND ended_at >= now() - make_interval(days => ${SUCCESS_WINDOW_DAYS})
    ) o ON true
    WHERE p.id = ANY(${providerIds}::bigint[]) AND p.first_heartbeat_at IS NOT NULL`;
  if (rows.length === 0) return;
  const ids: number[] = [];
  const uptimes: number[] = [];
  const scores: number[] = [];
  for (const r of rows) {
    const uptime = Math.round(1000 * Math.min(100, (100 * Number(r.covered)) / Number(r.window_seconds))) / 1000;
    ids.push(r.id);
    uptimes.push(uptime);
    scores.push(reliabilityScore({
        completedJobs: r.completed,
        failedJobs: r.failed,
        overstatedRequests: r.overstated,
        uptimePercent: uptime,
        ageDays: Number(r.age_days),
      }));
  }
  await db`
    UPDATE providers p SET uptime_percent = v.uptime, reliability_score = v.score, reputation_at = now()
    FROM unnest(${ids}::bigint[], ${uptimes}::float8[], ${scores}::float8[]) AS v(id, uptime, score)
    WHERE p.id = v.id`;
}

/** Providers whose figures are older than the refresh period (the sweep keeps silent ones decaying). */
export async function refreshDueReputations(db: Db, limit = 1000): Promise<number> {
  const due = await db<{ id: number }[]>`
    SELECT id FROM providers
    WHERE first_heartbeat_at IS NOT NULL
      AND (reputation_at IS NULL OR reputation_at < now() - make_interval(secs => ${REPUTATION_REFRESH_SECONDS}))
      AND (uptime_percent > 0 OR last_heartbeat >= now() - make_interval(hours => ${UPTIME_WINDOW_HOURS + 1}))
    ORDER BY reputation_at NULLS FIRST LIMIT ${limit}`;
  await refreshReputation(db, due.map((r) => r.id));
  return due.length;
}
