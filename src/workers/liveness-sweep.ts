// The provider side's background work:
// - the platform's pulse (every 5 s), which tells the sweeps whether a silence
//   was the providers' or an outage of the platform's own;
// - the liveness sweep (every SVC_LIVENESS_SWEEP_SECONDS): silent providers go
//   offline and their running work goes back to the jobs issue's re-queue
//   path; uptime and reliability of providers not heard from keep decaying;
// - the heartbeat telemetry flusher, stopped (and drained) at shutdown;
// - the retention sweep (workers/retention.ts);
// - the cache-invalidation listener (LISTEN), which keeps this process's key
//   and provider caches in step with changes committed by any process.
import { heartbeatPipeline, type HeartbeatDeps as Deps } from "../domain/providers/heartbeat.js";
import { INVALIDATION_CHANNEL, applyInvalidation, forgetEverything } from "../domain/accounts/invalidation.js";
import { requeueWorkOf } from "../domain/dispatch/job-hooks.js";
import { markSilentProvidersOffline } from "../domain/dispatch/liveness-sweep.js";
import { pulse, PULSE_SECONDS } from "../domain/shared/platform-pulse.js";
import { refreshDueReputations } from "../domain/providers/reputation.js";
import type { Worker } from "./worker.js";
import { retentionWorker } from "./retention.js";
import { failureLevel } from "../errors.js";

/** One sweep: offline marking, re-queueing, then due reputation refreshes. */
export async function sweepOnce(deps: Deps): Promise<{ offline: number[]; refreshed: number }> {
  const { sql, log } = deps;
  // Its own pulse first: after an outage the first sweep sees the platform up only from now.
  await pulse(sql);
  const offline = await markSilentProvidersOffline(sql);
  for (const id of offline) await requeueWorkOf(sql, log, id, "silent", "provider went offline (no heartbeat within 120 s)");
  if (offline.length) log.info({ count: offline.length }, "providers marked offline");
  const refreshed = await refreshDueReputations(sql);
  return { offline, refreshed };
}

export function livenessSweepWorker(deps: Deps): Worker {
  let timer: NodeJS.Timeout | undefined;
  let running: Promise<unknown> | undefined;
  const tick = () => {
    if (running) return;
    running = sweepOnce(deps)
      .catch((err) => deps.log[failureLevel(err)]({ err }, "liveness sweep failed"))
      .finally(() => (running = undefined));
  };
  return {
    start() {
      const seconds = deps.config.livenessSweepSeconds;
      if (seconds > 0) timer = setInterval(tick, seconds * 1000);
    },
    async stop() {
      if (timer) clearInterval(timer);
      await running;
    },
  };
}

export function heartbeatFlushWorker(deps: Deps): Worker {
  return {
    start() {
      heartbeatPipeline(deps);
    },
    stop: () => heartbeatPipeline(deps).stop(),
  };
}

export function invalidationListener(deps: Deps): Worker {
  let unlisten: (() => Promise<void>) | undefined;
  return {
    async start() {
      const sub = await deps.sql.listen(
        INVALIDATION_CHANNEL,
        (payload) => applyInvalidation(deps.sql, payload),
        // Called on every (re)connect: anything sent while disconnected is lost, so start cold.
        () => forgetEverything(deps.sql),
      );
      unlisten = sub.unlisten;
    },
    async stop() {
      await unlisten?.().catch(() => {});
    },
  };
}

/** The platform's pulse, every PULSE_SECONDS (domain/shared/platform-pulse.ts). */
export function pulseWorker(deps: Deps): Worker {
  let timer: NodeJS.Timeout | undefined;
  let running: Promise<unknown> | undefined;
  const tick = () => {
    if (running) return;
    running = pulse(deps.sql)
      .catch((err) => deps.log[failureLevel(err)]({ err }, "platform pulse not written"))
      .finally(() => (running = undefined));
  };
  return {
    start() {
      tick();
      timer = setInterval(tick, PULSE_SECONDS * 1000);
    },
    async stop() {
      if (timer) clearInterval(timer);
      await running;
    },
  };
}

/** Every worker of the provider side, in start order. */
export function providerWorkers(deps: Deps): Worker[] {
  return [invalidationListener(deps), pulseWorker(deps), heartbeatFlushWorker(deps), livenessSweepWorker(deps), retentionWorker(deps)];
}
