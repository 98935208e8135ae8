// The platform's own pulse: whether it could hear providers. Every server
// process writes the pulse every PULSE_SECONDS; a gap of more than
// PULSE_GAP_SECONDS means no process could (the database away, every process
// down), and the platform counts as up again only from the next pulse. A
// provider's silence (no heartbeat within the live window), and a polled job's
// missing pickup, count against the provider only once the platform has been
// up for that whole window: after an outage every provider gets one window to
// be heard again, instead of all their jobs being re-queued as their fault.
import type { Db } from "../../db/index.js";

export const PULSE_SECONDS = 5;
export const PULSE_GAP_SECONDS = 20;

/** Writes the pulse; returns how long the platform has been up (seconds). */
export async function pulse(db: Db): Promise<number> {
  const [row] = await db<{ up_seconds: number }[]>`
    INSERT INTO platform_pulse (id, last_at, up_since) VALUES (1, now(), now())
    ON CONFLICT (id) DO UPDATE SET
      up_since = CASE WHEN platform_pulse.last_at < now() - make_interval(secs => ${PULSE_GAP_SECONDS}) THEN now() ELSE platform_pulse.up_since END,
      last_at = now()
    RETURNING CASE WHEN isfinite(up_since) THEN extract(epoch FROM now() - up_since)::float8 ELSE 'Infinity'::float8 END AS up_seconds`;
  return row.up_seconds;
}

/**
 * SQL condition: the platform has been up (pulsing) for at least `seconds`. The pulse written
 * last must be recent too: a platform whose pulse stopped is not up, whatever it was before.
 */
export function upForSql(db: Db, seconds: number) {
  return db`EXISTS (SELECT 1 FROM platform_pulse
    WHERE id = 1 AND up_since <= now() - make_interval(secs => ${seconds}) AND last_at > now() - make_interval(secs => ${PULSE_GAP_SECONDS}))`;
}
