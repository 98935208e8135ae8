// The server side of job time: every sweep (SVC_JOB_SWEEP_MS)
//  1. fails running jobs past max_duration_seconds (the provider is told to
//     stop; a serving job that never reported its endpoint is its provider's
//     failure instead, re-queued: dispatch.ts timeOutJob), and grows the hold
//     of running jobs whose paid time is running out, or stops them when the
//     renter cannot pay for more (src/domain/money/hold-extension.ts),
//  2. re-queues (or, past the attempt limit, fails) jobs a live provider left
//     pending (never picked up) for 120 s; and, every LOST_JOBS_SWEEP_SECONDS,
//     jobs whose provider is no longer live: the safety net beside the paths
//     that re-queue a provider's work when it goes (the liveness sweep,
//     suspension, a task-key mismatch), for one that did not finish (a process
//     killed between the two),
//  3. fills any available provider that has a free GPU and a queued job it
//     can run (a window opened, a provider was approved, a lock was busy),
//  4. releases /v1 reservations whose request's process died before it
//     settled them (past their expires_at: usage-billing.ts).
// Each job moves under its row lock with a status re-check, so several
// processes can sweep at once and a result racing a timeout settles once.
import type { Sql } from "../db/index.js";
import type { Logger } from "../log.js";
import { dispatchForProvider, dispatchQueued, placeJobs, providersWithLostJobs, releaseUnclaimed, requeueJobsOfProvider, timeOutJob } from "../domain/dispatch/dispatch.js";
import { pulse } from "../domain/shared/platform-pulse.js";
import { overdueJobIds } from "../domain/money/settlement.js";
import { refreshReputation } from "../domain/providers/reputation.js";
import { fundRunningJob, jobsRunningOutOfPaidTime } from "../domain/money/hold-extension.js";
import { releaseExpiredReservations } from "../domain/money/usage-billing.js";
import type { Worker } from "./worker.js";
import { failureLevel } from "../errors.js";

const BATCH = 200;
/**
 * How often a process's sweep looks for jobs held by providers no longer live.
 * That read visits every provider (whether one is live depends on the clock):
 * about 35 ms of database time at 100,000 providers (bench:sweeps), for what
 * the paths that re-queue a provider's work have normally done already.
 */
export const LOST_JOBS_SWEEP_SECONDS = 30;

export interface SweepResult {
  /** Jobs failed at their max_duration_seconds as the renter's timeout. */
  timedOut: number;
  /** Holds grown, and jobs stopped because the renter could not pay for more. */
  extended: number;
  outOfFunds: number;
  /** Jobs taken off their provider (its fault: not picked up, silent, a serving job past its deadline that never served), re-queued or failed. */
  requeued: number;
  failed: number;
  assigned: number;
  /** /v1 reservations released past their expiry (their request's process died). */
  reservationsReleased: number;
}

/** One pass (`lostJobs`: with the safety net); exported so tests and tools can drive it directly. */
export async function sweepJobs(sql: Sql, opts: { lostJobs?: boolean } = {}): Promise<SweepResult> {
  const out: SweepResult = { timedOut: 0, extended: 0, outOfFunds: 0, requeued: 0, failed: 0, assigned: 0, reservationsReleased: 0 };
  const freed = new Set<number>();
  // Its own pulse first: after an outage the first sweep sees the platform up only from now (the
  // safety net and the pickup window then wait a live window).
  await pulse(sql);
  const docked = new Set<number>();
  for (const id of await overdueJobIds(sql, BATCH)) {
    const done = await sql.begin((tx) => timeOutJob(tx, id));
    if (!done) continue;
    freed.add(done.providerId);
    if (done.outcome === "timeout") out.timedOut++;
    else {
      docked.add(done.providerId);
      if (done.outcome === "requeued") {
        out.requeued++;
        await placeJobs(sql, [id]);
      } else out.failed++;
    }
  }
  await refreshReputation(sql, [...docked]);
  for (const id of await jobsRunningOutOfPaidTime(sql, BATCH)) {
    const r = await sql.begin((tx) => fundRunningJob(tx, id));
    if (r.kind === "extended") out.extended++;
    if (r.kind === "stopped") {
      out.outOfFunds++;
      freed.add(r.providerId);
    }
  }
  for (const providerId of opts.lostJobs === false ? [] : await providersWithLostJobs(sql)) {
    const r = await requeueJobsOfProvider(sql, providerId, "silent", "provider stopped responding (no heartbeat in the last 120 seconds)");
    out.requeued += r.requeued.length;
    out.failed += r.failed.length;
  }
  const unclaimed = await releaseUnclaimed(sql);
  out.requeued += unclaimed.requeued;
  out.failed += unclaimed.failed;
  for (const providerId of freed) out.assigned += (await dispatchForProvider(sql, providerId)).length;
  out.assigned += await dispatchQueued(sql);
  out.reservationsReleased = await releaseExpiredReservations(sql);
  return out;
}

export function jobTimeoutsWorker(opts: { sql: Sql; log: Logger; intervalMs: number }): Worker {
  let timer: NodeJS.Timeout | undefined;
  let running: Promise<void> | undefined;
  let stopped = false;
  let lostJobsAt = -Infinity;
  const tick = () => {
    const lostJobs = performance.now() - lostJobsAt >= LOST_JOBS_SWEEP_SECONDS * 1000;
    if (lostJobs) lostJobsAt = performance.now();
    running = sweepJobs(opts.sql, { lostJobs })
      .then((r) => {
        if (r.timedOut || r.outOfFunds || r.requeued || r.failed || r.reservationsReleased) opts.log.info(r, "job sweep");
      })
      .catch((err) => {
        if (!stopped) opts.log[failureLevel(err)]({ err }, "job sweep failed");
      })
      .finally(() => {
        running = undefined;
        if (!stopped) timer = setTimeout(tick, opts.intervalMs);
      });
  };
  return {
    start() {
      timer = setTimeout(tick, opts.intervalMs);
    },
    async stop() {
      stopped = true;
      if (timer) clearTimeout(timer);
      await running;
    },
  };
}
