// The daemon event log: what daemons report (crashes, errors, job lifecycle),
// stored per provider and listed for admins.
import { type JsonObject, type MessageInitShape } from "@bufbuild/protobuf";
import type { DaemonEventRecordSchema } from "../../../gen/svc/v1/admin_pb.js";
import { DaemonEventRequestSchema, type DaemonEventRequest, type DaemonEventResponseSchema } from "../../../gen/svc/v1/providers_pb.js";
import type { Db, Sql } from "../../db/index.js";
import { apiError, badRequest } from "../../errors.js";
import { text, truncate, withoutNul } from "../shared/lenient.js";
import { checkEnum, countedFor, iso, requireMembers } from "../shared/validate.js";
import { confirmPickup } from "../shared/job-pickup.js";
import { deleteInBatches } from "../shared/batched-delete.js";

export const SEVERITIES = ["info", "warning", "error", "critical"] as const;
/** Spec: daemon-event `details` max 5000 characters; longer details are truncated and stored. */
export const MAX_DETAILS_CHARS = 5000;
/** Events one provider may store per hour (both wires); past it 429 with Retry-After. */
export const MAX_EVENTS_PER_HOUR = 600;
/** Advisory-lock namespace: one provider's events are counted and stored one at a time. */
const EVENT_LOCK_NS = 0x7634;
/**
 * The instants a daemon's `timestamp` may name (UTC): from 1970 (a machine whose clock was never set
 * reports 1970-01-01, which an admin should see as such) to the end of year 9999.
 */
export const REPORTED_AT_MIN = Date.UTC(1970, 0, 1);
export const REPORTED_AT_MAX = Date.UTC(9999, 11, 31, 23, 59, 59, 999);

/** RFC 3339 date-time (`T`, `t` or a space between date and time), the offset optional. */
const DATE_TIME = /^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?(?:[Zz]|([+-])(\d{2}):(\d{2}))?$/;

const daysInMonth = (year: number, month: number) => new Date(Date.UTC(year, month, 0)).getUTCDate();

/**
 * A daemon's time of an event, read strictly: an RFC 3339 date-time (2024-06-01T10:00:00Z,
 * 2024-06-01T13:00:00.5+03:00), one without an offset taken as UTC (never as this host's zone),
 * fractions of a second kept to the millisecond, a leap second as the minute's last millisecond,
 * the instant between 1970 and 9999 (UTC). Anything else is a 400 naming the field.
 */
export function parseReportedTime(value: string, field = "timestamp"): Date {
  const bad = () =>
    badRequest(`${field} must be an RFC 3339 date-time from 1970 to 9999, such as 2024-06-01T10:00:00Z (one without an offset is read as UTC)`);
  const m = DATE_TIME.exec(value.trim());
  if (!m) throw bad();
  const [year, month, day, hour, minute, second] = m.slice(1, 7).map(Number);
  const sign = m[8];
  const offset = sign ? Number(m[9]) * 60 + Number(m[10]) : 0;
  // Years before 1969 are out of range whatever the offset (and Date.UTC would read 0-99 as 1900-1999).
  if (year < 1969 || month < 1 || month > 12 || day < 1 || day > daysInMonth(year, month) || hour > 23 || minute > 59 || second > 60) throw bad();
  if (sign && (Number(m[9]) > 23 || Number(m[10]) > 59)) throw bad();
  const ms = second === 60 ? 999 : m[7] ? Number(m[7].slice(0, 3).padEnd(3, "0")) : 0;
  const t = Date.UTC(year, month - 1, day, hour, minute, Math.min(second, 59), ms) - (sign === "-" ? -offset : offset) * 60_000;
  if (!(t >= REPORTED_AT_MIN && t <= REPORTED_AT_MAX)) throw bad();
  return new Date(t);
}

/** A daemon event as either wire reports it: DaemonEventRequest's members, by the same names. */
export interface DaemonEventInput {
  eventType?: string;
  severity?: string;
  daemonVersion?: string;
  timestamp?: string;
  hostname?: string;
  osInfo?: string;
  pythonVersion?: string;
  details?: string;
  jobId?: string;
}

/** Strings stay strings; an object or list sent as `details` is kept as its JSON text. */
function detailsText(v: unknown): string | undefined {
  if (v === undefined || v === null) return undefined;
  return typeof v === "string" ? v : JSON.stringify(v);
}

/** REST sends the whole body (`raw`, read leniently); gRPC the typed fields. */
export function daemonEventInputOf(req: DaemonEventRequest): DaemonEventInput {
  const raw: JsonObject | undefined = req.raw && Object.keys(req.raw).length > 0 ? req.raw : undefined;
  if (!raw) {
    return {
      eventType: req.eventType,
      severity: req.severity,
      daemonVersion: req.daemonVersion,
      timestamp: req.timestamp,
      hostname: req.hostname,
      osInfo: req.osInfo,
      pythonVersion: req.pythonVersion,
      details: req.details,
      jobId: req.jobId,
    };
  }
  const s = (k: string) => (typeof raw[k] === "string" ? (raw[k] as string) : typeof raw[k] === "number" ? String(raw[k]) : undefined);
  return {
    eventType: s("event_type"),
    severity: s("severity"),
    daemonVersion: s("daemon_version"),
    timestamp: s("timestamp"),
    hostname: s("hostname"),
    osInfo: s("os_info"),
    pythonVersion: s("python_version"),
    details: detailsText(raw.details),
    jobId: s("job_id"),
  };
}

/**
 * Records a daemon event of an authenticated provider (both wires) and returns
 * the documented answer `{success, event_type, provider_id}`.
 */
export async function recordDaemonEvent(
  deps: { sql: Sql },
  providerId: number,
  req: DaemonEventRequest,
): Promise<MessageInitShape<typeof DaemonEventResponseSchema>> {
  const e = await storeDaemonEvent(deps.sql, providerId, daemonEventInputOf(req));
  return { success: true, eventType: e.eventType, providerId: BigInt(providerId) };
}

/**
 * Stores one event; 400 names the field for a missing type, an unknown severity or a bad timestamp;
 * 429 once the provider stored MAX_EVENTS_PER_HOUR in the last hour.
 */
export async function storeDaemonEvent(sql: Sql, providerId: number, reported: DaemonEventInput): Promise<{ eventType: string; providerId: number; id: number }> {
  // What the daemon says of itself, made storable: NUL characters dropped, lone surrogates replaced (src/shared/nul-text.ts).
  const input = withoutNul(reported);
  requireMembers(DaemonEventRequestSchema, input);
  const eventType = input.eventType!.trim();
  if (eventType.length > 200) throw badRequest("event_type must be at most 200 characters");
  const severity = input.severity === undefined || input.severity.trim() === "" ? "info" : checkEnum(input.severity.trim().toLowerCase(), SEVERITIES, "severity");
  const reportedAt = input.timestamp !== undefined && input.timestamp.trim() !== "" ? parseReportedTime(input.timestamp) : null;
  const details = input.details === undefined ? undefined : truncate(input.details, MAX_DETAILS_CHARS);
  const row = await sql.begin(async (tx) => {
    await tx`SELECT pg_advisory_xact_lock(${EVENT_LOCK_NS}, ${providerId % 2147483647}::int)`;
    // The 600th newest event (ids follow time): while it is less than an hour old, the hour is full.
    // Reads at most MAX_EVENTS_PER_HOUR entries of the (provider_id, id DESC) index.
    const [full] = await tx<{ retry: number }[]>`
      SELECT ceil(extract(epoch FROM created_at + interval '1 hour' - now()))::int AS retry FROM (
        SELECT created_at FROM daemon_events WHERE provider_id = ${providerId}
        ORDER BY id DESC OFFSET ${MAX_EVENTS_PER_HOUR - 1} LIMIT 1) e
      WHERE created_at > now() - interval '1 hour'`;
    if (full) {
      const retry = Math.max(1, full.retry);
      throw apiError(429, `at most ${MAX_EVENTS_PER_HOUR} daemon events per provider per hour; retry after ${retry} s`, { "retry-after": String(retry) });
    }
    const [r] = await tx<{ id: number }[]>`
      INSERT INTO daemon_events (provider_id, event_type, severity, details, details_truncated, details_length, job_id,
                                 daemon_version, hostname, os_info, python_version, reported_at)
      VALUES (${providerId}, ${eventType}, ${severity}, ${details?.value ?? null}, ${details?.truncated ?? false},
              ${details?.length ?? 0}, ${text(input.jobId, 200) ?? null}, ${text(input.daemonVersion, 64) ?? null},
              ${text(input.hostname, 255) ?? null}, ${text(input.osInfo, 255) ?? null}, ${text(input.pythonVersion, 64) ?? null},
              ${reportedAt})
      RETURNING id`;
    // An event naming a job (our legacy daemon's job_started) says the daemon has it.
    const jobId = text(input.jobId, 200);
    if (jobId) await confirmPickup(tx, providerId, jobId);
    return r;
  });
  return { eventType, providerId, id: row.id };
}

interface EventRow {
  id: number;
  provider_id: number;
  event_type: string;
  severity: string;
  details: string | null;
  details_truncated: boolean;
  details_length: number;
  job_id: string | null;
  daemon_version: string | null;
  hostname: string | null;
  os_info: string | null;
  python_version: string | null;
  /** ISO 8601 in UTC, formatted by the database (eventsSql). */
  reported_at: string | null;
  created_at: Date;
}

export function daemonEventMessage(e: EventRow): MessageInitShape<typeof DaemonEventRecordSchema> {
  return {
    id: BigInt(e.id),
    providerId: BigInt(e.provider_id),
    eventType: e.event_type,
    severity: e.severity,
    details: e.details ?? undefined,
    detailsTruncated: e.details_truncated,
    detailsLength: BigInt(e.details_length),
    jobId: e.job_id ?? undefined,
    daemonVersion: e.daemon_version ?? undefined,
    hostname: e.hostname ?? undefined,
    osInfo: e.os_info ?? undefined,
    pythonVersion: e.python_version ?? undefined,
    reportedAt: e.reported_at ?? undefined,
    createdAt: iso(e.created_at)!,
  };
}

/** A provider's events, newest first, optionally of one severity and/or type; the total counted up to LIST_COUNTED, or one past the page. */
export async function listDaemonEvents(
  db: Db,
  providerId: number,
  filter: { severity?: string; eventType?: string; limit: number; offset: number },
): Promise<{ rows: EventRow[]; total: number }> {
  const severity = filter.severity ? checkEnum(filter.severity, SEVERITIES, "severity") : null;
  const eventType = filter.eventType || null;
  const where = db`provider_id = ${providerId}
    AND (${severity}::text IS NULL OR severity = ${severity})
    AND (${eventType}::text IS NULL OR event_type = ${eventType})`;
  // reported_at as text, in UTC by the database: any year stored before timestamps were checked
  // (year 1, say) reads back as stored, whatever the session's zone.
  const [rows, [{ total }]] = await Promise.all([
    db<EventRow[]>`
      SELECT id, provider_id, event_type, severity, details, details_truncated, details_length, job_id, daemon_version,
             hostname, os_info, python_version, created_at,
             to_char(reported_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"') AS reported_at
      FROM daemon_events WHERE ${where} ORDER BY id DESC LIMIT ${filter.limit} OFFSET ${filter.offset}`,
    db<{ total: number }[]>`SELECT count(*)::bigint AS total FROM (SELECT 1 FROM daemon_events WHERE ${where} LIMIT ${countedFor(filter)}) c`,
  ]);
  return { rows, total };
}

/**
 * Deletes the events stored more than `days` days ago (0: none), a batch a statement (the retention
 * sweep's). A provider may store MAX_EVENTS_PER_HOUR events of MAX_DETAILS_CHARS each, so without
 * this the table grows with the fleet times its age.
 */
export async function deleteExpiredDaemonEvents(db: Db, days: number): Promise<number> {
  if (days <= 0) return 0;
  return deleteInBatches(async (limit) => {
    const r = await db`
      DELETE FROM daemon_events WHERE id = ANY(ARRAY(
        SELECT id FROM daemon_events WHERE created_at < now() - make_interval(days => ${days})
        LIMIT ${limit} FOR UPDATE SKIP LOCKED))`;
    return r.count;
  });
}
