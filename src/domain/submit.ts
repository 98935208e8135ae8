// POST /api/jobs/submit: validation, the estimate hold, and placement, in one
// transaction. Nothing is held unless the job row exists and some approved,
// online provider could run it (503 otherwise, rolled back whole).
import crypto from "node:crypto";
import type { Sql, Tx } from "../db/index.js";
import { apiError, badRequest, notFound, paymentRequired } from "../http/errors.js";
import { liveSql, hardwareFitSql, placeJob, type PlaceResult } from "./dispatch.js";
import { validateParams } from "./job-schemas.js";
import type { JobRow } from "./jobs.js";
import { hold, renterFunds } from "./ledger.js";
import { estimateHalala, JOB_TYPES, RATE_HALALA_PER_MINUTE, type JobType } from "./pricing.js";
import { checkSubmitQuota } from "./quota.js";
import { signTask } from "./task-signing.js";
import { buildTaskSpec, modelOf, normalizeContainerSpec, workspaceVolumeName } from "./task-spec.js";
import { templateById, templateGpuRequirements } from "./templates.js";
import { checkEnum, checkRange } from "./validate.js";

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

export function newJobId(): string {
  return `job-${Date.now().toString(36)}-${crypto.randomBytes(6).toString("hex")}`;
}

export interface Submitted {
  job: JobRow;
  placement: PlaceResult;
}

/** Submits inside `tx`; the caller commits (and may refill contended providers after). */
export async function submitJob(tx: Tx, hmacSecret: string, renterId: number, input: SubmitInput): Promise<Submitted> {
  const template = input.templateId ? templateById(input.templateId) : undefined;
  const rawType = input.jobType?.trim() || template?.jobType;
  if (!rawType) throw badRequest("missing required fields: job_type");
  const jobType = checkEnum(rawType, JOB_TYPES, "job_type") as JobType;
  if (template && template.jobType !== jobType) throw badRequest(`job_type must be ${template.jobType} for template ${template.id}`);

  const L = SUBMIT_LIMITS;
  const durationMinutes = checkRange(input.durationMinutes ?? L.durationMinutes.default, L.durationMinutes.min, L.durationMinutes.max, "duration_minutes");
  const maxDurationSeconds = checkRange(input.maxDurationSeconds ?? L.maxDurationSeconds.default, L.maxDurationSeconds.min, L.maxDurationSeconds.max, "max_duration_seconds", true);
  const priority = checkRange(input.priority ?? L.priority.default, L.priority.min, L.priority.max, "priority", true);
  const requestedProvider = input.providerId === undefined ? null : checkRange(input.providerId, 1, Number.MAX_SAFE_INTEGER, "provider_id", true);
  const params = validateParams(jobType, input.params);
  let gpuRequirements = normalizeGpuRequirements(input.gpuRequirements);
  if (template) gpuRequirements = templateGpuRequirements(template, gpuRequirements);
  const containerSpec = await normalizeContainerSpec(tx, jobType, input.containerSpec ?? (template ? { image: template.image } : undefined));

  const rate = RATE_HALALA_PER_MINUTE[jobType];
  const estimate = estimateHalala(rate, durationMinutes);

  const jobId = newJobId();
  const volume = workspaceVolumeName(jobId);
  const model = modelOf(jobType, params);
  const checkpointEnabled = input.checkpointEnabled ?? false;
  const taskSpec = buildTaskSpec({ jobId, jobType, params, containerSpec, gpuRequirements, maxDurationSeconds, workspaceVolumeName: volume, checkpointEnabled, model });

  // Money first (402), then quotas (429), then capacity (503). The funds read,
  // the quota check and the job row go out together (pipelined on the
  // transaction's connection, run in that order: the quota counts jobs before
  // this one); a refusal throws and rolls the row back. 402 wins over 429.
  const [funds, quota, inserted] = await Promise.allSettled([
    renterFunds(tx, renterId),
    checkSubmitQuota(tx, renterId, estimate),
    tx<JobRow[]>`
      INSERT INTO jobs (job_id, renter_id, requested_provider_id, job_type, status, priority, duration_minutes, max_duration_seconds,
                        rate_halala_per_minute, cost_halala, params, container_spec, gpu_requirements, task_spec, task_spec_hmac,
                        model, pricing_class, checkpoint_enabled, prewarm_requested, template_id)
      VALUES (${jobId}, ${renterId}, ${requestedProvider}, ${jobType}, 'queued', ${priority}, ${durationMinutes}, ${maxDurationSeconds},
              ${rate}, ${estimate}, ${tx.json(params as never)}, ${tx.json(containerSpec as never)},
              ${gpuRequirements ? tx.json(gpuRequirements as never) : null}, ${tx.json(taskSpec as never)}, ${signTask(hmacSecret, taskSpec)},
              ${model}, ${containerSpec.pricing_class as string}, ${checkpointEnabled}, ${input.prewarm ?? false}, ${template?.id ?? null})
      RETURNING *`,
  ]);
  if (funds.status === "rejected") throw funds.reason;
  if (funds.value.balance <= 0) throw paymentRequired("insufficient balance: the wallet balance is 0; top up before submitting jobs");
  if (funds.value.available < estimate) {
    throw paymentRequired(`insufficient balance: this job holds ${estimate} halala (${rate} halala/min x ${durationMinutes} min) and ${funds.value.available} halala is available`);
  }
  if (quota.status === "rejected") throw quota.reason;
  if (inserted.status === "rejected") throw inserted.reason;
  const [job] = inserted.value;

  // The hold, the first placement attempt and the renter's job count go out
  // together, run in that order: renter accounts are locked before
  // provider_load, as on every path. A 402 from the hold rolls everything back.
  const [held, placed, counted] = await Promise.allSettled([
    hold(tx, renterId, job.id, estimate),
    placeJob(tx, job.id),
    tx`UPDATE renters SET total_jobs = total_jobs + 1 WHERE id = ${renterId}`,
  ]);
  for (const r of [held, placed, counted]) if (r.status === "rejected") throw r.reason;
  const placement = (placed as PromiseFulfilledResult<PlaceResult>).value;
  if (placement.providerId === null) {
    await assertCapacity(tx, job.id, requestedProvider); // 503/404 roll the whole submit back
    return { job, placement };
  }
  return { job: placement.job!, placement };
}

/** 404 for an unknown requested provider; 503 when no approved, online provider could ever run the job. */
async function assertCapacity(tx: Tx, id: number, requestedProvider: number | null): Promise<void> {
  if (requestedProvider !== null) {
    const [p] = await tx`SELECT 1 FROM providers WHERE id = ${requestedProvider}`;
    if (!p) throw notFound(`provider_id ${requestedProvider}: provider not found`);
  }
  const [ok] = await tx`
    SELECT 1 FROM providers p, jobs j
    WHERE j.id = ${id} AND ${liveSql(tx)} AND ${hardwareFitSql(tx)} AND (j.requested_provider_id IS NULL OR p.id = j.requested_provider_id)
    LIMIT 1`;
  if (!ok) {
    throw apiError(
      503,
      requestedProvider !== null
        ? `provider ${requestedProvider} is not available: it must be approved, online and meet gpu_requirements`
        : "no providers available: no approved, online provider matches this job's gpu_requirements",
      { "retry-after": "30" },
    );
  }
}

/** Re-reads a job after the submit committed and contended providers were refilled. */
export async function reloadJob(sql: Sql, id: number): Promise<JobRow> {
  const [job] = await sql<JobRow[]>`SELECT * FROM jobs WHERE id = ${id}`;
  return job;
}
