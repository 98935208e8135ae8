// What a daemon reports about its jobs. One function per report, taking
// (sql, providerId, message): the legacy JSON routes and the gRPC stream
// share them. Only the provider holding the job's current attempt may report
// on it (403 otherwise).
import ipaddr from "ipaddr.js";
import type { JsonObject, JsonValue, MessageInitShape } from "@bufbuild/protobuf";
import type { Value } from "@bufbuild/protobuf/wkt";
import { valueJson } from "../../shared/value-json.js";
import { JobResultRequestSchema, type AssignedJobSchema, type JobResultResponseSchema } from "../../../gen/svc/v1/jobs_pb.js";
import type { Db, Sql, Tx } from "../../db/index.js";
import { badRequest, conflict, forbidden, notFound } from "../../errors.js";
import { dispatchForProvider, loseJobLocked, placeJobs, type ProviderFaultReason } from "../dispatch/dispatch.js";
import { MAX_LOG_LINES_READ } from "./jobs.js";
import { type JobRow } from "../shared/job-row.js";
import type { AssignedJob } from "../notify/job-notices.js";
import { completeLocked, endLocked, figuresOf, isActive, lockJob, runSeconds, type Figures, type LockedJob } from "../money/settlement.js";
import { refreshReputation } from "../providers/reputation.js";
import { keepAttestation, type VerifiedAttestation } from "../providers/attestations.js";
import { REFUSAL_REASONS, SERVING_JOB_TYPES, endpointHealthOf, judgeFailure, judgeServed, judgeTimeout, servingPolicy, type RefusalReason } from "../shared/job-end.js";
import { checkRange, requireFields, requireMembers } from "../shared/validate.js";
import { withoutNul } from "../shared/lenient.js";
import { confirmPickup } from "../shared/job-pickup.js";
import { legacySigningOf, providerTaskSecret } from "../accounts/provider-secret.js";
import { canonicalJson, signTask, verifyTask } from "../../shared/task-signature.js";

type AssignedJobInit = MessageInitShape<typeof AssignedJobSchema>;
type ResultInit = MessageInitShape<typeof JobResultResponseSchema>;

/** What a daemon needs to run a job: the signed task and its limits. */
export function assignedJobMessage(job: AssignedJob): AssignedJobInit {
  return {
    id: BigInt(job.id),
    jobId: job.job_id,
    jobType: job.job_type,
    taskSpec: job.task_spec as JsonObject,
    taskSpecHmac: job.task_spec_hmac,
    gpuRequirements: (job.gpu_requirements ?? undefined) as JsonObject | undefined,
    durationMinutes: BigInt(Math.ceil(job.duration_minutes)),
    maxDurationSeconds: BigInt(job.max_duration_seconds),
    attempt: job.attempt,
  };
}

/** Jobs assigned to a provider and not yet picked up (stream daemons on connect). */
export async function pendingJobsForProvider(db: Db, providerId: number): Promise<JobRow[]> {
  return db<JobRow[]>`SELECT * FROM jobs WHERE provider_id = ${providerId} AND status = 'pending' ORDER BY assigned_at, id`;
}

/** Each provider's pending jobs (ids, in assignment order): a stream's check for assignments whose notice it missed. */
export async function pendingJobIdsOf(db: Db, providerIds: number[]): Promise<Map<number, string[]>> {
  const rows = await db<{ provider_id: number; job_id: string }[]>`
    SELECT provider_id, job_id FROM jobs
    WHERE provider_id = ANY(${providerIds}::bigint[]) AND status = 'pending'
    ORDER BY assigned_at, id`;
  const byProvider = new Map<number, string[]>();
  for (const r of rows) {
    const ids = byProvider.get(r.provider_id);
    if (ids) ids.push(r.job_id);
    else byProvider.set(r.provider_id, [r.job_id]);
  }
  return byProvider;
}

/** A job assigned to this provider, for the stream after an assignment notice; undefined when no longer pending there. */
export async function assignedJobFor(db: Db, providerId: number, jobId: string): Promise<AssignedJobInit | undefined> {
  const [job] = await db<JobRow[]>`SELECT * FROM jobs WHERE job_id = ${jobId} AND provider_id = ${providerId} AND status = 'pending'`;
  return job ? assignedJobMessage(job) : undefined;
}

function assertAssignee(job: Pick<JobRow, "provider_id">, providerId: number): void {
  if (job.provider_id !== providerId) throw forbidden("this job is not assigned to this provider");
}

/**
 * pending -> running: the daemon picked the job up; the max-duration clock
 * restarts now. `confirmed`: the daemon itself said so (a stream accept, a
 * report); a legacy poll is not, its answer may be lost on the way (acked_at).
 */
async function startLocked(tx: Tx, job: JobRow, confirmed: boolean): Promise<void> {
  if (job.status !== "pending") return;
  await tx`
    UPDATE jobs SET status = 'running', started_at = now(), timeout_at = now() + make_interval(secs => max_duration_seconds),
           acked_at = ${confirmed ? tx`now()` : null}, preparing_at = NULL, progress_phase = NULL, updated_at = now()
    WHERE id = ${job.id} AND status = 'pending'`;
  await tx`UPDATE job_attempts SET status = 'running', started_at = now() WHERE job_id = ${job.id} AND attempt = ${job.attempt}`;
}

/**
 * A pending attempt has not been handed to the daemon (the legacy poll and a stream's accept start it):
 * a report on it comes from the run of an earlier attempt, re-queued and assigned back here, and must
 * not start this one (it would run on the record with nothing behind it, and be billed at its deadline).
 */
function assertHandedOut(job: Pick<JobRow, "status" | "attempt" | "job_id">, what: string): void {
  if (job.status === "pending") {
    throw conflict(
      `attempt ${job.attempt} of job ${job.job_id} has not been picked up by this provider yet (poll it, or accept it on the stream); ` +
        `this ${what} comes from an earlier run and was not accepted`,
    );
  }
}

/**
 * The daemon reported on its job, of the attempt it names (none: the current one): a running job it
 * polled is confirmed (it got the poll's answer). A pending one is refused (assertHandedOut). Returns
 * the job as it now is.
 */
async function confirmLocked(tx: Tx, job: LockedJob, attempt: number | undefined, what: string): Promise<LockedJob> {
  assertAttempt(job, attempt, what);
  assertHandedOut(job, what);
  if (job.status === "running" && job.acked_at === null) {
    await confirmPickup(tx, job.provider_id!, job.job_id);
    // One it prepared since the poll starts now (confirmPickup).
    return job.preparing_at === null
      ? { ...job, acked_at: job.db_now }
      : { ...job, acked_at: job.db_now, started_at: job.db_now, preparing_at: null, progress_phase: null };
  }
  return job;
}

async function lockOwnActive(tx: Tx, providerId: number, jobId: string): Promise<LockedJob> {
  requireFields({ job_id: jobId });
  const job = await lockJob(tx, jobId);
  assertAssignee(job, providerId);
  if (job.status !== "pending" && job.status !== "running") throw conflict(`job is already ${job.status}`);
  return job;
}

/**
 * The legacy poll: the provider's oldest pending job, now running (when it has
 * none, free GPUs are filled from the queue first; undefined: no work). The
 * answer may be lost on its way to the daemon: the job counts as picked up
 * once the daemon reports on it (confirmLocked); until then it bills nothing,
 * and after the pickup window it is re-queued (dispatch.ts releaseUnclaimed). Its
 * task_spec_hmac is signed with the secret the provider's daemon holds (its
 * own, src/domain/accounts/provider-secret.ts; the service's for a file from
 * before per-provider secrets), and only when the stored HMAC still verifies:
 * a task changed behind the service's back goes out unsigned and is refused.
 */
export async function pollJob(
  sql: Sql,
  serviceSecret: string,
  providerId: number,
  onPlatformFault: (jobId: string, error: string) => void = () => {},
): Promise<AssignedJobInit | undefined> {
  const take = () =>
    sql.begin(async (tx) => {
      for (;;) {
        const [job] = await tx<LockedJob[]>`
          SELECT *, now() AS db_now FROM jobs WHERE provider_id = ${providerId} AND status = 'pending'
          ORDER BY assigned_at, id LIMIT 1 FOR UPDATE SKIP LOCKED`;
        if (!job) return undefined;
        // A task changed behind the service's back is not handed out: the platform's fault.
        if (!verifyTask(serviceSecret, job.task_spec, job.task_spec_hmac)) {
          await endLocked(tx, job, "failed", { reason: "platform_error", error: UNVERIFIABLE_TASK });
          onPlatformFault(job.job_id, UNVERIFIABLE_TASK);
          continue;
        }
        await startLocked(tx, job, false);
        return job;
      }
    });
  let job = await take();
  if (!job && (await dispatchForProvider(sql, providerId)).length > 0) job = await take();
  if (!job) return undefined;
  const msg = assignedJobMessage(job);
  const signing = await legacySigningOf(sql, providerId);
  if (signing.holds === "provider") msg.taskSpecHmac = signTask(providerTaskSecret(serviceSecret, providerId, signing.epoch), job.task_spec);
  return msg;
}

export const UNVERIFIABLE_TASK =
  "the job's task no longer matches the signature the service gave it (changed after submit); it was not run and the hold was released";

/**
 * A pending job whose stored task does not verify against its HMAC (changed
 * behind the service's back): never handed to a daemon; failed as the
 * platform's fault (the whole hold back, no re-queue, no dock). Returns
 * whether it ended it (the caller logs it as an error).
 */
export async function failUnverifiableTask(sql: Sql, providerId: number, jobId: string): Promise<boolean> {
  const ended = await sql.begin(async (tx) => {
    const job = await lockJob(tx, jobId);
    if (job.provider_id !== providerId || !isActive(job.status)) return false;
    await endLocked(tx, job, "failed", { reason: "platform_error", error: UNVERIFIABLE_TASK });
    return true;
  });
  if (ended) await dispatchForProvider(sql, providerId);
  return ended;
}

/**
 * A stream daemon accepts an assignment (or names it in its hello, of the same attempt): pending ->
 * running, confirmed. An accept of another attempt is refused.
 */
export async function markJobAccepted(sql: Sql, providerId: number, msg: { jobId: string; attempt?: number }): Promise<void> {
  await sql.begin(async (tx) => {
    const job = await lockOwnActive(tx, providerId, msg.jobId);
    assertAttempt(job, msg.attempt, "accept");
    if (job.status === "pending") await startLocked(tx, job, true);
    else await confirmLocked(tx, job, msg.attempt, "accept");
  });
}

/**
 * A daemon prepares a job it was handed before it runs it (pulling its image): a stream daemon
 * before its accept, a legacy one after its poll and before any other report on the job. The
 * attempt is kept from the pickup sweep for another window (dispatch.ts unclaimedWhy, up to
 * PREPARE_LIMIT_SECONDS after the assignment), and what it does is the job's progress_phase for
 * its renter to see. Nothing is billed: the run starts at the accept, or at the legacy daemon's
 * next report (confirmLocked).
 */
export async function markJobPreparing(sql: Sql, providerId: number, msg: { jobId: string; attempt?: number; detail?: string }): Promise<void> {
  await sql.begin(async (tx) => {
    const job = await lockOwnActive(tx, providerId, msg.jobId);
    assertAttempt(job, msg.attempt, "preparing notice");
    const polled = job.status === "running" && job.acked_at === null;
    if (job.status !== "pending" && !polled) {
      throw conflict(`job ${job.job_id} is already ${job.status}: a preparing notice is for a job not yet accepted, or polled and not yet reported on`);
    }
    const detail = withoutNul(msg.detail)?.trim().slice(0, 200);
    await tx`UPDATE jobs SET preparing_at = now(), progress_phase = ${`preparing${detail ? `: ${detail}` : ""}`}, updated_at = now() WHERE id = ${job.id}`;
  });
}

/**
 * A daemon refuses a job, or (`interrupted`) stopped one it had started because
 * the provider shut it down: the provider's fault either way (end reason
 * provider_refused unless the daemon names a more precise one: signature_mismatch,
 * unsupported_on_provider, provider_interrupted). It goes back to the queue for
 * another provider (a new attempt, dispatch.ts loseJobLocked), the renter is
 * charged nothing for this attempt and the provider's reliability is docked.
 */
export async function markJobRejected(
  sql: Sql,
  providerId: number,
  msg: { jobId: string; reason?: string; interrupted?: boolean; endReason?: string; attempt?: number },
): Promise<"requeued" | "failed"> {
  if (msg.endReason && !(REFUSAL_REASONS as readonly string[]).includes(msg.endReason)) {
    throw badRequest(`end_reason must be one of ${REFUSAL_REASONS.join(", ")}`);
  }
  const code: RefusalReason = msg.interrupted ? "provider_interrupted" : ((msg.endReason || "provider_refused") as RefusalReason);
  const { outcome, id } = await sql.begin(async (tx) => {
    const job = await lockOwnActive(tx, providerId, msg.jobId);
    assertAttempt(job, msg.attempt, "hand-back");
    const what = code === "provider_interrupted" ? "interrupted the job" : "rejected the job";
    const reason = withoutNul(msg.reason);
    const why = `provider ${providerId} ${what}${reason ? `: ${reason.slice(0, 500)}` : ""}`;
    return { outcome: await loseJobLocked(tx, job, code, why), id: job.id };
  });
  if (outcome === "requeued") await placeJobs(sql, [id]);
  // The slot it freed is offered the queue's other work (placing the job itself looks only at some providers).
  await dispatchForProvider(sql, providerId);
  await refreshReputation(sql, [providerId]);
  return outcome;
}

function resultResponse(jobId: string, f: Figures): ResultInit {
  return {
    success: true,
    jobId,
    // The interface's status is completed or failed: a failure of the provider's that sent the job
    // back to the queue is this attempt failing (end_reason and fault say whose it was).
    status: f.status === "queued" ? "failed" : f.status,
    actualMinutes: BigInt(f.actualMinutes),
    costHalala: BigInt(f.cost),
    providerEarnedHalala: BigInt(f.providerEarned),
    platformFeeHalala: BigInt(f.platformFee),
    endReason: f.endReason,
    fault: f.fault,
  };
}

export interface ResultReport {
  jobId: string;
  success?: boolean;
  result?: Value | JsonValue;
  error?: string;
  metrics?: JsonObject;
  /** A failure's attribution: renter, provider or platform (absent: unattributed). */
  fault?: string;
  /** A failure's end reason (job-end.ts REPORTED_FAILURE_REASONS). */
  endReason?: string;
  /** The attempt the result is for; absent: the current one. */
  attempt?: number;
  /**
   * The daemon's attestation of this result, verified before the report (verifyAttestation). Kept for
   * the attempt the result ends only when the result is taken: a refused report keeps nothing.
   */
  attestation?: VerifiedAttestation;
}

/** A report that ends an attempt must be about the job's current one (when it names it). */
function assertAttempt(job: { attempt: number; job_id: string }, attempt: number | undefined, what: string): void {
  if (attempt !== undefined && attempt !== job.attempt) {
    throw conflict(`this ${what} is for attempt ${attempt} of job ${job.job_id}, which is on attempt ${job.attempt}; it was not accepted`);
  }
}

const MAX_ERROR = 10_000;

function resultJson(v: Value | JsonValue | undefined): JsonValue | undefined {
  if (v === undefined) return undefined;
  if (v !== null && typeof v === "object" && "$typeName" in v) return valueJson(v as Value);
  return v as JsonValue;
}

/**
 * The final report of a job. Success settles it (the time used, 75/25). A
 * failure follows its fault (job-end.ts judgeFailure): the renter's (its code,
 * image or input; its time ran out) pays the time used; the provider's goes
 * back to the queue as a new attempt with no charge (dispatch.ts); the
 * platform's and an unattributed one (no fault named: the legacy protocol's
 * bare `success:false`) release the whole hold. A repeat after a result
 * answers the same figures and moves no money; a result after a timeout or
 * cancel is 409 (the job ended without it). A reported timeout is believed
 * only as far as the server's record bears it out (job-end.ts judgeTimeout:
 * reported before max_duration_seconds had run, a serving job that never
 * reported its endpoint, or one whose endpoint had been failing the server's
 * health probe for longer than the grace, it is the provider's failure,
 * provider_error), and so is a success (job-end.ts judgeServed: a serving job
 * that never reported its endpoint, or whose endpoint the probe found dead,
 * served nothing; a failure the daemon puts on the renter there bills nothing,
 * settlement.ts billsTimeUsed).
 */
export async function reportResult(sql: Sql, providerId: number, msg: ResultReport): Promise<ResultInit> {
  requireMembers(JobResultRequestSchema, msg);
  // The machine's output, made storable: NUL characters dropped, lone surrogates replaced (src/shared/nul-text.ts).
  const result = withoutNul(resultJson(msg.result));
  const reported = withoutNul(msg.error);
  const error = reported?.trim() ? reported.slice(0, MAX_ERROR) : undefined;
  const metrics = withoutNul(msg.metrics);
  const success = msg.success ?? error === undefined;
  const judged = success ? undefined : judgeFailure(msg.endReason || undefined, msg.fault || undefined);
  if (judged && "error" in judged) throw badRequest(judged.error);
  const { figures, freed, requeued } = await sql.begin(async (tx) => {
    let job = await lockJob(tx, msg.jobId);
    assertAssignee(job, providerId);
    assertAttempt(job, msg.attempt, "result");
    // The report is the daemon's evidence that it had the job.
    if (isActive(job.status)) job = await confirmLocked(tx, job, msg.attempt, "result");
    if (!isActive(job.status)) {
      // A repeat of the report that ended the job answers its figures again.
      // (A reported timeout the server judged the provider's failure ended as provider_error, and
      // so did a success of a serving job that never reported its endpoint.)
      const endedAs = (r: string) => job.end_reason === r || ((r === "timeout" || r === "platform_error") && job.end_reason === "provider_error");
      const repeat = judged
        ? job.status === "failed" && endedAs(judged.reason)
        : job.end_reason === "completed" || (job.status === "failed" && job.end_reason === "provider_error" && judgeServed(job) !== undefined);
      if (repeat) return { figures: figuresOf(job), freed: false, requeued: undefined };
      throw conflict(`job already ${job.status} (${job.end_reason ?? "ended"}); the result was not accepted`);
    }
    // The result is taken: its attestation is kept for the attempt it ends (the one the report named,
    // assertAttempt), before the settling below issues the receipt that reads it.
    if (msg.attestation) await keepAttestation(tx, job, msg.attestation);
    // A success the server's record contradicts (a serving job that never reported its endpoint, or whose endpoint was dead) is the provider's failure.
    const unserved = success ? judgeServed(job) : undefined;
    if (success && !unserved) return { figures: await completeLocked(tx, job, result ?? null, metrics), freed: true, requeued: undefined };
    let { reason, fault } = unserved ?? (judged as Exclude<typeof judged, { error: string } | undefined>);
    let text = unserved?.error ?? error ?? "the job failed on the provider";
    if (reason === "timeout") {
      // The daemon's word against the server's record: too soon, or a serving job that never served (job-end.ts).
      const t = judgeTimeout(
        {
          jobType: job.job_type,
          ranSeconds: runSeconds(job),
          secondsToDeadline: job.timeout_at === null ? undefined : (new Date(job.timeout_at).getTime() - new Date(job.db_now).getTime()) / 1000,
          maxDurationSeconds: job.max_duration_seconds,
          endpointReported: job.endpoint_url !== null,
          endpointHealth: endpointHealthOf(job),
        },
        true,
      );
      if (t.fault === "provider") {
        reason = t.reason;
        fault = t.fault;
        text = `${t.error}; the daemon said: ${text}`;
      }
    }
    if (fault === "platform") {
      // The platform's failures are the server's to record (an admin's doing, a task it cannot vouch for):
      // a daemon's word that the platform failed it would end the job unpaid and unmarked, so it is the
      // provider's failure, as its other failures are (re-queued at no charge, the provider docked).
      reason = "provider_error";
      fault = "provider";
      text = `a daemon cannot put a failure on the platform: taken as the provider's; the daemon said: ${text}`;
    }
    if (fault === "provider") {
      const outcome = await loseJobLocked(tx, job, reason as ProviderFaultReason, `provider ${providerId} failed the job: ${text}`);
      if (outcome === "requeued") {
        const f: Figures = { status: "queued", endReason: reason, fault, actualMinutes: 0, cost: 0, providerEarned: 0, platformFee: 0 };
        return { figures: f, freed: true, requeued: job.id };
      }
      const [ended] = await tx<JobRow[]>`SELECT * FROM jobs WHERE id = ${job.id}`;
      return { figures: figuresOf(ended), freed: true, requeued: undefined };
    }
    const f = await endLocked(tx, job, "failed", { reason, fault, error: text, result, metrics, reported: true });
    return { figures: f, freed: true, requeued: undefined };
  });
  if (requeued !== undefined) await placeJobs(sql, [requeued]);
  if (freed) await dispatchForProvider(sql, providerId);
  if (figures.fault === "provider") await refreshReputation(sql, [providerId]);
  return resultResponse(msg.jobId, figures);
}

const RESERVED_COMPLETE_FIELDS = new Set(["api_key", "key", "job_id", "success", "error", "metrics", "result", "fault", "end_reason"]);

/** POST /api/jobs/{id}/complete: the body is the result; `error` or `success: false` marks a failure. */
export async function completeJob(sql: Sql, providerId: number, jobId: string, body: JsonObject): Promise<ResultInit> {
  const rest: JsonObject = {};
  for (const [k, v] of Object.entries(body)) if (!RESERVED_COMPLETE_FIELDS.has(k)) rest[k] = v;
  if (body.error !== undefined && body.error !== null && typeof body.error !== "string") throw badRequest("error must be a string");
  if (body.success !== undefined && typeof body.success !== "boolean") throw badRequest("success must be a boolean");
  if (body.metrics !== undefined && body.metrics !== null && (typeof body.metrics !== "object" || Array.isArray(body.metrics))) {
    throw badRequest("metrics must be an object");
  }
  const error = typeof body.error === "string" ? body.error : undefined;
  return reportResult(sql, providerId, {
    jobId,
    success: body.success === false || error ? false : true,
    // Nothing but the report fields: the job completed with no output (its output answers 404).
    result: body.result !== undefined ? body.result : Object.keys(rest).length > 0 ? rest : null,
    error: error ?? (body.success === false ? "the job failed on the provider" : undefined),
    metrics: (body.metrics ?? undefined) as JsonObject | undefined,
    fault: typeof body.fault === "string" ? body.fault : undefined,
    endReason: typeof body.end_reason === "string" ? body.end_reason : undefined,
  });
}

export const LOG_LEVELS = ["debug", "info", "warning", "error", "critical"] as const;
const LEVEL_ALIASES: Record<string, string> = { warn: "warning", fatal: "critical", trace: "debug" };
export const MAX_LOG_LINES_PER_CALL = 1000;
export const MAX_LOG_LINE_CHARS = 16_384;

function logLine(v: JsonValue, i: number): { level: string; message: string } {
  let level = "info";
  let message: unknown = v;
  if (v !== null && typeof v === "object" && !Array.isArray(v)) {
    message = v.message;
    if (v.level !== undefined && v.level !== null) {
      const l = typeof v.level === "string" ? v.level.toLowerCase() : "";
      level = LEVEL_ALIASES[l] ?? l;
      if (!(LOG_LEVELS as readonly string[]).includes(level)) throw badRequest(`logs[${i}].level must be one of ${LOG_LEVELS.join(", ")}`);
    }
    if (typeof message !== "string") throw badRequest(`logs[${i}].message must be a string`);
  } else if (typeof message !== "string") {
    throw badRequest(`logs[${i}] must be a string or an object {level, message}`);
  }
  if ((message as string).length > MAX_LOG_LINE_CHARS) throw badRequest(`logs[${i}] must be at most ${MAX_LOG_LINE_CHARS} characters`);
  return { level, message: message as string };
}

/** Lines stored per job attempt, the truncation notice included: what a read returns (one constant). */
export const MAX_LOG_LINES_PER_ATTEMPT = MAX_LOG_LINES_READ;
/**
 * Characters of messages stored per job attempt (4 MiB of ASCII): with the line bound, what one read
 * of its log answers (10,000 lines of 16,384 characters would be 160 MB in one answer).
 */
export const MAX_LOG_CHARS_PER_ATTEMPT = 4 * 1024 * 1024;
/** Daemons flush their last lines shortly after the result: logs are taken this long after the attempt ended. */
export const LOG_GRACE_AFTER_END_MINUTES = 5;
export const LOG_TRUNCATED_NOTICE =
  `log truncated: at most ${MAX_LOG_LINES_PER_ATTEMPT.toLocaleString("en-US")} lines and ` +
  `${MAX_LOG_CHARS_PER_ATTEMPT.toLocaleString("en-US")} characters are kept per job attempt; later lines were dropped`;
/** Advisory-lock namespace: appends to one job run one at a time, so the per-attempt cap holds. */
const LOG_LOCK_NS = 0x7633;

/**
 * Appends log lines to the job's current attempt. Lines past the per-attempt
 * bounds (lines, characters) are dropped, and every line after them (one
 * notice line says so); lines come up to
 * LOG_GRACE_AFTER_END_MINUTES after the attempt ended, later ones are 409.
 * `count` is the number of lines kept.
 */
export async function appendLogs(
  sql: Sql,
  providerId: number,
  msg: { jobId: string; logs: (Value | JsonValue)[]; attempt?: number },
): Promise<{ count: number; dropped: number }> {
  requireFields({ job_id: msg.jobId });
  if (msg.logs.length > MAX_LOG_LINES_PER_CALL) throw badRequest(`logs must hold at most ${MAX_LOG_LINES_PER_CALL} lines per call`);
  if (msg.attempt !== undefined) checkRange(msg.attempt, 1, 1_000_000, "attempt", true);
  const lines = msg.logs.map((v, i) => logLine(withoutNul(resultJson(v) ?? null), i));
  // The lines' attempt: the one named (an earlier run's lines are kept with it), else the current one.
  const [job] = await sql<
    (Pick<JobRow, "id" | "job_id" | "provider_id" | "attempt" | "status" | "acked_at"> & { closed: boolean; lines_attempt: number; attempt_provider: number | null })[]
  >`
    SELECT j.id, j.job_id, j.provider_id, j.attempt, j.status, j.acked_at, a.attempt AS lines_attempt, a.provider_id AS attempt_provider,
           coalesce(a.ended_at < now() - make_interval(mins => ${LOG_GRACE_AFTER_END_MINUTES}), false) AS closed
    FROM jobs j LEFT JOIN job_attempts a ON a.job_id = j.id AND a.attempt = coalesce(${msg.attempt ?? null}::int, j.attempt)
    WHERE j.job_id = ${msg.jobId}`;
  if (!job) throw notFound("job not found");
  const current = msg.attempt === undefined || msg.attempt === job.attempt;
  if (current) assertAssignee(job, providerId);
  else if (job.attempt_provider !== providerId) throw forbidden(`attempt ${msg.attempt} of this job was not run by this provider`);
  if (job.closed) {
    throw conflict(`the job's attempt ended more than ${LOG_GRACE_AFTER_END_MINUTES} minutes ago; its logs are closed`);
  }
  // A pending attempt has not reached the daemon: lines naming none come from an earlier run.
  if (current) assertHandedOut(job, "log batch");
  const attempt = current ? job.attempt : msg.attempt!;
  // Lines of a running job it polled: the daemon got the poll's answer.
  const unconfirmed = current && job.status === "running" && job.acked_at === null;
  if (lines.length === 0) {
    if (unconfirmed) await confirmPickup(sql, providerId, job.job_id);
    return { count: 0, dropped: 0 };
  }
  return sql.begin(async (tx) => {
    // The attempt's log lock first, before the pickup's lock on the job row: a batch holding the log
    // lock waits for that row (its lines' foreign key), so a batch locking the row first and then
    // waiting for the log lock deadlocked with it.
    await tx`SELECT pg_advisory_xact_lock(${LOG_LOCK_NS}, ${job.id % 2147483647}::int)`;
    if (unconfirmed) await confirmPickup(tx, providerId, job.job_id);
    const [{ stored, chars, truncated }] = await tx<{ stored: number; chars: number; truncated: boolean }[]>`
      SELECT (SELECT count(*)::int FROM (
                SELECT 1 FROM job_logs WHERE job_id = ${job.id} AND attempt = ${attempt} LIMIT ${MAX_LOG_LINES_PER_ATTEMPT}) s) AS stored,
             coalesce(a.log_chars, 0) AS chars, coalesce(a.log_truncated, false) AS truncated
      FROM (SELECT 1) one LEFT JOIN job_attempts a ON a.job_id = ${job.id} AND a.attempt = ${attempt}`;
    // Room for daemon lines keeps one line free for the notice; a truncated attempt already holds it.
    let room = truncated || stored >= MAX_LOG_LINES_PER_ATTEMPT ? 0 : MAX_LOG_LINES_PER_ATTEMPT - 1 - stored;
    let roomChars = MAX_LOG_CHARS_PER_ATTEMPT - Number(chars);
    const kept: { level: string; message: string }[] = [];
    for (const l of lines) {
      if (room === 0 || l.message.length > roomChars) break;
      kept.push(l);
      room--;
      roomChars -= l.message.length;
    }
    const dropped = lines.length - kept.length;
    const keptChars = kept.reduce((n, l) => n + l.message.length, 0);
    // The notice once: an attempt at the line bound holds it already (it fills the line kept free for it).
    const truncating = dropped > 0 && !truncated && stored < MAX_LOG_LINES_PER_ATTEMPT;
    if (truncating) kept.push({ level: "warning", message: LOG_TRUNCATED_NOTICE });
    // The lines before the attempt's count: their insert takes the job row's key-share lock (the
    // foreign key), and every path that ends an attempt locks the job row before the attempt row, so
    // updating the attempt first could deadlock with it.
    if (kept.length > 0) {
      await tx`
        INSERT INTO job_logs (job_id, attempt, level, message)
        SELECT ${job.id}, ${attempt}, l.level, l.message
        FROM unnest(${tx.array(kept.map((l) => l.level))}::text[], ${tx.array(kept.map((l) => l.message))}::text[]) WITH ORDINALITY AS l(level, message, n)
        ORDER BY l.n`;
    }
    if (keptChars > 0 || truncating) {
      await tx`
        UPDATE job_attempts SET log_chars = log_chars + ${keptChars}, log_truncated = log_truncated OR ${truncating}
        WHERE job_id = ${job.id} AND attempt = ${attempt}`;
    }
    return { count: lines.length - dropped, dropped };
  });
}

/** Progress of a job (0-100 and a phase marker); the first report on a job it polled confirms the pickup. */
export async function reportProgress(sql: Sql, providerId: number, msg: { jobId: string; progressPct?: number; phase?: string; attempt?: number }): Promise<void> {
  const reported = withoutNul(msg.phase);
  if (msg.progressPct === undefined && (reported === undefined || reported === "")) throw badRequest("missing required fields: progress_pct or phase");
  const pct = msg.progressPct === undefined ? undefined : checkRange(msg.progressPct, 0, 100, "progress_pct");
  const phase = reported === undefined ? undefined : reported.trim().slice(0, 200) || undefined;
  if (reported !== undefined && reported.length > 200) throw badRequest("phase must be at most 200 characters");
  await sql.begin(async (tx) => {
    const job = await confirmLocked(tx, await lockOwnActive(tx, providerId, msg.jobId), msg.attempt, "progress report");
    await tx`
      UPDATE jobs SET progress_pct = coalesce(${pct ?? null}, progress_pct), progress_phase = coalesce(${phase ?? null}, progress_phase), updated_at = now()
      WHERE id = ${job.id}`;
  });
}

/**
 * vllm_serve and other serving jobs, and a custom_container's published port (params.expose_port):
 * where the endpoint listens (a URL, or a port on the provider's address: the one its heartbeats
 * report, else `reportedFrom`, the address this report came from).
 */
export async function endpointReady(
  sql: Sql,
  providerId: number,
  msg: { jobId: string; endpointUrl?: string; port?: number; model?: string; endpointApiKey?: string; attempt?: number },
  reportedFrom?: string,
): Promise<{ endpointUrl: string }> {
  // The endpoint's own secret (the daemon's per-job VLLM_API_KEY), sent upstream by the /v1 gateway as a
  // Bearer token: a header value, so printable ASCII without spaces. None: the gateway sends no credential.
  const apiKey = msg.endpointApiKey || null;
  if (apiKey !== null && !/^[\x21-\x7e]{1,512}$/.test(apiKey)) {
    throw badRequest("endpoint_api_key must be 1 to 512 printable ASCII characters without spaces");
  }
  let url = msg.endpointUrl?.trim();
  if (url) {
    let u: URL;
    try {
      u = new URL(url);
    } catch {
      throw badRequest("endpoint_url must be an absolute http(s) URL");
    }
    if (u.protocol !== "http:" && u.protocol !== "https:") throw badRequest("endpoint_url must be an absolute http(s) URL");
    if (url.length > 2000) throw badRequest("endpoint_url must be at most 2000 characters");
  } else if (msg.port !== undefined) {
    checkRange(msg.port, 1, 65535, "port", true);
    const [p] = await sql<{ provider_ip: string | null }[]>`SELECT provider_ip FROM providers WHERE id = ${providerId}`;
    // Daemons seldom know their own address: the one the server sees them at is where the
    // engine's published port is reached, unless a proxy or NAT stands between (then they
    // report endpoint_url).
    const ip = p?.provider_ip || plainAddress(reportedFrom);
    if (!ip) throw badRequest("endpoint_url is required: no provider address is on record to combine with port");
    const host = ip.includes(":") ? `[${ip}]` : ip;
    url = `http://${host}:${msg.port}`;
  } else {
    throw badRequest("missing required fields: endpoint_url (or port)");
  }
  const endpoint = url;
  await sql.begin(async (tx) => {
    const job = await confirmLocked(tx, await lockOwnActive(tx, providerId, msg.jobId), msg.attempt, "endpoint report");
    // The key belongs to the endpoint reported with it: a report without one clears an earlier one's.
    // The health probe asks the endpoint reported now at its next pass (a probe of the old one still
    // in flight is not recorded: dispatch/endpoint-health.ts). A failing clock keeps running: only a
    // healthy answer stops it, so that reporting the endpoint again and again excuses no dead engine.
    // The attempt's first report, later than the load grace after its run started: its billed time starts
    // that grace before now (job-end.ts servingPolicy), here and on the attempt's record. The deadline
    // stays: the daemon's kill timer runs from its own start (a timeout is judged by it, judgeTimeout).
    // Only a serving job's billing waits for its endpoint: a custom_container's port moves nothing.
    const grace = servingPolicy.loadGraceSeconds;
    const serving = SERVING_JOB_TYPES.includes(job.job_type);
    await tx`
      WITH late AS (
        SELECT now() - make_interval(secs => ${grace}) AS start FROM jobs
        WHERE ${serving} AND id = ${job.id} AND endpoint_url IS NULL AND status = 'running' AND started_at < now() - make_interval(secs => ${grace})
      ), moved AS (
        UPDATE job_attempts a SET started_at = late.start FROM late WHERE a.job_id = ${job.id} AND a.attempt = ${job.attempt}
      )
      UPDATE jobs j SET endpoint_url = ${endpoint}, endpoint_api_key = ${apiKey}, endpoint_probed_at = NULL, updated_at = now(),
             started_at = coalesce(late.start, j.started_at)
      FROM (SELECT 1) one LEFT JOIN late ON true
      WHERE j.id = ${job.id}`;
  });
  return { endpointUrl: endpoint };
}

/** A socket's address as a host: an IPv4-mapped IPv6 address as its IPv4 form; undefined if not an address. */
function plainAddress(address: string | undefined): string | undefined {
  if (!address || !ipaddr.isValid(address)) return undefined;
  return ipaddr.process(address).toString();
}
