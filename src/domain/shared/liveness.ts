// Liveness constants (spec: heartbeat every 30 s; live within 120 s).
export const HEARTBEAT_INTERVAL_SECONDS = 30;
export const LIVE_WINDOW_SECONDS = 120;

/** Heard within the live window before `now`: the database's clock, which stored the heartbeat (no default: never this host's). */
export function isLive(lastHeartbeat: Date | null, now: Date): boolean {
  return lastHeartbeat !== null && now.getTime() - lastHeartbeat.getTime() <= LIVE_WINDOW_SECONDS * 1000;
}
