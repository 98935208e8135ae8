// The two statements that write heartbeats (src/domain/providers/heartbeat.ts),
// both set-based over one JSON array of beats:
// - writeTelemetryRows: coalesced beats that change no state (the telemetry
//   flush); a provider marked offline behind the cache's back is moved online.
// - writeStateRows: beats that change state (first beat, offline -> online),
//   grouped by src/domain/providers/state-beats.ts and answered after commit.
// Both lock the provider rows FOR NO KEY UPDATE in id order: FOR UPDATE would
// also wait for the key-share locks of rows that reference the provider (a
// job's hold, an event), queued in front of that transaction's own update of
// the provider. A beat that moves a provider online clears its load row's
// `away` in the same statement (a trigger on providers, migration 060; after
// the provider's row, the order every writer of both takes), so dispatch
// offers it work once the beat commits; a paused provider's stays set, and a
// beat that changes no state does not touch the load row.
import type { Sql } from "../../db/index.js";
import { REPUTATION_REFRESH_SECONDS } from "./reputation.js";
import { LIVE_WINDOW_SECONDS } from "../shared/liveness.js";
import { withinRunWindowSql } from "./preferences.js";
import { verifiesTasksSql } from "./versions.js";

/** A heartbeat after lenient parsing; undefined members were not reported. */
export interface HeartbeatInput {
  /** The gpu_status object (plus daemon_uptime_s) as JSON text, serialised once. */
  telemetryJson?: string;
  daemonVersion?: string;
  gpuVramMib?: number;
  gpuCount?: number;
  computeCapability?: string;
  cudaVersion?: string;
  driverVersion?: string;
  cachedModels?: string[];
  providerIp?: string;
  hostname?: string;
  /** resource_spec as JSON text. */
  resourceSpecJson?: string;
  /**
   * The job types the daemon declared it runs (migration 049). Every beat states it: [] when it
   * declared none (stored as NULL: offered every type), undefined only for inputs that say nothing of it.
   */
  supportedJobTypes?: string[];
}

/**
 * One provider's beat(s) in a batch: the first and last beat's times and the merged input. The
 * times are this process's performance.now(): a write sends only their age, and stores the
 * database's now() less it (beatsSql).
 */
export interface BeatSpan {
  firstTs: number;
  lastTs: number;
  input: HeartbeatInput;
}

/** Field-wise merge: a later beat wins, but what it left out keeps the earlier value. */
export function mergeInput(a: HeartbeatInput, b: HeartbeatInput): HeartbeatInput {
  const out: HeartbeatInput = { ...a };
  for (const [k, v] of Object.entries(b)) if (v !== undefined) (out as Record<string, unknown>)[k] = v;
  return out;
}

const str = (v: string | undefined) => (v === undefined ? "null" : JSON.stringify(v));
const int = (v: number | undefined) => (v === undefined ? "null" : String(v));

/**
 * How much older than the stored last_heartbeat a beat may look and still be written. A beat's
 * time is the statement's now() less its age, so it runs late by however long its statement
 * waited to start: a later flush of this process (flushes run one at a time, in order) can come
 * out earlier than the beat it follows. A beat older by more than this (a batch retried long
 * after, another process's late one) writes nothing; last_heartbeat never moves back.
 */
export const BEAT_TIME_SLACK_SECONDS = 5;

/** A beat's age in whole milliseconds at `at` (never negative). */
const ageMs = (at: number, ts: number) => (ts >= at ? 0 : Math.round(at - ts));

/**
 * One batch as a single JSON array for json_to_recordset: built by string
 * concatenation so the telemetry, already JSON text, is not serialised again
 * (cheaper than postgres.js array parameters, one per column). Each beat's
 * time goes as its age now (milliseconds), not as a time of this host's clock.
 */
function batchJson(entries: [number, BeatSpan][]): string {
  const at = performance.now();
  const parts: string[] = [];
  for (const [id, p] of entries) {
    const i = p.input;
    parts.push(
      `{"id":${id},"first_ago":${ageMs(at, p.firstTs)},"last_ago":${ageMs(at, p.lastTs)},` +
        `"dv":${str(i.daemonVersion)},"vram":${int(i.gpuVramMib)},"cnt":${int(i.gpuCount)},"cc":${str(i.computeCapability)},` +
        `"cuda":${str(i.cudaVersion)},"driver":${str(i.driverVersion)},"tel":${i.telemetryJson ?? "null"},` +
        `"cached":${i.cachedModels ? JSON.stringify(i.cachedModels) : "null"},"ip":${str(i.providerIp)},` +
        `"host":${str(i.hostname)},"rs":${i.resourceSpecJson ?? "null"},"jt":${i.supportedJobTypes ? JSON.stringify(i.supportedJobTypes) : "null"}}`,
    );
  }
  return `[${parts.join(",")}]`;
}

/**
 * The batch's rows as relation `v`. first_ts and last_ts are the database's clock: now() less
 * each beat's age when the batch was built. Every rule that compares them (liveness, the live
 * window, coverage, the ordering of beats) reads now(), so a skew between this host's clock and
 * the database's moves none of them; only the time the statement took to start is added.
 */
const beatsSql = (db: Sql, entries: [number, BeatSpan][]) => db`
  SELECT id, now() - first_ago * interval '1 millisecond' AS first_ts, now() - last_ago * interval '1 millisecond' AS last_ts,
         dv, vram, cnt, cc, cuda, driver, tel, cached, ip, host, rs, jt
  FROM json_to_recordset(${batchJson(entries)}::text::json) AS b(
    id bigint, first_ago float8, last_ago float8, dv text, vram bigint, cnt int, cc text, cuda text,
    driver text, tel json, cached text[], ip text, host text, rs jsonb, jt text[])`;

const reputationDueSql = (db: Sql) =>
  db`(p.reputation_at IS NULL OR p.reputation_at < now() - make_interval(secs => ${REPUTATION_REFRESH_SECONDS})) AS reputation_due`;

/**
 * The telemetry columns of provider `p` from beat `v` (unreported ones keep their value). A
 * provider approved before it reported its hardware has it approved as its first report states it
 * (migration 047); later reports of more wait for an admin. The declared job types ride on this
 * update, no statement of their own: each beat states them, so a daemon replaced by one that
 * declares none (an older version) is offered every type again.
 */
const telemetrySet = (db: Sql) => db`
  approved_gpu_count = CASE WHEN p.approval_status = 'approved' AND p.approved_gpu_count IS NULL AND v.cnt IS NOT NULL
                            THEN greatest(v.cnt, 1) ELSE p.approved_gpu_count END,
  approved_vram_mib = CASE WHEN p.approval_status = 'approved' AND p.approved_vram_mib IS NULL AND v.vram IS NOT NULL
                           THEN v.vram ELSE p.approved_vram_mib END,
  daemon_version = coalesce(v.dv, p.daemon_version),
  gpu_vram_mib = coalesce(v.vram, p.gpu_vram_mib),
  gpu_count = coalesce(v.cnt, p.gpu_count),
  gpu_compute_capability = coalesce(v.cc, p.gpu_compute_capability),
  gpu_cuda_version = coalesce(v.cuda, p.gpu_cuda_version),
  gpu_driver_version = coalesce(v.driver, p.gpu_driver_version),
  gpu_telemetry = coalesce(v.tel, p.gpu_telemetry),
  cached_models = coalesce(v.cached, p.cached_models),
  preload_model = CASE WHEN p.preload_model = ANY(v.cached) THEN NULL ELSE p.preload_model END,
  provider_ip = coalesce(v.ip, p.provider_ip),
  hostname = coalesce(v.host, p.hostname),
  resource_spec = coalesce(v.rs, p.resource_spec),
  supported_job_types = CASE WHEN v.jt IS NULL THEN p.supported_job_types WHEN cardinality(v.jt) = 0 THEN NULL ELSE v.jt END`;

/**
 * Uptime coverage accumulates on the provider row for the UTC hour of its
 * latest beat (no extra row written per beat); `credit` is
 * svc_heartbeat_credit of the beat(s) against the previous last_heartbeat
 * (SET expressions see the row before the update). A beat in a later hour
 * starts a new accumulator; finishedHours() files the old one. The beats of a
 * provider that takes no work credit nothing: paused, or scheduled and outside
 * its run window (it is heard, but placement skips it), since uptime is a
 * third of the reliability score that placement prefers; nor do the beats of a
 * daemon that cannot verify this server's tasks (versions.ts verifiesTasksSql:
 * another task-signing key pinned, or below the minimum version), which
 * dispatch gives no jobs.
 */
function coverageSet(db: Sql, hour: ReturnType<Sql>) {
  const credit = db`(CASE WHEN p.is_paused OR NOT ${withinRunWindowSql(db, "p")} OR NOT ${verifiesTasksSql(db, "p")} THEN 0
    ELSE svc_heartbeat_credit(p.last_heartbeat, v.first_ts, v.last_ts) END)`;
  return db`
    uptime_hour_seconds = CASE WHEN p.uptime_hour = ${hour} THEN least(3600, p.uptime_hour_seconds + ${credit})
                               ELSE least(3600, ${credit}) END,
    uptime_hour = ${hour}`;
}

/** Files each finished hour (`rows`: id, old_hour, old_seconds, new_hour) into provider_uptime. */
function finishedHours(db: Sql, rows: ReturnType<Sql>) {
  return db`
    INSERT INTO provider_uptime (provider_id, hour, covered_seconds)
    SELECT id, old_hour, old_seconds FROM (${rows}) r
    WHERE old_hour < new_hour AND old_seconds > 0
    ON CONFLICT (provider_id, hour) DO UPDATE
      SET covered_seconds = least(3600, provider_uptime.covered_seconds + excluded.covered_seconds)`;
}

export interface TelemetryRow {
  id: number;
  old_status: string;
  new_status: string;
  reputation_due: boolean;
}

/**
 * Writes coalesced steady beats (ids ascending, each once). Rows of providers
 * no longer approved or now suspended are left alone, and a beat older than
 * the stored last_heartbeat by more than BEAT_TIME_SLACK_SECONDS writes nothing. Returns the rows written that the
 * caller acts on: a provider the write moved online, or whose reputation is due
 * (every other row would be sent back and parsed for nothing: most of a batch).
 */
export function writeTelemetryRows(sql: Sql, entries: [number, BeatSpan][]): Promise<TelemetryRow[]> {
  return sql<TelemetryRow[]>`
    WITH v AS (${beatsSql(sql, entries)}
    ), prev AS MATERIALIZED (
      SELECT p.id, p.status, p.last_heartbeat, p.uptime_hour, p.uptime_hour_seconds, ${reputationDueSql(sql)}
      FROM providers p JOIN v ON v.id = p.id
      WHERE p.approval_status = 'approved' AND p.status <> 'suspended'
      ORDER BY p.id FOR NO KEY UPDATE OF p
    ), upd AS (
      UPDATE providers p SET
        ${coverageSet(sql, sql`date_trunc('hour', greatest(p.last_heartbeat, v.last_ts), 'UTC')`)},
        last_heartbeat = greatest(p.last_heartbeat, v.last_ts),
        first_heartbeat_at = coalesce(p.first_heartbeat_at, v.first_ts),
        status = CASE WHEN p.status IN ('offline', 'registered', 'connected') AND NOT p.is_paused THEN 'online' ELSE p.status END,
        status_since = CASE WHEN p.status IN ('offline', 'registered', 'connected') AND NOT p.is_paused THEN now() ELSE p.status_since END,
        ${telemetrySet(sql)},
        updated_at = now()
      FROM v JOIN prev ON prev.id = v.id
      WHERE p.id = v.id
        AND (prev.last_heartbeat IS NULL OR v.last_ts > prev.last_heartbeat - make_interval(secs => ${BEAT_TIME_SLACK_SECONDS}))
      RETURNING p.id, prev.status AS old_status, p.status AS new_status, prev.reputation_due,
                prev.uptime_hour AS old_hour, prev.uptime_hour_seconds AS old_seconds, p.uptime_hour AS new_hour
    ), done AS (
      ${finishedHours(sql, sql`SELECT id, old_hour, old_seconds, new_hour FROM upd`)}
    )
    SELECT id, old_status, new_status, reputation_due FROM upd
    WHERE (new_status = 'online' AND old_status <> 'online') OR reputation_due`;
}

/** What a state-changing beat found (status, approval, reasons) and left (new_*: null when refused). */
export interface StateRow {
  id: number;
  status: string;
  approval_status: string;
  rejection_reason: string | null;
  suspended_reason: string | null;
  reputation_due: boolean;
  /** Heard within the live window before this beat (else it was not live, whatever its status said). */
  was_heard: boolean;
  new_status: string | null;
  new_paused: boolean | null;
  new_preload: string | null;
  new_daemon_version: string | null;
  new_job_types: string[] | null;
}

/**
 * Writes state-changing beats (ids ascending, each once) in one statement, so
 * they commit as it ends: an approved provider that is not suspended moves
 * online (paused when paused) with its telemetry and uptime coverage. One row
 * comes back per provider locked; a provider that does not exist, or (with
 * `skipLocked`) whose row another transaction holds, has none.
 */
export function writeStateRows(sql: Sql, entries: [number, BeatSpan][], skipLocked: boolean): Promise<StateRow[]> {
  return sql<StateRow[]>`
    WITH v AS (${beatsSql(sql, entries)}
    ), prev AS MATERIALIZED (
      SELECT p.id, p.status, p.approval_status, p.rejection_reason, p.suspended_reason,
             p.uptime_hour, p.uptime_hour_seconds, ${reputationDueSql(sql)},
             coalesce(p.last_heartbeat > now() - make_interval(secs => ${LIVE_WINDOW_SECONDS}), false) AS was_heard
      FROM providers p JOIN v ON v.id = p.id
      ORDER BY p.id FOR NO KEY UPDATE OF p ${skipLocked ? sql`SKIP LOCKED` : sql``}
    ), upd AS (
      UPDATE providers p SET
        ${coverageSet(sql, sql`date_trunc('hour', greatest(p.last_heartbeat, v.last_ts), 'UTC')`)},
        last_heartbeat = greatest(p.last_heartbeat, v.last_ts),
        first_heartbeat_at = coalesce(p.first_heartbeat_at, v.first_ts),
        status = CASE WHEN p.is_paused THEN 'paused' ELSE 'online' END,
        status_since = CASE WHEN p.status = (CASE WHEN p.is_paused THEN 'paused' ELSE 'online' END) THEN p.status_since ELSE now() END,
        ${telemetrySet(sql)},
        updated_at = now()
      FROM v JOIN prev ON prev.id = v.id
      WHERE p.id = v.id AND prev.approval_status = 'approved' AND prev.status <> 'suspended'
      RETURNING p.id, p.status, p.is_paused, p.preload_model, p.daemon_version, p.supported_job_types, p.uptime_hour
    ), done AS (
      ${finishedHours(sql, sql`SELECT prev.id, prev.uptime_hour AS old_hour, prev.uptime_hour_seconds AS old_seconds, upd.uptime_hour AS new_hour FROM prev JOIN upd ON upd.id = prev.id`)}
    )
    SELECT prev.id, prev.status, prev.approval_status, prev.rejection_reason, prev.suspended_reason, prev.reputation_due, prev.was_heard,
           upd.status AS new_status, upd.is_paused AS new_paused, upd.preload_model AS new_preload,
           upd.daemon_version AS new_daemon_version, upd.supported_job_types AS new_job_types
    FROM prev LEFT JOIN upd ON upd.id = prev.id`;
}
