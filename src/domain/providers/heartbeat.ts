// The heartbeat: one domain function for both wires (REST
// POST /api/providers/heartbeat and the daemon gRPC stream).
//
// Write path, built for 100,000 providers beating every 30 s (3,300/s), and
// for all of them coming back at once after an outage:
// - A heartbeat that changes state (first beat, offline -> online, or the
//   first after the live window while still marked online) is
//   written before it is acknowledged, grouped with the other state-changing
//   beats that arrive meanwhile (src/domain/providers/state-beats.ts): one
//   statement per group, committed before any of its beats is answered; the
//   row lock orders it against admin actions and the sweep. Providers that
//   came online are offered queued work after the commit, before the answer.
// - A heartbeat that changes no state (approved and online, or paused, by
//   the in-process cache, src/domain/accounts/provider-cache.ts, or else by one
//   primary-key read) is pure telemetry: it is acknowledged at once, and its
//   telemetry, last_heartbeat and uptime coverage are coalesced per provider
//   and written in batches with unnest every FLUSH_INTERVAL_MS. Losing a batch
//   (crash) loses at most that much telemetry, never a state change.
// - If the cache was stale (the sweep marked the provider offline a moment
//   ago), the batch write itself moves it back online and dispatch is offered.
// - The times written (last_heartbeat, first_heartbeat_at, uptime coverage) are
//   the database's clock, which every liveness rule compares them with: a write
//   sends each beat's age (this process's monotonic clock) and stores now() less
//   that age, so a skew between this host's clock and PostgreSQL's moves nothing.
import type { JsonObject, JsonValue, MessageInitShape } from "@bufbuild/protobuf";
import { valueJson } from "../../shared/value-json.js";
import type { HeartbeatRequest, HeartbeatResponseSchema } from "../../../gen/svc/v1/providers_pb.js";
import type { Sql } from "../../db/index.js";
import { failureLevel, forbidden, notFound } from "../../errors.js";
import type { Logger } from "../../log.js";
import type { Config } from "../../config.js";
import { count, names, num, object, storableJson, text } from "../shared/lenient.js";
import { mayEscapeUnstorable } from "../../shared/nul-text.js";
import type { StructText } from "../../shared/struct-binary.js";
import { providerCacheOf, type ProviderState, type ProviderStateCache } from "../accounts/provider-cache.js";
import { refreshReputation } from "./reputation.js";
import { updateSignals, type UpdateSignals } from "./versions.js";
import { mergeInput as merge, writeTelemetryRows, type HeartbeatInput, type StateRow } from "./heartbeat-write.js";
import { StateBeatBatcher } from "./state-beats.js";
import { LIVE_WINDOW_SECONDS } from "../shared/liveness.js";

export type { HeartbeatInput } from "./heartbeat-write.js";

export const FLUSH_INTERVAL_MS = 250;
/** A buffer this large is flushed without waiting for the timer. */
const FLUSH_AT_ENTRIES = 5000;
/**
 * Rows per batch statement. A statement's parameters are built in one
 * synchronous step (about 2–8 µs a row), during which no beat is answered: a
 * smaller statement keeps that pause short.
 */
const BATCH_ROWS = 500;
/** Telemetry larger than this (JSON characters) keeps only the documented gpu_status fields. */
const MAX_TELEMETRY_CHARS = 16_384;
/** Bounds of a declared supported_job_types list: a handful of job types, each a short name. */
const MAX_JOB_TYPES = 64;
const MAX_JOB_TYPE_CHARS = 64;
/** The largest VRAM figure (MiB) a heartbeat is believed for: a card's size, or its free memory. */
export const MAX_VRAM_MIB = 16 * 1024 * 1024;

export interface HeartbeatDeps {
  config: Config;
  sql: Sql;
  log: Logger;
  /**
   * Called after providers came online (committed): dispatch offers them queued
   * work. Given by the caller because dispatch sits above providers. Never throws.
   */
  offerWork(providerIds: number[]): Promise<void>;
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

/** The members of gpu_status a heartbeat reads besides storing it (a hand-read one keeps just these as values). */
export const GPU_STATUS_READ: ReadonlySet<string> = new Set([...DOCUMENTED_GPU_FIELDS, "all_gpus"]);

/** gpu_status as a heartbeat reads it: its storable JSON text, its members, and how many GPUs all_gpus lists. */
interface GpuRead {
  json: string;
  field(name: string): unknown;
  allGpus: number | undefined;
}

function gpuOfBody(body: JsonObject): GpuRead | undefined {
  let gpu = object(body.gpu_status);
  const list = Array.isArray(body.gpu_status) ? (body.gpu_status as JsonValue[]) : undefined;
  if (!gpu && list) gpu = { all_gpus: list, ...(object(list[0]) ?? {}) }; // a bare list of GPUs
  if (!gpu) return undefined;
  const g = gpu;
  return { json: storableJson(g), field: (f) => g[f], allGpus: Array.isArray(g.all_gpus) ? g.all_gpus.length : undefined };
}

/** A gpu_status Struct read straight to text (shared/struct-binary.ts): the same as gpuOfBody gives for its object. */
function gpuOfText(t: StructText): GpuRead {
  return {
    json: t.plain || !mayEscapeUnstorable(t.json) ? t.json : storableJson(JSON.parse(t.json)),
    field: (f) => t.scalars.get(f),
    allGpus: t.lengths.get("all_gpus"),
  };
}

/**
 * The documented members of a heartbeat body, read leniently (see lenient.ts). `gpuText`: its
 * gpu_status, when that was read off the wire as text (body.gpu_status is then not read).
 */
export function parseHeartbeatBody(body: JsonObject, gpuText?: StructText): HeartbeatInput {
  const gpu = gpuText ? gpuOfText(gpuText) : gpuOfBody(body);
  const uptime = num(body.uptime);
  let telemetryJson: string | undefined;
  if (gpu) {
    telemetryJson = gpu.json;
    // daemon_uptime_s joins the object in its JSON text (no copy of the object).
    if (uptime !== undefined) telemetryJson = `${telemetryJson.slice(0, -1)}${telemetryJson.length > 2 ? "," : ""}"daemon_uptime_s":${uptime}}`;
    if (telemetryJson.length > MAX_TELEMETRY_CHARS) {
      const small: JsonObject = {};
      for (const f of DOCUMENTED_GPU_FIELDS) {
        const v = gpu.field(f);
        if (v !== undefined && typeof v !== "object") small[f] = v as JsonValue;
      }
      if (uptime !== undefined) small.daemon_uptime_s = uptime;
      telemetryJson = storableJson(small);
    }
  } else if (uptime !== undefined) {
    telemetryJson = storableJson({ daemon_uptime_s: uptime });
  }
  return {
    telemetryJson,
    daemonVersion: text(body.daemon_version, 64) ?? text(gpu?.field("daemon_version"), 64),
    gpuVramMib: count(gpu?.field("gpu_vram_mib"), MAX_VRAM_MIB),
    gpuCount: count(gpu?.field("gpu_count"), 1024) ?? (gpu?.allGpus !== undefined ? Math.min(gpu.allGpus, 1024) : undefined),
    computeCapability: text(gpu?.field("compute_capability"), 32),
    cudaVersion: text(gpu?.field("cuda_version"), 32),
    driverVersion: text(gpu?.field("driver_version"), 64),
    cachedModels: body.cached_models === undefined ? undefined : names(body.cached_models),
    providerIp: text(body.provider_ip, 64),
    hostname: text(body.provider_hostname, 255),
    resourceSpecJson: objectJson(body.resource_spec),
    // Every beat states it: absent or unreadable declares nothing (any job type), as a daemon older than the field.
    supportedJobTypes: declaredJobTypes(body.supported_job_types),
  };
}

/** REST sends the whole body (`raw`); gRPC the typed fields. Both end in parseHeartbeatBody. */
/** gpu_status already read off the wire beside its message (services/daemon-wire.ts): as JSON, or as text. */
const GPU_STATUS_JSON = Symbol("gpuStatusJson");
const GPU_STATUS_TEXT = Symbol("gpuStatusText");
/** Kept on the message under symbols (no reflection sees them) rather than in a WeakMap, whose entries the collector treats as ephemerons. */
type WithGpuStatus = HeartbeatRequest & { [GPU_STATUS_JSON]?: JsonValue; [GPU_STATUS_TEXT]?: StructText };

/** Keeps gpu_status as read off the wire; undefined forgets it (gpu_status was replaced). */
export function setGpuStatusRead(req: HeartbeatRequest, read: { json: JsonValue } | { text: StructText } | undefined): void {
  const r = req as WithGpuStatus;
  r[GPU_STATUS_JSON] = read && "json" in read ? read.json : undefined;
  r[GPU_STATUS_TEXT] = read && "text" in read ? read.text : undefined;
}

/** gpu_status as read off the wire, as JSON (parsed from the text when that is what was kept). */
export function gpuStatusJsonOf(req: HeartbeatRequest): JsonValue | undefined {
  const r = req as WithGpuStatus;
  const text = r[GPU_STATUS_TEXT];
  return text ? (JSON.parse(text.json) as JsonValue) : r[GPU_STATUS_JSON];
}

export function heartbeatInputOf(req: HeartbeatRequest): HeartbeatInput {
  if (req.raw && Object.keys(req.raw).length > 0) return parseHeartbeatBody(req.raw);
  const body: JsonObject = {};
  const gpuText = (req as WithGpuStatus)[GPU_STATUS_TEXT];
  const gpuStatus = gpuText ? undefined : (req as WithGpuStatus)[GPU_STATUS_JSON];
  if (gpuStatus !== undefined) body.gpu_status = gpuStatus;
  else if (!gpuText && req.gpuStatus) body.gpu_status = valueJson(req.gpuStatus);
  if (req.uptime !== undefined) body.uptime = req.uptime;
  if (req.providerIp !== undefined) body.provider_ip = req.providerIp;
  if (req.providerHostname !== undefined) body.provider_hostname = req.providerHostname;
  if (req.cachedModels.length > 0) body.cached_models = req.cachedModels;
  if (req.resourceSpec) body.resource_spec = req.resourceSpec;
  if (req.daemonVersion !== undefined) body.daemon_version = req.daemonVersion;
  if (req.supportedJobTypes.length > 0) body.supported_job_types = req.supportedJobTypes;
  return parseHeartbeatBody(body, gpuText);
}

/** A provider that, by its cached state, a heartbeat leaves unchanged. */
function steady(s: ProviderState): boolean {
  return s.approvalStatus === "approved" && ((s.status === "online" && !s.isPaused) || (s.status === "paused" && s.isPaused));
}

/** A declared job-type list as the cache keeps it; null when none is declared (every type). */
export const jobTypesKey = (types: readonly string[] | null | undefined): string | null => (types && types.length > 0 ? JSON.stringify(types) : null);

/** A job-type list as a daemon declares it (a heartbeat's supported_job_types, a stream's hello), bounded. */
export const declaredJobTypes = (v: unknown): string[] => names(v, MAX_JOB_TYPES, MAX_JOB_TYPE_CHARS) ?? [];

/**
 * Whether a steady beat leaves the provider's declared job types as they are. One that changes
 * them is written before it is answered, as a state change: placement reads them, and a
 * telemetry flush could leave a job of a type the daemon no longer runs placed on it meanwhile.
 */
const sameJobTypes = (s: ProviderState, input: HeartbeatInput) => input.supportedJobTypes === undefined || jobTypesKey(input.supportedJobTypes) === s.jobTypes;

/** The state a written state-changing beat left (new_status set). */
function stateOf(row: StateRow, now: number): ProviderState {
  return {
    approvalStatus: row.approval_status,
    status: row.new_status!,
    isPaused: !!row.new_paused,
    preloadModel: row.new_preload,
    daemonVersion: row.new_daemon_version,
    jobTypes: jobTypesKey(row.new_job_types),
    checkedAt: now,
  };
}

interface Pending {
  /** performance.now() of the first and the last beat: only their age at the write is used. */
  firstTs: number;
  lastTs: number;
  input: HeartbeatInput;
  /** Failed batch writes this entry was part of. */
  attempts: number;
}

const MAX_WRITE_ATTEMPTS = 3;
/** Daemon versions whose answers are kept (cleared past it: a daemon may report any text). */
const MAX_KEPT_ANSWERS = 256;

interface Told {
  signals: UpdateSignals;
  message: string;
}

/** Per-pool heartbeat state: the provider cache and the telemetry buffer. */
export class HeartbeatPipeline {
  private buffer = new Map<number, Pending>();
  /** Providers whose uptime/reliability the next flush recomputes. */
  private readonly reputationDue = new Set<number>();
  private timer: NodeJS.Timeout | undefined;
  private flushing: Promise<void> | undefined;
  /** The batch the flush under way is writing: an entry leaves it once its statement committed. */
  private writing: Map<number, Pending> | undefined;
  private stopped = false;
  readonly cache: ProviderStateCache;
  /** Group commit of the state-changing beats. */
  readonly stateBeats: StateBeatBatcher;
  private readonly told = new Map<string, Told>();

  constructor(private readonly deps: HeartbeatDeps) {
    this.cache = providerCacheOf(deps.sql);
    this.stateBeats = new StateBeatBatcher(deps.sql, (rows) => this.afterStateCommit(rows));
  }

  async record(providerId: number, input: HeartbeatInput): Promise<HeartbeatResult> {
    // `now` (Date) times the in-process cache only; `at` (monotonic) times the beat, and only its age
    // when it is written is sent (heartbeat-write.ts): the stored time is the database's clock.
    const now = Date.now();
    const at = performance.now();
    let cached = this.stopped ? undefined : this.cache.get(providerId, now);
    // Not cached here (another process took its last beats, or it expired):
    // one primary-key read tells whether this beat changes anything. Unless
    // its state was announced changed: the state-changing write reads it.
    if (!cached && !this.stopped && !this.cache.changed(providerId, now)) cached = await this.load(providerId, now);
    if (cached && steady(cached) && sameJobTypes(cached, input)) {
      this.enqueue(providerId, at, input);
      if (cached.preloadModel && input.cachedModels?.includes(cached.preloadModel)) cached.preloadModel = null;
      if (input.daemonVersion) cached.daemonVersion = input.daemonVersion;
      return this.answer(cached, input, now);
    }
    return this.recordNow(providerId, input, now, at);
  }

  /**
   * Reads the provider's current state into the cache; undefined when it does not exist, or when it
   * was last heard longer ago than the live window (still marked online, the sweep not there yet):
   * such a beat makes it live again, so it goes to the state-changing write and is answered once
   * placement can see it, like a first beat.
   */
  private async load(providerId: number, now: number): Promise<ProviderState | undefined> {
    const [row] = await this.deps.sql<
      {
        approval_status: string; status: string; is_paused: boolean; preload_model: string | null; daemon_version: string | null;
        supported_job_types: string[] | null; heard: boolean;
      }[]
    >`
      SELECT approval_status, status, is_paused, preload_model, daemon_version, supported_job_types,
             coalesce(last_heartbeat > now() - make_interval(secs => ${LIVE_WINDOW_SECONDS}), false) AS heard
      FROM providers WHERE id = ${providerId}`;
    if (!row || !row.heard) return undefined;
    const state: ProviderState = {
      approvalStatus: row.approval_status,
      status: row.status,
      isPaused: row.is_paused,
      preloadModel: row.preload_model,
      daemonVersion: row.daemon_version,
      jobTypes: jobTypesKey(row.supported_job_types),
      checkedAt: now,
    };
    if (steady(state)) this.cache.set(providerId, state);
    return state;
  }

  /**
   * The job types a daemon declared on connecting (a stream's hello): written at once, so that
   * placement reads them before the daemon's first heartbeat. An empty list says nothing (a daemon
   * that declares none says so in its heartbeats).
   */
  async declareJobTypes(providerId: number, types: string[]): Promise<void> {
    if (types.length === 0) return;
    await this.deps.sql`UPDATE providers SET supported_job_types = ${types}::text[] WHERE id = ${providerId}`;
    const cached = this.cache.get(providerId);
    if (cached) cached.jobTypes = jobTypesKey(types);
  }

  /**
   * A beat that changes state: written with its group (state-beats.ts), answered after the commit.
   * This provider's earlier beats that are not written yet go with it, merged before it: written
   * after it by the flush, an earlier beat's telemetry (its declared job types) would undo its. The
   * flush under way is waited for when it still holds such a beat.
   */
  private async recordNow(providerId: number, input: HeartbeatInput, now: number, at: number): Promise<HeartbeatResult> {
    while (this.flushing && this.writing?.has(providerId)) await this.flushing;
    const earlier = this.buffer.get(providerId);
    if (earlier) this.buffer.delete(providerId);
    const row = earlier
      ? await this.stateBeats.write(providerId, at, merge(earlier.input, input), earlier.firstTs)
      : await this.stateBeats.write(providerId, at, input);
    if (!row) throw notFound("provider not found");
    if (row.approval_status !== "approved") {
      const why = row.approval_status === "rejected" && row.rejection_reason ? `: ${row.rejection_reason}` : "";
      throw forbidden(
        `provider not approved (approval_status: ${row.approval_status}${why}); heartbeats are accepted once an administrator approves this provider`,
      );
    }
    if (row.new_status === null) throw forbidden(`provider is suspended${row.suspended_reason ? `: ${row.suspended_reason}` : ""}; contact support`);
    return this.answer(stateOf(row, now), input, now);
  }

  /** After a group of state-changing beats committed, before they are answered: cache, dispatch, reputation. */
  private async afterStateCommit(rows: StateRow[]): Promise<void> {
    const now = Date.now();
    const cameOnline: number[] = [];
    for (const row of rows) {
      if (row.new_status === null) {
        this.cache.forget([row.id]);
        continue;
      }
      this.cache.set(row.id, stateOf(row, now));
      if (row.new_status === "online" && (row.status !== "online" || !row.was_heard)) cameOnline.push(row.id);
      // Derived figures, not state: recomputed by the next batch write.
      if (row.reputation_due) this.reputationDue.add(row.id);
    }
    if (this.reputationDue.size > 0) this.startTimer();
    if (cameOnline.length > 0) await this.deps.offerWork(cameOnline);
  }

  /**
   * What a beat of this daemon version is told (update signals, message): the same for every beat of
   * a version, so worked out once per version and pause state. A fleet reports a handful of versions.
   */
  private toldOf(version: string | null | undefined, paused: boolean): Told {
    const { daemonMinVersion: min, daemonLatestVersion: latest } = this.deps.config;
    const key = `${paused ? "p" : "a"}${version ?? ""}\n${min}\n${latest}`;
    let told = this.told.get(key);
    if (!told) {
      if (this.told.size >= MAX_KEPT_ANSWERS) this.told.clear();
      const signals = updateSignals(version, min, latest);
      let message = paused ? "Heartbeat received; provider is paused and receives no new jobs" : "Heartbeat received";
      if (signals.needsUpdate) message += `; daemon is below the minimum version ${signals.minVersion}: update required`;
      else if (signals.newerRelease) message += `; daemon ${signals.latestVersion} is available`;
      told = { signals, message };
      this.told.set(key, told);
    }
    return told;
  }

  private answer(state: ProviderState, input: HeartbeatInput, now: number): HeartbeatResult {
    const { signals, message } = this.toldOf(input.daemonVersion ?? state.daemonVersion, state.isPaused);
    const preload = state.preloadModel && !input.cachedModels?.includes(state.preloadModel) ? state.preloadModel : undefined;
    return {
      success: true,
      message,
      timestamp: new Date(now).toISOString(),
      updateAvailable: signals.updateAvailable,
      needsUpdate: signals.needsUpdate,
      latestVersion: signals.latestVersion,
      minVersion: signals.minVersion,
      approvalStatus: state.approvalStatus,
      approved: state.approvalStatus === "approved",
      preloadModel: preload ? { modelName: preload, status: "downloading" } : undefined,
      paused: state.isPaused,
    };
  }

  private enqueue(providerId: number, at: number, input: HeartbeatInput): void {
    const p = this.buffer.get(providerId);
    if (p) {
      p.lastTs = Math.max(p.lastTs, at);
      p.input = merge(p.input, input);
    } else {
      this.buffer.set(providerId, { firstTs: at, lastTs: at, input, attempts: 0 });
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
    this.writing = batch;
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
        this.writing = undefined;
      });
    await this.flushing;
  }

  private async writeBatch(batch: Map<number, Pending>): Promise<void> {
    const started = performance.now();
    const entries = [...batch.entries()].sort((a, b) => a[0] - b[0]);
    for (let i = 0; i < entries.length; i += BATCH_ROWS) {
      const rows = await writeTelemetryRows(this.deps.sql, entries.slice(i, i + BATCH_ROWS));
      // Consumed: a failure after this point must not write these rows again.
      for (const [id] of entries.slice(i, i + BATCH_ROWS)) batch.delete(id);
      const cameOnline = rows.filter((r) => r.old_status !== "online" && r.new_status === "online").map((r) => r.id);
      if (cameOnline.length > 0) await this.deps.offerWork(cameOnline);
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

/** A stream daemon's hello declared its job types: see HeartbeatPipeline.declareJobTypes. */
export function recordDeclaredJobTypes(deps: HeartbeatDeps, providerId: number, types: readonly string[]): Promise<void> {
  return heartbeatPipeline(deps).declareJobTypes(providerId, declaredJobTypes(types));
}

/**
 * Records a heartbeat of an authenticated provider and returns the documented
 * answer. 403 when the provider is not approved or is suspended (nothing is
 * recorded then), 404 when it no longer exists.
 */
export function recordHeartbeat(deps: HeartbeatDeps, providerId: number, req: HeartbeatRequest): Promise<HeartbeatResult> {
  return heartbeatPipeline(deps).record(providerId, heartbeatInputOf(req));
}
