// The heartbeat: one domain function for both wires (REST
// POST /api/providers/heartbeat and the daemon gRPC stream).
//
// Write path, built for 100,000 providers beating every 30 s (3,300/s):
// - A heartbeat that changes state (first beat, offline -> online) is
//   written synchronously, in one statement, before it is acknowledged; the
//   row lock orders it against admin actions and the sweep. Provider rows are
//   locked FOR NO KEY UPDATE everywhere: FOR UPDATE would also wait for the
//   key-share locks of rows that reference the provider (a job's hold, an
//   event), queued in front of that transaction's own update of the provider.
// - A heartbeat that changes no state (approved and online, or paused, by
//   the in-process cache, src/domain/accounts/provider-cache.ts, or else by one
//   primary-key read) is pure telemetry: it is acknowledged at once, and its
//   telemetry, last_heartbeat and uptime coverage are coalesced per provider
//   and written in batches with unnest every FLUSH_INTERVAL_MS. Losing a batch
//   (crash) loses at most that much telemetry, never a state change.
// - If the cache was stale (the sweep marked the provider offline a moment
//   ago), the batch write itself moves it back online and dispatch is offered.
import { toJson, type JsonObject, type JsonValue, type MessageInitShape } from "@bufbuild/protobuf";
import { ValueSchema } from "@bufbuild/protobuf/wkt";
import type { HeartbeatRequest, HeartbeatResponseSchema } from "../../../gen/svc/v1/providers_pb.js";
import type { Sql } from "../../db/index.js";
import { failureLevel, forbidden, notFound } from "../../errors.js";
import type { Logger } from "../../log.js";
import type { Config } from "../../config.js";
import { count, names, num, object, storableJson, text } from "../shared/lenient.js";
import { providerCacheOf, type ProviderState, type ProviderStateCache } from "../accounts/provider-cache.js";
import { REPUTATION_REFRESH_SECONDS, refreshReputation } from "./reputation.js";
import { updateSignals } from "./versions.js";

export const FLUSH_INTERVAL_MS = 250;
/** A buffer this large is flushed without waiting for the timer. */
const FLUSH_AT_ENTRIES = 5000;
/** Rows per batch statement. */
const BATCH_ROWS = 2500;
/** Telemetry larger than this (JSON characters) keeps only the documented gpu_status fields. */
const MAX_TELEMETRY_CHARS = 16_384;

export interface HeartbeatDeps {
  config: Config;
  sql: Sql;
  log: Logger;
  /**
   * Called after a provider came online (committed): dispatch offers it queued
   * work. Given by the caller because dispatch sits above providers.
   */
  offerWork(providerId: number): Promise<void>;
}

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
}

export type HeartbeatResult = MessageInitShape<typeof HeartbeatResponseSchema>;

const DOCUMENTED_GPU_FIELDS = [
  "gpu_name", "gpu_vram_mib", "driver_version", "gpu_util_pct", "temp_c", "power_w", "free_vram_mib",
  "daemon_version", "python_version", "os_info", "compute_capability", "cuda_version", "gpu_count",
];

const objectJson = (v: unknown) => {
  const o = object(v);
  return o ? storableJson(o) : undefined;
};

/** The documented members of a heartbeat body, read leniently (see lenient.ts). */
export function parseHeartbeatBody(body: JsonObject): HeartbeatInput {
  let gpu = object(body.gpu_status);
  const list = Array.isArray(body.gpu_status) ? (body.gpu_status as JsonValue[]) : undefined;
  if (!gpu && list) gpu = { all_gpus: list, ...(object(list[0]) ?? {}) }; // a bare list of GPUs
  const allGpus = gpu && Array.isArray(gpu.all_gpus) ? gpu.all_gpus : undefined;
  const uptime = num(body.uptime);
  let telemetryJson: string | undefined;
  if (gpu) {
    telemetryJson = storableJson(gpu);
    // daemon_uptime_s joins the object in its JSON text (no copy of the object).
    if (uptime !== undefined) telemetryJson = `${telemetryJson.slice(0, -1)}${telemetryJson.length > 2 ? "," : ""}"daemon_uptime_s":${uptime}}`;
    if (telemetryJson.length > MAX_TELEMETRY_CHARS) {
      const small: JsonObject = {};
      for (const f of DOCUMENTED_GPU_FIELDS) if (gpu[f] !== undefined && typeof gpu[f] !== "object") small[f] = gpu[f];
      if (uptime !== undefined) small.daemon_uptime_s = uptime;
      telemetryJson = storableJson(small);
    }
  } else if (uptime !== undefined) {
    telemetryJson = storableJson({ daemon_uptime_s: uptime });
  }
  return {
    telemetryJson,
    daemonVersion: text(body.daemon_version, 64) ?? text(gpu?.daemon_version, 64),
    gpuVramMib: count(gpu?.gpu_vram_mib, 16 * 1024 * 1024),
    gpuCount: count(gpu?.gpu_count, 1024) ?? (allGpus ? Math.min(allGpus.length, 1024) : undefined),
    computeCapability: text(gpu?.compute_capability, 32),
    cudaVersion: text(gpu?.cuda_version, 32),
    driverVersion: text(gpu?.driver_version, 64),
    cachedModels: body.cached_models === undefined ? undefined : names(body.cached_models),
    providerIp: text(body.provider_ip, 64),
    hostname: text(body.provider_hostname, 255),
    resourceSpecJson: objectJson(body.resource_spec),
  };
}

/** REST sends the whole body (`raw`); gRPC the typed fields. Both end in parseHeartbeatBody. */
export function heartbeatInputOf(req: HeartbeatRequest): HeartbeatInput {
  if (req.raw && Object.keys(req.raw).length > 0) return parseHeartbeatBody(req.raw);
  const body: JsonObject = {};
  if (req.gpuStatus) body.gpu_status = toJson(ValueSchema, req.gpuStatus);
  if (req.uptime !== undefined) body.uptime = req.uptime;
  if (req.providerIp !== undefined) body.provider_ip = req.providerIp;
  if (req.providerHostname !== undefined) body.provider_hostname = req.providerHostname;
  if (req.cachedModels.length > 0) body.cached_models = req.cachedModels;
  if (req.resourceSpec) body.resource_spec = req.resourceSpec;
  if (req.daemonVersion !== undefined) body.daemon_version = req.daemonVersion;
  return parseHeartbeatBody(body);
}

/** A provider that, by its cached state, a heartbeat leaves unchanged. */
function steady(s: ProviderState): boolean {
  return s.approvalStatus === "approved" && ((s.status === "online" && !s.isPaused) || (s.status === "paused" && s.isPaused));
}

interface Pending {
  firstTs: number;
  lastTs: number;
  input: HeartbeatInput;
  /** Failed batch writes this entry was part of. */
  attempts: number;
}

const MAX_WRITE_ATTEMPTS = 3;

/** Field-wise merge: a later beat wins, but what it left out keeps the earlier value. */
function merge(a: HeartbeatInput, b: HeartbeatInput): HeartbeatInput {
  const out: HeartbeatInput = { ...a };
  for (const [k, v] of Object.entries(b)) if (v !== undefined) (out as Record<string, unknown>)[k] = v;
  return out;
}

interface SyncRow {
  id: number;
  status: string;
  approval_status: string;
  is_paused: boolean;
  rejection_reason: string | null;
  suspended_reason: string | null;
  reputation_due: boolean;
  new_status: string | null;
  new_paused: boolean | null;
  new_preload: string | null;
  new_daemon_version: string | null;
}

interface FlushRow {
  id: number;
  old_status: string;
  new_status: string;
  reputation_due: boolean;
}

const str = (v: string | undefined) => (v === undefined ? "null" : JSON.stringify(v));
const int = (v: number | undefined) => (v === undefined ? "null" : String(v));

/**
 * One batch as a single JSON array for json_to_recordset: built by string
 * concatenation so the telemetry, already JSON text, is not serialised again
 * (cheaper than postgres.js array parameters, one per column).
 */
function batchJson(entries: [number, Pending][]): string {
  const parts: string[] = [];
  for (const [id, p] of entries) {
    const i = p.input;
    parts.push(
      `{"id":${id},"first_ts":"${new Date(p.firstTs).toISOString()}","last_ts":"${new Date(p.lastTs).toISOString()}",` +
        `"dv":${str(i.daemonVersion)},"vram":${int(i.gpuVramMib)},"cnt":${int(i.gpuCount)},"cc":${str(i.computeCapability)},` +
        `"cuda":${str(i.cudaVersion)},"driver":${str(i.driverVersion)},"tel":${i.telemetryJson ?? "null"},` +
        `"cached":${i.cachedModels ? JSON.stringify(i.cachedModels) : "null"},"ip":${str(i.providerIp)},` +
        `"host":${str(i.hostname)},"rs":${i.resourceSpecJson ?? "null"}}`,
    );
  }
  return `[${parts.join(",")}]`;
}

/**
 * Uptime coverage accumulates on the provider row for the UTC hour of its
 * latest beat (no extra row written per beat); `credit` is
 * svc_heartbeat_credit of the beat(s) against the previous last_heartbeat
 * (SET expressions see the row before the update). A beat in a later hour
 * starts a new accumulator; finishedHours() files the old one.
 */
function coverageSet(db: Sql, hour: ReturnType<Sql>, credit: ReturnType<Sql>) {
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

/** Per-pool heartbeat state: the provider cache and the telemetry buffer. */
export class HeartbeatPipeline {
  private buffer = new Map<number, Pending>();
  /** Providers whose uptime/reliability the next flush recomputes. */
  private readonly reputationDue = new Set<number>();
  private timer: NodeJS.Timeout | undefined;
  private flushing: Promise<void> | undefined;
  private stopped = false;
  readonly cache: ProviderStateCache;

  constructor(private readonly deps: HeartbeatDeps) {
    this.cache = providerCacheOf(deps.sql);
  }

  async record(providerId: number, input: HeartbeatInput): Promise<HeartbeatResult> {
    const now = Date.now();
    // Not cached here (another process took its last beats, or it expired):
    // one primary-key read tells whether this beat changes anything.
    const cached = this.stopped ? undefined : (this.cache.get(providerId, now) ?? (await this.load(providerId, now)));
    if (cached && steady(cached)) {
      this.enqueue(providerId, now, input);
      if (cached.preloadModel && input.cachedModels?.includes(cached.preloadModel)) cached.preloadModel = null;
      if (input.daemonVersion) cached.daemonVersion = input.daemonVersion;
      return this.answer(cached, input, now);
    }
    return this.recordNow(providerId, input, now);
  }

  /** Reads the provider's current state into the cache; undefined when it does not exist. */
  private async load(providerId: number, now: number): Promise<ProviderState | undefined> {
    const [row] = await this.deps.sql<{ approval_status: string; status: string; is_paused: boolean; preload_model: string | null; daemon_version: string | null }[]>`
      SELECT approval_status, status, is_paused, preload_model, daemon_version FROM providers WHERE id = ${providerId}`;
    if (!row) return undefined;
    const state: ProviderState = {
      approvalStatus: row.approval_status,
      status: row.status,
      isPaused: row.is_paused,
      preloadModel: row.preload_model,
      daemonVersion: row.daemon_version,
      checkedAt: now,
    };
    if (steady(state)) this.cache.set(providerId, state);
    return state;
  }

  /** The synchronous path: state and telemetry in one statement, then the answer. */
  private async recordNow(providerId: number, input: HeartbeatInput, now: number): Promise<HeartbeatResult> {
    const { sql, log } = this.deps;
    const ts = new Date(now);
    const [row] = await sql<SyncRow[]>`
      WITH prev AS MATERIALIZED (
        SELECT id, status, approval_status, is_paused, last_heartbeat, rejection_reason, suspended_reason,
               uptime_hour, uptime_hour_seconds,
               (reputation_at IS NULL OR reputation_at < now() - make_interval(secs => ${REPUTATION_REFRESH_SECONDS})) AS reputation_due
        FROM providers WHERE id = ${providerId} FOR NO KEY UPDATE
      ), upd AS (
        UPDATE providers p SET
          ${coverageSet(sql, sql`date_trunc('hour', greatest(p.last_heartbeat, ${ts}::timestamptz))`, sql`svc_heartbeat_credit(p.last_heartbeat, ${ts}, ${ts})`)},
          last_heartbeat = greatest(p.last_heartbeat, ${ts}::timestamptz),
          first_heartbeat_at = coalesce(p.first_heartbeat_at, ${ts}::timestamptz),
          status = CASE WHEN p.is_paused THEN 'paused' ELSE 'online' END,
          status_since = CASE WHEN p.status = (CASE WHEN p.is_paused THEN 'paused' ELSE 'online' END) THEN p.status_since ELSE now() END,
          ${this.telemetrySet(input)},
          updated_at = now()
        FROM prev
        WHERE p.id = prev.id AND prev.approval_status = 'approved' AND prev.status <> 'suspended'
        RETURNING p.status, p.is_paused, p.preload_model, p.daemon_version, p.uptime_hour
      ), done AS (
        ${finishedHours(sql, sql`SELECT prev.id, prev.uptime_hour AS old_hour, prev.uptime_hour_seconds AS old_seconds, upd.uptime_hour AS new_hour FROM prev JOIN upd ON true`)}
      )
      SELECT prev.id, prev.status, prev.approval_status, prev.is_paused, prev.rejection_reason, prev.suspended_reason,
             prev.reputation_due, upd.status AS new_status, upd.is_paused AS new_paused,
             upd.preload_model AS new_preload, upd.daemon_version AS new_daemon_version
      FROM prev LEFT JOIN upd ON true`;
    if (!row) throw notFound("provider not found");
    if (row.approval_status !== "approved") {
      this.cache.forget([providerId]);
      const why = row.approval_status === "rejected" && row.rejection_reason ? `: ${row.rejection_reason}` : "";
      throw forbidden(
        `provider not approved (approval_status: ${row.approval_status}${why}); heartbeats are accepted once an administrator approves this provider`,
      );
    }
    if (row.new_status === null) {
      this.cache.forget([providerId]);
      throw forbidden(`provider is suspended${row.suspended_reason ? `: ${row.suspended_reason}` : ""}; contact support`);
    }
    const state: ProviderState = {
      approvalStatus: row.approval_status,
      status: row.new_status,
      isPaused: !!row.new_paused,
      preloadModel: row.new_preload,
      daemonVersion: row.new_daemon_version,
      checkedAt: now,
    };
    this.cache.set(providerId, state);
    if (row.status !== "online" && state.status === "online") await this.deps.offerWork(providerId);
    // Derived figures, not state: recomputed by the next batch write.
    if (row.reputation_due) {
      this.reputationDue.add(providerId);
      this.startTimer();
    }
    return this.answer(state, input, now);
  }

  /** The telemetry columns of a heartbeat (unreported ones keep their value). */
  private telemetrySet(i: HeartbeatInput) {
    const { sql } = this.deps;
    return sql`
      daemon_version = coalesce(${i.daemonVersion ?? null}::text, p.daemon_version),
      gpu_vram_mib = coalesce(${i.gpuVramMib ?? null}::bigint, p.gpu_vram_mib),
      gpu_count = coalesce(${i.gpuCount ?? null}::int, p.gpu_count),
      gpu_compute_capability = coalesce(${i.computeCapability ?? null}::text, p.gpu_compute_capability),
      gpu_cuda_version = coalesce(${i.cudaVersion ?? null}::text, p.gpu_cuda_version),
      gpu_driver_version = coalesce(${i.driverVersion ?? null}::text, p.gpu_driver_version),
      gpu_telemetry = coalesce(${i.telemetryJson ?? null}::text::jsonb, p.gpu_telemetry),
      cached_models = coalesce(${i.cachedModels ?? null}::text[], p.cached_models),
      preload_model = CASE WHEN p.preload_model = ANY(${i.cachedModels ?? null}::text[]) THEN NULL ELSE p.preload_model END,
      provider_ip = coalesce(${i.providerIp ?? null}::text, p.provider_ip),
      hostname = coalesce(${i.hostname ?? null}::text, p.hostname),
      resource_spec = coalesce(${i.resourceSpecJson ?? null}::text::jsonb, p.resource_spec)`;
  }

  private answer(state: ProviderState, input: HeartbeatInput, now: number): HeartbeatResult {
    const { config } = this.deps;
    const signals = updateSignals(input.daemonVersion ?? state.daemonVersion, config.daemonMinVersion, config.daemonLatestVersion);
    const preload = state.preloadModel && !input.cachedModels?.includes(state.preloadModel) ? state.preloadModel : undefined;
    let message = state.isPaused ? "Heartbeat received; provider is paused and receives no new jobs" : "Heartbeat received";
    if (signals.needsUpdate) message += `; daemon is below the minimum version ${signals.minVersion}: update required`;
    else if (signals.updateAvailable) message += `; daemon ${signals.latestVersion} is available`;
    return {
      success: true,
      message,
      timestamp: new Date(now).toISOString(),
      ...signals,
      approvalStatus: state.approvalStatus,
      approved: state.approvalStatus === "approved",
      preloadModel: preload ? { modelName: preload, status: "downloading" } : undefined,
      paused: state.isPaused,
    };
  }

  private enqueue(providerId: number, now: number, input: HeartbeatInput): void {
    const p = this.buffer.get(providerId);
    if (p) {
      p.lastTs = Math.max(p.lastTs, now);
      p.input = merge(p.input, input);
    } else {
      this.buffer.set(providerId, { firstTs: now, lastTs: now, input, attempts: 0 });
    }
    this.startTimer();
    if (this.buffer.size >= FLUSH_AT_ENTRIES && !this.flushing) void this.flush();
  }

  private startTimer(): void {
    if (this.timer || this.stopped) return;
    this.timer = setInterval(() => {
      if (!this.flushing) void this.flush();
    }, FLUSH_INTERVAL_MS);
    this.timer.unref();
  }

  /** Writes everything buffered so far (after any flush already under way); one flush at a time. */
  async flush(): Promise<void> {
    while (this.flushing) await this.flushing;
    if (this.buffer.size === 0 && this.reputationDue.size === 0) return;
    const batch = this.buffer;
    this.buffer = new Map();
    this.flushing = this.writeBatch(batch)
      .catch((err) => {
        // Unwritten entries go back for the next flush, each at most MAX_WRITE_ATTEMPTS
        // times: pure telemetry is dropped rather than retried forever (it is
        // never a state change; the next beat carries fresh telemetry anyway).
        let dropped = 0;
        for (const [id, p] of batch) {
          if (++p.attempts >= MAX_WRITE_ATTEMPTS) {
            dropped++;
            continue;
          }
          const newer = this.buffer.get(id);
          this.buffer.set(id, newer ? { firstTs: p.firstTs, lastTs: newer.lastTs, input: merge(p.input, newer.input), attempts: p.attempts } : p);
        }
        this.deps.log[failureLevel(err)]({ err, providers: batch.size, dropped }, "heartbeat telemetry batch write failed");
      })
      .finally(() => {
        this.flushing = undefined;
      });
    await this.flushing;
  }

  private async writeBatch(batch: Map<number, Pending>): Promise<void> {
    const started = performance.now();
    const entries = [...batch.entries()].sort((a, b) => a[0] - b[0]);
    for (let i = 0; i < entries.length; i += BATCH_ROWS) {
      const rows = await this.writeRows(entries.slice(i, i + BATCH_ROWS));
      // Consumed: a failure after this point must not write these rows again.
      for (const [id] of entries.slice(i, i + BATCH_ROWS)) batch.delete(id);
      const { sql, log } = this.deps;
      for (const r of rows) {
        if (r.old_status !== "online" && r.new_status === "online") await this.deps.offerWork(r.id);
      }
      for (const r of rows) if (r.reputation_due) this.reputationDue.add(r.id);
    }
    const refreshed = this.reputationDue.size;
    if (refreshed > 0) {
      const due = [...this.reputationDue];
      this.reputationDue.clear();
      await refreshReputation(this.deps.sql, due).catch((err) => this.deps.log[failureLevel(err)]({ err }, "reputation refresh failed"));
    }
    const ms = Math.round(performance.now() - started);
    // A flush slower than its interval means the database is falling behind the beats.
    const level = ms > 4 * FLUSH_INTERVAL_MS ? "warn" : "debug";
    this.deps.log[level]({ providers: entries.length, reputations: refreshed, ms }, "heartbeat batch written");
  }

  private writeRows(entries: [number, Pending][]): Promise<FlushRow[]> {
    const { sql } = this.deps;
    return sql<FlushRow[]>`
      WITH v AS (
        SELECT * FROM json_to_recordset(${batchJson(entries)}::text::json) AS v(
          id bigint, first_ts timestamptz, last_ts timestamptz, dv text, vram bigint, cnt int, cc text, cuda text,
          driver text, tel jsonb, cached jsonb, ip text, host text, rs jsonb)
      ), prev AS MATERIALIZED (
        SELECT p.id, p.status, p.last_heartbeat, p.uptime_hour, p.uptime_hour_seconds,
               (p.reputation_at IS NULL OR p.reputation_at < now() - make_interval(secs => ${REPUTATION_REFRESH_SECONDS})) AS reputation_due
        FROM providers p JOIN v ON v.id = p.id
        WHERE p.approval_status = 'approved' AND p.status <> 'suspended'
        ORDER BY p.id FOR NO KEY UPDATE OF p
      ), upd AS (
        UPDATE providers p SET
          ${coverageSet(sql, sql`date_trunc('hour', v.last_ts)`, sql`svc_heartbeat_credit(p.last_heartbeat, v.first_ts, v.last_ts)`)},
          last_heartbeat = v.last_ts,
          first_heartbeat_at = coalesce(p.first_heartbeat_at, v.first_ts),
          status = CASE WHEN p.status IN ('offline', 'registered', 'connected') AND NOT p.is_paused THEN 'online' ELSE p.status END,
          status_since = CASE WHEN p.status IN ('offline', 'registered', 'connected') AND NOT p.is_paused THEN now() ELSE p.status_since END,
          daemon_version = coalesce(v.dv, p.daemon_version),
          gpu_vram_mib = coalesce(v.vram, p.gpu_vram_mib),
          gpu_count = coalesce(v.cnt, p.gpu_count),
          gpu_compute_capability = coalesce(v.cc, p.gpu_compute_capability),
          gpu_cuda_version = coalesce(v.cuda, p.gpu_cuda_version),
          gpu_driver_version = coalesce(v.driver, p.gpu_driver_version),
          gpu_telemetry = coalesce(v.tel, p.gpu_telemetry),
          cached_models = CASE WHEN v.cached IS NULL THEN p.cached_models
                               ELSE ARRAY(SELECT jsonb_array_elements_text(v.cached)) END,
          preload_model = CASE WHEN v.cached IS NOT NULL AND v.cached ? p.preload_model THEN NULL ELSE p.preload_model END,
          provider_ip = coalesce(v.ip, p.provider_ip),
          hostname = coalesce(v.host, p.hostname),
          resource_spec = coalesce(v.rs, p.resource_spec),
          updated_at = now()
        FROM v JOIN prev ON prev.id = v.id
        WHERE p.id = v.id AND (prev.last_heartbeat IS NULL OR v.last_ts > prev.last_heartbeat)
        RETURNING p.id, prev.status AS old_status, p.status AS new_status, prev.reputation_due,
                  prev.uptime_hour AS old_hour, prev.uptime_hour_seconds AS old_seconds, p.uptime_hour AS new_hour
      ), done AS (
        ${finishedHours(sql, sql`SELECT id, old_hour, old_seconds, new_hour FROM upd`)}
      )
      SELECT id, old_status, new_status, reputation_due FROM upd`;
  }

  /** Stops the timer and writes what is buffered (shutdown). */
  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearInterval(this.timer);
    this.timer = undefined;
    await this.flush();
  }

  /** Buffered providers (tests, metrics). */
  get pending(): number {
    return this.buffer.size;
  }
}

const pipelines = new WeakMap<Sql, HeartbeatPipeline>();

/** The pipeline of a pool (created on first use). */
export function heartbeatPipeline(deps: HeartbeatDeps): HeartbeatPipeline {
  let p = pipelines.get(deps.sql);
  if (!p) pipelines.set(deps.sql, (p = new HeartbeatPipeline(deps)));
  return p;
}

/**
 * Records a heartbeat of an authenticated provider and returns the documented
 * answer. 403 when the provider is not approved or is suspended (nothing is
 * recorded then), 404 when it no longer exists.
 */
export function recordHeartbeat(deps: HeartbeatDeps, providerId: number, req: HeartbeatRequest): Promise<HeartbeatResult> {
  return heartbeatPipeline(deps).record(providerId, heartbeatInputOf(req));
}
