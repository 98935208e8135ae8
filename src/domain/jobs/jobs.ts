// Area jobs (src/domain/jobs): submit (with its batcher), job schemas and
// templates, task specs and their signing, reads, reports from daemons and
// control (cancel). It may use every area below it, dispatch included.
//
// Job rows and the Job resource shape.
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { JobAttemptSchema } from "../../../gen/svc/v1/jobs_pb.js";
import type { JobSchema } from "../../../gen/svc/v1/models_pb.js";
import type { Db } from "../../db/index.js";
import { badRequest, forbidden, notFound } from "../../errors.js";
import { explainQueue, explainQueues, type QueueReason } from "../dispatch/dispatch.js";
import { iso } from "../shared/validate.js";
import { billableMinutes } from "../money/pricing.js";
import { ACTIVE_STATUSES, JOB_SUMMARY_COLUMNS, TERMINAL_STATUSES, type JobAttemptRow, type JobRow, type JobSummaryRow } from "../shared/job-row.js";
import { jobCountSql } from "../shared/job-counts.js";
import { SERVING_JOB_TYPES, deadAtEnd, servedNothing } from "../shared/job-end.js";

const big = (n: number | null) => (n === null ? undefined : BigInt(n));

/**
 * The database's now() when a job row was read (as settlement.ts's LockedJob has it): the readers
 * of this module select it with the row or page, so that the row's times are compared with the
 * clock that wrote them.
 */
export interface DbNow {
  db_now?: Date;
}

/** `now() AS db_now`, selected beside a row or a page (DbNow). */
const dbNowSql = (db: Db) => db`now() AS db_now`;

/**
 * A running job's cost so far: the billable minutes it has run at its rate (what an end would
 * charge now: settlement grows a short hold to it first, as far as the renter can pay,
 * settlement.ts coverRun); none while no end of it would charge anything: polled and not yet
 * reported on (acked_at; a legacy daemon preparing it, say), or a serving job that served nothing
 * (job-end.ts servedNothing: no endpoint reported yet; deadAtEnd: its endpoint failing the probe
 * past the grace). The minutes run up to the database's now() read with the row (started_at is
 * the database's time, as is the billing that will charge them); a row read without it falls
 * back on this process's clock.
 */
function runningCost(j: JobSummaryRow & DbNow): bigint | undefined {
  if (j.status !== "running" || j.started_at === null) return undefined;
  const at = j.db_now ? new Date(j.db_now) : new Date();
  if (j.acked_at === null || servedNothing(j) || deadAtEnd({ ...j, db_now: at })) return 0n;
  const minutes = billableMinutes(Math.max(0, (at.getTime() - new Date(j.started_at).getTime()) / 1000), j.max_duration_seconds);
  return BigInt(j.rate_halala_per_minute * minutes);
}

export function jobMessage(j: JobSummaryRow & DbNow): MessageInitShape<typeof JobSchema> {
  return {
    id: BigInt(j.id),
    jobId: j.job_id,
    jobType: j.job_type,
    status: j.status,
    submittedAt: iso(j.submitted_at)!,
    startedAt: iso(j.started_at),
    completedAt: iso(j.completed_at),
    costHalala: BigInt(j.cost_halala),
    heldHalala: BigInt(j.held_halala ?? j.cost_halala),
    runningCostHalala: runningCost(j),
    actualCostHalala: big(j.actual_cost_halala),
    providerEarnedHalala: big(j.provider_earned_halala),
    platformFeeHalala: big(j.platform_fee_halala),
    providerId: big(j.provider_id),
    renterId: BigInt(j.renter_id),
    durationMinutes: j.duration_minutes,
    maxDurationSeconds: BigInt(j.max_duration_seconds),
    priority: j.priority,
    error: j.error ?? undefined,
    progressPct: j.progress_pct ?? undefined,
    progressPhase: j.progress_phase ?? undefined,
    endpointUrl: j.endpoint_url ?? undefined,
    attempt: j.attempt,
    model: j.model ?? undefined,
    endReason: j.end_reason ?? undefined,
    fault: j.fault ?? undefined,
  };
}

export async function recentJobsOfRenter(db: Db, renterId: number, limit = 10): Promise<(JobSummaryRow & DbNow)[]> {
  return db<(JobSummaryRow & DbNow)[]>`
    SELECT ${db(JOB_SUMMARY_COLUMNS)}, ${dbNowSql(db)} FROM jobs WHERE renter_id = ${renterId} ORDER BY submitted_at DESC, id DESC LIMIT ${limit}`;
}

export async function recentJobsOfProvider(db: Db, providerId: number, limit = 10): Promise<(JobSummaryRow & DbNow)[]> {
  return db<(JobSummaryRow & DbNow)[]>`
    SELECT ${db(JOB_SUMMARY_COLUMNS)}, ${dbNowSql(db)} FROM jobs WHERE provider_id = ${providerId} ORDER BY submitted_at DESC, id DESC LIMIT ${limit}`;
}

/** The provider's newest job still on it (pending or running), among all its jobs, not only its recent ones; undefined when none. */
export async function activeJobOfProvider(db: Db, providerId: number): Promise<(JobSummaryRow & DbNow) | undefined> {
  const [job] = await db<(JobSummaryRow & DbNow)[]>`
    SELECT ${db(JOB_SUMMARY_COLUMNS)}, ${dbNowSql(db)} FROM jobs
    WHERE provider_id = ${providerId} AND status IN ('pending', 'running') ORDER BY submitted_at DESC, id DESC LIMIT 1`;
  return job;
}

// ---- readers ----

/**
 * Who reads: the owning renter, an admin, or a provider. A provider reads a
 * job (its spec, endpoint, output) only while it is the job's current
 * provider; after the job moved on it reads only its own attempts (their
 * history rows and logs), never another provider's endpoint, logs or the output.
 */
export type JobReader = { role: "renter"; renterId: number } | { role: "provider"; providerId: number } | { role: "admin" } | { role: "public" };

const MOVED_ON = "this job moved to another provider; a provider reads only its own attempts of it";

async function jobByPublicId(db: Db, jobId: string): Promise<JobRow & DbNow> {
  const [job] = await db<(JobRow & DbNow)[]>`SELECT *, ${dbNowSql(db)} FROM jobs WHERE job_id = ${jobId}`;
  if (!job) throw notFound("job not found");
  return job;
}

async function attemptsHeldBy(db: Db, job: JobRow, providerId: number): Promise<number[]> {
  const rows = await db<{ attempt: number }[]>`SELECT attempt FROM job_attempts WHERE job_id = ${job.id} AND provider_id = ${providerId} ORDER BY attempt`;
  return rows.map((r) => r.attempt);
}

/** The whole job, for its renter, an admin, or its current provider. */
export async function jobForReader(db: Db, jobId: string, reader: JobReader): Promise<JobRow & DbNow> {
  const job = await jobByPublicId(db, jobId);
  if (reader.role === "admin") return job;
  if (reader.role === "renter" && job.renter_id === reader.renterId) return job;
  if (reader.role === "provider") {
    if (job.provider_id === reader.providerId) return job;
    if ((await attemptsHeldBy(db, job, reader.providerId)).length > 0) throw forbidden(MOVED_ON);
  }
  throw forbidden("this job belongs to another caller");
}

/** The attempts of a job a reader may see: every one, or the numbers of a provider's own. */
export type AttemptScope = "all" | number[];

/** The job and the attempts the reader may see (a provider: its own, also after the job moved on). */
export async function attemptsForReader(db: Db, jobId: string, reader: JobReader): Promise<{ job: JobRow & DbNow; attempts: AttemptScope }> {
  const job = await jobByPublicId(db, jobId);
  if (reader.role === "admin") return { job, attempts: "all" };
  if (reader.role === "renter" && job.renter_id === reader.renterId) return { job, attempts: "all" };
  if (reader.role === "provider") {
    const own = await attemptsHeldBy(db, job, reader.providerId);
    if (own.length > 0) return { job, attempts: own };
  }
  throw forbidden("this job belongs to another caller");
}

/**
 * The Job resource, with why it waits when it is queued. A renter does not see
 * a serving job's (vllm_serve's) endpoint_url: models are reached through /v1,
 * where requests are billed per token; the raw endpoint would serve them
 * unbilled. A custom_container's published port (params.expose_port) is the
 * renter's own to reach: its endpoint_url is shown.
 */
export async function jobView(db: Db, job: JobSummaryRow & DbNow, reader?: JobReader, known?: QueueReason): Promise<MessageInitShape<typeof JobSchema>> {
  return viewOf(job, reader, job.status === "queued" ? (known ?? (await explainQueue(db, job))) : undefined);
}

/** jobView of a page of jobs: the queued ones' reasons read together (explainQueues). */
export async function jobViews(db: Db, jobs: (JobSummaryRow & DbNow)[], reader?: JobReader): Promise<MessageInitShape<typeof JobSchema>[]> {
  const reasons = await explainQueues(db, jobs);
  return jobs.map((job) => viewOf(job, reader, reasons.get(job.id)));
}

/**
 * The Job message as `reader` may see it: a renter never sees a serving job's
 * (vllm_serve's) endpoint_url (see jobView), wherever its jobs are listed.
 */
export function jobMessageFor(job: JobSummaryRow & DbNow, reader: JobReader | undefined): MessageInitShape<typeof JobSchema> {
  const msg = jobMessage(job);
  if (reader?.role === "renter" && SERVING_JOB_TYPES.includes(job.job_type)) msg.endpointUrl = undefined;
  return msg;
}

function viewOf(job: JobSummaryRow & DbNow, reader: JobReader | undefined, q: QueueReason | undefined): MessageInitShape<typeof JobSchema> {
  const msg = jobMessageFor(job, reader);
  if (q) {
    msg.queueReason = q.reason;
    msg.queueReasonCode = q.code;
  }
  return msg;
}

export const JOB_STATUSES = [...ACTIVE_STATUSES, ...TERMINAL_STATUSES];

export async function listJobs(
  db: Db,
  reader: JobReader,
  f: { status?: string; limit: number; offset: number; before?: string },
): Promise<{ rows: (JobSummaryRow & DbNow)[]; total: number }> {
  const status = f.status ? db`AND j.status = ${f.status}` : db``;
  const owner =
    reader.role === "renter"
      ? db`j.renter_id = ${reader.renterId}`
      : reader.role === "provider"
        ? db`j.provider_id = ${reader.providerId}`
        : reader.role === "admin"
          ? db`true`
          : db`false`;
  // The total in the same statement (one snapshot with the rows), from the ended jobs' counters
  // (jobCountSql), not from visiting every row of the history.
  const count = () =>
    reader.role === "renter"
      ? jobCountSql(db, { renterId: reader.renterId, status: f.status })
      : reader.role === "provider"
        ? jobCountSql(db, { providerId: reader.providerId, status: f.status })
        : reader.role === "admin"
          ? jobCountSql(db, { status: f.status })
          : db`0::bigint`;
  // After the cursor's job: `submitted_at <=` bounds the index range the list is read from (its
  // indexes lead with submitted_at, not id), the id breaks ties among jobs submitted together.
  let after = db``;
  if (f.before !== undefined) {
    const [c] = await db<{ submitted_at: Date; id: number }[]>`SELECT j.submitted_at, j.id FROM jobs j WHERE j.job_id = ${f.before} AND ${owner}`;
    if (!c) throw badRequest("before must be the job_id of a job in this list (the last job of the page before)");
    after = db`AND j.submitted_at <= ${c.submitted_at} AND (j.submitted_at < ${c.submitted_at} OR j.id < ${c.id})`;
  }
  const rows = await db<(JobSummaryRow & DbNow & { total: number })[]>`
    SELECT ${db(JOB_SUMMARY_COLUMNS)}, ${count()} AS total, ${dbNowSql(db)} FROM jobs j WHERE ${owner} ${status} ${after}
    ORDER BY j.submitted_at DESC, j.id DESC LIMIT ${f.limit} OFFSET ${f.offset}`;
  let total = rows[0]?.total ?? 0;
  if (rows.length === 0 && f.offset > 0) {
    const [c] = await db<{ n: number }[]>`SELECT ${count()} AS n`;
    total = Number(c.n);
  }
  return { rows, total: Number(total) };
}

export async function jobAttempts(db: Db, id: number): Promise<JobAttemptRow[]> {
  return db<JobAttemptRow[]>`SELECT * FROM job_attempts WHERE job_id = ${id} ORDER BY attempt`;
}

/** What the JobAttempt message shows of an attempt: its row's columns, a timestamp also as the text JSON has for it. */
type AttemptFields = Pick<JobAttemptRow, "attempt" | "provider_id" | "status" | "end_reason" | "fault" | "cost_halala" | "error"> &
  Record<"assigned_at" | "started_at" | "ended_at", Date | string | null>;

/** The JobAttempt message of an attempt (a job's history, a watch's attempts). */
export function attemptMessage(a: AttemptFields): MessageInitShape<typeof JobAttemptSchema> {
  return {
    attempt: a.attempt,
    providerId: big(a.provider_id),
    status: a.status,
    assignedAt: iso(a.assigned_at),
    startedAt: iso(a.started_at),
    endedAt: iso(a.ended_at),
    endReason: a.end_reason ?? undefined,
    fault: a.fault ?? undefined,
    costHalala: big(a.cost_halala),
    error: a.error ?? undefined,
  };
}

export const MAX_LOG_LINES_READ = 10_000;

export async function jobLogs(db: Db, id: number, attempt: number) {
  return db<{ id: number; level: string; message: string; created_at: Date }[]>`
    SELECT id, level, message, created_at FROM job_logs WHERE job_id = ${id} AND attempt = ${attempt}
    ORDER BY id LIMIT ${MAX_LOG_LINES_READ}`;
}
