// The task payload a daemon runs (task_spec), generated from the validated
// params of every job type, and the container spec it runs in. The spec is
// signed (task-signing.ts) and never changes after submit: a re-queued job
// runs the very same signed task on its next provider.
import { badRequest } from "../../errors.js";
import type { Db } from "../../db/index.js";
import { RATE_HALALA_PER_MINUTE, type JobType } from "../money/pricing.js";
import { checkImageReference, isBuiltinImage, isImageApproved } from "./registry.js";
import { DEFAULT_CONTAINERS, IMAGE_TYPES, type ImageType } from "./job-schemas.js";

/** How a job type is priced, named after its per-minute rate tier (pricing.ts holds the rates). */
export function pricingClassOf(jobType: JobType): string {
  const rate = RATE_HALALA_PER_MINUTE[jobType];
  return rate <= 10 ? "economy" : rate <= 15 ? "inference" : rate <= 20 ? "standard" : "premium";
}

/** What each job type hands back, so daemons know where to put the result. */
const OUTPUTS: Record<JobType, Record<string, string>> = {
  "llm-inference": { kind: "text", field: "response" },
  llm_inference: { kind: "text", field: "response" },
  vllm_serve: { kind: "endpoint", report: "endpoint-ready" },
  image_generation: { kind: "image", field: "data", format: "png", encoding: "base64" },
  training: { kind: "artifacts", field: "artifacts" },
  rendering: { kind: "files", field: "files" },
  benchmark: { kind: "json", field: "scores" },
  custom_container: { kind: "json" },
};

/**
 * Job types whose result is an image (base64 under `data`): a daemon's bare string result of one is
 * its image, answered as `{data}` (the spec: image results carry data, text results response).
 */
export const IMAGE_RESULT_JOB_TYPES: readonly string[] = Object.entries(OUTPUTS).filter(([, o]) => o.kind === "image").map(([t]) => t);

const CONTAINER_FIELDS = ["image", "image_type", "pricing_class"];

/** Whether a container_spec names an image; one that does not runs the job type's default (job-schemas.ts). */
export function namesImage(spec: Record<string, unknown> | undefined): boolean {
  return typeof spec?.image === "string" && spec.image.trim() !== "";
}

/**
 * Normalizes container_spec: `image_type` always present, the image always
 * explicit (the job type's default when none is named), `pricing_class`
 * added. A renter-chosen image must be a pinned reference on the approved
 * registry list; an image approved at a renter's request runs as
 * custom_container only. The other types run the platform's program in the
 * image (a model, a render, the serving engine), with the network it needs
 * and, for vllm_serve, a public port: a renter's own image there would get
 * them for its own entrypoint, so they take the built-in images only.
 */
export async function normalizeContainerSpec(db: Db, jobType: JobType, spec: Record<string, unknown> | undefined): Promise<Record<string, unknown>> {
  const given = spec ?? {};
  for (const k of Object.keys(given)) {
    if (!CONTAINER_FIELDS.includes(k)) throw badRequest(`container_spec.${k} is not supported (allowed: ${CONTAINER_FIELDS.join(", ")})`);
  }
  if (given.image !== undefined && typeof given.image !== "string") throw badRequest("container_spec.image must be a string");
  // Set by the service: a container_spec sent back as a job answered it (with its pricing_class) is taken,
  // one asking for another class is refused rather than silently priced otherwise.
  if (given.pricing_class !== undefined && given.pricing_class !== null && given.pricing_class !== pricingClassOf(jobType)) {
    throw badRequest(`container_spec.pricing_class is set by the service: ${jobType} jobs are priced as ${pricingClassOf(jobType)}`);
  }
  if (given.image_type !== undefined && (typeof given.image_type !== "string" || !IMAGE_TYPES.includes(given.image_type as ImageType))) {
    throw badRequest(`container_spec.image_type must be one of ${IMAGE_TYPES.join(", ")}`);
  }
  const fallback = DEFAULT_CONTAINERS[jobType];
  let image = fallback.image;
  if (namesImage(given)) {
    image = checkImageReference(given.image as string, "container_spec.image");
    if (jobType !== "custom_container" && !isBuiltinImage(image)) {
      throw badRequest(
        `container_spec.image ${image} is not one of the platform's built-in images, which ${jobType} jobs run on ` +
          "(GET /api/registry/images, source builtin); run an image of your own as a custom_container job",
      );
    }
    if (!(await isImageApproved(db, image))) {
      // 400, as for any other present and wrong value (the interface documents no 403 for submit).
      throw badRequest(`container_spec.image ${image} is not an approved image; only images on the registry's approved list can run`);
    }
  }
  const imageType = (given.image_type as ImageType | undefined) ?? fallback.image_type;
  return { image, image_type: imageType, pricing_class: pricingClassOf(jobType) };
}

export interface TaskSpecInput {
  jobId: string;
  jobType: JobType;
  params: Record<string, unknown>;
  containerSpec: Record<string, unknown>;
  gpuRequirements: Record<string, unknown> | null;
  maxDurationSeconds: number;
  workspaceVolumeName: string;
  checkpointEnabled: boolean;
  model: string | null;
}

/** The params the job's program reads: an image's negative seed (a new one each run) is left out, so the engine draws one. */
function inputsOf(jobType: JobType, params: Record<string, unknown>): Record<string, unknown> {
  if (jobType !== "image_generation" || typeof params.seed !== "number" || params.seed >= 0) return params;
  const { seed: _, ...rest } = params;
  return rest;
}

/** The signed payload: what to run (image, command or model), its inputs and its limits. */
export function buildTaskSpec(t: TaskSpecInput): Record<string, unknown> {
  const spec: Record<string, unknown> = {
    version: 1,
    job_id: t.jobId,
    job_type: t.jobType,
    container: { image: t.containerSpec.image, image_type: t.containerSpec.image_type },
    inputs: inputsOf(t.jobType, t.params),
    output: OUTPUTS[t.jobType],
    limits: { max_duration_seconds: t.maxDurationSeconds, gpu_requirements: t.gpuRequirements },
    workspace: { volume: t.workspaceVolumeName, mount_path: "/workspace", checkpoint_enabled: t.checkpointEnabled },
  };
  if (t.model) spec.model = t.model;
  if (t.jobType === "custom_container") {
    if (t.params.command) spec.command = t.params.command;
    if (t.params.env) spec.env = t.params.env;
  }
  if (t.jobType === "vllm_serve") spec.serve = { api: "openai", container_port: 8000 };
  return spec;
}

/** The model a job runs, echoed in the submission (model-bearing types only). */
export function modelOf(jobType: JobType, params: Record<string, unknown>): string | null {
  if (typeof params.model === "string") return params.model;
  if (jobType === "training" && typeof params.base_model === "string") return params.base_model;
  return null;
}

export const workspaceVolumeName = (jobId: string) => `svc-ws-${jobId}`;
