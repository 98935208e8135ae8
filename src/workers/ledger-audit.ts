// The periodic ledger audit (src/domain/money/ledger-audit.ts): every process
// ticks every SVC_LEDGER_AUDIT_SECONDS, one wins the advisory lock and runs it
// when due (a full run once per SVC_LEDGER_AUDIT_FULL_SECONDS, incremental ones
// between); its figures are kept in ledger_audits, which every process's
// /metrics reads (svc_ledger_drift_halala, svc_ledger_discrepancies).
import type { Sql } from "../db/index.js";
import { runScheduledLedgerAudit } from "../domain/money/ledger-audit.js";
import type { Logger } from "../log.js";
import type { Worker } from "./worker.js";
import { failureLevel } from "../errors.js";

export function ledgerAuditWorker(opts: { sql: Sql; log: Logger; periodSeconds: number; fullSeconds: number }): Worker {
  let first: NodeJS.Timeout | undefined;
  let timer: NodeJS.Timeout | undefined;
  let running: Promise<unknown> | undefined;
  const tick = () => {
    if (running) return;
    running = runScheduledLedgerAudit(opts.sql, opts.periodSeconds, opts.fullSeconds)
      .then((r) => {
        if (!r) return;
        const log = r.discrepancyCount > 0 ? opts.log.error.bind(opts.log) : opts.log.info.bind(opts.log);
        log({ ms: r.ms, mode: r.mode, fromEntryId: r.fromEntryId, toEntryId: r.toEntryId, entries: r.entries, driftHalala: r.driftHalala, discrepancies: r.discrepancyCount }, "ledger audit");
      })
      .catch((err) => opts.log[failureLevel(err)]({ err }, "ledger audit failed"))
      .finally(() => (running = undefined));
  };
  return {
    start() {
      if (opts.periodSeconds <= 0) return;
      // The first run soon after start (once due), then every period.
      first = setTimeout(tick, Math.min(opts.periodSeconds, 30) * 1000);
      timer = setInterval(tick, opts.periodSeconds * 1000);
    },
    async stop() {
      clearTimeout(first);
      if (timer) clearInterval(timer);
      await running;
    },
  };
}
