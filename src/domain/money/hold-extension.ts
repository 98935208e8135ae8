// Paying for a running job as it runs. Submit holds the estimate (rate x
// duration_minutes); a job may run up to max_duration_seconds, so before its
// paid time (the whole minutes its hold covers) runs out, the hold grows from
// the renter's available balance, EXTEND_MINUTES at a time (fewer when that
// is all the balance covers, never past max_duration_seconds). When the
// balance covers not one more minute, the job is stopped as its paid time
// runs out: out_of_funds, the renter's fault, settled for the time used (none
// for a serving job that never reported its endpoint: settlement.ts
// billsTimeUsed; its hold grows all the same, since once the endpoint is
// reported its whole run is billed). So no job runs on time nobody pays for,
// and the provider is paid for every billed minute. The renter's monthly spend limit bounds the growth the same
// way (spend_limit, also the renter's). Each step locks the job row, then the renter's accounts (the
// order settlement uses), so an extension and a settlement never both act. The
// hold never grows into what the renter's /v1 requests in flight reserved.
import type { Db, Tx } from "../../db/index.js";
import { extendHold } from "./ledger.js";
import { lockedHeadroom } from "./headroom.js";
import { endLocked, lockJobById, runSeconds, type Figures } from "./settlement.js";

/** A hold grows when less than this much paid time is left. */
export const EXTEND_LEAD_SECONDS = 60;
/** How much paid time one extension adds, at most. */
export const EXTEND_MINUTES = 5;
/** An unfunded job stops this long before its paid time is up, so no second of it goes unpaid. */
export const STOP_MARGIN_SECONDS = 5;

/** The whole minutes a hold pays for. */
export const paidMinutes = (held: number, rate: number) => Math.floor(held / rate);

/**
 * Running jobs whose paid time ends within the lead (the sweep's candidates),
 * soonest first: a range of jobs_paid_until_idx (migration 040), whose
 * svc_paid_until is paidMinutes' rule in SQL. The lead is SQL text, not a
 * parameter, so a generic plan sees the same range.
 */
export function runningOutOfPaidTimeSql(db: Db, limit: number) {
  const paidUntil = db`svc_paid_until(started_at, coalesce(held_halala, cost_halala), rate_halala_per_minute)`;
  return db<{ id: number }[]>`
    SELECT id FROM jobs
    WHERE status = 'running' AND acked_at IS NOT NULL
      AND ${paidUntil} <= now() + ${db.unsafe(`interval '${EXTEND_LEAD_SECONDS} seconds'`)}
      AND floor(coalesce(held_halala, cost_halala)::numeric / rate_halala_per_minute) * 60 < max_duration_seconds
    ORDER BY ${paidUntil} LIMIT ${limit}`;
}

export async function jobsRunningOutOfPaidTime(db: Db, limit: number): Promise<number[]> {
  return (await runningOutOfPaidTimeSql(db, limit)).map((r) => r.id);
}

export type FundingOutcome =
  | { kind: "extended"; held: number }
  | { kind: "stopped"; providerId: number; figures: Figures }
  | { kind: "unchanged" };

/** Extends one running job's hold if its paid time is running out, or stops it when the renter cannot pay for more. */
export async function fundRunningJob(tx: Tx, id: number): Promise<FundingOutcome> {
  const job = await lockJobById(tx, id);
  // An unconfirmed job (polled, no report yet) bills nothing: neither grown nor stopped until confirmed.
  if (!job || job.status !== "running" || job.started_at === null || job.acked_at === null) return { kind: "unchanged" };
  const rate = job.rate_halala_per_minute;
  const held = job.held_halala ?? job.cost_halala;
  const paid = paidMinutes(held, rate);
  const ranSeconds = runSeconds(job);
  const capMinutes = Math.ceil(job.max_duration_seconds / 60);
  if (paid >= capMinutes || ranSeconds + EXTEND_LEAD_SECONDS < paid * 60) return { kind: "unchanged" };

  // What the renter's /v1 requests in flight reserved is theirs; what it owes for refunds is not its to spend;
  // the hold grows within the monthly spend limit too (headroom.ts).
  const { funds, limit, usage } = await lockedHeadroom(tx, job.renter_id);
  const funded = Math.floor(funds / rate);
  const withinLimit = Math.floor(limit / rate);
  const minutes = Math.min(EXTEND_MINUTES, capMinutes - paid, funded, withinLimit);
  if (minutes >= 1) {
    // What tops the hold up to whole paid minutes again, plus the new ones.
    const amount = (paid + minutes) * rate - held;
    const after = held + amount;
    await extendHold(tx, job.renter_id, job.id, amount, after);
    await tx`UPDATE jobs SET held_halala = ${after}, updated_at = now() WHERE id = ${job.id}`;
    return { kind: "extended", held: after };
  }
  if (ranSeconds + STOP_MARGIN_SECONDS < paid * 60) return { kind: "unchanged" }; // a top-up (or a higher limit) may still come
  const paidTime = `the ${paid} minute${paid === 1 ? "" : "s"} held (${rate} halala/min)`;
  const figures = await endLocked(
    tx,
    job,
    "failed",
    funded < 1
      ? { reason: "out_of_funds", error: `stopped: the renter's balance cannot pay for more than ${paidTime}` }
      : {
          reason: "spend_limit",
          error: `stopped: the renter's monthly_spend_limit_halala (${usage.monthlySpendLimitHalala}) leaves nothing for more than ${paidTime}`,
        },
  );
  return { kind: "stopped", providerId: job.provider_id!, figures };
}
