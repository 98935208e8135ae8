// Compute templates: ready-made job setups, one per kind of work. A template's
// params_schema IS the schema submit validates `params` with (job-schemas.ts),
// its image is its job type's default image (the one the daemons' program for
// the type runs in), which a submit's container_spec.image may replace under
// the rules of any job of the type, and its resource_requirements become the
// job's gpu_requirements at submit.
import type { JsonObject, MessageInitShape } from "@bufbuild/protobuf";
import type { TemplateSchema } from "../../../gen/svc/v1/models_pb.js";
import { notFound } from "../../errors.js";
import { DEFAULT_CONTAINERS, PARAMS_SCHEMAS } from "./job-schemas.js";
import type { JobType } from "../money/pricing.js";

export interface TemplateDef {
  id: string;
  name: string;
  description: string;
  jobType: JobType;
  tags: string[];
  sortOrder: number;
  minVramGb: number;
  gpuRequired: boolean;
}

/** The built-in set. */
export const TEMPLATES: readonly TemplateDef[] = [
  {
    id: "llm-inference",
    name: "LLM inference",
    description: "Run a prompt through an open LLM (Llama 3.1, Mistral, Qwen 2.5, Gemma 2, ALLaM...) and get the completion.",
    jobType: "llm-inference",
    tags: ["llm", "text", "inference"],
    sortOrder: 10,
    minVramGb: 16,
    gpuRequired: true,
  },
  {
    id: "image-generation",
    name: "Image generation",
    description: "Generate an image from a text prompt with Stable Diffusion XL, SDXL Turbo, SD 1.5 or FLUX.1 schnell.",
    jobType: "image_generation",
    tags: ["image", "diffusion", "inference"],
    sortOrder: 20,
    minVramGb: 12,
    gpuRequired: true,
  },
  {
    id: "vllm-serve",
    name: "vLLM serving",
    description: "A managed vLLM server with an OpenAI-compatible endpoint, billed per minute while it runs.",
    jobType: "vllm_serve",
    tags: ["llm", "serving", "openai"],
    sortOrder: 30,
    minVramGb: 16,
    gpuRequired: true,
  },
  {
    id: "fine-tuning",
    name: "Fine-tuning (LoRA)",
    description: "Fine-tune an open model on your dataset with LoRA, QLoRA or full training.",
    jobType: "training",
    tags: ["training", "llm", "lora"],
    sortOrder: 40,
    minVramGb: 24,
    gpuRequired: true,
  },
  {
    id: "blender-render",
    name: "Blender rendering",
    description: "Render frames of a .blend scene with Cycles or Eevee on the GPU.",
    jobType: "rendering",
    tags: ["rendering", "3d", "blender"],
    sortOrder: 50,
    minVramGb: 8,
    gpuRequired: true,
  },
  {
    id: "gpu-benchmark",
    name: "GPU benchmark",
    description: "Measure a GPU: matrix multiply, memory bandwidth, LLM and image throughput.",
    jobType: "benchmark",
    tags: ["benchmark", "diagnostics"],
    sortOrder: 60,
    minVramGb: 4,
    gpuRequired: true,
  },
];

const BY_ID = new Map(TEMPLATES.map((t) => [t.id, t]));

export function templateById(id: string): TemplateDef {
  const t = BY_ID.get(id);
  if (!t) throw notFound(`template not found: ${id.slice(0, 100)}`);
  return t;
}

/** Other spellings of a job type that templates name one way (job_type accepts both llm-inference and llm_inference). */
const TEMPLATE_JOB_TYPE = new Map<string, JobType>([["llm_inference", "llm-inference"]]);

/** Whether a job of type `jobType` (either spelling) is the kind of work template `t` sets up: the list's filter and submit's check. */
export function templateRuns(t: TemplateDef, jobType: string): boolean {
  return t.jobType === (TEMPLATE_JOB_TYPE.get(jobType) ?? jobType);
}

export function listTemplates(f: { tag?: string; jobType?: string } = {}): TemplateDef[] {
  return TEMPLATES.filter((t) => (!f.tag || t.tags.includes(f.tag)) && (!f.jobType || templateRuns(t, f.jobType))).sort(
    (a, b) => a.sortOrder - b.sortOrder,
  );
}

/**
 * The gpu_requirements a job from this template needs, merged with what the
 * renter asked for: the larger min_vram_gb wins, other members are kept.
 * Answers null when neither side asks for anything (no GPU requirement).
 */
export function templateGpuRequirements(t: TemplateDef, requested?: Record<string, unknown> | null): Record<string, unknown> | null {
  const out: Record<string, unknown> = { ...(requested ?? {}) };
  if (t.gpuRequired) {
    const asked = typeof out.min_vram_gb === "number" && Number.isFinite(out.min_vram_gb) ? out.min_vram_gb : 0;
    out.min_vram_gb = Math.max(asked, t.minVramGb);
  }
  return Object.keys(out).length > 0 ? out : null;
}

export function templateMessage(t: TemplateDef): MessageInitShape<typeof TemplateSchema> {
  return {
    id: t.id,
    name: t.name,
    description: t.description,
    image: DEFAULT_CONTAINERS[t.jobType].image,
    tags: [...t.tags],
    sortOrder: t.sortOrder,
    paramsSchema: PARAMS_SCHEMAS[t.jobType] as JsonObject,
    resourceRequirements: { minVramGb: t.minVramGb, gpuRequired: t.gpuRequired },
    jobType: t.jobType,
  };
}
