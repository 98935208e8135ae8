// DaemonService.Connect: the bidirectional stream of newer daemons (protocol
// described in proto/svc/v1/daemon.proto). Every report runs the same domain
// function as its JSON route; assignments are pushed from the process-wide
// LISTEN hub (workers/job-signals.ts) the moment they commit, and so are
// settings changes. A stream reads its provider again on a heartbeat only when
// a notice may have been missed since it last did.
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { Code, ConnectError, type ServiceImpl } from "@connectrpc/connect";
import { AssignedJobSchema } from "../../gen/svc/v1/jobs_pb.js";
import {
  DaemonMessageSchema,
  DaemonService,
  type DaemonMessage,
  type DaemonSettingsSchema,
  type Hello,
  ServerMessageSchema,
} from "../../gen/svc/v1/daemon_pb.js";
import { recordDaemonEvent } from "../domain/providers/daemon-events.js";
import { recordDeclaredJobTypes, recordHeartbeat } from "../domain/providers/heartbeat.js";
import {
  appendLogs,
  assignedJobMessage,
  endpointReady,
  failUnverifiableTask,
  markJobAccepted,
  markJobPreparing,
  markJobRejected,
  reportProgress,
  reportResult,
} from "../domain/jobs/job-reports.js";
import type { AssignedJob } from "../domain/notify/job-notices.js";
import type { JobRow } from "../domain/shared/job-row.js";
import { providerById, type DaemonSettingsRow } from "../domain/providers/providers.js";
import { preferenceFields } from "../domain/providers/preferences.js";
import { recordReadiness } from "../domain/providers/readiness.js";
import { registerProviderKey, verifyAttestation } from "../domain/providers/attestations.js";
import { recordTaskKeyCheck, taskKeyMismatch } from "../domain/dispatch/task-key.js";
import { AsyncQueue } from "../daemon/async-queue.js";
import { deferred, observed } from "../shared/iterables.js";
import type { TaskSigner } from "../shared/task-signature.js";
import { loadTaskSigner } from "../domain/jobs/task-signer.js";
import { canonicalJson, verifyTask } from "../shared/task-signature.js";
import { apiError, badRequest, notFound } from "../errors.js";
import { answeredLogLevel, failureLogLevel, toConnectError, toHttpError } from "../http/errors.js";
import { refuseNul } from "../http/nul.js";
import { setStructBytes } from "../shared/struct-binary.js";
import { jobSignalHub, type JobSignalHub } from "../workers/job-signals.js";
import { DeliveredJobs } from "../domain/jobs/delivered-jobs.js";
import { callerProviderId, logPlatformFault, type Deps } from "./deps.js";
import { credentialsKey } from "../http/credentials.js";
import { streamRefresher, type StreamRefresher } from "../domain/jobs/stream-refresh.js";

export const HEARTBEAT_INTERVAL_SECONDS = 30;

/** How long a stream may be open before its hello: one that never says it holds a provider's stream slot for nothing. */
export const streamTimeouts = { helloMs: 30_000 };
/**
 * Jobs a hello may name as held (running_job_ids): four times the most a provider runs at once (1024
 * GPUs, one job each). Each named is answered (resumed, or cancelled), so an unbounded list made a
 * hello of a few megabytes into hundreds of megabytes of answers.
 */
export const HELLO_MAX_JOB_IDS = 4096;
/** Drain notice: reconnect after this much, plus jitter so a fleet does not return at once. */
const DRAIN_RECONNECT_MS = 1000;
/**
 * A job's progress reports written per second from one stream. A job reports
 * progress by printing lines, as often as it likes, and each report is a
 * transaction on the job's row and a notice to its watchers. Past this many
 * in a second, a report replaces the one waiting, which is written when the
 * second ends (the latest wins), or before the job's result.
 */
export const PROGRESS_WRITES_PER_SECOND = 10;
/**
 * Answers one stream holds for its daemon at most before it stops reading the daemon's reports
 * (HTTP/2 flow control then holds the daemon back) until it has taken half of them. Answers are
 * small (acks, refusals: a few hundred bytes each), so a daemon that never reads costs its stream
 * well under a megabyte. Pushes (jobs, cancels, settings) are queued whatever: they come at the
 * pace of the provider's assignments, not of what the daemon sends.
 */
export const OUT_QUEUE_HIGH_WATER = 1000;
/**
 * Reports with a budget of their own: heartbeats (the heartbeat row, per stream), progress
 * (PROGRESS_WRITES_PER_SECOND), log lines and events (per attempt and per provider, in their
 * domain functions). Every other message counts against the stream's writes (Deps.streamWriteLimit).
 */
const OWN_BUDGET: ReadonlySet<DaemonMessage["kind"]["case"]> = new Set(["heartbeat", "progress", "logs", "event"]);

type ProgressReport = { jobId: string; progressPct?: number; phase?: string; attempt?: number };

type Out = MessageInitShape<typeof ServerMessageSchema>;
type Settings = MessageInitShape<typeof DaemonSettingsSchema>;

function settingsOf(p: Omit<DaemonSettingsRow, "id">): Settings {
  return {
    paused: p.is_paused || p.status === "paused",
    ...preferenceFields(p),
    approvalStatus: p.approval_status,
  };
}

function errorCode(thrown: unknown): string {
  const err = toConnectError(thrown);
  if (err instanceof ConnectError) return Code[err.code].replace(/[A-Z]/g, (c, i) => (i ? "_" : "") + c.toLowerCase());
  return "internal";
}

/**
 * A row of the rate table applied to one stream's messages: at most `points`
 * in a window of `durationSec` that starts with the first message after the
 * last window ended (a fixed window, as the HTTP rows count). A message over
 * it is refused before any work is done for it.
 */
class StreamWindow {
  private start = -Infinity;
  private count = 0;

  constructor(readonly limit: { points: number; durationSec: number }) {}

  /** Counts a message at `now` (ms); false when the window is full. */
  take(now: number): boolean {
    if (now - this.start >= this.limit.durationSec * 1000) {
      this.start = now;
      this.count = 0;
    }
    if (this.count >= this.limit.points) return false;
    this.count++;
    return true;
  }

  /** Counts a message at `now` (ms); throws the 429 when the window is full, `refusal` its message. */
  takeOrThrow(now: number, refusal: (retrySeconds: number) => string): void {
    if (this.take(now)) return;
    const retry = Math.max(1, Math.ceil((this.start + this.limit.durationSec * 1000 - now) / 1000));
    throw apiError(429, refusal(retry), { "Retry-After": String(retry) });
  }
}

/** One connected daemon: what it was sent, and the handling of what it sends. */
class StreamSession {
  readonly out = new AsyncQueue<Out>(OUT_QUEUE_HIGH_WATER);
  /** Jobs this stream has handed to the daemon (or the daemon said it runs): never pushed twice. */
  private readonly delivered = new DeliveredJobs();
  private lastSettings = "";
  /** The daemon pinned another task-signing key: it would refuse every task, so none is pushed. */
  private keyMismatch = false;
  /** Pushes triggered by notices run one at a time, in the order the notices came. */
  private chain: Promise<void> = Promise.resolve();
  /** Undefined when rate limits are off (and so are the next two). */
  private readonly beats: StreamWindow | undefined;
  /** The stream's reports without a budget of their own (OWN_BUDGET). */
  private readonly writes: StreamWindow | undefined;
  /** Refusals answered with a StreamError, but for results': past it, a refused report gets no answer. */
  private readonly refusals: StreamWindow | undefined;
  /** False once the hello's attestation key was not registered: results are then taken unattested. */
  private attesting = true;
  /** Per job: the second its progress writes are counted in, their count, and the report waiting for the next second. */
  private readonly progress = new Map<string, { second: number; writes: number; waiting?: ProgressReport; timer?: NodeJS.Timeout }>();
  /** The hub's generation when this stream last read its provider whole; undefined: read at the next beat. */
  private syncedAt: number | undefined;

  constructor(
    private readonly deps: Deps,
    private readonly providerId: number,
    private readonly signer: TaskSigner,
    private readonly refresher: StreamRefresher,
    private readonly hub: JobSignalHub,
    /** The stream's codec is binary (not JSON): a job's Structs go pre-encoded (shared/struct-binary.ts). */
    private readonly binary: boolean,
    /** The address the daemon connects from: where a port it serves on is reached, unless it says otherwise. */
    private readonly clientIp: string,
  ) {
    this.beats = deps.streamBeatLimit && new StreamWindow(deps.streamBeatLimit);
    this.writes = deps.streamWriteLimit && new StreamWindow(deps.streamWriteLimit);
    this.refusals = deps.streamWriteLimit && new StreamWindow(deps.streamWriteLimit);
  }

  private send(m: Out) {
    this.out.push(m);
  }

  private fail(err: unknown, jobId = "", report = "", attempt?: number) {
    const e = toHttpError(err);
    if (e.status >= 500) this.deps.log[answeredLogLevel(err, e)]({ err, providerId: this.providerId, jobId, report }, "daemon stream report failed");
    // A refused result is always answered: the daemon keeps it until it is acknowledged or refused.
    // Other refusals are answered at a bounded rate, so that they cannot fill the queue themselves.
    if (!(report === "result" && jobId) && this.refusals?.take(Date.now()) === false) return;
    this.send({ kind: { case: "error", value: { code: errorCode(err), message: e.message, jobId, report, attempt } } });
  }

  private pushSettings(s: Settings) {
    const json = JSON.stringify(s);
    if (json === this.lastSettings) return;
    this.lastSettings = json;
    this.send({ kind: { case: "settings", value: s } });
  }

  /** `signed`: the task spec's canonical JSON, as this process signed it when it made the job (no need to verify). */
  private async deliver(job: AssignedJob, signed?: string): Promise<void> {
    if (this.keyMismatch || this.delivered.has(job.job_id)) return;
    this.delivered.add(job.job_id);
    // Only a task whose stored HMAC verifies is pushed, signed: a row changed behind the
    // service's back is never run; the job fails as the platform's fault (full refund, no re-queue).
    const canonical = signed ?? canonicalJson(job.task_spec);
    if (signed === undefined && !verifyTask(this.deps.config.hmacSecret, job.task_spec, job.task_spec_hmac, canonical)) {
      if (await failUnverifiableTask(this.deps.sql, this.providerId, job.job_id)) {
        logPlatformFault(this.deps, job.job_id, { fault: "platform", endReason: "platform_error" });
      }
      return;
    }
    this.send({ kind: { case: "job", value: this.jobMessage(job) }, taskSignature: this.signer.sign(job.job_id, job.task_spec, canonical) });
  }

  private jobMessage(job: AssignedJob) {
    const init = assignedJobMessage(job);
    if (!this.binary) return init;
    const { taskSpec, gpuRequirements, ...rest } = init;
    const msg = create(AssignedJobSchema, rest);
    setStructBytes(msg, AssignedJobSchema.field.taskSpec, taskSpec ?? {});
    if (gpuRequirements) setStructBytes(msg, AssignedJobSchema.field.gpuRequirements, gpuRequirements);
    return msg;
  }

  /** Runs fn after every earlier notice was handled (a re-queue's cancel goes out before its new assignment). */
  serial(fn: () => Promise<void>): Promise<void> {
    const run = this.chain.then(fn);
    this.chain = run.catch(() => {});
    return run;
  }

  /** Pushes every pending job of this provider not yet delivered on this stream. */
  async deliverPending(): Promise<void> {
    const { sql } = this.deps;
    const jobs = await sql<JobRow[]>`
      SELECT * FROM jobs WHERE provider_id = ${this.providerId} AND status = 'pending' ORDER BY assigned_at, id`;
    for (const job of jobs) await this.deliver(job);
  }

  async assigned(jobId: string, carried?: () => AssignedJob | undefined, signed?: string): Promise<void> {
    if (this.delivered.has(jobId)) return;
    // The notice carried the job as committed: no read. A cancel committed since follows in order.
    const notified = carried?.();
    if (notified) return this.deliver(notified, signed);
    const [job] = await this.deps.sql<JobRow[]>`
      SELECT * FROM jobs WHERE job_id = ${jobId} AND provider_id = ${this.providerId} AND status = 'pending'`;
    if (job) await this.deliver(job);
  }

  async cancel(jobId: string): Promise<void> {
    const [job] = await this.deps.sql<{ status: string; error: string | null; provider_id: number | null }[]>`
      SELECT status, error, provider_id FROM jobs WHERE job_id = ${jobId}`;
    const reason = !job ? "unknown job" : job.provider_id !== this.providerId ? "re-queued to another provider" : job.error ?? job.status;
    // A job re-queued away may come back to this provider later as a new attempt.
    this.delivered.forget(jobId);
    this.forgetProgress(jobId);
    this.send({ kind: { case: "cancel", value: { jobId, reason } } });
  }

  /** Welcome: settings, then resumption of what the daemon still runs, then the backlog. */
  async open(hello: Hello): Promise<void> {
    const { sql, config } = this.deps;
    const generation = this.hub.generation;
    // Decided before anything is pushed: a daemon that cannot verify our tasks gets none.
    const mismatch = taskKeyMismatch(hello.taskSigningKey, this.signer.publicKey);
    this.keyMismatch = mismatch !== undefined;
    if (mismatch) this.deps.log.warn({ providerId: this.providerId }, "daemon pinned another task-signing key; provider kept out of dispatch");
    await recordTaskKeyCheck(sql, this.providerId, mismatch);
    // The daemon's attestation key: registered on first connect, checked against each result it signs.
    // Not registered (past the provider's cap, say): its results are taken unattested, as from a daemon without a key.
    if (hello.providerKey) {
      await registerProviderKey(sql, this.providerId, hello.providerKey).catch((err) => {
        this.attesting = false;
        this.fail(err, "", "hello");
      });
    }
    await recordDeclaredJobTypes(this.deps, this.providerId, hello.supportedJobTypes);
    const provider = await providerById(sql, this.providerId);
    const settings = settingsOf(provider);
    this.lastSettings = JSON.stringify(settings);
    this.send({
      kind: {
        case: "welcome",
        value: {
          providerId: BigInt(this.providerId),
          heartbeatIntervalSeconds: HEARTBEAT_INTERVAL_SECONDS,
          latestVersion: config.daemonLatestVersion,
          minVersion: config.daemonMinVersion,
          approvalStatus: provider.approval_status,
          settings,
          taskSigningKey: this.signer.publicKey,
        },
      },
    });
    // The welcome tells the daemon the key it does not trust; it explains and leaves.
    if (this.keyMismatch) return;
    const stillRunning = new Set(hello.runningJobIds);
    const held = await sql<{ job_id: string; status: string; provider_id: number | null; attempt: number }[]>`
      SELECT job_id, status, provider_id, attempt FROM jobs
      WHERE job_id = ANY(${sql.array([...stillRunning])}::text[])
         OR (provider_id = ${this.providerId} AND status = 'running')`;
    const byId = new Map(held.map((j) => [j.job_id, j]));
    for (const jobId of stillRunning) {
      const j = byId.get(jobId);
      const attempt = hello.runningJobAttempts[jobId];
      if (j && j.provider_id === this.providerId && j.status === "pending" && attempt !== j.attempt) {
        // Assigned back here as a new attempt while the daemon was away (or it names no attempt): what it
        // runs is an earlier attempt's run. That run is stopped, and the new attempt pushed afresh below.
        this.send({ kind: { case: "cancel", value: { jobId, reason: `re-queued: attempt ${j.attempt} of the job follows` } } });
      } else if (j && j.provider_id === this.providerId && (j.status === "pending" || j.status === "running")) {
        this.delivered.add(jobId);
        if (j.status === "pending") await markJobAccepted(sql, this.providerId, { jobId, attempt }).catch((err) => this.fail(err, jobId));
      } else {
        this.send({ kind: { case: "cancel", value: { jobId, reason: !j ? "unknown job" : j.provider_id !== this.providerId ? "re-queued to another provider" : `job is ${j.status}` } } });
      }
    }
    // Running here by the record but not on the daemon: it restarted and lost them; hand them back. Of
    // the attempt read above: one the job moved to since (assigned back here, not yet handed out) stays.
    for (const j of held) {
      if (j.provider_id === this.providerId && j.status === "running" && !stillRunning.has(j.job_id)) {
        const handBack = { jobId: j.job_id, reason: "the daemon reconnected without this job (restarted)", interrupted: true, attempt: j.attempt };
        await markJobRejected(sql, this.providerId, handBack).catch((err) => this.fail(err, j.job_id));
      }
    }
    await this.deliverPending();
    this.syncedAt = generation;
  }

  /**
   * Reads the provider's settings and pending jobs and pushes what changed: on a settings notice, and
   * on a heartbeat after a notice may have been missed (the hub lost its connection or stopped
   * listening, or a push of this stream failed).
   */
  async refresh(): Promise<void> {
    const generation = this.hub.generation;
    const { settings, pending } = await this.refresher.state(this.providerId);
    if (!settings) throw notFound("provider not found");
    this.pushSettings(settingsOf(settings));
    const missed = pending.filter((jobId) => !this.delivered.has(jobId));
    if (missed.length > 0) {
      await this.serial(async () => {
        for (const jobId of missed) await this.assigned(jobId);
      });
    }
    this.syncedAt = generation;
  }

  /**
   * refresh() once every push queued before it is done (the welcome first, so that no settings go out
   * ahead of it); its own pushes of jobs then take their turn in the serial order.
   */
  refreshInTurn(): Promise<void> {
    return this.serial(async () => {}).then(() => this.refresh());
  }

  /** A push failed: the next heartbeat reads the provider again. */
  unsynced(): void {
    this.syncedAt = undefined;
  }

  /** Writes a progress report now, or keeps it as its job's waiting one (PROGRESS_WRITES_PER_SECOND). */
  private async progressReport(r: ProgressReport): Promise<void> {
    const now = Date.now();
    let p = this.progress.get(r.jobId);
    if (!p || (!p.timer && now - p.second >= 1000)) this.progress.set(r.jobId, (p = { second: now, writes: 0 }));
    if (!p.timer && p.writes < PROGRESS_WRITES_PER_SECOND) {
      p.writes++;
      return reportProgress(this.deps.sql, this.providerId, r);
    }
    p.waiting = r;
    const entry = p;
    entry.timer ??= setTimeout(() => {
      const waiting = entry.waiting!;
      Object.assign(entry, { second: Date.now(), writes: 1, waiting: undefined, timer: undefined });
      reportProgress(this.deps.sql, this.providerId, waiting).catch((err) => this.fail(err, waiting.jobId, "progress"));
    }, Math.max(0, entry.second + 1000 - now));
  }

  /** Before a job's result or refusal: its waiting report is written first, so the job ends on it. */
  private async flushProgress(jobId: string): Promise<void> {
    const waiting = this.progress.get(jobId)?.waiting;
    this.forgetProgress(jobId);
    if (waiting) await reportProgress(this.deps.sql, this.providerId, waiting).catch((err) => this.fail(err, jobId, "progress"));
  }

  /** The job was taken from this stream: its waiting report is dropped. */
  private forgetProgress(jobId: string): void {
    clearTimeout(this.progress.get(jobId)?.timer);
    this.progress.delete(jobId);
  }

  /**
   * Runs the report that ends a job on this stream (result, hand-back). Refused, it ended nothing
   * here: the job is this provider's no longer (or not yet), and a later attempt of it may come
   * back to this stream, so it is not remembered as delivered.
   */
  private async unlessRefused<T>(jobId: string, report: () => Promise<T>): Promise<T> {
    try {
      return await report();
    } catch (err) {
      this.delivered.forget(jobId);
      throw err;
    }
  }

  /** The stream ended: waiting reports are dropped. */
  close(): void {
    for (const p of this.progress.values()) clearTimeout(p.timer);
    this.progress.clear();
  }

  /** Counts a message against its stream budget (heartbeats', or the writes'); throws the 429 past it. */
  private takeBudget(kind: DaemonMessage["kind"]["case"]): void {
    const now = Date.now();
    if (kind === "heartbeat" && this.beats) {
      const { points, durationSec } = this.beats.limit;
      this.beats.takeOrThrow(now, (retry) => `too many heartbeats on this stream: at most ${points} per ${durationSec} s; beat again in ${retry} s`);
    } else if (!OWN_BUDGET.has(kind) && this.writes) {
      const { points, durationSec } = this.writes.limit;
      const what = kind ?? "empty";
      this.writes.takeOrThrow(
        now,
        (retry) => `too many reports on this stream (this one: ${what}): at most ${points} per ${durationSec} s besides heartbeats, progress, logs and events; send again in ${retry} s`,
      );
    }
  }

  async handle(msg: DaemonMessage): Promise<void> {
    const { sql } = this.deps;
    const pid = this.providerId;
    const k = msg.kind;
    const jobId = "value" in k && k.value && "jobId" in k.value ? k.value.jobId : "";
    const attempt = "value" in k && k.value && "attempt" in k.value ? k.value.attempt : undefined;
    try {
      this.takeBudget(k.case);
      // A NUL outside the machine's output (a job id, a fault) is refused, as on the JSON routes.
      refuseNul(DaemonMessageSchema, msg);
      switch (k.case) {
        case "heartbeat":
          this.send({ kind: { case: "heartbeatAck", value: await recordHeartbeat(this.deps, pid, k.value) } });
          this.deps.metrics?.heartbeat("stream");
          if (this.syncedAt === undefined || !this.hub.heardAllSince(this.syncedAt)) await this.refresh();
          return;
        case "jobAccepted":
          await markJobAccepted(sql, pid, { jobId: k.value.jobId, attempt: k.value.attempt });
          this.delivered.add(k.value.jobId);
          return;
        case "jobPreparing":
          await markJobPreparing(sql, pid, { jobId: k.value.jobId, attempt: k.value.attempt, detail: k.value.detail });
          return;
        case "jobRejected":
          this.delivered.end(k.value.jobId);
          await this.flushProgress(k.value.jobId);
          await this.unlessRefused(k.value.jobId, () =>
            markJobRejected(sql, pid, {
              jobId: k.value.jobId,
              reason: k.value.reason,
              interrupted: k.value.interrupted,
              endReason: k.value.endReason,
              attempt: k.value.attempt,
            }),
          );
          return;
        case "logs":
          await appendLogs(sql, pid, { jobId: k.value.jobId, logs: k.value.logs, attempt: k.value.attempt });
          return;
        case "progress":
          await this.progressReport({ jobId: k.value.jobId, progressPct: k.value.progressPct, phase: k.value.phase, attempt: k.value.attempt });
          return;
        case "endpointReady":
          await endpointReady(sql, pid, {
            jobId: k.value.jobId,
            endpointUrl: k.value.endpointUrl,
            port: k.value.port,
            model: k.value.model,
            endpointApiKey: k.value.endpointApiKey,
            attempt: k.value.attempt,
          }, this.clientIp);
          return;
        case "result": {
          this.delivered.end(k.value.jobId);
          await this.flushProgress(k.value.jobId);
          const r = k.value;
          const ack = await this.unlessRefused(r.jobId, async () => {
            // Checked first (a bad one refuses the report before any work); kept only with the result it came with.
            const attestation = r.attestation && this.attesting ? await verifyAttestation(sql, pid, r.jobId, r.result, r.attestation) : undefined;
            return reportResult(sql, pid, {
              jobId: r.jobId,
              success: r.success,
              result: r.result,
              error: r.error,
              metrics: r.metrics,
              fault: r.fault,
              endReason: r.endReason,
              attempt: r.attempt,
              attestation,
            });
          });
          logPlatformFault(this.deps, r.jobId, ack);
          this.send({ kind: { case: "resultAck", value: ack } });
          return;
        }
        case "event":
          await recordDaemonEvent(this.deps, pid, k.value);
          return;
        case "readiness":
          await recordReadiness(this.deps, pid, k.value);
          return;
        case "hello":
          throw badRequest("hello is only the first message of a stream");
        default:
          throw badRequest("empty daemon message");
      }
    } catch (err) {
      this.fail(err, jobId, k.case ?? "", attempt);
    }
  }
}

/** `p`, or a DEADLINE_EXCEEDED error with `why` once `ms` passed without it. */
async function beforeDeadline<T>(p: Promise<T>, ms: number, why: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new ConnectError(why, Code.DeadlineExceeded)), ms);
  });
  try {
    return await Promise.race([p, late]);
  } finally {
    clearTimeout(timer);
  }
}

export function daemonService(deps: Deps): Partial<ServiceImpl<typeof DaemonService>> {
  const hub = jobSignalHub(deps.sql, deps.log);
  const refresher = streamRefresher(deps.sql);
  // Loaded on the first stream (the key row may not exist before migrations ran); a failed load is retried.
  let signer: Promise<TaskSigner> | undefined;
  const signerOnce = () => (signer ??= loadTaskSigner(deps.sql).catch((err) => ((signer = undefined), Promise.reject(err))));
  return {
    // Not an async generator: each answer would pass one more generator on its way out (shared/iterables.ts).
    connect(requests: AsyncIterable<DaemonMessage>, ctx): AsyncIterable<Out> {
      return deferred(async () => {
        const providerId = callerProviderId(ctx);
        const iterator = requests[Symbol.asyncIterator]();
        const first = await beforeDeadline(iterator.next(), streamTimeouts.helloMs, `the stream must open with a hello message within ${streamTimeouts.helloMs / 1000} s`);
        if (first.done || first.value.kind.case !== "hello") throw badRequest("the stream must open with a hello message");
        refuseNul(DaemonMessageSchema, first.value);
        if (first.value.kind.value.runningJobIds.length > HELLO_MAX_JOB_IDS) throw badRequest(`running_job_ids must name at most ${HELLO_MAX_JOB_IDS} jobs`);
        const binary = !(ctx.requestHeader.get("content-type") ?? "").includes("json");
        const session = new StreamSession(deps, providerId, await signerOnce(), refresher, hub, binary, ctx.values.get(credentialsKey).clientIp);
        const report = (p: Promise<void>) =>
          p.catch((err) => {
            session.unsynced();
            deps.log[failureLogLevel(err)]({ err, providerId }, "daemon stream push failed");
          });
        // Subscribe before reading the backlog, so an assignment committed in between is not missed.
        const unsubscribe = await hub.subscribe(providerId, {
          assigned: (jobId, job, signed) => void report(session.serial(() => session.assigned(jobId, job, signed))),
          cancel: (jobId) => void report(session.serial(() => session.cancel(jobId))),
          settings: () => void report(session.refreshInTurn()),
          resync: () => void report(session.refreshInTurn()),
        });
        const onShutdown = () => {
          session.out.push({
            kind: { case: "drain", value: { reason: "server shutting down", reconnectAfterMs: DRAIN_RECONNECT_MS + Math.floor(Math.random() * DRAIN_RECONNECT_MS) } },
          });
          session.out.close();
        };
        deps.metrics?.daemonStreams.inc();
        const end = () => {
          // Nobody reads the answers any more: the loop reading reports must not wait for room.
          session.out.close();
          deps.metrics?.daemonStreams.dec();
          ctx.signal.removeEventListener("abort", onShutdown);
          unsubscribe();
        };
        try {
          await session.serial(() => session.open(first.value.kind.value as Hello));
        } catch (err) {
          end();
          throw err;
        }
        if (ctx.signal.aborted) onShutdown();
        else ctx.signal.addEventListener("abort", onShutdown, { once: true });
        // Reports are handled in order (logs before the result), beside the outgoing pushes.
        let unreadable: { err: unknown } | undefined;
        void (async () => {
          for (;;) {
            // A daemon that does not read its answers is not read either (OUT_QUEUE_HIGH_WATER).
            if (!session.out.hasRoom) await session.out.room();
            const next = await iterator.next();
            if (next.done) break;
            await session.handle(next.value);
          }
        })()
          .catch((err: unknown) => {
            // A message that could not be read (too large, malformed, nested too deep) ends the answers
            // with why, on every wire (the gRPC path's status says it too).
            if (err instanceof ConnectError && err.code !== Code.Canceled) unreadable = { err };
          })
          .finally(() => {
            session.close();
            session.out.close(unreadable);
          });
        return observed(session.out, { onEnd: end });
      });
    },
  };
}
