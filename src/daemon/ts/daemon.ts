// The TypeScript provider daemon: one gRPC stream to the service (generated
// Connect client), reconnecting with backoff and jitter; heartbeats with
// nvidia-smi telemetry, readiness once, daemon events; every pushed task is
// verified before it runs (stream signature with the pinned server key, and
// the HMAC when the secret is configured); pause, run window, temperature
// limit, usage cap and VRAM reserve decide whether a job is accepted; jobs
// run through the executors; results survive reconnects and restarts (kept
// on disk, sent until acked) and are signed with the daemon's own key
// (provider attestation, registered in hello; docs/receipts.md). A refused
// stream's Retry-After is waited out before the next.
import crypto from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { create, fromBinary, fromJson, toBinary, type JsonObject, type JsonValue, type MessageInitShape } from "@bufbuild/protobuf";
import { ValueSchema } from "@bufbuild/protobuf/wkt";
import { ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import {
  DaemonMessageSchema,
  DaemonService,
  type DaemonSettings,
  type ServerMessage,
  type Welcome,
} from "../../../gen/svc/v1/daemon_pb.js";
import type { AssignedJob } from "../../../gen/svc/v1/jobs_pb.js";
import { withinRunWindow } from "../../shared/run-window.js";
import { verifyTask, verifyTaskSignature } from "../../shared/task-signature.js";
import { withoutNul } from "../../shared/nul-text.js";
import { jsonDepthExceeds, MAX_JSON_DEPTH, PROTO_RECURSION_LIMIT } from "../../shared/json-nesting.js";
import { attestationStatement, ed25519Signer, keyIdOf, type Ed25519Signer, type GpuFacts } from "../../shared/receipt.js";
import { AsyncQueue } from "../async-queue.js";
import { runCommand, withholdSecrets } from "./exec.js";
import { executorFor, supportedJobTypes, type ExecutorConfig } from "./executors/plan.js";
import type { JobHooks, JobSpec, Outcome, RunningJob } from "./executors/types.js";
import { GpuPool } from "./gpu-pool.js";
import { killLeftoverProcesses } from "./job-processes.js";
import { daemonLabel, removeLeftovers } from "./leftovers.js";
import { GpuProbe, gpuStatus, type GpuSnapshot } from "./nvidia-smi.js";
import { DAEMON_VERSION } from "./version.js";

type Msg = MessageInitShape<typeof DaemonMessageSchema>;
type MsgKind = Msg["kind"];

export interface DaemonConfig {
  url: string;
  key: string;
  /** SVC_HMAC_SECRET, when the operator has it: tasks are also checked against task_spec_hmac. */
  hmacSecret?: string;
  /** The server's task-signing key (base64); pinned per server from the first welcome when not given. */
  serverKey?: string;
  /** --trust-new-server-key: pin the key the server presents now, replacing a different pinned one. */
  trustNewServerKey?: boolean;
  stateDir: string;
  nvidiaSmi: string;
  /** CUDA_VISIBLE_DEVICES of the daemon's environment: the only GPUs it reports and hands to jobs (undefined: all). */
  visibleDevices?: string;
  executors: ExecutorConfig;
  cachedModels: string[];
  /** Overrides the heartbeat interval the server asks for (tests). */
  heartbeatSeconds?: number;
  reconnectMinMs: number;
  reconnectMaxMs: number;
  /**
   * SIGTERM/SIGINT: running jobs are stopped at once and reported as interrupted; the
   * daemon has exited within this long (a job gets half of it to exit before SIGKILL).
   */
  stopGraceMs: number;
  log: (line: string) => void;
  /** Overrides JOB_LOG_MAX_BYTES (tests). */
  jobLogMaxBytes?: number;
  /** Overrides BACKLOG_MAX_BYTES (tests). */
  backlogMaxBytes?: number;
}

/** What the signed task says about how the job runs (signedTerms). */
interface SignedTerms {
  jobType: string | undefined;
  maxDurationSeconds: number | undefined;
  minVramGb: number;
}

/** What a job needs of a GPU, from its signed task. */
interface JobNeeds {
  minVramGb: number;
}

interface ActiveJob {
  spec: JobSpec;
  /** The assignment's attempt, named in the reports that end it (undefined from a server that sends none). */
  attempt?: number;
  running?: RunningJob;
  cancelled: boolean;
  /** What the server said when it cancelled the job. */
  cancelReason?: string;
  /** Stopped because the daemon is shutting down: reported as interrupted by the provider. */
  interrupted: boolean;
  /** Stopped because its max_duration_seconds ran out: reported as timeout (the renter's limit). */
  timedOut?: boolean;
  logs: string[];
  /** Bytes of log text taken for sending so far (JOB_LOG_MAX_BYTES caps it). */
  logBytes: number;
  /** Lines dropped past JOB_LOG_MAX_BYTES (every line after the first one dropped). */
  droppedLines: number;
  /** Lines dropped while the daemon was away from the server and held BACKLOG_MAX_BYTES already. */
  droppedAway?: number;
  flushTimer?: NodeJS.Timeout;
  /** The GPUs as probed when the job was accepted: the facts its result's attestation signs. */
  gpu?: GpuFacts;
  /** The host GPU (nvidia-smi index) handed to this job, given back when it has ended. */
  gpuIndex?: number;
  /** A new attempt of this job, assigned back here while this one was being stopped: started once it is gone. */
  next?: { job: AssignedJob; signature: string };
  /** Aborted when the server cancels the job: ends its preparation (an image pull) before it was accepted. */
  abort: AbortController;
  /**
   * Accepted (JobAccepted sent or queued): only then does a reconnect's hello name it as held, since
   * the server starts a pending job it is named (the billed time); one still being prepared is not.
   */
  accepted?: boolean;
  /** What the job waits for while it is prepared (JobPreparing's detail); undefined otherwise. */
  preparing?: string;
}

/**
 * Codes of a refused preparing notice or accept that mean the job is not (or no longer) this
 * provider's to run: cancelled, re-queued elsewhere, another attempt. Such a job is dropped as if
 * cancelled; a cancel pushed while the daemon was away is lost, and a job it prepares is not named
 * in its hello (the server would start it), so this refusal is how it learns.
 */
const NOT_OURS_CODES = new Set(["already_exists", "aborted", "permission_denied", "not_found", "failed_precondition"]);

const MAX_BACKLOG = 10_000;
/**
 * Log text one job attempt may send: the server keeps 4 MiB (4,194,304 characters) per attempt and
 * drops the rest, so more would only be held and sent for nothing. Room is left under it for the
 * line that says how many were dropped.
 */
const JOB_LOG_MAX_BYTES = 4 * 1024 * 1024 - 64 * 1024;
/**
 * What the daemon holds of log batches and heartbeats while it cannot reach the server, all jobs
 * together (MAX_BACKLOG counts messages; a log batch may be 3 MB). Past it log lines are dropped
 * (and counted in their job's notice) and beats are not kept; results, accepts, refusals and
 * events are never dropped for it.
 */
const BACKLOG_MAX_BYTES = 32 * 1024 * 1024;
/** Counted for a heartbeat held, over its GPU status's JSON: its other fields. */
const HEARTBEAT_OVERHEAD_BYTES = 1024;
/** The kill timer of a job whose signed task names no max_duration_seconds (nor its assignment). */
const DEFAULT_MAX_DURATION_SECONDS = 1800;
/**
 * The largest message the server takes on the stream (DaemonService.Connect's body_limit_kb, 16 MiB):
 * a bigger one ends the stream. A result over it is refused here, as the job's own failure.
 */
export const STREAM_MESSAGE_MAX_BYTES = 16 * 1024 * 1024;
/** Room left in a result report for all but its output: ids, error, metrics, attestation (a few KiB). */
const REPORT_OVERHEAD_BYTES = 64 * 1024;
/**
 * The deepest a result may nest objects and arrays: the server holds a stream message to the depth its
 * JSON form would nest (MAX_JSON_DEPTH), and the message and its result report are the first two levels.
 * A deeper one would end the stream (and again after every reconnect): it is the job's own failure instead.
 */
export const RESULT_MAX_DEPTH = MAX_JSON_DEPTH - 2;
const LOG_FLUSH_MS = 300;
const LOG_BATCH = 200;

const toValue = (v: JsonValue) => fromJson(ValueSchema, v, { recursionLimit: PROTO_RECURSION_LIMIT });

/** The fault the server's protocol pairs with each end reason this daemon reports. */
function failureAttribution(endReason: "runtime_error" | "provider_error" | "timeout"): { endReason: string; fault: string } {
  return { endReason, fault: endReason === "provider_error" ? "provider" : "renter" };
}

/** How long a job that died of a stop signal waits for the daemon's own stop before it is reported as failed. */
const STOP_SIGNAL_WAIT_MS = 1000;
/** An assignment's attempt; a server that sends none leaves it 0 (proto3's default). */
const attemptOf = (job: AssignedJob) => job.attempt || undefined;
/**
 * A result refused with one of these codes was not judged, only not taken now (the server's
 * database away, a fault of the server, the stream's budget of reports spent for the minute): it
 * is sent again every RESULT_RETRY_MS, up to RESULT_RETRIES times (five minutes), and again with
 * each welcome until acknowledged. SVC_RESULT_RETRY_SECONDS changes the interval.
 */
const RETRIED_CODES = new Set(["unavailable", "internal", "deadline_exceeded", "unknown", "resource_exhausted"]);
const RESULT_RETRY_MS = (Number(process.env.SVC_RESULT_RETRY_SECONDS) || 5) * 1000;
const RESULT_RETRIES = 60;
const STOP_SIGNALS = new Set(["SIGTERM", "SIGINT", "SIGHUP"]);
/**
 * A job pushed while every GPU is taken (the server counts a job that is still being stopped as
 * ended already) waits this long for one to be given back before it is refused.
 */
const GPU_WAIT_MS = 60_000;
const GPU_WAIT_POLL_MS = 100;
/**
 * How long after it arrived a job may wait for what it needs here (its image pulled) before it is
 * handed back: under the server's limit on preparing (30 minutes after the assignment,
 * PREPARE_LIMIT_SECONDS), past which the server takes it back itself. SVC_PREPARE_WAIT_SECONDS
 * changes it (docs/daemons.md).
 */
const PREPARE_WAIT_MS = (Number(process.env.SVC_PREPARE_WAIT_SECONDS) || 25 * 60) * 1000;
/**
 * How often a job being prepared is said to be (JobPreparing): each keeps it for a pickup window
 * (120 s) on the server. SVC_PREPARE_NOTICE_SECONDS changes it (docs/daemons.md).
 */
const PREPARE_NOTICE_MS = (Number(process.env.SVC_PREPARE_NOTICE_SECONDS) || 30) * 1000;

/** Whether the job ended by SIGTERM/SIGINT/SIGHUP from outside (directly, or as a shell's 128+n exit status). */
function stopSignalled(o: Outcome): boolean {
  if (o.success) return false;
  const { signal, exit_code: code } = o.metrics;
  return (typeof signal === "string" && STOP_SIGNALS.has(signal)) || code === 143 || code === 130 || code === 129;
}

/** The longest Retry-After honoured (10 minutes): a larger one is waited for this long. */
const MAX_RETRY_AFTER_MS = 600_000;

/**
 * How long a refused stream asked the daemon to wait before it opens the next (its Retry-After in
 * seconds: a rate limit's 429, a 503 while the server's database is away), in ms; 0 when it did not say.
 */
export function retryAfterMs(err: unknown): number {
  if (!(err instanceof ConnectError)) return 0;
  const s = Number(err.metadata.get("retry-after"));
  return Number.isFinite(s) && s > 0 ? Math.min(MAX_RETRY_AFTER_MS, Math.ceil(s * 1000)) : 0;
}

/** How long a welcomed stream must have stayed open for its end to restart the reconnect backoff. */
const STABLE_STREAM_MS = 10_000;

/** Exponential backoff with full jitter in [0.5, 1.5) of the step. */
export function backoffMs(attempt: number, minMs: number, maxMs: number, random = Math.random): number {
  const step = Math.min(maxMs, minMs * 2 ** Math.min(attempt, 20));
  return Math.round(step * (0.5 + random()));
}

export class ProviderDaemon {
  private readonly probe: GpuProbe;
  private readonly started = Date.now();
  private out: AsyncQueue<Msg> | undefined;
  private connected = false;
  private abortConn: AbortController | undefined;
  private stopping = false;
  private readonly stopSignal = new AbortController();
  private heartbeatTimer: NodeJS.Timeout | undefined;
  private readonly backlog: MsgKind[] = [];
  /** The bytes of log text and beats held in the backlog (BACKLOG_MAX_BYTES caps them). */
  private backlogBytes = 0;
  private readonly unackedResults = new Map<string, MsgKind>();
  /** unackedResults on disk: a result outlives a restart of the daemon until the server took or refused it. */
  private readonly keptResults: KeptResults;
  /** Results the server could not take for now, each sent again when its timer fires. */
  private readonly resultRetries = new Map<string, { count: number; timer?: NodeJS.Timeout }>();
  /** This daemon's own key: registered with the server in hello, it signs each result (provider attestation). */
  private readonly attestKey: Ed25519Signer | undefined;
  private readonly jobs = new Map<string, ActiveJob>();
  /** The host's GPUs, one per running job. */
  private readonly gpuPool = new GpuPool();
  private settings: DaemonSettings | undefined;
  private signingKey: string | undefined;
  /** Where signingKey came from: the per-server file, the single file of older versions, or --server-key. */
  private keySource: "pinned" | "legacy" | "configured" | undefined;
  /** The next welcome's key is pinned whatever was pinned before (--trust-new-server-key, once). */
  private trustNextKey: boolean;
  private keyMismatch = false;
  /** The process's exit status: 0, or EXIT_KEY_MISMATCH when the daemon left because it cannot trust the server. */
  exitCode = 0;
  private readinessSent = false;
  private runLoop: Promise<void> | undefined;
  private stopped: Promise<void> | undefined;
  paused = false;
  approved = false;
  providerId: number | undefined;

  constructor(private readonly cfg: DaemonConfig) {
    withholdSecrets(cfg.key, cfg.hmacSecret);
    this.probe = new GpuProbe(cfg.nvidiaSmi, this.stopSignal.signal, cfg.visibleDevices);
    this.attestKey = loadAttestationKey(cfg.stateDir, cfg.log);
    this.keptResults = new KeptResults(path.join(cfg.stateDir, KEPT_RESULTS_DIR, daemonLabel(cfg.url, cfg.executors.workRoot)), cfg.log);
    for (const [jobId, kind] of this.keptResults.load()) this.unackedResults.set(jobId, kind);
    if (this.unackedResults.size > 0) cfg.log(`${this.unackedResults.size} result(s) kept from an earlier run, sent once connected (jobs ${[...this.unackedResults.keys()].join(", ")})`);
    this.trustNextKey = !!cfg.trustNewServerKey && !cfg.serverKey;
    if (cfg.serverKey) [this.signingKey, this.keySource] = [cfg.serverKey, "configured"];
    else {
      const pinned = readKey(pinnedKeyFile(cfg.stateDir, cfg.url));
      const legacy = pinned ? undefined : readKey(path.join(cfg.stateDir, LEGACY_KEY_FILE));
      this.signingKey = pinned ?? legacy;
      this.keySource = pinned ? "pinned" : legacy ? "legacy" : undefined;
    }
  }

  // ---- connection ---------------------------------------------------------

  start(): Promise<void> {
    this.runLoop ??= this.loop();
    return this.runLoop;
  }

  private async loop(): Promise<void> {
    const docker = this.cfg.executors.docker;
    // Before any job: a job's process or container a killed run of this daemon left may still hold
    // a GPU (the server hands its job out again), and its jobs' volumes and folders the disk. No
    // job of this run holds any yet.
    await killLeftoverProcesses(this.cfg.executors.workRoot, this.cfg.log);
    if (docker?.daemonLabel) {
      await removeLeftovers({ docker: docker.docker, label: docker.daemonLabel, workRoot: this.cfg.executors.workRoot }, this.cfg.log, this.stopSignal.signal);
    }
    const client = createClient(DaemonService, createGrpcTransport({ baseUrl: this.cfg.url }));
    let attempt = 0;
    while (!this.stopping) {
      let welcomedAt: number | undefined;
      const out = new AsyncQueue<Msg>();
      this.out = out;
      const abort = new AbortController();
      this.abortConn = abort;
      let drainMs: number | undefined;
      let retryAfter = 0;
      const snapshot = await this.probe.snapshot();
      if (this.stopping) break;
      out.push({
        kind: {
          case: "hello",
          value: {
            daemonVersion: DAEMON_VERSION,
            gpus: snapshot.gpus as unknown as JsonObject[],
            resourceSpec: resourceSpec(),
            cachedModels: this.cfg.cachedModels,
            // With the jobs whose result the server has not acknowledged: a job that ended while the
            // daemon was away is not lost, and its result follows the welcome.
            runningJobIds: [...new Set([...this.acceptedJobIds(), ...this.unackedResults.keys()])],
            // Of which attempt each is: a job assigned back here as a new attempt meanwhile is not taken for the old run.
            runningJobAttempts: this.heldAttempts(),
            // The server keeps a provider whose daemon would refuse its tasks out of dispatch.
            taskSigningKey: this.trustNextKey ? undefined : this.signingKey,
            providerKey: this.attestKey?.publicKey,
            // Recorded before the welcome: no job of another type is placed here before the first beat.
            supportedJobTypes: supportedJobTypes(this.cfg.executors),
          },
        },
      });
      try {
        for await (const msg of client.connect(out, { headers: { "x-provider-key": this.cfg.key }, signal: abort.signal })) {
          if (msg.kind.case === "welcome") {
            welcomedAt = Date.now();
            await this.onWelcome(msg.kind.value);
          } else if (msg.kind.case === "drain") {
            drainMs = msg.kind.value.reconnectAfterMs;
            this.cfg.log(`server is draining (${msg.kind.value.reason}); reconnecting in ${drainMs} ms`);
            out.close();
          } else {
            this.onMessage(msg);
          }
        }
      } catch (err) {
        retryAfter = retryAfterMs(err);
        if (!this.stopping) this.cfg.log(`stream closed: ${(err as Error).message}${retryAfter ? `; retrying in ${retryAfter / 1000} s, as the server asked` : ""}`);
      }
      this.connected = false;
      this.out = undefined;
      out.close();
      if (this.heartbeatTimer) clearInterval(this.heartbeatTimer);
      if (this.stopping) break;
      // A welcome restarts the backoff only for a stream that then stayed open: a server that welcomes
      // and drops each stream at once is not reconnected to at the first step's pace forever.
      if (welcomedAt !== undefined && Date.now() - welcomedAt >= STABLE_STREAM_MS) attempt = 0;
      const wait = drainMs ?? Math.max(backoffMs(attempt++, this.cfg.reconnectMinMs, this.cfg.reconnectMaxMs), retryAfter);
      await sleep(wait, this.stopSignal.signal);
    }
  }

  /** The attempt of each job this daemon runs or holds a result of (those an older server named none of are left out). */
  private heldAttempts(): Record<string, number> {
    const held: Record<string, number> = {};
    for (const [jobId, kind] of this.unackedResults) {
      const attempt = kind?.case === "result" ? kind.value?.attempt : undefined;
      if (attempt) held[jobId] = attempt;
    }
    for (const [jobId, active] of this.jobs) if (active.attempt && active.accepted) held[jobId] = active.attempt;
    return held;
  }

  /** The jobs this daemon accepted and still holds (not those it prepares: the server would start them). */
  private acceptedJobIds(): string[] {
    return [...this.jobs].filter(([, a]) => a.accepted).map(([jobId]) => jobId);
  }

  /**
   * Sends now when connected, else keeps it for the next connection. `heldBytes`: the message is a
   * log batch or a beat, of about that size, kept only within BACKLOG_MAX_BYTES and half the
   * message count, so that what must get through (accepts, refusals, events) has room. Whether it
   * was sent or kept.
   */
  private send(kind: MsgKind, heldBytes?: number): boolean {
    if (this.connected && this.out?.push({ kind })) return true;
    if (heldBytes !== undefined) {
      if (this.backlogBytes + heldBytes > (this.cfg.backlogMaxBytes ?? BACKLOG_MAX_BYTES) || this.backlog.length >= MAX_BACKLOG / 2) return false;
      this.backlogBytes += heldBytes;
    } else if (this.backlog.length >= MAX_BACKLOG) return false;
    this.backlog.push(kind);
    return true;
  }

  private async onWelcome(w: Welcome) {
    this.providerId = Number(w.providerId);
    this.approved = w.approvalStatus === "approved";
    if (w.settings) this.applySettings(w.settings);
    const distrust = this.checkSigningKey(w.taskSigningKey);
    if (distrust) {
      // Takes no work (the server pushes none: our hello named the key) and leaves.
      this.keyMismatch = true;
      this.exitCode = EXIT_KEY_MISMATCH;
      this.cfg.log(distrust);
      this.out?.push({ kind: this.eventKind("task_signing_key_mismatch", "critical", distrust) });
      void this.stop();
      return;
    }
    this.connected = true;
    this.cfg.log(`connected as provider ${this.providerId} (${w.approvalStatus})`);
    this.backlogBytes = 0;
    for (const kind of this.backlog.splice(0)) this.out?.push({ kind });
    const seconds = this.cfg.heartbeatSeconds ?? w.heartbeatIntervalSeconds ?? 30;
    if (this.heartbeatTimer) clearInterval(this.heartbeatTimer);
    this.heartbeatTimer = setInterval(() => void this.heartbeat(), seconds * 1000);
    // The heartbeat before the results held from before: whatever a result does to the stream,
    // this connection has told the server the provider is alive.
    await this.heartbeat();
    if (this.connected) for (const kind of this.unackedResults.values()) this.out?.push({ kind });
    // Jobs being prepared are not named in the hello: a notice at once tells the server they are
    // still wanted, and its refusal tells this daemon one was cancelled or moved meanwhile.
    for (const [jobId, active] of this.jobs) if (!active.accepted) this.notePreparing(jobId, active);
    if (!this.readinessSent) {
      this.readinessSent = true;
      await this.readiness();
      this.event("daemon_started", "info", `pid ${process.pid}, version ${DAEMON_VERSION}`);
    }
  }

  /** Pins the welcome's key when nothing (or --trust-new-server-key) says otherwise; else why it cannot be trusted. */
  private checkSigningKey(key: string): string | undefined {
    if (!key) return undefined;
    const origin = new URL(this.cfg.url).origin;
    if (!this.signingKey || this.trustNextKey) {
      if (this.signingKey && this.signingKey !== key) this.cfg.log(`pinned the new task-signing key of ${origin} (${key}), replacing ${this.signingKey}, as --trust-new-server-key asked`);
      this.trustNextKey = false;
      this.pin(key);
      return undefined;
    }
    if (this.signingKey === key) {
      // A pin of an older version (one file for every server) moves to this server's own file.
      if (this.keySource === "legacy") this.pin(key);
      return undefined;
    }
    const source =
      this.keySource === "configured"
        ? "given with --server-key (SVC_SERVER_KEY)"
        : `pinned for it in ${this.keySource === "legacy" ? path.join(this.cfg.stateDir, LEGACY_KEY_FILE) : pinnedKeyFile(this.cfg.stateDir, this.cfg.url)}`;
    const fix =
      this.keySource === "configured"
        ? "After checking the server's key with its operator, set --server-key to it."
        : "After checking the server's key with its operator, restart with --trust-new-server-key (SVC_TRUST_NEW_SERVER_KEY=1) to pin it.";
    return [
      `the server at ${origin} signs tasks with another key than the one ${source}:`,
      `  pinned: ${this.signingKey}`,
      `  server: ${key}`,
      "Either the server was replaced or its database recreated, or something impersonates it. This daemon takes no work from it and exits.",
      fix,
    ].join("\n");
  }

  private pin(key: string) {
    this.signingKey = key;
    this.keySource = "pinned";
    const file = pinnedKeyFile(this.cfg.stateDir, this.cfg.url);
    try {
      fs.mkdirSync(path.dirname(file), { recursive: true, mode: 0o700 });
      // Renamed into place: daemons sharing the state folder never read half a key.
      const tmp = `${file}.${process.pid}.tmp`;
      fs.writeFileSync(tmp, key + "\n", { mode: 0o600 });
      fs.renameSync(tmp, file);
    } catch (err) {
      this.cfg.log(`could not pin the server key: ${(err as Error).message}`);
    }
  }

  private onMessage(msg: ServerMessage) {
    const k = msg.kind;
    switch (k.case) {
      case "job":
        void this.onJob(k.value, msg.taskSignature);
        return;
      case "cancel":
        this.cancelJob(k.value.jobId, k.value.reason);
        return;
      case "settings":
        this.applySettings(k.value);
        return;
      case "heartbeatAck":
        this.approved = k.value.approved;
        this.paused = k.value.paused;
        if (k.value.updateAvailable || k.value.needsUpdate) this.cfg.log(`an update is available: ${k.value.latestVersion} (this is ${DAEMON_VERSION})`);
        return;
      case "resultAck":
        this.unackedResults.delete(k.value.jobId);
        this.keptResults.drop(k.value.jobId);
        clearTimeout(this.resultRetries.get(k.value.jobId)?.timer);
        this.resultRetries.delete(k.value.jobId);
        return;
      case "error":
        this.cfg.log(`server refused a report${k.value.jobId ? ` about ${k.value.jobId}` : ""}: ${k.value.message}`);
        // Only a refused result is given up on; a refused log line or event about the same job is not.
        // A result the server could not take now (its database away, say) is sent again.
        if (k.value.jobId && k.value.report === "result" && this.refusedHeldResult(k.value.jobId, k.value.attempt)) {
          if (RETRIED_CODES.has(k.value.code) || this.droppedAttestation(k.value.jobId, k.value.message)) this.resendResult(k.value.jobId);
          else {
            this.unackedResults.delete(k.value.jobId);
            this.keptResults.drop(k.value.jobId);
            this.resultRetries.delete(k.value.jobId);
          }
        }
        if (k.value.jobId && NOT_OURS_CODES.has(k.value.code) && this.refusedAsNotOurs(k.value.jobId, k.value.report, k.value.attempt)) {
          this.cancelJob(k.value.jobId, `the server refused its ${k.value.report === "jobAccepted" ? "accept" : "preparing notice"}: ${k.value.message}`);
        }
        return;
    }
  }

  /**
   * Whether a refused result is the one held for the job: a refusal of an earlier attempt's result
   * (sent before the job came back here as a new attempt) leaves the later attempt's result alone.
   */
  private refusedHeldResult(jobId: string, attempt: number | undefined): boolean {
    const held = this.unackedResults.get(jobId);
    const heldAttempt = held?.case === "result" ? held.value?.attempt : undefined;
    return attempt === undefined || heldAttempt === undefined || attempt === heldAttempt;
  }

  /**
   * Whether a refusal of this report means the job is not this provider's: a refused accept, or a
   * refused preparing notice while the job is still being prepared (one sent before the accept and
   * held over a reconnect may reach the server after the job started, and is refused for that), of
   * the attempt this daemon holds now.
   */
  private refusedAsNotOurs(jobId: string, report: string, attempt: number | undefined): boolean {
    const active = this.jobs.get(jobId);
    if (!active) return false;
    // The refusal of an earlier run's report (a job assigned back here as a new attempt) is not this run's.
    if (attempt !== undefined && active.attempt !== undefined && attempt !== active.attempt) return false;
    if (report === "jobAccepted") return true;
    return report === "jobPreparing" && active.accepted !== true;
  }

  /** Stops a job the server says is not this provider's to run (a cancel, or a refusal saying so). */
  private cancelJob(jobId: string, reason: string) {
    const job = this.jobs.get(jobId);
    if (!job || job.cancelled) return;
    job.cancelled = true;
    job.cancelReason = reason;
    job.abort.abort();
    this.cfg.log(`job ${jobId} cancelled by the server (${reason})`);
    void job.running?.stop(`cancelled: ${reason}`);
  }

  /** A preparing notice for the job (JobPreparing): keeps it assigned here while it waits. */
  private notePreparing(jobId: string, active: ActiveJob) {
    if (active.preparing !== undefined) this.send({ case: "jobPreparing", value: { jobId, attempt: active.attempt, detail: active.preparing } });
  }

  /**
   * A result refused for its attestation alone (the server names the field: "attestation.…") is
   * sent again without it, so an honest output is not lost to the job's timeout; the server then
   * keeps it unattested. False when there was none to drop.
   */
  private droppedAttestation(jobId: string, message: string): boolean {
    const result = this.unackedResults.get(jobId);
    if (result?.case !== "result" || !result.value.attestation || !message.startsWith("attestation.")) return false;
    this.cfg.log(`job ${jobId}: the server refused the result's attestation (${message}); sending the result unattested`);
    const unattested: MsgKind = { case: "result", value: { ...result.value, attestation: undefined } };
    this.unackedResults.set(jobId, unattested);
    this.keptResults.keep(jobId, unattested);
    return true;
  }

  /** Sends an unacknowledged result again after RESULT_RETRY_MS (or with the next welcome, if the stream drops first). */
  private resendResult(jobId: string) {
    const retry = this.resultRetries.get(jobId) ?? { count: 0 };
    if (retry.timer) return;
    if (retry.count >= RESULT_RETRIES) {
      this.resultRetries.delete(jobId);
      this.unackedResults.delete(jobId);
      this.keptResults.drop(jobId);
      this.cfg.log(`gave up sending the result of ${jobId} after ${RESULT_RETRIES} tries`);
      return;
    }
    retry.count++;
    retry.timer = setTimeout(() => {
      retry.timer = undefined;
      const result = this.unackedResults.get(jobId);
      if (result && this.connected) this.out?.push({ kind: result });
    }, RESULT_RETRY_MS);
    retry.timer.unref();
    this.resultRetries.set(jobId, retry);
  }

  private applySettings(s: DaemonSettings) {
    this.settings = s;
    this.paused = s.paused;
  }

  // ---- reports --------------------------------------------------------------

  private async heartbeat() {
    // While stopping, the probe is aborted: a heartbeat now would report no GPUs.
    if (this.stopping) return;
    const snap = await this.probe.snapshot();
    if (this.stopping) return;
    const status = gpuStatus(snap, DAEMON_VERSION, { osInfo: `${os.type()} ${os.release()} ${os.arch()}`, runtimeVersion: `node ${process.versions.node}` }) as JsonValue;
    this.send({
      case: "heartbeat",
      value: {
        gpuStatus: toValue(status),
        uptime: (Date.now() - this.started) / 1000,
        providerHostname: os.hostname(),
        cachedModels: this.cfg.cachedModels,
        resourceSpec: resourceSpec(),
        daemonVersion: DAEMON_VERSION,
        // In every beat: the server offers this provider no job type that executorFor would refuse.
        supportedJobTypes: supportedJobTypes(this.cfg.executors),
      },
    }, JSON.stringify(status).length + HEARTBEAT_OVERHEAD_BYTES);
  }

  private async readiness() {
    const snap = await this.probe.snapshot();
    const torch = await runCommand("python3", ["-c", "import torch"], { timeoutMs: 20_000, signal: this.stopSignal.signal });
    this.send({
      case: "readiness",
      value: {
        daemonVersion: DAEMON_VERSION,
        checks: {
          cuda: snap.gpus.length > 0 && snap.cudaVersion !== null,
          pytorch: torch.code === 0,
          vramGb: Math.round(snap.gpus.reduce((a, g) => a + (g.vram_mib ?? 0), 0) / 102.4) / 10,
          driver: snap.driverVersion ?? "",
        },
      },
    });
  }

  event(eventType: string, severity: "info" | "warning" | "error" | "critical", details?: string, jobId?: string) {
    this.send(this.eventKind(eventType, severity, details, jobId));
  }

  private eventKind(eventType: string, severity: "info" | "warning" | "error" | "critical", details?: string, jobId?: string): MsgKind {
    return {
      case: "event",
      value: {
        eventType,
        severity,
        details: details?.slice(0, 5000),
        jobId,
        daemonVersion: DAEMON_VERSION,
        timestamp: new Date().toISOString(),
        hostname: os.hostname(),
        osInfo: `${os.type()} ${os.release()}`,
      },
    };
  }

  // ---- jobs -------------------------------------------------------------------

  /** Why this job must not run here now, or undefined. */
  private async refusal(job: JobNeeds, snap: GpuSnapshot): Promise<string | undefined> {
    const s = this.settings;
    if (this.paused || s?.paused) return "the provider is paused";
    if (s && !withinRunWindow(s.runMode, s.scheduledStart, s.scheduledEnd)) return "outside the provider's scheduled run window";
    if (!s || snap.gpus.length === 0) return undefined;
    if (s.gpuUsageCapPct <= 0) return "the GPU usage cap is 0%";
    // Judged on the GPUs no other job holds: the job gets one of them, and another job's GPU being
    // hot or busy is that job's doing. With every GPU held the job waits for one (takeGpu).
    const held = new Set(this.gpuPool.taken());
    const free = snap.gpus.filter((g) => g.index === null || !held.has(g.index));
    const reasons = free.map((g) => gpuUnfit(g, s, job));
    return reasons.includes(undefined) ? undefined : reasons[0];
  }

  private verified(job: AssignedJob, signature: string): boolean {
    if (this.keyMismatch) return false;
    const hmac = this.cfg.hmacSecret ? verifyTask(this.cfg.hmacSecret, job.taskSpec, job.taskSpecHmac) : undefined;
    if (hmac === false) return false;
    const sig = this.signingKey ? verifyTaskSignature(this.signingKey, job.jobId, job.taskSpec, signature) : undefined;
    if (sig === false) return false;
    return hmac === true || sig === true;
  }

  /** A job the server cancelled before it was accepted: nothing started, nothing to report. */
  private droppedCancelled(active: ActiveJob): void {
    this.cfg.log(`job ${active.spec.jobId} not started: the server cancelled it while it was being checked`);
  }

  /** Refuses a job; `endReason` says why in the server's terms (the provider's fault each). */
  private reject(job: AssignedJob, reason: string, endReason: "provider_refused" | "signature_mismatch" | "unsupported_on_provider" = "provider_refused") {
    this.cfg.log(`job ${job.jobId} refused: ${reason}`);
    this.send({ case: "jobRejected", value: { jobId: job.jobId, reason, endReason, attempt: attemptOf(job) } });
  }

  private async onJob(job: AssignedJob, signature: string) {
    const prior = this.jobs.get(job.jobId);
    if (prior) {
      // Pushed again while it runs: the same attempt, nothing to do. Pushed while it is being
      // stopped (re-queued away, then assigned back to this provider), or naming another attempt
      // than the run held here (assigned back while the daemon was away: no cancel came): a new
      // attempt, started once the old run is gone.
      const another = attemptOf(job) !== undefined && prior.attempt !== undefined && attemptOf(job) !== prior.attempt;
      if (prior.cancelled || another) prior.next = { job, signature };
      if (another) this.cancelJob(job.jobId, `attempt ${attemptOf(job)} of the job follows`);
      return;
    }
    if (this.stopping) return this.reject(job, "the daemon is shutting down");
    // What runs, and for how long, is what the server signed (the task), never the envelope around it.
    const signed = signedTerms(job);
    const spec: JobSpec = {
      jobId: job.jobId,
      jobType: signed.jobType ?? "",
      taskSpec: (job.taskSpec ?? {}) as JsonObject,
      maxDurationSeconds: signed.maxDurationSeconds ?? DEFAULT_MAX_DURATION_SECONDS,
    };
    const active: ActiveJob = { spec, attempt: attemptOf(job), cancelled: false, interrupted: false, logs: [], logBytes: 0, droppedLines: 0, abort: new AbortController() };
    const arrived = Date.now();
    this.jobs.set(job.jobId, active);
    try {
      if (!this.verified(job, signature)) {
        this.event("task_signature_invalid", "error", "the task's signature does not verify; refused", job.jobId);
        return this.reject(job, "task signature verification failed: the daemon refused a tampered or unsigned task", "signature_mismatch");
      }
      const unsigned = unsignedDisagreement(job, signed);
      if (unsigned) {
        this.event("task_signature_invalid", "error", `${unsigned}; refused`, job.jobId);
        return this.reject(job, `the assignment does not match its signed task: ${unsigned}`, "signature_mismatch");
      }
      const needs: JobNeeds = { minVramGb: signed.minVramGb };
      const snap = await this.probe.snapshot();
      if (active.cancelled) return this.droppedCancelled(active);
      const why = await this.refusal(needs, snap);
      if (active.cancelled) return this.droppedCancelled(active);
      if (why) return this.reject(job, why);
      active.gpu = gpuFacts(snap);
      let executor;
      try {
        executor = executorFor(spec, this.cfg.executors);
      } catch (err) {
        return this.reject(job, (err as Error).message, "unsupported_on_provider");
      }
      // SIGTERM came while the task was being checked: nothing started, refuse it.
      if (this.stopping) return this.reject(job, "the daemon is shutting down");
      if (snap.gpus.length > 0) {
        // Its own GPU, never every GPU of the host: the server gives this provider one job per GPU.
        const gpu = await this.takeGpu(active, needs, snap);
        if (active.cancelled) return this.droppedCancelled(active);
        if (this.stopping) return this.reject(job, "the daemon is shutting down");
        if (gpu === undefined) return this.reject(job, `every GPU of this host is running another job (GPUs ${this.gpuPool.taken().join(", ")})`);
        spec.gpus = [gpu];
        // The result's attestation names the GPU the job ran on, not every GPU of the host.
        active.gpu = gpuFacts({ ...snap, gpus: snap.gpus.filter((g) => g.index === gpu) });
      } else if (executor.name === "docker" && this.cfg.executors.docker?.gpus) {
        // The host had GPUs when the daemon started and nvidia-smi lists none now: a driver problem of this machine.
        return this.reject(job, "nvidia-smi lists no GPU now; the job's container cannot be given one");
      }
      // What the job needs on this machine before it runs (its container image, pulled when it is not
      // here): before the accept, which starts the job's billed time and its max_duration_seconds.
      // Within the server's pickup window; failing or running past it is this machine's failure.
      if (executor.prepare) {
        const signal = AbortSignal.any([active.abort.signal, this.stopSignal.signal]);
        let notices: ReturnType<typeof setInterval> | undefined;
        const preparing = (detail: string) => {
          active.preparing = detail;
          clearInterval(notices);
          this.notePreparing(job.jobId, active);
          notices = setInterval(() => this.notePreparing(job.jobId, active), PREPARE_NOTICE_MS);
        };
        const failed = await executor
          .prepare(spec, { deadline: arrived + PREPARE_WAIT_MS, signal, stop: this.stopSignal.signal, log: this.cfg.log, preparing })
          .finally(() => {
            clearInterval(notices);
            active.preparing = undefined;
          });
        if (active.cancelled) return this.droppedCancelled(active);
        if (this.stopping) return this.reject(job, "the daemon is shutting down");
        if (failed) {
          this.event("job_prepare_failed", "warning", failed, job.jobId);
          return this.reject(job, failed);
        }
      }
      // Cancelled while it was checked (the probe, the GPU wait): not accepted, not started.
      if (active.cancelled) return this.droppedCancelled(active);
      active.accepted = true;
      this.send({ case: "jobAccepted", value: { jobId: job.jobId, attempt: active.attempt } });
      this.event("job_started", "info", `${spec.jobType} on ${executor.name}`, job.jobId);
      let outcome: Outcome;
      try {
        outcome = await this.execute(active, executor.start.bind(executor));
      } catch (err) {
        // This machine could not start it (its job folder, the executor): the provider's failure, re-queued.
        const error = `could not start the job: ${(err as Error).message}`;
        outcome = { success: false, error, metrics: { duration_seconds: 0, executor: executor.name }, endReason: "provider_error" };
      }
      // A service manager's stop signals every process of the service at once (systemd's
      // control-group kill): the job may die of it a moment before the daemon hears its own.
      if (!active.cancelled && !active.interrupted && stopSignalled(outcome)) await waitUntil(() => this.stopping, Date.now() + STOP_SIGNAL_WAIT_MS);
      this.finish(active, outcome);
    } finally {
      // Given back before anything else is heard from the server, which may already send the next job.
      this.gpuPool.release(active.gpuIndex);
      active.gpuIndex = undefined;
      this.jobs.delete(job.jobId);
      if (active.next) void this.onJob(active.next.job, active.next.signature);
    }
  }

  /**
   * Takes a free GPU for the job (one with the memory it asks for when there is one), waiting up to
   * GPU_WAIT_MS for a job still being stopped to give its GPU back. Undefined when none came free,
   * or the job was cancelled or the daemon is stopping meanwhile.
   */
  private async takeGpu(active: ActiveJob, job: JobNeeds, snap: GpuSnapshot): Promise<number | undefined> {
    const { minVramGb } = job;
    const minTotalMib = minVramGb > 0 ? minVramGb * 1000 + (this.settings?.vramReserveGb ?? 0) * 1024 : 0;
    const deadline = Date.now() + GPU_WAIT_MS;
    // The GPUs fit for it first (refusal() found one free, unless every GPU was held).
    const s = this.settings;
    const gpus = s ? [...snap.gpus].sort((a, b) => Number(gpuUnfit(a, s, job) !== undefined) - Number(gpuUnfit(b, s, job) !== undefined)) : snap.gpus;
    for (;;) {
      active.gpuIndex = this.gpuPool.take(gpus, minTotalMib);
      if (active.gpuIndex !== undefined || active.cancelled || this.stopping || Date.now() >= deadline) return active.gpuIndex;
      await sleep(GPU_WAIT_POLL_MS, this.stopSignal.signal);
    }
  }

  private async execute(active: ActiveJob, start: (spec: JobSpec, hooks: JobHooks) => RunningJob): Promise<Outcome> {
    const { spec } = active;
    const running = start(spec, {
      log: (line) => this.logLine(active, line),
      progress: (pct, phase) => this.report(active, { case: "progress", value: { jobId: spec.jobId, progressPct: pct, phase, attempt: active.attempt } }),
      endpointReady: (url, apiKey) =>
        this.report(active, {
          case: "endpointReady",
          value: {
            jobId: spec.jobId,
            attempt: active.attempt,
            ...(url.startsWith("port:") ? { port: Number(url.slice(5)) } : { endpointUrl: url }),
            ...(apiKey ? { endpointApiKey: apiKey } : {}),
          },
        }),
    });
    active.running = running;
    // Cancelled before it started (cancelJob found no run to stop): stopped now.
    if (active.cancelled) void running.stop(`cancelled: ${active.cancelReason ?? "by the server"}`);
    const timer = setTimeout(() => {
      active.timedOut = true;
      void running.stop(`max_duration_seconds (${spec.maxDurationSeconds} s) exceeded; the job was killed`);
    }, spec.maxDurationSeconds * 1000);
    try {
      return await running.done;
    } finally {
      clearTimeout(timer);
      this.flushLogs(active);
      this.noteDroppedLines(active);
    }
  }

  /**
   * A report on a running job. None goes out once the server cancelled the run: it would be refused,
   * or, when the job came back to this provider as a new attempt, taken for that attempt's.
   */
  private report(active: ActiveJob, kind: MsgKind) {
    if (!active.cancelled) this.send(kind);
  }

  private logLine(active: ActiveJob, line: string) {
    const text = line.length > 16_000 ? line.slice(0, 16_000) : line;
    const bytes = Buffer.byteLength(text, "utf8");
    // Past the job's budget every later line goes too (as the server drops them): its log reads whole up to a point.
    if (active.droppedLines > 0 || active.logBytes + bytes > (this.cfg.jobLogMaxBytes ?? JOB_LOG_MAX_BYTES)) {
      active.droppedLines++;
      return;
    }
    active.logBytes += bytes;
    active.logs.push(text);
    if (active.logs.length >= LOG_BATCH) this.flushLogs(active);
    else active.flushTimer ??= setTimeout(() => this.flushLogs(active), LOG_FLUSH_MS);
  }

  private flushLogs(active: ActiveJob) {
    if (active.flushTimer) clearTimeout(active.flushTimer);
    active.flushTimer = undefined;
    if (active.logs.length === 0) return;
    const lines = active.logs.splice(0);
    // None goes out once the server cancelled the run (report()).
    if (active.cancelled) return;
    const bytes = lines.reduce((n, l) => n + Buffer.byteLength(l, "utf8"), 0);
    const kept = this.send({ case: "logs", value: { jobId: active.spec.jobId, logs: lines.map((l) => toValue(l)), attempt: active.attempt } }, bytes);
    if (!kept) active.droppedAway = (active.droppedAway ?? 0) + lines.length;
  }

  /** Once the job's output has ended: one line in its log saying how many lines were dropped, and why. */
  private noteDroppedLines(active: ActiveJob) {
    const why: string[] = [];
    if (active.droppedLines > 0) why.push(`${active.droppedLines} past the ${this.cfg.jobLogMaxBytes ?? JOB_LOG_MAX_BYTES} bytes of log text a job may send`);
    if (active.droppedAway) {
      why.push(`${active.droppedAway} while the daemon could not reach the server and held ${this.cfg.backlogMaxBytes ?? BACKLOG_MAX_BYTES} bytes of reports already`);
    }
    if (why.length === 0) return;
    const total = active.droppedLines + (active.droppedAway ?? 0);
    const text = `${total} log line(s) of this job were dropped by the provider's daemon: ${why.join("; ")}`;
    this.cfg.log(`job ${active.spec.jobId}: ${text}`);
    const notice = `[svc-daemon] ${text}`;
    // Small, and not droppable: the one line that says the log is not whole.
    this.report(active, { case: "logs", value: { jobId: active.spec.jobId, logs: [toValue(notice)], attempt: active.attempt } });
  }

  private finish(active: ActiveJob, outcome: Outcome): void {
    const { jobId } = active.spec;
    if (active.cancelled) {
      this.event("job_cancelled", "info", outcome.error, jobId);
      return;
    }
    // Stopped by the shutdown (also when a service manager's stop signal reached the job's own
    // processes first): the provider's doing. A job that completed meanwhile still reports its result.
    if (active.interrupted || (this.stopping && !outcome.success)) {
      this.cfg.log(`job ${jobId} interrupted: the daemon is stopping`);
      this.send({ case: "jobRejected", value: { jobId, reason: "the provider's daemon was stopped while the job ran", interrupted: true, attempt: active.attempt } });
      this.event("job_interrupted", "warning", outcome.error, jobId);
      return;
    }
    if (outcome.result !== undefined && jsonDepthExceeds(outcome.result, RESULT_MAX_DEPTH)) {
      const error = `the job's result nests objects and arrays more than ${RESULT_MAX_DEPTH} levels deep, the most a result may`;
      this.cfg.log(`job ${jobId}: ${error}; reported as its failure`);
      return this.finish(active, { success: false, error, metrics: outcome.metrics, endReason: "runtime_error" });
    }
    // The server stores the output made storable (no NUL, no lone surrogate): the attestation signs it as stored.
    const output = withoutNul(outcome.result);
    // Counted on the JSON, before anything is built of it (encoding millions of small values takes long).
    const size = output === undefined ? 0 : valueBytes(output);
    if (size > STREAM_MESSAGE_MAX_BYTES - REPORT_OVERHEAD_BYTES) {
      // Sent, it would end the stream (and again after every reconnect): the job's own failure instead, reported small.
      const error = `the job's result is ${size} bytes once encoded, over the ${STREAM_MESSAGE_MAX_BYTES - REPORT_OVERHEAD_BYTES} bytes a result may take of a report (the stream's limit is ${STREAM_MESSAGE_MAX_BYTES})`;
      this.cfg.log(`job ${jobId}: ${error}; reported as its failure`);
      return this.finish(active, { success: false, error, metrics: outcome.metrics, endReason: "runtime_error" });
    }
    const result: MsgKind = {
      case: "result",
      value: {
        jobId,
        attempt: active.attempt,
        success: outcome.success,
        result: output === undefined ? undefined : toValue(output),
        error: withoutNul(outcome.error),
        metrics: withoutNul(outcome.metrics),
        // Whose fault a failure was, so the server bills or re-queues it (docs/daemons.md).
        ...(outcome.success ? {} : failureAttribution(active.timedOut ? "timeout" : (outcome.endReason ?? "runtime_error"))),
        attestation: this.attest(jobId, output, active.gpu),
      },
    };
    this.unackedResults.set(jobId, result);
    this.keptResults.keep(jobId, result);
    // Its tries are its own: none spent on an earlier attempt's result (replaced here) count against them.
    clearTimeout(this.resultRetries.get(jobId)?.timer);
    this.resultRetries.delete(jobId);
    if (this.connected) this.out?.push({ kind: result });
    this.event(outcome.success ? "job_completed" : "job_failed", outcome.success ? "info" : "warning", outcome.error ?? `${outcome.metrics.duration_seconds} s`, jobId);
  }

  /** The signed statement of a result: its output hash and the GPUs it ran on, by this daemon's key. */
  private attest(jobId: string, result: JsonValue | undefined, gpu: GpuFacts | undefined) {
    if (!this.attestKey) return undefined;
    const statement = attestationStatement(jobId, result ?? null, gpu ?? { model: null, count: 0, vram_mib: null, driver_version: null, uuids: [] });
    return { keyId: keyIdOf("prv", this.attestKey.publicKey), statement: statement as unknown as JsonObject, signature: this.attestKey.signCanonical(statement) };
  }

  // ---- shutdown ---------------------------------------------------------------

  /**
   * SIGTERM/SIGINT: take no more work, stop the running jobs (SIGTERM to their process groups,
   * SIGKILL after half the grace period; containers are killed), report them as interrupted,
   * then half-close the stream: the server answers every report before it ends its side, so
   * the end of the stream acknowledges them. Bounded by the stop grace period; nothing of ours
   * (timer, child process, connection) is left to hold the process once it returns.
   */
  async stop(): Promise<void> {
    if (this.stopping) return this.stopped;
    this.stopping = true;
    this.stopped = this.shutdown();
    return this.stopped;
  }

  private async shutdown(): Promise<void> {
    const deadline = Date.now() + this.cfg.stopGraceMs;
    const left = () => Math.max(0, deadline - Date.now());
    this.cfg.log(`stopping; ${this.jobs.size} job(s) running`);
    // Kills a probe or readiness check in flight and wakes a reconnect wait.
    this.stopSignal.abort();
    const jobs = [...this.jobs.values()];
    for (const j of jobs) j.interrupted = !j.cancelled;
    const killAfterMs = Math.floor(this.cfg.stopGraceMs / 2);
    await within(Promise.all(jobs.map((j) => j.running?.stop("the provider's daemon was stopped", killAfterMs))), left());
    // Let onJob send each job's report before the stream closes.
    await waitUntil(() => this.jobs.size === 0, deadline);
    if (this.connected) this.event("daemon_stopped", "info", `${jobs.length} job(s) interrupted`);
    await waitUntil(() => !this.connected || this.unackedResults.size === 0, deadline);
    const undelivered = this.backlog.length;
    if (undelivered > 0) this.cfg.log(`${undelivered} report(s) not delivered: not connected to the server`);
    this.out?.close();
    if (!(await within(this.runLoop ?? Promise.resolve(), left()))) {
      this.cfg.log("the server did not close the stream in time; closing it");
      this.abortConn?.abort();
      await this.runLoop;
    }
  }
}

/** Under the state folder: the results not yet acknowledged, in a folder per server and work folder (KeptResults). */
export const KEPT_RESULTS_DIR = "results";

/**
 * The results the server has not acknowledged, one file each (the DaemonMessage as sent, binary;
 * 0600 in a 0700 folder: a result is the renter's output), so that a job that ended while the
 * server was away is not lost when the daemon stops or dies before it is back: the next start names
 * the job in its hello and sends the result. A file goes once the server took or refused the
 * result. The folder is named by the server and work folder (daemonLabel): two daemons sharing a
 * state folder keep their results apart. What cannot be written or read is logged: the daemon
 * runs on, holding the result in memory only.
 */
class KeptResults {
  constructor(
    private readonly dir: string,
    private readonly log: (line: string) => void,
  ) {}

  private file(jobId: string): string {
    return path.join(this.dir, `${crypto.createHash("sha256").update(jobId).digest("hex").slice(0, 32)}.result`);
  }

  load(): Map<string, MsgKind> {
    const kept = new Map<string, MsgKind>();
    let names: string[];
    try {
      names = fs.readdirSync(this.dir);
    } catch {
      return kept;
    }
    for (const name of names) {
      const file = path.join(this.dir, name);
      try {
        // A write a killed run did not finish.
        if (name.endsWith(".tmp")) fs.rmSync(file, { force: true });
        if (!name.endsWith(".result")) continue;
        const kind = fromBinary(DaemonMessageSchema, fs.readFileSync(file), { recursionLimit: PROTO_RECURSION_LIMIT }).kind;
        if (kind.case !== "result" || !kind.value.jobId) throw new Error("not a job result");
        kept.set(kind.value.jobId, kind);
      } catch (err) {
        this.log(`could not read the kept result ${file} (${(err as Error).message}); removed`);
        this.remove(file);
      }
    }
    return kept;
  }

  keep(jobId: string, kind: MsgKind): void {
    const file = this.file(jobId);
    const tmp = `${file}.${process.pid}.tmp`;
    try {
      fs.mkdirSync(this.dir, { recursive: true, mode: 0o700 });
      fs.rmSync(tmp, { force: true });
      fs.writeFileSync(tmp, toBinary(DaemonMessageSchema, create(DaemonMessageSchema, { kind })), { mode: 0o600, flag: "wx" });
      fs.renameSync(tmp, file);
    } catch (err) {
      this.log(`could not keep the result of ${jobId} on disk (${(err as Error).message}): it is lost if the daemon stops before the server takes it`);
    }
  }

  drop(jobId: string): void {
    this.remove(this.file(jobId));
  }

  private remove(file: string): void {
    try {
      fs.rmSync(file, { force: true });
    } catch (err) {
      this.log(`could not remove the kept result ${file}: ${(err as Error).message}`);
    }
  }
}

/** This daemon's attestation key: a raw Ed25519 seed, base64, made on first start (mode 0600). */
export const ATTESTATION_KEY_FILE = "provider-key";

/**
 * Reads the daemon's attestation key from its state folder, creating it on first start. Created
 * under a temporary name and linked into place, so daemons sharing the folder agree on one key.
 * Without a usable key the daemon runs on and attests nothing (its receipts then say so).
 */
function loadAttestationKey(stateDir: string, log: (line: string) => void): Ed25519Signer | undefined {
  const file = path.join(stateDir, ATTESTATION_KEY_FILE);
  try {
    if (!fs.existsSync(file)) {
      fs.mkdirSync(stateDir, { recursive: true, mode: 0o700 });
      const tmp = `${file}.${process.pid}.tmp`;
      fs.writeFileSync(tmp, crypto.randomBytes(32).toString("base64") + "\n", { mode: 0o600 });
      try {
        fs.linkSync(tmp, file);
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== "EEXIST") throw err;
      } finally {
        fs.unlinkSync(tmp);
      }
    }
    const seed = Buffer.from(fs.readFileSync(file, "utf8").trim(), "base64");
    return ed25519Signer(seed);
  } catch (err) {
    log(`no provider attestation key (${file}): ${(err as Error).message}; results are reported unsigned`);
    return undefined;
  }
}

const varintBytes = (n: number) => (n < 0x80 ? 1 : n < 0x4000 ? 2 : n < 0x200000 ? 3 : n < 0x10000000 ? 4 : 5);
/** A length-delimited field of n bytes: its tag, its length, its bytes. */
const fieldBytes = (n: number) => 1 + varintBytes(n) + n;

/**
 * The size of a JSON value encoded as google.protobuf.Value (as a result travels on the stream),
 * counted without building the message: null and booleans 2 bytes, numbers 9, strings and nested
 * structs and lists length-delimited.
 */
export function valueBytes(v: JsonValue): number {
  if (v === null || typeof v === "boolean") return 2;
  if (typeof v === "number") return 9;
  if (typeof v === "string") return fieldBytes(Buffer.byteLength(v, "utf8"));
  let n = 0;
  if (Array.isArray(v)) for (const item of v) n += fieldBytes(valueBytes(item));
  else for (const [k, item] of Object.entries(v)) n += fieldBytes(fieldBytes(Buffer.byteLength(k, "utf8")) + fieldBytes(valueBytes(item)));
  return fieldBytes(n);
}

/** The job type, kill timer and GPU memory its signed task_spec names (task-spec.ts buildTaskSpec). */
function signedTerms(job: AssignedJob): SignedTerms {
  const t = (job.taskSpec ?? {}) as JsonObject;
  const asObject = (v: JsonValue | undefined): JsonObject => (v && typeof v === "object" && !Array.isArray(v) ? v : {});
  const limits = asObject(t.limits);
  const max = limits.max_duration_seconds;
  const vram = asObject(limits.gpu_requirements).min_vram_gb;
  return {
    jobType: typeof t.job_type === "string" && t.job_type !== "" ? t.job_type : undefined,
    maxDurationSeconds: typeof max === "number" && Number.isFinite(max) && max > 0 ? max : undefined,
    minVramGb: typeof vram === "number" && Number.isFinite(vram) ? vram : 0,
  };
}

/**
 * How the assignment's own (unsigned) fields disagree with its signed task, or undefined: the
 * server sends both from the same job, so a difference means the message was altered.
 */
function unsignedDisagreement(job: AssignedJob, signed: SignedTerms): string | undefined {
  if (signed.jobType === undefined) return "the signed task names no job_type";
  if (job.jobType !== signed.jobType) return `job_type ${job.jobType || "(none)"} is not the signed task's ${signed.jobType}`;
  const outer = Number(job.maxDurationSeconds) || undefined;
  if (outer !== signed.maxDurationSeconds) return `max_duration_seconds ${outer ?? "(none)"} is not the signed task's ${signed.maxDurationSeconds ?? "(none)"}`;
  return undefined;
}

/** Why this GPU cannot take the job now under the provider's settings; undefined when it can. */
function gpuUnfit(g: GpuSnapshot["gpus"][number], s: DaemonSettings, job: JobNeeds): string | undefined {
  if (g.temperature_c !== null && g.temperature_c >= s.tempLimitC) return `GPU ${g.index} is at ${g.temperature_c} C, at or above the ${s.tempLimitC} C limit`;
  if (s.gpuUsageCapPct < 100 && g.utilization_pct !== null && g.utilization_pct > s.gpuUsageCapPct) {
    return `GPU ${g.index} is ${g.utilization_pct}% busy, above the ${s.gpuUsageCapPct}% usage cap`;
  }
  // Judged as placement judges it (dispatch.ts hardwareFitSql): the GPU's total memory less the reserve,
  // 1000 MiB per GB. Not the memory free now: this GPU runs no other job of this daemon (the GPU pool),
  // so what another program holds for a moment must not make the provider refuse a job it was given.
  const minVramGb = job.minVramGb;
  const usable = (g.vram_mib ?? 0) - s.vramReserveGb * 1024;
  if (minVramGb > 0 && usable < minVramGb * 1000) {
    return `GPU ${g.index} has ${Math.max(0, Math.round(usable))} MiB of VRAM after the ${s.vramReserveGb} GB reserve; the job needs ${minVramGb} GB`;
  }
  return undefined;
}

/** The GPU facts an attestation signs, from a probe snapshot. */
function gpuFacts(s: GpuSnapshot): GpuFacts {
  const g = s.gpus[0];
  return {
    model: g?.name ?? null,
    count: s.gpus.length,
    vram_mib: g?.vram_mib ?? null,
    driver_version: s.driverVersion,
    uuids: s.gpus.map((x) => x.uuid).filter((u): u is string => typeof u === "string"),
  };
}

/** Older versions pinned one key for every server here; it still counts for a server without a pin of its own. */
const LEGACY_KEY_FILE = "server-task-key";

/** Exit status when the daemon leaves because it cannot trust the server's key (EX_CONFIG: a service manager should not restart it). */
export const EXIT_KEY_MISMATCH = 78;

/** The file holding the task-signing key pinned for a server: one per origin, so one state folder serves several servers. */
export function pinnedKeyFile(stateDir: string, url: string): string {
  const { protocol, hostname, port } = new URL(url);
  const name = [protocol.replace(/:$/, ""), hostname, port].filter(Boolean).join("_").replace(/[^A-Za-z0-9.-]/g, "_");
  return path.join(stateDir, "server-keys", name);
}

function readKey(file: string): string | undefined {
  try {
    return fs.readFileSync(file, "utf8").trim() || undefined;
  } catch {
    return undefined;
  }
}

function resourceSpec(): JsonObject {
  return { cpu_count: os.cpus().length, ram_gb: Math.round((os.totalmem() / 1024 ** 3) * 10) / 10, platform: process.platform };
}

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const t = setTimeout(done, ms);
    function done() {
      clearTimeout(t);
      signal?.removeEventListener("abort", done);
      resolve();
    }
    signal?.addEventListener("abort", done, { once: true });
  });
}

/** Whether p settled within ms; the timer is cleared either way (a pending one would hold the process). */
async function within(p: Promise<unknown>, ms: number): Promise<boolean> {
  const stop = new AbortController();
  try {
    return await Promise.race([p.then(() => true), sleep(ms, stop.signal).then(() => false)]);
  } finally {
    stop.abort();
  }
}

/** Polls until cond() holds or the deadline (epoch ms) passed. */
async function waitUntil(cond: () => boolean, deadline: number): Promise<void> {
  while (!cond() && Date.now() < deadline) await sleep(Math.min(20, deadline - Date.now()));
}
