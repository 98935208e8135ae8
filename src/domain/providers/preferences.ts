// Provider preferences: run mode, schedule window and hardware limits, with
// the documented bounds, and the run-window rule the scheduler applies.
import type { Db } from "../../db/index.js";
import { badRequest } from "../../errors.js";
import { checkEnum, checkRange } from "../shared/validate.js";
import { HHMM } from "../../shared/run-window.js";

export const RUN_MODES = ["always-on", "manual", "scheduled"] as const;
export type RunMode = (typeof RUN_MODES)[number];

/** Spec bounds (Limits: "Provider preference bounds"). */
export const PREFERENCE_BOUNDS = {
  gpu_usage_cap_pct: { min: 0, max: 100, integer: true },
  vram_reserve_gb: { min: 0, max: 16, integer: false },
  temp_limit_c: { min: 50, max: 100, integer: true },
} as const;

/**
 * SQL form of withinRunWindow for a providers row alias, e.g.
 * `WHERE ${withinRunWindowSql(sql, "p")}`; evaluated at the statement's now().
 */
export function withinRunWindowSql(db: Db, alias = "providers") {
  const a = db(alias);
  // The function is not inlined (a SQL function with a subquery: ~10 µs a row);
  // the test in front answers for every provider that is not scheduled.
  return db`(${a}.run_mode IS DISTINCT FROM 'scheduled'
    OR svc_within_run_window(${a}.run_mode, ${a}.scheduled_start, ${a}.scheduled_end, now()))`;
}

export interface PreferencesInput {
  runMode?: string;
  scheduledStart?: string;
  scheduledEnd?: string;
  gpuUsageCapPct?: number;
  vramReserveGb?: number;
  tempLimitC?: number;
}

export interface Preferences {
  run_mode: RunMode;
  scheduled_start: string | null;
  scheduled_end: string | null;
  gpu_usage_cap_pct: number;
  vram_reserve_gb: number;
  temp_limit_c: number;
}

/** The preferences as messages carry them (ProviderPreferences, and within DaemonSettings and Provider): a window end not set is absent. */
export interface PreferenceFields {
  runMode: string;
  scheduledStart?: string;
  scheduledEnd?: string;
  gpuUsageCapPct: number;
  vramReserveGb: number;
  tempLimitC: number;
}

export function preferenceFields(p: Omit<Preferences, "run_mode"> & { run_mode: string }): PreferenceFields {
  return {
    runMode: p.run_mode,
    scheduledStart: p.scheduled_start ?? undefined,
    scheduledEnd: p.scheduled_end ?? undefined,
    gpuUsageCapPct: p.gpu_usage_cap_pct,
    vramReserveGb: p.vram_reserve_gb,
    tempLimitC: p.temp_limit_c,
  };
}

function bounded(value: number | undefined, field: keyof typeof PREFERENCE_BOUNDS): number | undefined {
  if (value === undefined) return undefined;
  const b = PREFERENCE_BOUNDS[field];
  return checkRange(value, b.min, b.max, field, b.integer);
}

function hhmm(value: string | undefined, field: string): string | null | undefined {
  if (value === undefined) return undefined;
  const v = value.trim();
  if (v === "") return null;
  if (!HHMM.test(v)) throw badRequest(`${field} must be a time of day HH:MM (UTC, 00:00-23:59)`);
  return v;
}

/**
 * Applies the given preferences (omitted ones keep their value) and returns
 * the stored result. A scheduled run mode needs both window ends, given now
 * or stored before; 400 names the field otherwise.
 */
export async function setPreferences(db: Db, providerId: number, input: PreferencesInput): Promise<Preferences> {
  const runMode = input.runMode === undefined ? undefined : checkEnum(input.runMode.trim(), RUN_MODES, "run_mode");
  const start = hhmm(input.scheduledStart, "scheduled_start");
  const end = hhmm(input.scheduledEnd, "scheduled_end");
  const cap = bounded(input.gpuUsageCapPct, "gpu_usage_cap_pct");
  const reserve = bounded(input.vramReserveGb, "vram_reserve_gb");
  const temp = bounded(input.tempLimitC, "temp_limit_c");

  const [current] = await db<Preferences[]>`
    SELECT run_mode, scheduled_start, scheduled_end, gpu_usage_cap_pct, vram_reserve_gb, temp_limit_c
    FROM providers WHERE id = ${providerId} FOR NO KEY UPDATE`;
  const next: Preferences = {
    run_mode: runMode ?? current.run_mode,
    scheduled_start: start === undefined ? current.scheduled_start : start,
    scheduled_end: end === undefined ? current.scheduled_end : end,
    gpu_usage_cap_pct: cap ?? current.gpu_usage_cap_pct,
    vram_reserve_gb: reserve ?? current.vram_reserve_gb,
    temp_limit_c: temp ?? current.temp_limit_c,
  };
  if (next.run_mode === "scheduled") {
    const missing = [!next.scheduled_start && "scheduled_start", !next.scheduled_end && "scheduled_end"].filter(Boolean);
    if (missing.length) throw badRequest(`run_mode scheduled needs ${missing.join(" and ")} (HH:MM, UTC)`);
    if (next.scheduled_start === next.scheduled_end) throw badRequest("scheduled_end must differ from scheduled_start");
  }
  await db`
    UPDATE providers SET run_mode = ${next.run_mode}, scheduled_start = ${next.scheduled_start},
      scheduled_end = ${next.scheduled_end}, gpu_usage_cap_pct = ${next.gpu_usage_cap_pct},
      vram_reserve_gb = ${next.vram_reserve_gb}, temp_limit_c = ${next.temp_limit_c}, updated_at = now()
    WHERE id = ${providerId}`;
  return next;
}
