// POST /api/jobs/submit: validation (prepareSubmit), then the writes
// (submitMany): the job row, the estimate hold and placement, for one submit
// or a batch of them in one transaction. Nothing is written for a submit that
// is refused (402, 429, 404, 503).
import crypto from "node:crypto";
import { allInTransaction, inOrder, type Db, type Sql, type Tx } from "../../db/index.js";
import { type ServiceError, apiError, badRequest, forbidden, notFound, paymentRequired } from "../../errors.js";
import { heardSql, liveSql, hardwareFitSql, jobTypeFitSql, declaredTypes, placeMany, readCandidates, renameJobs, type FreshRows, type NewJob, type PlaceResult, type QueueStanding } from "../dispatch/dispatch.js";
import { checkImageRunsJobType, validateParams } from "./job-schemas.js";
import type { JobRow } from "../shared/job-row.js";
import { lockRenterAccounts, takeHold, writeHolds, type AcceptedHold, type RenterAccounts } from "../money/ledger.js";
import { estimateHalala, JOB_TYPES, RATE_HALALA_PER_MINUTE, type JobType } from "../money/pricing.js";
import { quotaRefusal, quotaUsageMany, withReserved, type QuotaUsage } from "../money/quota.js";
import { freeOf, reservedMany, type Promised } from "../money/promised.js";
import { lockReservations } from "../money/usage-billing.js";
import { canonicalJson, hmacOfCanonical } from "../../shared/task-signature.js";
import { buildTaskSpec, modelOf, namesImage, normalizeContainerSpec, workspaceVolumeName } from "./task-spec.js";
import { templateById, templateGpuRequirements, templateRuns } from "./templates.js";
import { daemonPolicy, outdatedDaemonSql } from "../providers/versions.js";
import { checkEnum, checkRange } from "../shared/validate.js";

export const SUBMIT_LIMITS = {
  durationMinutes: { min: 0.01, max: 1440, default: 10 },
  maxDurationSeconds: { min: 1, max: 86_400, default: 1800 },
  priority: { min: 1, max: 3, default: 2 },
  minVramGb: { min: 0, max: 1024 },
} as const;

export interface SubmitInput {
  jobType?: string;
  durationMinutes?: number;
  providerId?: number;
  params?: Record<string, unknown>;
  containerSpec?: Record<string, unknown>;
  gpuRequirements?: Record<string, unknown>;
  maxDurationSeconds?: number;
  priority?: number;
  templateId?: string;
  checkpointEnabled?: boolean;
  prewarm?: boolean;
}

const GPU_REQUIREMENT_FIELDS = ["min_vram_gb", "gpu_model"];

/** gpu_requirements: min_vram_gb (number) and gpu_model (substring), or null for none. */
export function normalizeGpuRequirements(req: Record<string, unknown> | undefined | null): Record<string, unknown> | null {
  if (!req) return null;
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(req)) {
    if (v === null || v === undefined) continue;
    if (k === "min_vram_gb") {
      out.min_vram_gb = checkRange(typeof v === "number" ? v : NaN, SUBMIT_LIMITS.minVramGb.min, SUBMIT_LIMITS.minVramGb.max, "gpu_requirements.min_vram_gb");
    } else if (k === "gpu_model") {
      if (typeof v !== "string" || v.trim() === "" || v.length > 100) throw badRequest("gpu_requirements.gpu_model must be a non-empty string of at most 100 characters");
      out.gpu_model = v.trim();
    } else {
      throw badRequest(`gpu_requirements.${k} is not supported (allowed: ${GPU_REQUIREMENT_FIELDS.join(", ")})`);
    }
  }
  return Object.keys(out).length ? out : null;
}

/** Random bytes for job ids, drawn 4 KiB at a time: one call into the CSPRNG per ~680 ids instead of one each. */
let idBytes = Buffer.alloc(0);
let idOffset = 0;

export function newJobId(): string {
  if (idOffset + 6 > idBytes.length) {
    idBytes = crypto.randomBytes(4096);
    idOffset = 0;
  }
  const hex = idBytes.toString("hex", idOffset, idOffset + 6);
  idOffset += 6;
  return `job-${Date.now().toString(36)}-${hex}`;
}

export interface Submitted {
  job: JobRow;
  placement: PlaceResult;
  /**
   * The queued jobs of its batch, each with its place and reason, read together once the batch
   * committed (the submit batcher's; absent elsewhere). A failed read rejects for whoever awaits it.
   */
  standings?: Promise<Map<number, QueueStanding>>;
}

/** A validated submit, ready to be written: everything but what the database decides. */
export interface SubmitIntent {
  renterId: number;
  jobId: string;
  jobType: JobType;
  durationMinutes: number;
  maxDurationSeconds: number;
  priority: number;
  requestedProvider: number | null;
  rate: number;
  estimate: number;
  params: Record<string, unknown>;
  containerSpec: Record<string, unknown>;
  gpuRequirements: Record<string, unknown> | null;
  taskSpec: Record<string, unknown>;
  taskSpecHmac: string;
  /** canonicalJson(taskSpec), which taskSpecHmac signs: the job's stored task spec has this form too. */
  taskSpecCanonical: string;
  model: string | null;
  checkpointEnabled: boolean;
  prewarm: boolean;
  templateId: string | null;
}

/**
 * Validates a submit and builds what the job will run (task spec, signature):
 * 400 naming the field (an unapproved image included). Reads only (the
 * registry's approved images), so it runs before any transaction.
 */
/**
 * A vllm_serve job with params.public serves every renter's /v1 requests
 * (src/http/v1/endpoints.ts), billed per token: the platform's managed
 * endpoints. Only the accounts the operator names (SVC_V1_MANAGED_RENTERS,
 * emails) may submit one, once the account proved it owns the address (signed in
 * with the emailed code, migration 051: registration takes any address): a renter
 * pinning such a job to a provider of its own could draw other renters' prompts,
 * and their billing, to a server of its own.
 */
export async function checkPublicServing(db: Db, renterId: number, input: SubmitInput, managedEmails: readonly string[]): Promise<void> {
  const params = input.params as Record<string, unknown> | undefined;
  // Anything but `true` is left to validateParams (a non-boolean is refused there, as is `public` on other job types).
  if (params?.public !== true) return;
  const jobType = input.jobType?.trim() || (input.templateId ? templateById(input.templateId)?.jobType : undefined);
  if (jobType !== "vllm_serve") return;
  const [renter] = await db<{ email: string; proven: boolean; older_keys: boolean }[]>`
    SELECT email, email_proven_at IS NOT NULL AS proven,
           EXISTS (SELECT 1 FROM api_keys k WHERE k.renter_id = r.id AND k.revoked_at IS NULL AND k.created_at < r.email_proven_at) AS older_keys
    FROM renters r WHERE id = ${renterId}`;
  if (renter && managedEmails.includes(renter.email.toLowerCase())) {
    // A key from before the proof may be whoever registered the address (its first proof as a managed
    // address revokes them, login.ts; one proven before the operator named it keeps them until rotated).
    if (renter.proven && renter.older_keys) {
      throw forbidden(
        "params.public: keys issued before this account proved its address are still live, and whoever registered the address may hold one; " +
          "rotate the account's keys (POST /api/renters/rotate-key) and submit with the new key",
      );
    }
    if (renter.proven) return;
    // Registration takes any address: the right goes to the account that showed it owns it.
    throw forbidden(
      "params.public: this account's email is a managed-endpoint account's (SVC_V1_MANAGED_RENTERS), but the account has not proven it owns the address; " +
        "sign in once with POST /api/renters/login-email and the code sent there",
    );
  }
  throw forbidden(
    "params.public: only the platform's managed-endpoint accounts (SVC_V1_MANAGED_RENTERS) may serve every renter's /v1 requests; " +
      "without it a vllm_serve job serves its own renter's requests",
  );
}

export async function prepareSubmit(db: Db, hmacSecret: string, renterId: number, input: SubmitInput): Promise<SubmitIntent> {
  const template = input.templateId ? templateById(input.templateId) : undefined;
  const rawType = input.jobType?.trim() || template?.jobType;
  if (!rawType) throw badRequest("missing required fields: job_type");
  const jobType = checkEnum(rawType, JOB_TYPES, "job_type") as JobType;
  if (template && !templateRuns(template, jobType)) throw badRequest(`job_type must be ${template.jobType} for template ${template.id}`);

  const L = SUBMIT_LIMITS;
  const durationMinutes = checkRange(input.durationMinutes ?? L.durationMinutes.default, L.durationMinutes.min, L.durationMinutes.max, "duration_minutes");
  const maxDurationSeconds = checkRange(input.maxDurationSeconds ?? L.maxDurationSeconds.default, L.maxDurationSeconds.min, L.maxDurationSeconds.max, "max_duration_seconds", true);
  const priority = checkRange(input.priority ?? L.priority.default, L.priority.min, L.priority.max, "priority", true);
  const requestedProvider = input.providerId === undefined ? null : checkRange(input.providerId, 1, Number.MAX_SAFE_INTEGER, "provider_id", true);
  // A template names no image of its own: its job runs in the type's default image unless container_spec names
  // another, under the rules of any job of the type (templates.ts).
  const givenContainer = input.containerSpec;
  // Absent inputs take the defaults of job-schemas.ts, so what the task spec says is what runs and is billed.
  const params = validateParams(jobType, input.params, { defaultImage: !namesImage(givenContainer) });
  let gpuRequirements = normalizeGpuRequirements(input.gpuRequirements);
  if (template) gpuRequirements = templateGpuRequirements(template, gpuRequirements);
  const containerSpec = await normalizeContainerSpec(db, jobType, givenContainer);
  checkImageRunsJobType(jobType, containerSpec.image as string);

  const rate = RATE_HALALA_PER_MINUTE[jobType];
  const estimate = estimateHalala(rate, durationMinutes);
  const jobId = newJobId();
  const model = modelOf(jobType, params);
  const checkpointEnabled = input.checkpointEnabled ?? false;
  const taskSpec = buildTaskSpec({ jobId, jobType, params, containerSpec, gpuRequirements, maxDurationSeconds, workspaceVolumeName: workspaceVolumeName(jobId), checkpointEnabled, model });
  const taskSpecCanonical = canonicalJson(taskSpec);
  return {
    renterId, jobId, jobType, durationMinutes, maxDurationSeconds, priority, requestedProvider, rate, estimate, params, containerSpec,
    gpuRequirements, taskSpec, taskSpecHmac: hmacOfCanonical(hmacSecret, taskSpecCanonical), taskSpecCanonical, model, checkpointEnabled, prewarm: input.prewarm ?? false,
    templateId: template?.id ?? null,
  };
}

export type SubmitOutcome = { ok: true; submitted: Submitted } | { ok: false; error: ServiceError };

interface RenterState {
  /** Locked by this transaction: the judgement below takes each accepted hold out of it. */
  accounts: RenterAccounts;
  usage: QuotaUsage;
  /** Price caps of the renter's /v1 requests in flight, and what it owes for refunds: promised already, not for a job to hold. */
  promised: Promised;
  /** Suspended since its key was accepted: the suspension committed while this waited for the renter's reservation lock (admin.ts setRenterStatus). */
  suspended: boolean;
}

/**
 * Writes any number of submits in the caller's transaction, set-based (the
 * submit batcher's group commit, or one submit): each one is judged in the
 * order given, as if they came one after another. A renter suspended since
 * its key was accepted first (403), then money (402), then quotas (429), then
 * capacity (404 for an unknown requested provider, 503 when no approved,
 * online provider could ever run it); a refused submit writes nothing. The
 * others' job rows are inserted, their estimates held, their renters' job
 * counts raised and the jobs placed, each step one statement for the whole set.
 *
 * Locks, in the order every path takes them: the renters' /v1 reservation
 * locks and their ledger accounts, each in id order (which also serialises one
 * renter's submits, so the funds, reservations and quota reads that follow are
 * the truth), then providers' load rows.
 */
export async function submitMany(tx: Tx, intents: SubmitIntent[]): Promise<SubmitOutcome[]> {
  const renterIds = [...new Set(intents.map((i) => i.renterId))].sort((a, b) => a - b);
  // One round trip: the locks and everything the judgement needs, and ids for the rows
  // (so that the writes below can all go out together, without waiting for the insert).
  // Placement's first read too: the new jobs as they will be, under placeholder ids
  // (above any row's id, in arrival order) until the sequence has given theirs.
  const fresh: NewJob[] = intents.map((it, i) => ({
    id: PLACEHOLDER_ID + i,
    jobType: it.jobType,
    priority: it.priority,
    requestedProviderId: it.requestedProvider,
    gpuRequirements: it.gpuRequirements,
  }));
  // Sent in this order. The locks, the capacity check and the ids run under generic plans, made once
  // per connection: PostgreSQL planned these again on most batches (their custom plans know how many
  // renters or requirements the arrays hold, so they look cheaper than the generic one), and the
  // capacity check cost more to plan than to run. The quota read keeps the connection's own setting:
  // its generic plan reads renter_quota and renter_daily_jobs whole.
  const steps = [
    inOrder(tx`SET LOCAL plan_cache_mode = force_generic_plan`),
    inOrder(lockReservations(tx, renterIds)),
    reservedMany(tx, renterIds),
    lockRenterAccounts(tx, renterIds),
    capacityOf(tx, intents),
    inOrder(tx<{ id: number }[]>`SELECT nextval('jobs_id_seq') AS id FROM generate_series(1, ${intents.length})`),
    inOrder(tx`SET LOCAL plan_cache_mode TO DEFAULT`),
    quotaUsageMany(tx, renterIds),
    readCandidates(tx, [], [0], true, fresh),
  ] as const;
  const [, , reserved, accounts, capacity, newIds, , usage, candidates] = await allInTransaction(steps);
  const renters = new Map<number, RenterState>(
    renterIds.map((id) => {
      const promised = reserved.get(id) ?? { v1: 0, owed: 0, suspended: false };
      return [id, { accounts: accounts.get(id)!, usage: withReserved(usage.get(id)!, promised.v1), promised, suspended: promised.suspended }];
    }),
  );

  const holds: AcceptedHold[] = [];
  const outcomes: (SubmitOutcome | undefined)[] = intents.map((intent, i) => {
    const r = renters.get(intent.renterId)!;
    if (r.suspended) return refused(forbidden("renter account is suspended"));
    const { estimate, rate, durationMinutes } = intent;
    const { available, held } = r.accounts;
    if (available + held <= 0) return refused(paymentRequired("insufficient balance: the wallet balance is 0; top up before submitting jobs"));
    if (available < estimate) {
      return refused(paymentRequired(`insufficient balance: this job holds ${estimate} halala (${rate} halala/min x ${durationMinutes} min) and ${available} halala is available`));
    }
    if (freeOf(available, r.promised) < estimate) {
      const owed = r.promised.owed > 0 ? `${r.promised.v1 > 0 ? " and" : ""} ${r.promised.owed} is owed for refunded payments` : "";
      return refused(
        paymentRequired(
          `insufficient balance: this job holds ${estimate} halala (${rate} halala/min x ${durationMinutes} min) and ${available} halala is available, ` +
            `of which${r.promised.v1 > 0 ? ` ${r.promised.v1} is reserved by /v1 requests in flight` : ""}${owed}; retry when they end, or top up`,
        ),
      );
    }
    const quota = quotaRefusal(r.usage, estimate);
    if (quota) return refused(apiError(429, quota));
    const cap = capacity[i];
    if (!cap.known) return refused(notFound(`provider_id ${intent.requestedProvider}: provider not found`));
    if (!cap.capable) return refused(apiError(503, incapableWhy(intent, cap), { "retry-after": "30" }));
    holds.push(takeHold(r.accounts, { renterId: intent.renterId, jobId: newIds[i].id, amount: estimate }));
    r.usage = { ...r.usage, jobsToday: r.usage.jobsToday + 1, spentAndHeldHalala: r.usage.spentAndHeldHalala + estimate };
    return undefined;
  });
  const acceptedAt = intents.flatMap((_, i) => (outcomes[i] === undefined ? [i] : []));
  if (acceptedAt.length === 0) return outcomes as SubmitOutcome[];

  const ids = acceptedAt.map((i) => newIds[i].id);
  const counts = new Map<number, number>();
  for (const i of acceptedAt) counts.set(intents[i].renterId, (counts.get(intents[i].renterId) ?? 0) + 1);
  const accepted = new Set(acceptedAt);
  const firstRound = renameJobs(candidates, (id) => {
    if (id < PLACEHOLDER_ID) return id;
    const i = id - PLACEHOLDER_ID;
    return accepted.has(i) ? newIds[i].id : undefined;
  });
  // One round trip, run in this order on the transaction's connection: the rows, written by
  // placement's first assignment (assigned where their provider was taken, queued otherwise;
  // the providers are locked after the accounts, which are ours already), their holds, the
  // renters' counts.
  const [placement] = await allInTransaction([
    placeMany(tx, ids, { firstRound, fresh: freshRows(tx, acceptedAt.map((i) => ({ id: newIds[i].id, intent: intents[i] }))) }),
    writeHolds(tx, holds),
    tx`UPDATE renters SET total_jobs = total_jobs + c.n
       FROM unnest(${[...counts.keys()]}::bigint[], ${[...counts.values()]}::bigint[]) AS c(id, n) WHERE renters.id = c.id`,
  ]);

  // Placed jobs come back with their rows; only the ones left queued are read.
  const queuedIds = ids.filter((id) => !placement.placed.has(id));
  const queued = new Map(
    queuedIds.length === 0 ? [] : (await tx<JobRow[]>`SELECT * FROM jobs WHERE id = ANY(${queuedIds}::bigint[])`).map((r) => [r.id, r]),
  );
  let k = 0;
  return outcomes.map((o) => {
    if (o) return o;
    const id = ids[k++];
    const got = placement.placed.get(id);
    const submitted: Submitted = got
      ? { job: got.job, placement: { providerId: got.providerId, contended: [], job: got.job } }
      : { job: queued.get(id)!, placement: { providerId: null, contended: placement.contended } };
    return { ok: true, submitted };
  });
}

/**
 * Why no provider can take a submit: the 503's message. Providers that could run it but for a
 * daemon below SVC_DAEMON_MIN_VERSION (given no jobs until it updates itself) are named first:
 * that is the whole reason. Then its hardware (as before providers declared job types), then the
 * job type: a provider that fits but whose daemon does not run the type is named as such, and so
 * is a fleet where none that fits runs it.
 */
function incapableWhy(intent: SubmitIntent, cap: Capacity): string {
  const pinned = intent.requestedProvider;
  if (cap.outdated) {
    const min = `the minimum version ${daemonPolicy.minVersion} (SVC_DAEMON_MIN_VERSION)`;
    return pinned !== null
      ? `provider ${pinned} is not available: its daemon is below ${min} and is given no jobs until it updates itself`
      : `no providers available: the online providers that could run this job have a daemon below ${min}, and are given no jobs until it updates itself`;
  }
  if (!cap.fitsHardware) {
    if (pinned !== null) return `provider ${pinned} is not available: it must be approved, online and meet gpu_requirements`;
    return intent.gpuRequirements === null
      ? "no providers available: no approved provider is online"
      : "no providers available: no approved, online provider matches this job's gpu_requirements";
  }
  return pinned !== null
    ? `provider ${pinned} is not available: it does not run ${intent.jobType} jobs (${declaredTypes(cap.declared)})`
    : `no providers available: no approved, online provider that matches this job's gpu_requirements runs ${intent.jobType} jobs`;
}

/** Ids the fresh jobs carry in placement's first read, before the sequence gives theirs: above any real id. */
const PLACEHOLDER_ID = 2 ** 52;

const refused = (error: ServiceError): SubmitOutcome => ({ ok: false, error });

/** One submit inside `tx` (submitMany for one); throws its refusal. */
export async function submitJob(tx: Tx, hmacSecret: string, renterId: number, input: SubmitInput): Promise<Submitted> {
  const [o] = await submitMany(tx, [await prepareSubmit(tx, hmacSecret, renterId, input)]);
  if (!o.ok) throw o.error;
  return o.submitted;
}

/** The jobs columns a submit writes (besides status and assignment, which placement sets). */
const FRESH_COLUMNS = [
  "id", "job_id", "renter_id", "requested_provider_id", "job_type", "priority", "duration_minutes", "max_duration_seconds",
  "rate_halala_per_minute", "cost_halala", "params", "container_spec", "gpu_requirements", "task_spec", "task_spec_hmac",
  "model", "pricing_class", "checkpoint_enabled", "prewarm_requested", "template_id",
];

/** The new rows, for placement to insert (placeMany's `fresh`): FRESH_COLUMNS and their order. */
function freshRows(tx: Tx, rows: { id: number; intent: SubmitIntent }[]): FreshRows {
  const list = rows.map((r) => r.intent);
  const col = <T>(f: (i: SubmitIntent) => T) => list.map(f);
  const json = (v: unknown) => (v === null ? null : JSON.stringify(v));
  // Booleans go as text: postgres.js does not send a boolean array as bool[].
  const select = tx`
    SELECT id, job_id, renter_id, requested_provider_id, job_type, priority, duration_minutes, max_duration_seconds,
           rate AS rate_halala_per_minute, estimate AS cost_halala, params::jsonb AS params, container_spec::jsonb AS container_spec,
           gpu_requirements::jsonb AS gpu_requirements, task_spec::jsonb AS task_spec, task_spec_hmac, model, pricing_class,
           checkpoint_enabled::bool AS checkpoint_enabled, prewarm::bool AS prewarm_requested, template_id, ord
    FROM unnest(${rows.map((r) => r.id)}::bigint[], ${col((i) => i.jobId)}::text[], ${col((i) => i.renterId)}::bigint[], ${col((i) => i.requestedProvider)}::bigint[],
                ${col((i) => i.jobType)}::text[], ${col((i) => i.priority)}::int[], ${col((i) => i.durationMinutes)}::float8[],
                ${col((i) => i.maxDurationSeconds)}::bigint[], ${col((i) => i.rate)}::bigint[], ${col((i) => i.estimate)}::bigint[],
                ${col((i) => json(i.params))}::text[], ${col((i) => json(i.containerSpec))}::text[], ${col((i) => json(i.gpuRequirements))}::text[],
                ${col((i) => json(i.taskSpec))}::text[], ${col((i) => i.taskSpecHmac)}::text[], ${col((i) => i.model)}::text[],
                ${col((i) => i.containerSpec.pricing_class as string)}::text[], ${col((i) => String(i.checkpointEnabled))}::text[],
                ${col((i) => String(i.prewarm))}::text[], ${col((i) => i.templateId)}::text[])
         WITH ORDINALITY AS x(id, job_id, renter_id, requested_provider_id, job_type, priority, duration_minutes, max_duration_seconds,
                              rate, estimate, params, container_spec, gpu_requirements, task_spec, task_spec_hmac, model,
                              pricing_class, checkpoint_enabled, prewarm, template_id, ord)`;
  return { columns: FRESH_COLUMNS, ids: rows.map((r) => r.id), select };
}

/** What capacityOf finds for a submit. */
export interface Capacity {
  /** Its requested provider exists (true when it asks for none). */
  known: boolean;
  /** Some approved, online provider (the requested one, if any) fits its hardware and runs its job type. */
  capable: boolean;
  /** Some such provider fits its hardware, whatever job types it runs (read only when not `capable`). */
  fitsHardware: boolean;
  /** The job types the requested provider's daemon declared (null: none declared, or no provider requested). */
  declared: string[] | null;
  /** Some provider (the requested one, if any) would be capable but for its daemon's version (read only when not `capable`). */
  outdated: boolean;
}

/**
 * For each submit: whether its requested provider exists (`known`) and
 * whether some approved, online provider fits it (`capable`), evaluated once
 * per distinct (gpu_requirements, provider_id, job_type).
 */
export async function capacityOf(tx: Tx, intents: SubmitIntent[]): Promise<Capacity[]> {
  const keyOf = (i: SubmitIntent) => JSON.stringify([i.gpuRequirements, i.requestedProvider, i.jobType]);
  const distinct = [...new Map(intents.map((i) => [keyOf(i), i])).values()];
  const rows = await capacitySql(tx, distinct);
  const byKey = new Map(rows.map((r) => [keyOf(distinct[Number(r.ord) - 1]), r]));
  return intents.map((i) => byKey.get(keyOf(i))!);
}

/**
 * The capacity statement for `distinct` submits. The hardware-only check, the requested
 * provider's declared types and the outdated daemons are read only for a submit no provider can
 * take (CASE evaluates lazily): an accepted submit costs one EXISTS, as before job types were declared.
 */
export function capacitySql(tx: Db, distinct: Pick<SubmitIntent, "gpuRequirements" | "requestedProvider" | "jobType">[]) {
  const mine = tx`(j.requested_provider_id IS NULL OR p.id = j.requested_provider_id)`;
  const candidates = tx`FROM providers p WHERE ${liveSql(tx)} AND ${hardwareFitSql(tx)} AND ${mine}`;
  // Heard, fitting, and given no jobs only because its daemon is below the minimum version.
  const outdated = tx`FROM providers p WHERE ${heardSql(tx)} AND ${outdatedDaemonSql(tx, "p")} AND ${hardwareFitSql(tx)} AND ${jobTypeFitSql(tx)} AND ${mine}`;
  // OFFSET 0: `capable` is computed once per row, not copied into each of its uses below.
  return tx<{ ord: number; known: boolean; capable: boolean; fitsHardware: boolean; declared: string[] | null; outdated: boolean }[]>`
    SELECT j.ord, j.known, j.capable,
           CASE WHEN j.capable THEN true ELSE EXISTS (SELECT 1 ${candidates}) END AS "fitsHardware",
           CASE WHEN j.capable OR j.requested_provider_id IS NULL THEN NULL
                ELSE (SELECT supported_job_types FROM providers WHERE id = j.requested_provider_id) END AS declared,
           CASE WHEN j.capable THEN false ELSE EXISTS (SELECT 1 ${outdated}) END AS outdated
    FROM (
      SELECT j.*,
             (j.requested_provider_id IS NULL OR EXISTS (SELECT 1 FROM providers WHERE id = j.requested_provider_id)) AS known,
             EXISTS (SELECT 1 ${candidates} AND ${jobTypeFitSql(tx)}) AS capable
      FROM (SELECT req::jsonb AS gpu_requirements, requested_provider_id, job_type, ord
            FROM unnest(${distinct.map((i) => (i.gpuRequirements ? JSON.stringify(i.gpuRequirements) : null))}::text[],
                        ${distinct.map((i) => i.requestedProvider)}::bigint[], ${distinct.map((i) => i.jobType)}::text[])
                 WITH ORDINALITY AS x(req, requested_provider_id, job_type, ord)) j
      OFFSET 0
    ) j`;
}

/** Re-reads a job after the submit committed and contended providers were refilled. */
export async function reloadJob(sql: Sql, id: number): Promise<JobRow> {
  const [job] = await sql<JobRow[]>`SELECT * FROM jobs WHERE id = ${id}`;
  return job;
}
