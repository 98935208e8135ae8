// The serving endpoints' health probe (src/domain/dispatch/endpoint-health.ts):
// at start and every SVC_ENDPOINT_PROBE_SECONDS (0: off) this process claims
// the running serving jobs no process probed within the period, GETs each
// engine's /health, and ends the attempts whose endpoint failed every probe for
// longer than the grace as their provider's failure. Claims keep several
// processes from probing one job twice in a period. The first pass runs at
// start: an endpoint that went down while no process probed is found failing
// (and tried last by /v1) at once, not a period later; like every pass it
// probes CONCURRENCY endpoints at a time, however many are due. A pass starts
// a period after the one before started (at once when that one ran longer,
// never two at once), so a job's probes stay a period apart however long its
// pass takes; stop() has the pass claim nothing more and waits only for its
// probes in flight.
import type { Sql } from "../db/index.js";
import type { Logger } from "../log.js";
import { sweepEndpoints } from "../domain/dispatch/endpoint-health.js";
import type { Worker } from "./worker.js";
import { failureLevel } from "../errors.js";

export function endpointHealthWorker(opts: { sql: Sql; log: Logger; periodSeconds: number; allowPrivate: boolean }): Worker {
  let timer: NodeJS.Timeout | undefined;
  let running: Promise<unknown> | undefined;
  let stopped = false;
  const tick = () => {
    const started = Date.now();
    running = sweepEndpoints(opts.sql, { periodSeconds: opts.periodSeconds, allowPrivate: opts.allowPrivate, stopped: () => stopped })
      .then((r) => {
        if (r.outage) opts.log.error(r, "every serving endpoint failed its health check: the platform's own network is the likelier cause; no provider was blamed");
        if (r.requeued || r.failed) opts.log.warn(r, "serving endpoints failing past the grace: attempts ended as the provider's failure");
      })
      .catch((err) => {
        if (!stopped) opts.log[failureLevel(err)]({ err }, "endpoint health sweep failed");
      })
      .finally(() => {
        running = undefined;
        if (!stopped) timer = setTimeout(tick, Math.max(0, started + opts.periodSeconds * 1000 - Date.now()));
      });
  };
  return {
    start() {
      if (opts.periodSeconds > 0) tick();
    },
    async stop() {
      stopped = true;
      if (timer) clearTimeout(timer);
      await running;
    },
  };
}
