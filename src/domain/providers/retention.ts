// What the reputation figures no longer read is deleted: provider_uptime keeps
// a row per provider and hour, provider_attempt_days one per provider and day,
// so without this both grow with the fleet times its age (100,000 providers
// file 2.4 million uptime hours a day) while the score reads the last 24 hours
// and the last 30 days.
import type { Db } from "../../db/index.js";
import { deleteInBatches } from "../shared/batched-delete.js";
import { SUCCESS_WINDOW_DAYS, UPTIME_WINDOW_HOURS } from "./reputation.js";

/** Filed uptime hours are kept this long: the window, and a week for looking back at an outage. */
export const UPTIME_KEPT_HOURS = UPTIME_WINDOW_HOURS + 7 * 24;
/** Attempt days are kept while the success rate may read them, and one day more. */
export const ATTEMPT_DAYS_KEPT = SUCCESS_WINDOW_DAYS + 1;

export interface RetentionResult {
  uptimeHours: number;
  attemptDays: number;
}

export async function deleteExpiredReputationRows(db: Db): Promise<RetentionResult> {
  // provider_uptime has an index on hour; provider_attempt_days, bounded by this to about 31 rows a
  // provider, is read whole (once an hour). A batch a statement, so heartbeats filing hours never wait long.
  const uptimeHours = await deleteInBatches(async (limit) => {
    const r = await db`
      DELETE FROM provider_uptime WHERE ctid = ANY(ARRAY(
        SELECT ctid FROM provider_uptime
        WHERE hour < date_trunc('hour', now(), 'UTC') - make_interval(hours => ${UPTIME_KEPT_HOURS})
        LIMIT ${limit} FOR UPDATE SKIP LOCKED))`;
    return r.count;
  });
  const attemptDays = await deleteInBatches(async (limit) => {
    const r = await db`
      DELETE FROM provider_attempt_days WHERE ctid = ANY(ARRAY(
        SELECT ctid FROM provider_attempt_days
        WHERE day <= (now() AT TIME ZONE 'UTC')::date - ${ATTEMPT_DAYS_KEPT}::int
        LIMIT ${limit} FOR UPDATE SKIP LOCKED))`;
    return r.count;
  });
  return { uptimeHours, attemptDays };
}
