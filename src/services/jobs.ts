// JobService: thin translation between messages and the job domain
// (submit.ts, dispatch.ts, job-reports.ts, settlement.ts, job-control.ts);
// WatchJob streams from the per-process hub (workers/job-watch.ts).
import { create, toJson, type JsonObject, type JsonValue, type MessageInitShape } from "@bufbuild/protobuf";
import type { HandlerContext, ServiceImpl } from "@connectrpc/connect";
import { JobService, SubmitJobRequestSchema, SubmitJobResponseSchema, type JobOutputSchema } from "../../gen/svc/v1/jobs_pb.js";
import type { Db } from "../db/index.js";
import { apiError, badRequest, forbidden, notFound, ServiceError } from "../errors.js";
import { dispatchForProvider, jobPolicy, queuePosition, type QueueStanding } from "../domain/dispatch/dispatch.js";
import { servingPolicy } from "../domain/shared/job-end.js";
import { idempotent, restoreAnswer } from "../domain/money/idempotency.js";
import { cancelJob } from "../domain/jobs/job-control.js";
import { appendLogs, completeJob, endpointReady, markJobPreparing, pollJob, reportProgress, reportResult } from "../domain/jobs/job-reports.js";
import { JOB_STATUSES, attemptMessage, attemptsForReader, jobAttempts, jobForReader, jobLogs, jobView, jobViews, listJobs, type JobReader } from "../domain/jobs/jobs.js";
import { type JobRow } from "../domain/shared/job-row.js";
import { checkPublicServing, prepareSubmit, reloadJob, submitJob, type SubmitInput, type Submitted } from "../domain/jobs/submit.js";
import { SubmitBatcher } from "../domain/jobs/submit-batcher.js";
import { IMAGE_RESULT_JOB_TYPES } from "../domain/jobs/task-spec.js";
import { verifyAttestation } from "../domain/providers/attestations.js";
import { parseCursor } from "../domain/jobs/job-watch.js";
import { jobWatchHub } from "../workers/job-watch.js";
import { jobSignalHub } from "../workers/job-signals.js";
import { checkEnum, iso, optionalText, page, REASON_MAX_CHARS } from "../domain/shared/validate.js";
import { callerProviderId, callerRenterId, logPlatformFault, principalOf, type Deps, auditActor } from "./deps.js";
import { credentialsKey } from "../http/credentials.js";
import { rasterImageType } from "../shared/image-formats.js";
import { canonicalJson } from "../shared/task-signature.js";

/** The documented `timeout_at` form: YYYY-MM-DD HH:MM:SS.mmm (UTC). */
export function timeoutAtText(d: Date | null): string | undefined {
  return d ? new Date(d).toISOString().replace("T", " ").slice(0, 23) : undefined;
}

type OutputInit = MessageInitShape<typeof JobOutputSchema>;

function readerOf(ctx: HandlerContext): JobReader {
  return principalOf(ctx) as JobReader;
}

/** Runs a submit and counts its outcome (assigned, queued, or the refusal's status) in the metrics. */
async function countedSubmit<T extends { queued: boolean }>(deps: Deps, submit: () => Promise<T>): Promise<T> {
  try {
    const answer = await submit();
    deps.metrics?.submit(answer.queued ? "queued" : "assigned");
    return answer;
  } catch (err) {
    deps.metrics?.submit(err instanceof ServiceError ? String(err.status) : "error");
    throw err;
  }
}

/** The answer to a submit; `standing`: the queued job's place and reason when already read (its batch's). */
async function submission(db: Db, job: JobRow, standing?: QueueStanding) {
  const queued = job.status === "queued";
  const view = await jobView(db, job, undefined, standing?.reason);
  return {
    success: true,
    queued,
    message: queued
      ? `Job queued: ${view.queueReason}.`
      : `Job assigned to provider ${job.provider_id}; ${job.cost_halala} halala held until it settles.`,
    job: {
      job: view,
      timeoutAt: timeoutAtText(job.timeout_at),
      gpuRequirements: (job.gpu_requirements ?? undefined) as JsonObject | undefined,
      containerSpec: job.container_spec as JsonObject,
      workspaceVolumeName: (job.task_spec as { workspace?: { volume?: string } }).workspace?.volume ?? "",
      checkpointEnabled: job.checkpoint_enabled,
      taskSpecSigned: job.task_spec_hmac !== "",
      pricingClass: job.pricing_class,
      prewarmRequested: job.prewarm_requested,
      queuePosition: queued ? BigInt(standing?.position ?? (await queuePosition(db, job.id))) : undefined,
    },
  } satisfies MessageInitShape<typeof SubmitJobResponseSchema>;
}

/** The result object a completed job answers on /output (a bare string as {data} for an image job, else {response}). */
function resultObject(job: JobRow): JsonObject | undefined {
  const r = job.result as JsonValue | null;
  if (r === null || r === undefined) return undefined;
  if (typeof r === "string") return IMAGE_RESULT_JOB_TYPES.includes(job.job_type) ? { data: r } : { response: r };
  if (typeof r === "object" && !Array.isArray(r)) return r;
  return { result: r };
}

function pendingMessage(job: JobRow, queueReason?: string): string {
  if (job.status === "queued") return `Job is queued${queueReason ? `: ${queueReason}` : ""}.`;
  if (job.status === "pending") return "Job is assigned to a provider and starting.";
  return job.progress_pct !== null ? `Job is running (${Math.round(job.progress_pct)}%).` : "Job is running.";
}

const PNG_MAGIC = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);
/**
 * The output formats: json, png and raw (the interface's), and result: the stored result as the
 * exact bytes a receipt's output_sha256 hashes (docs/receipts.md).
 */
const OUTPUT_FORMATS = ["json", "png", "raw", "result"] as const;

function imageBytes(obj: JsonObject | undefined): Buffer | undefined {
  if (typeof obj?.data !== "string") return undefined;
  const bytes = Buffer.from(obj.data.replace(/^data:[\w/+.-]+;base64,/, ""), "base64");
  return bytes.length > 0 ? bytes : undefined;
}

export function jobService(deps: Deps): Partial<ServiceImpl<typeof JobService>> {
  const { sql, config } = deps;
  jobPolicy.maxAttempts = config.jobMaxAttempts;
  servingPolicy.loadGraceSeconds = config.servingLoadGraceSeconds;
  const batcher = new SubmitBatcher(sql);
  const watchHub = jobWatchHub(sql, deps.log);
  const signals = jobSignalHub(sql, deps.log);
  /**
   * A committed submit placed on a provider whose stream is on this process: pushed now (see
   * assignedHere). `canonical`: its task spec as prepareSubmit signed it.
   */
  const pushHere = (s: Submitted, canonical?: string) => {
    if (s.placement.providerId !== null && s.job.status === "pending") signals.assignedHere(s.placement.providerId, s.job, canonical);
  };

  /** A finished job's output object, or the status error for the format routes. */
  async function completedOutput(ctx: HandlerContext, jobId: string): Promise<{ job: JobRow; obj: JsonObject }> {
    const job = await jobForReader(sql, jobId, readerOf(ctx));
    if (job.status === "failed" || job.status === "cancelled") throw apiError(410, job.error ?? `job ${job.status}`);
    if (job.status !== "completed") throw notFound(`no output yet: job is ${job.status}`);
    const obj = resultObject(job);
    if (!obj) throw notFound("job has no output");
    return { job, obj };
  }

  /**
   * /output/result: the job's stored result exactly as its receipt's output_sha256 hashes it, the
   * canonical JSON (RFC 8785) of the object or string the daemon reported, nothing added or wrapped:
   * its SHA-256 is output_sha256. A failed job that stored a result (a failure the daemon reported
   * with its output) answers it too, as its receipt names it; /output itself stays 410 for it.
   */
  async function storedResult(ctx: HandlerContext, jobId: string) {
    const job = await jobForReader(sql, jobId, readerOf(ctx));
    if (job.status !== "completed" && job.status !== "failed" && job.status !== "cancelled") throw notFound(`no output yet: job is ${job.status}`);
    if (job.result === null || job.result === undefined) {
      if (job.status !== "completed") throw apiError(410, job.error ?? `job ${job.status}`);
      throw notFound("job has no output");
    }
    return { contentType: "application/json; charset=utf-8", data: Buffer.from(canonicalJson(job.result), "utf8") };
  }

  return {
    submit: (req, ctx) => countedSubmit(deps, async () => {
      const renterId = callerRenterId(ctx);
      const { idempotencyKey, ...fields } = req;
      const input: SubmitInput = {
        jobType: req.jobType,
        durationMinutes: req.durationMinutes,
        providerId: req.providerId === undefined ? undefined : Number(req.providerId),
        params: req.params,
        containerSpec: req.containerSpec,
        gpuRequirements: req.gpuRequirements,
        maxDurationSeconds: req.maxDurationSeconds === undefined ? undefined : Number(req.maxDurationSeconds),
        priority: req.priority,
        templateId: req.templateId,
        checkpointEnabled: req.checkpointEnabled,
        prewarm: req.prewarm,
      };
      await checkPublicServing(sql, renterId, input, config.v1.managedRenters);
      let submitted: Submitted | undefined;
      const scope = `jobs.submit:renter:${renterId}`;
      if (idempotencyKey) {
        // The key's row and the submit share one transaction (a batch of one), so a replay answers what was stored.
        const res = await idempotent(sql, SubmitJobResponseSchema, scope, idempotencyKey, toJson(SubmitJobRequestSchema, { ...fields, idempotencyKey: undefined } as never), async (tx) => {
          submitted = undefined; // a re-run transaction (deadlock victim) may end up replaying a stored answer
          submitted = await submitJob(tx, config.hmacSecret, renterId, input);
          return submission(tx, submitted.job);
        });
        const written = submitted as Submitted | undefined; // undefined: a replay of the stored answer
        if (written) pushHere(written);
        if (!written || written.placement.contended.length === 0) return res;
        submitted = written;
      } else {
        const intent = await prepareSubmit(sql, config.hmacSecret, renterId, input);
        submitted = await batcher.submit(intent);
        pushHere(submitted, intent.taskSpecCanonical);
        if (submitted.placement.contended.length === 0) return submission(sql, submitted.job, (await submitted.standings)?.get(submitted.job.id));
      }
      // Providers another transaction was filling at that moment: try them now that the job is visible.
      for (const p of submitted.placement.contended) await dispatchForProvider(sql, p);
      const answer = create(SubmitJobResponseSchema, await submission(sql, await reloadJob(sql, submitted.job.id)));
      await restoreAnswer(sql, SubmitJobResponseSchema, scope, idempotencyKey, answer);
      return answer;
    }),

    async list(req, ctx) {
      const status = req.status ? checkEnum(req.status, JOB_STATUSES, "status") : undefined;
      const { limit, offset } = page(req.limit, req.offset, 200, "page on with before=<the last job_id of a page>");
      const before = optionalText(req.before, 200, "before");
      const { rows, total } = await listJobs(sql, readerOf(ctx), { status, limit, offset, before });
      const reader = readerOf(ctx);
      return { jobs: await jobViews(sql, rows, reader), total: BigInt(total), limit, offset };
    },

    async get(req, ctx) {
      const reader = readerOf(ctx);
      return jobView(sql, await jobForReader(sql, req.jobId, reader), reader);
    },

    async getOutput(req, ctx): Promise<OutputInit> {
      const job = await jobForReader(sql, req.jobId, readerOf(ctx));
      if (job.status === "queued" || job.status === "pending" || job.status === "running") {
        const view = job.status === "queued" ? await jobView(sql, job) : undefined;
        return {
          statusCode: 202,
          body: {
            case: "pending",
            value: {
              status: job.status,
              message: pendingMessage(job, view?.queueReason),
              progressPhase: job.progress_phase ?? undefined,
              progressPct: job.progress_pct ?? undefined,
              jobId: job.job_id,
            },
          },
        } satisfies OutputInit;
      }
      if (job.status === "failed" || job.status === "cancelled") {
        return { statusCode: 410, body: { case: "gone", value: { status: job.status, error: job.error ?? `job ${job.status}`, jobId: job.job_id } } } satisfies OutputInit;
      }
      const obj = resultObject(job);
      if (!obj) throw notFound("job has no output");
      // The interface's shape: the result object with the job's id and status (over members of the result's own
      // of those names). To check the output against a receipt, /output/result answers the stored result as hashed.
      return { statusCode: 200, body: { case: "result", value: { ...obj, job_id: job.job_id, status: job.status } as JsonObject } };
    },

    async getOutputFormat(req, ctx) {
      const format = checkEnum(req.format, OUTPUT_FORMATS, "format");
      if (format === "result") return storedResult(ctx, req.jobId);
      const { job, obj } = await completedOutput(ctx, req.jobId);
      if (format === "json") {
        return { contentType: "application/json; charset=utf-8", data: Buffer.from(JSON.stringify({ ...obj, job_id: job.job_id, status: job.status })) };
      }
      const image = imageBytes(obj);
      if (format === "png") {
        if (!image || !image.subarray(0, 8).equals(PNG_MAGIC)) throw notFound("this job has no PNG output");
        return { contentType: "image/png", data: image };
      }
      // raw: text as text, an image as its bytes, anything else as the JSON the daemon sent.
      const raw = job.result as JsonValue;
      if (typeof raw === "string") return { contentType: "text/plain; charset=utf-8", data: Buffer.from(raw) };
      if (typeof obj.response === "string") return { contentType: "text/plain; charset=utf-8", data: Buffer.from(obj.response) };
      if (image) {
        // The provider names the format: only a raster image type is served as one (an SVG is a document).
        const fmt = typeof obj.format === "string" ? obj.format : "png";
        return { contentType: rasterImageType(fmt) ?? "application/octet-stream", data: image };
      }
      return { contentType: "application/json; charset=utf-8", data: Buffer.from(JSON.stringify(raw)) };
    },

    async getLogs(req, ctx) {
      const { job, attempts: scope } = await attemptsForReader(sql, req.jobId, readerOf(ctx));
      // A provider's default is the latest attempt it held.
      const attempt = req.attempt ?? (scope === "all" ? job.attempt : scope[scope.length - 1]);
      if (!Number.isInteger(attempt) || attempt < 1) throw badRequest("attempt must be an integer >= 1");
      if (attempt > job.attempt) throw notFound(`attempt ${attempt} does not exist (the job has ${job.attempt})`);
      if (scope !== "all" && !scope.includes(attempt)) throw forbidden(`attempt ${attempt} ran on another provider; a provider reads only its own attempts' logs`);
      const lines = await jobLogs(sql, job.id, attempt);
      return {
        attempt,
        logs: lines.map((l) => ({ seq: BigInt(l.id), level: l.level, message: l.message, createdAt: iso(l.created_at)! })),
      };
    },

    async *watchJob(req, ctx) {
      const reader = readerOf(ctx);
      const cursor = parseCursor(req.cursor);
      const job = await jobForReader(sql, req.jobId, reader);
      yield* watchHub.watch(job.id, reader, cursor, ctx.signal);
    },

    async getHistory(req, ctx) {
      const { job, attempts: scope } = await attemptsForReader(sql, req.jobId, readerOf(ctx));
      const attempts = (await jobAttempts(sql, job.id)).filter((a) => scope === "all" || scope.includes(a.attempt));
      return {
        jobId: job.job_id,
        attempts: attempts.map(attemptMessage),
      };
    },

    async cancel(req, ctx) {
      const p = principalOf(ctx);
      const by = p.role === "renter" ? { role: "renter" as const, renterId: p.renterId } : { role: "admin" as const, ...auditActor(ctx) };
      const out = await cancelJob(sql, req.jobId, by, optionalText(req.reason, REASON_MAX_CHARS, "reason"));
      return { success: true, job: await jobView(sql, out.job, readerOf(ctx)), refundedHalala: BigInt(out.refunded), chargedHalala: BigInt(out.charged) };
    },

    async poll(_req, ctx) {
      const providerId = callerProviderId(ctx);
      const platformFault = (jobId: string, error: string) => deps.log.error({ jobId, providerId, fault: "platform" }, `job failed by the platform's fault: ${error}`);
      return { job: await pollJob(sql, config.hmacSecret, providerId, platformFault) };
    },

    async reportResult(req, ctx) {
      // Checked first (a bad one refuses the report before any work); kept only with the result it came with.
      const attestation = req.attestation ? await verifyAttestation(sql, callerProviderId(ctx), req.jobId, req.result, req.attestation) : undefined;
      const ack = await reportResult(sql, callerProviderId(ctx), {
        jobId: req.jobId,
        success: req.success,
        result: req.result,
        error: req.error,
        metrics: req.metrics,
        fault: req.fault,
        endReason: req.endReason,
        attempt: req.attempt,
        attestation,
      });
      logPlatformFault(deps, req.jobId, ack);
      return ack;
    },

    async appendLogs(req, ctx) {
      const { count, dropped } = await appendLogs(sql, callerProviderId(ctx), { jobId: req.jobId, logs: req.logs, attempt: req.attempt });
      return { success: true, jobId: req.jobId, count: BigInt(count), dropped: BigInt(dropped) };
    },

    async reportProgress(req, ctx) {
      await reportProgress(sql, callerProviderId(ctx), { jobId: req.jobId, progressPct: req.progressPct, phase: req.phase, attempt: req.attempt });
      return { success: true, jobId: req.jobId, count: 1n };
    },

    async reportPreparing(req, ctx) {
      await markJobPreparing(sql, callerProviderId(ctx), { jobId: req.jobId, attempt: req.attempt, detail: req.detail });
      return { success: true, jobId: req.jobId, count: 0n };
    },

    async endpointReady(req, ctx) {
      const { endpointUrl } = await endpointReady(sql, callerProviderId(ctx), {
        jobId: req.jobId,
        endpointUrl: req.endpointUrl,
        port: req.port,
        model: req.model,
        endpointApiKey: req.endpointApiKey,
        attempt: req.attempt,
      }, ctx.values.get(credentialsKey).clientIp);
      return { success: true, jobId: req.jobId, endpointUrl };
    },

    async complete(req, ctx) {
      const ack = await completeJob(sql, callerProviderId(ctx), req.jobId, req.body ?? {});
      logPlatformFault(deps, req.jobId, ack);
      return ack;
    },
  };
}
