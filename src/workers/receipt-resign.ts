// The re-signing sweep (every SVC_RECEIPT_RESIGN_SECONDS, and once at start):
// signs again, batch after batch, the receipts of revoked receipt keys that a
// revocation left (a process stopped midway, or more than the revocation's own
// request re-signed: src/domain/money/receipts.ts resignRevokedReceipts).
// Several processes may run it at once: batches of one key run one after the
// other, each resuming at the cursor the last one committed.
import type { Sql } from "../db/index.js";
import { resignRevokedReceipts } from "../domain/money/receipts.js";
import type { Logger } from "../log.js";
import { failureLevel } from "../errors.js";
import type { Worker } from "./worker.js";

export function receiptResignWorker(opts: { sql: Sql; log: Logger; periodSeconds: number }): Worker {
  let timer: NodeJS.Timeout | undefined;
  let running: Promise<unknown> | undefined;
  let stopping = false;
  const tick = () => {
    if (running) return;
    // Between batches it checks whether the process is stopping: shutdown waits for one batch at most.
    running = resignUntilStopped()
      .then((r) => {
        if (r.resigned) opts.log.info(r, "receipts of revoked keys signed again");
      })
      .catch((err) => opts.log[failureLevel(err)]({ err }, "receipt re-signing sweep failed"))
      .finally(() => (running = undefined));
  };
  async function resignUntilStopped(): Promise<{ resigned: number; done: boolean }> {
    let resigned = 0;
    while (!stopping) {
      const r = await resignRevokedReceipts(opts.sql, { until: Date.now() + 1000 });
      resigned += r.resigned;
      if (r.done) return { resigned, done: true };
    }
    return { resigned, done: false };
  }
  return {
    start() {
      if (opts.periodSeconds <= 0) return;
      tick();
      timer = setInterval(tick, opts.periodSeconds * 1000);
      timer.unref();
    },
    async stop() {
      stopping = true;
      if (timer) clearInterval(timer);
      await running;
    },
  };
}
