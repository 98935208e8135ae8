// The retention sweep (every SVC_RETENTION_SWEEP_SECONDS, and once at start):
// deletes the uptime hours and attempt days the reputation figures no longer
// read (src/domain/providers/retention.ts). Several processes may run it at
// once: each skips the rows another is deleting.
import { deleteExpiredReputationRows } from "../domain/providers/retention.js";
import type { HeartbeatDeps as Deps } from "../domain/providers/heartbeat.js";
import { failureLevel } from "../errors.js";
import type { Worker } from "./worker.js";

export function retentionWorker(deps: Deps): Worker {
  let timer: NodeJS.Timeout | undefined;
  let running: Promise<unknown> | undefined;
  const tick = () => {
    if (running) return;
    running = deleteExpiredReputationRows(deps.sql)
      .then((r) => {
        if (r.uptimeHours || r.attemptDays) deps.log.info(r, "expired uptime hours and attempt days deleted");
      })
      .catch((err) => deps.log[failureLevel(err)]({ err }, "retention sweep failed"))
      .finally(() => (running = undefined));
  };
  return {
    start() {
      const seconds = deps.config.retentionSweepSeconds;
      if (seconds <= 0) return;
      tick();
      timer = setInterval(tick, seconds * 1000);
      timer.unref();
    },
    async stop() {
      if (timer) clearInterval(timer);
      await running;
    },
  };
}
