// The retention sweep (every SVC_RETENTION_SWEEP_SECONDS, and once at start):
// deletes the uptime hours and attempt days the reputation figures no longer
// read (src/domain/providers/retention.ts) and the login codes the sign-in
// limits no longer count (src/domain/accounts/login.ts) and the Idempotency-Key
// rows past their window (src/domain/money/idempotency.ts), and the daemon
// events and finished webhook deliveries past the days the operator keeps them
// (SVC_DAEMON_EVENTS_KEPT_DAYS, SVC_WEBHOOKS_KEPT_DAYS). Several processes may
// run it at once: each skips the rows another is deleting.
import { deleteSpentLoginCodes } from "../domain/accounts/login.js";
import { deleteExpiredKeys } from "../domain/money/idempotency.js";
import { deleteExpiredReputationRows } from "../domain/providers/retention.js";
import { deleteExpiredDaemonEvents } from "../domain/providers/daemon-events.js";
import { deleteFinishedWebhooks } from "../domain/notify/webhooks.js";
import type { HeartbeatDeps as Deps } from "../domain/providers/heartbeat.js";
import { failureLevel } from "../errors.js";
import type { Worker } from "./worker.js";

export function retentionWorker(deps: Deps): Worker {
  let timer: NodeJS.Timeout | undefined;
  let running: Promise<unknown> | undefined;
  const failed = (what: string) => (err: unknown) => deps.log[failureLevel(err)]({ err }, `retention sweep of ${what} failed`);
  // Each deletion on its own: one failing leaves the other to run.
  const sweep = async () => {
    await deleteExpiredReputationRows(deps.sql).then((r) => {
      if (r.uptimeHours || r.attemptDays) deps.log.info(r, "expired uptime hours and attempt days deleted");
    }, failed("uptime hours and attempt days"));
    await deleteSpentLoginCodes(deps.sql).then((loginCodes) => {
      if (loginCodes) deps.log.info({ loginCodes }, "spent login codes deleted");
    }, failed("login codes"));
    await deleteExpiredKeys(deps.sql).then((idempotencyKeys) => {
      if (idempotencyKeys) deps.log.info({ idempotencyKeys }, "expired idempotency keys deleted");
    }, failed("idempotency keys"));
    await deleteExpiredDaemonEvents(deps.sql, deps.config.daemonEventsKeptDays).then((daemonEvents) => {
      if (daemonEvents) deps.log.info({ daemonEvents }, "expired daemon events deleted");
    }, failed("daemon events"));
    await deleteFinishedWebhooks(deps.sql, deps.config.webhooksKeptDays).then((webhookDeliveries) => {
      if (webhookDeliveries) deps.log.info({ webhookDeliveries }, "expired webhook deliveries deleted");
    }, failed("webhook deliveries"));
  };
  const tick = () => {
    if (running) return;
    running = sweep().finally(() => (running = undefined));
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
