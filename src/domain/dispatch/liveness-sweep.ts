// Moving silent providers offline. A provider is live while its last
// heartbeat is within LIVE_WINDOW_SECONDS; the sweep turns `online` (and a
// `connected` that got one window to beat since it was resumed) into
// `offline`, announces it to every process's heartbeat cache, and returns the
// ids so their work can be re-queued. Not within a live window of an outage of
// the platform's own (platform-pulse.ts): the providers get that window to be heard.
// Going offline marks the provider's load row away in the same statement (a
// trigger on providers, migration 060), waiting for an assignment to it in
// flight: that job is then on the provider when its work is re-queued, and an
// assignment that locks the row later sees it away, whatever its snapshot said.
import type { Sql } from "../../db/index.js";
import { providersChanged } from "../accounts/invalidation.js";
import { LIVE_WINDOW_SECONDS } from "../shared/liveness.js";
import { upForSql } from "../shared/platform-pulse.js";

const SWEEP_BATCH = 1000;

/**
 * One pass; returns the providers it moved offline. Rows a heartbeat holds
 * locked right now are skipped (they are being heard from). Safe to run in
 * several processes at once: each row moves once.
 */
export async function markSilentProvidersOffline(sql: Sql): Promise<number[]> {
  const moved: number[] = [];
  for (;;) {
    const ids = await sql.begin(async (tx) => {
      const rows = await tx<{ id: number }[]>`
        WITH silent AS (
          SELECT id FROM providers
          WHERE status IN ('online', 'connected')
            AND (last_heartbeat IS NULL OR last_heartbeat < now() - make_interval(secs => ${LIVE_WINDOW_SECONDS}))
            -- Silent while the platform could hear it (no outage of ours within the window).
            AND ${upForSql(tx, LIVE_WINDOW_SECONDS)}
            AND (status = 'online' OR status_since < now() - make_interval(secs => ${LIVE_WINDOW_SECONDS}))
          ORDER BY id
          LIMIT ${SWEEP_BATCH}
          FOR NO KEY UPDATE SKIP LOCKED
        )
        UPDATE providers p SET status = 'offline', status_since = now(), updated_at = now()
        FROM silent WHERE p.id = silent.id
        RETURNING p.id`;
      const batch = rows.map((r) => r.id);
      await providersChanged(sql, tx, batch);
      return batch;
    });
    moved.push(...ids);
    if (ids.length < SWEEP_BATCH) return moved;
  }
}
