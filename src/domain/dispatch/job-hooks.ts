// The two calls the provider side makes into the jobs issue's dispatcher
// (src/domain/dispatch/dispatch.ts): re-queue the work of a provider that went silent
// or was suspended, and hand queued work to a provider that became available.
// Neither may fail the provider-side operation that triggered it (the state
// change is already committed); errors are logged, and the job worker's own
// sweep is the safety net.
import type { Sql } from "../../db/index.js";
import type { Logger } from "../../log.js";
import { dispatchForProvider, hasQueuedJobs, requeueJobsOfProvider, type ProviderRemoval } from "./dispatch.js";
import { failureLevel } from "../../errors.js";

export async function requeueWorkOf(sql: Sql, log: Logger, providerId: number, removal: ProviderRemoval, reason: string): Promise<void> {
  try {
    await requeueJobsOfProvider(sql, providerId, removal, reason);
  } catch (err) {
    log[failureLevel(err)]({ err, providerId }, "re-queueing a provider's jobs failed");
  }
}

export async function offerWorkTo(sql: Sql, log: Logger, providerId: number): Promise<void> {
  try {
    await dispatchForProvider(sql, providerId);
  } catch (err) {
    log[failureLevel(err)]({ err, providerId }, "dispatching to a provider failed");
  }
}

/**
 * offerWorkTo for providers that came online together (a fleet coming back
 * after an outage): one index read when no job is queued, and none of the
 * rest once the queue is empty.
 */
export async function offerWorkToEach(sql: Sql, log: Logger, providerIds: number[]): Promise<void> {
  for (const id of providerIds) {
    try {
      if (!(await hasQueuedJobs(sql))) return;
    } catch (err) {
      log[failureLevel(err)]({ err, providers: providerIds.length }, "dispatching to providers failed");
      return;
    }
    await offerWorkTo(sql, log, id);
  }
}
