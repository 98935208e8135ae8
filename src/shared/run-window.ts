// The provider run-window rule, shared by the server (dispatch, in SQL as
// svc_within_run_window, migration 003) and the reference daemon, which
// declines work outside its window.
export const HHMM = /^([01]\d|2[0-3]):([0-5]\d)$/;

function minutesOf(hhmm: string): number {
  const m = HHMM.exec(hhmm)!;
  return Number(m[1]) * 60 + Number(m[2]);
}

/**
 * Whether a provider may take new jobs at `now` by its run mode:
 * always-on and manual always (manual providers stop work with pause);
 * scheduled only inside [start, end) in UTC, a window that crosses midnight
 * when end < start (22:00-06:00). A scheduled provider without a valid window
 * is outside it. Same rule as the SQL function svc_within_run_window
 * (migration 003), which the dispatcher can use in a WHERE clause.
 */
export function withinRunWindow(runMode: string, start: string | null | undefined, end: string | null | undefined, now: Date = new Date()): boolean {
  if (runMode !== "scheduled") return true;
  if (!start || !end || !HHMM.test(start) || !HHMM.test(end)) return false;
  const s = minutesOf(start);
  const e = minutesOf(end);
  const t = now.getUTCHours() * 60 + now.getUTCMinutes();
  if (s === e) return false;
  return s < e ? t >= s && t < e : t >= s || t < e;
}
