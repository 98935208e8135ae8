// Liveness constants (spec: heartbeat every 30 s; live within 120 s).
export const HEARTBEAT_INTERVAL_SECONDS = 30;
export const LIVE_WINDOW_SECONDS = 120;

export function isLive(lastHeartbeat: Date | null, now = new Date()): boolean {
  return lastHeartbeat !== null && now.getTime() - lastHeartbeat.getTime() <= LIVE_WINDOW_SECONDS * 1000;
}
