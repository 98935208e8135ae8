// The `params` of every job type as a JSON Schema, and the one validator
// that checks them. Submit and compute templates (`params_schema`) both use
// these: a bound, an allowed model or a default is written here and nowhere
// else. Bounds are enforced, never clamped; defaults fill only absent fields.
// `params` is optional for every job type (interface spec), so every field a
// job needs to run has a default: the minimal body runs a small, documented
// job (docs/jobs.md "Job defaults"), and the task spec carries the filled-in values.
import { Ajv, type ErrorObject, type ValidateFunction } from "ajv";
import { badRequest } from "../../errors.js";
import type { JobType } from "../money/pricing.js";
import { RESERVED_ENV_NAMES, RESERVED_ENV_PREFIX } from "../../shared/gpu-env.js";
import { isPrivateHost } from "../shared/address.js";

/** Image models a provider daemon may be asked to load for image_generation. */
export const IMAGE_MODELS = [
  "stabilityai/stable-diffusion-xl-base-1.0",
  "stabilityai/sdxl-turbo",
  "stable-diffusion-v1-5/stable-diffusion-v1-5",
  "black-forest-labs/FLUX.1-schnell",
] as const;

/** LLMs for llm-inference / llm_inference and managed vllm_serve. */
export const LLM_MODELS = [
  "meta-llama/Llama-3.1-8B-Instruct",
  "mistralai/Mistral-7B-Instruct-v0.3",
  "Qwen/Qwen2.5-7B-Instruct",
  "google/gemma-2-9b-it",
  "microsoft/Phi-3-mini-4k-instruct",
  "humain-ai/ALLaM-7B-Instruct-preview",
  "TinyLlama/TinyLlama-1.1B-Chat-v1.0",
] as const;

/** Base models that training jobs may fine-tune. */
export const TRAINING_BASE_MODELS = [...LLM_MODELS, "stabilityai/stable-diffusion-xl-base-1.0"] as const;

export const DEFAULT_IMAGE_MODEL = IMAGE_MODELS[0];
export const DEFAULT_LLM_MODEL = LLM_MODELS[2];
/** The smallest listed LLM: what training fine-tunes when no base_model is given. */
export const DEFAULT_TRAINING_BASE_MODEL = "TinyLlama/TinyLlama-1.1B-Chat-v1.0";
export const DEFAULT_IMAGE_PROMPT = "a lighthouse on a rocky coast at sunset, photograph";
export const DEFAULT_LLM_PROMPT = "Introduce yourself in one sentence.";

/**
 * Inputs the container programs build themselves, no download: the training
 * data (question/answer lines generated in the container, train.py) and the
 * benchmark scene (built procedurally in Blender, render.py).
 */
export const BUILTIN_DATASETS = ["builtin:tiny-instruct"] as const;
export const BUILTIN_SCENES = ["builtin:benchmark-scene"] as const;

export const IMAGE_TYPES = ["llm", "vllm", "diffusion", "training", "render", "benchmark", "custom"] as const;
export type ImageType = (typeof IMAGE_TYPES)[number];

/**
 * The image each job type runs in when container_spec names none (all on
 * the registry's built-in list, so approved by default). custom_container's
 * is the platform's CUDA base image, which then runs DEFAULT_CUSTOM_COMMAND
 * unless params.command is given.
 */
export const DEFAULT_CONTAINERS: Record<JobType, { image_type: ImageType; image: string }> = {
  "llm-inference": { image_type: "llm", image: "huggingface/transformers-pytorch-gpu:4.41.3" },
  llm_inference: { image_type: "llm", image: "huggingface/transformers-pytorch-gpu:4.41.3" },
  vllm_serve: { image_type: "vllm", image: "vllm/vllm-openai:v0.6.3" },
  image_generation: { image_type: "diffusion", image: "pytorch/pytorch:2.4.1-cuda12.1-cudnn9-runtime" },
  training: { image_type: "training", image: "pytorch/pytorch:2.4.1-cuda12.1-cudnn9-runtime" },
  rendering: { image_type: "render", image: "linuxserver/blender:4.2.3" },
  benchmark: { image_type: "benchmark", image: "nvidia/cuda:12.4.1-runtime-ubuntu22.04" },
  custom_container: { image_type: "custom", image: "nvidia/cuda:12.4.1-runtime-ubuntu22.04" },
};

/**
 * Refuses an image that cannot start a job type's program (400 naming container_spec.image).
 * The daemons start vllm_serve by handing the model's arguments to its image's entrypoint, vLLM's
 * API server, and the other built-in types as `python /svc-scripts/<program>` through the image's
 * entrypoint (docker.ts dockerRunArgs, svc_daemon.py): vLLM's image would start its server with
 * that command as its arguments. So vLLM's image runs vllm_serve (and custom_container, whose
 * command is its own) only, and vllm_serve runs in it only.
 */
export function checkImageRunsJobType(jobType: JobType, image: string): void {
  if (jobType === "custom_container" || (jobType === "vllm_serve") === VLLM_IMAGE.test(image)) return;
  if (jobType === "vllm_serve") {
    throw badRequest(`container_spec.image ${image}: vllm_serve jobs run in vLLM's image (vllm/vllm-openai) only, whose entrypoint (vLLM's API server) takes the job's model`);
  }
  throw badRequest(
    `container_spec.image ${image} starts vLLM's API server whatever it is given (its entrypoint), so it runs vllm_serve jobs only; ` +
      `leave container_spec.image out to run ${jobType} in ${DEFAULT_CONTAINERS[jobType].image}`,
  );
}

/** vLLM's image, any tag or digest (Docker Hub's name with or without its registry). */
const VLLM_IMAGE = /^(docker\.io\/)?vllm\/vllm-openai(:[\w][\w.-]*)?(@sha256:[0-9a-f]{64})?$/;

/** A GPU smoke check: lists the GPUs the container sees (fails when it sees none). */
export const DEFAULT_CUSTOM_COMMAND = ["nvidia-smi"];

export const BENCHMARK_SUITES = ["quick", "matmul", "memory", "llm", "image", "full"] as const;
export const RENDER_ENGINES = ["cycles", "eevee"] as const;

type Schema = Record<string, unknown>;

const text = (maxLength: number, description: string): Schema => ({ type: "string", minLength: 1, maxLength, description });
const int = (minimum: number, maximum: number, description: string, def?: number): Schema => ({
  type: "integer",
  minimum,
  maximum,
  description,
  ...(def === undefined ? {} : { default: def }),
});
/**
 * An http(s) URL or one of the built-in inputs (plain names: no regex metacharacters), the first
 * being the default. The provider's machine fetches the URL (x-input-url): its host must be public.
 */
const source = (builtins: readonly string[], description: string): Schema => ({
  type: "string",
  pattern: `^(?:https?://\\S+|${builtins.join("|")})$`,
  maxLength: 2048,
  default: builtins[0],
  description,
  "x-error": `must be an http(s) URL or ${builtins.join(", ")}`,
  "x-input-url": true,
});

const envMap: Schema = {
  type: "object",
  propertyNames: {
    pattern: "^[A-Za-z_][A-Za-z0-9_]{0,127}$",
    not: { anyOf: [{ enum: [...RESERVED_ENV_NAMES] }, { pattern: `^${RESERVED_ENV_PREFIX}` }] },
  },
  additionalProperties: { type: "string", maxLength: 4096 },
  maxProperties: 64,
};

// No field is required: `params` itself is optional, so each needed field has a default.
function objectSchema(title: string, properties: Record<string, Schema>): Schema {
  return { $schema: "http://json-schema.org/draft-07/schema#", title, type: "object", properties, additionalProperties: false };
}

const llmParams = (title: string) =>
  objectSchema(
    title,
    {
      prompt: { ...text(100_000, "The prompt text"), default: DEFAULT_LLM_PROMPT },
      system: { type: "string", maxLength: 20_000, description: "Optional system prompt" },
      max_tokens: int(32, 4096, "Most tokens to generate", 512),
      temperature: { type: "number", minimum: 0.1, maximum: 2.0, default: 0.7, description: "Sampling temperature" },
      top_p: { type: "number", exclusiveMinimum: 0, maximum: 1, description: "Nucleus sampling" },
      model: { type: "string", enum: [...LLM_MODELS], default: DEFAULT_LLM_MODEL, description: "Allowed LLM" },
    },
  );

/** JSON Schema of `params` per job type (draft-07). */
export const PARAMS_SCHEMAS: Record<JobType, Schema> = {
  image_generation: objectSchema(
    "image_generation params",
    {
      prompt: { ...text(4000, "What to draw"), default: DEFAULT_IMAGE_PROMPT },
      negative_prompt: { type: "string", maxLength: 4000, description: "What to avoid" },
      steps: int(5, 100, "Denoising steps", 30),
      width: int(256, 1024, "Image width in pixels", 1024),
      height: int(256, 1024, "Image height in pixels", 1024),
      // Any integer the spec's clients send: a negative one (-1, the usual "random") asks for a new
      // seed each run (task-spec.ts leaves it out of the task), a large one is taken as it is.
      seed: int(-Number.MAX_SAFE_INTEGER, Number.MAX_SAFE_INTEGER, "Random seed (same seed, same image); negative: a new one each run"),
      guidance_scale: { type: "number", minimum: 0, maximum: 30, description: "Classifier-free guidance" },
      model: { type: "string", enum: [...IMAGE_MODELS], default: DEFAULT_IMAGE_MODEL, description: "Allowed image model" },
    },
  ),
  "llm-inference": llmParams("llm-inference params"),
  llm_inference: llmParams("llm_inference params"),
  vllm_serve: objectSchema(
    "vllm_serve params",
    {
      model: { type: "string", enum: [...LLM_MODELS], default: DEFAULT_LLM_MODEL, description: "Model to serve" },
      max_model_len: int(256, 131_072, "Context length the server accepts", 8192),
      dtype: { type: "string", enum: ["auto", "float16", "bfloat16"], default: "auto" },
      gpu_memory_utilization: { type: "number", minimum: 0.1, maximum: 0.95, default: 0.9 },
      public: {
        type: "boolean",
        default: false,
        description:
          "Serve every renter's /v1 requests for the model (billed to them per token, 75% to the provider); " +
          "for the platform's managed-endpoint accounts (SVC_V1_MANAGED_RENTERS) only. " +
          "Otherwise the endpoint serves this renter's own /v1 requests only, with no token charge: the job pays for the GPU by the minute",
      },
    },
  ),
  training: objectSchema(
    "training params",
    {
      base_model: { type: "string", enum: [...TRAINING_BASE_MODELS], default: DEFAULT_TRAINING_BASE_MODEL, description: "Model to fine-tune" },
      dataset_url: source(BUILTIN_DATASETS, "HTTP(S) URL of the training data (text lines), or a built-in dataset"),
      method: { type: "string", enum: ["lora", "qlora", "full"], default: "lora" },
      epochs: int(1, 100, "Passes over the data", 3),
      batch_size: int(1, 512, "Examples per step", 8),
      learning_rate: { type: "number", exclusiveMinimum: 0, maximum: 1, default: 0.0002 },
      max_steps: int(1, 1_000_000, "Stop after this many steps"),
      output_name: { type: "string", pattern: "^[A-Za-z0-9._-]{1,128}$", "x-error": "must be 1-128 letters, digits, '.', '_' or '-'" },
    },
  ),
  rendering: objectSchema(
    "rendering params",
    {
      scene_url: source(BUILTIN_SCENES, "HTTP(S) URL of the .blend scene, or the built-in benchmark scene"),
      engine: { type: "string", enum: [...RENDER_ENGINES], default: "cycles" },
      frame_start: int(0, 1_000_000, "First frame", 1),
      frame_end: int(0, 1_000_000, "Last frame", 1),
      samples: int(1, 16_384, "Samples per pixel", 128),
      resolution_x: int(16, 8192, "Output width", 1920),
      resolution_y: int(16, 8192, "Output height", 1080),
      output_format: { type: "string", enum: ["PNG", "JPEG", "OPEN_EXR"], default: "PNG" },
    },
  ),
  benchmark: objectSchema(
    "benchmark params",
    {
      suite: { type: "string", enum: [...BENCHMARK_SUITES], default: "quick" },
      iterations: int(1, 1000, "Repetitions per test", 10),
    },
  ),
  custom_container: objectSchema(
    "custom_container params",
    {
      command: { type: "array", items: { type: "string", maxLength: 4096 }, minItems: 1, maxItems: 256, description: "Entrypoint and arguments" },
      env: { ...envMap, description: "Environment variables" },
      workdir: { type: "string", pattern: "^/\\S*$", maxLength: 1024, "x-error": "must be an absolute path" },
      expose_port: int(1, 65535, "Container port to publish on a port of the provider's host (every interface, no access control of the platform's); its URL is the job's endpoint_url once it answers"),
    },
  ),
};

/**
 * custom_container params when container_spec names no image: the platform's
 * CUDA base image then runs the GPU smoke check unless a command is given. A
 * renter's own image keeps the plain schema, so an absent command runs that
 * image's own CMD, as it always has.
 */
export const DEFAULT_IMAGE_CUSTOM_PARAMS_SCHEMA: Schema = (() => {
  const base = PARAMS_SCHEMAS.custom_container;
  const props = base.properties as Record<string, Schema>;
  return {
    ...base,
    title: "custom_container params (default image)",
    properties: { ...props, command: { ...props.command, default: DEFAULT_CUSTOM_COMMAND } },
  };
})();

const ajv = new Ajv({ allErrors: false, useDefaults: true, strict: true, strictRequired: false });
// Our own annotation: the plain-words message for a pattern mismatch.
ajv.addKeyword({ keyword: "x-error", schemaType: "string" });
ajv.addKeyword({ keyword: "x-input-url", schemaType: "boolean" });
const validators = new Map<string, ValidateFunction>(
  Object.entries(PARAMS_SCHEMAS).map(([type, schema]) => [type, ajv.compile(schema)]),
);
const defaultImageCustomValidator = ajv.compile(DEFAULT_IMAGE_CUSTOM_PARAMS_SCHEMA);

function typeWord(s: Schema): string {
  return s.type === "integer" ? "an integer" : s.type === "number" ? "a number" : s.type === "string" ? "a string" : s.type === "array" ? "an array" : s.type === "object" ? "an object" : "a value";
}

/** One 400 message naming the field (`params.steps ...`). */
function describe(jobType: string, schema: Schema, err: ErrorObject): string {
  const path = err.instancePath.split("/").filter(Boolean).join(".");
  const field = path ? `params.${path}` : "params";
  const top = err.instancePath.split("/").filter(Boolean)[0];
  const prop = top ? ((schema.properties as Record<string, Schema>)[top] ?? {}) : {};
  switch (err.keyword) {
    case "additionalProperties":
      return `params.${path ? path + "." : ""}${(err.params as { additionalProperty: string }).additionalProperty} is not a parameter of ${jobType}`;
    case "not":
      // The only `not` is env's reserved names.
      if (err.propertyName !== undefined) {
        return `${field}.${err.propertyName} is reserved: the provider's daemon decides which GPU a job sees and what the GPU runtime gives it (CUDA_VISIBLE_DEVICES and every ${RESERVED_ENV_PREFIX}* name)`;
      }
      return `${field} ${err.message}`;
    case "propertyNames":
      return `${field} has an invalid name '${(err.params as { propertyName: string }).propertyName}'`;
    case "pattern":
      if (err.propertyName !== undefined) return `${field} has an invalid name '${err.propertyName}'`;
      if (path === top && typeof prop["x-error"] === "string") return `${field} ${prop["x-error"]}`;
      return `${field} ${err.message}`;
    case "enum":
      return `${field} must be one of ${(err.params as { allowedValues: unknown[] }).allowedValues.join(", ")}`;
    case "minimum":
    case "maximum":
    case "exclusiveMinimum":
    case "type":
      if (path === top && typeof prop.minimum === "number" && typeof prop.maximum === "number") {
        return `${field} must be ${typeWord(prop)} between ${prop.minimum} and ${prop.maximum}`;
      }
      return err.keyword === "type" ? `${field} must be of type ${(err.params as { type: string }).type}` : `${field} ${err.message}`;
    default:
      return `${field} ${err.message}`;
  }
}

/**
 * Validates `params` of a job type; answers a copy with defaults filled in.
 * `defaultImage`: container_spec names no image (custom_container's command
 * default depends on it). Throws 400 naming the first offending field.
 */
export function validateParams(jobType: string, params: unknown, opts: { defaultImage?: boolean } = {}): Record<string, unknown> {
  const defaultImageCustom = jobType === "custom_container" && opts.defaultImage === true;
  const validate = defaultImageCustom ? defaultImageCustomValidator : validators.get(jobType);
  if (!validate) throw badRequest(`job_type must be one of ${Object.keys(PARAMS_SCHEMAS).join(", ")}`);
  const copy = params === undefined || params === null ? {} : structuredClone(params);
  if (typeof copy !== "object" || Array.isArray(copy)) throw badRequest("params must be an object");
  if (!validate(copy)) throw badRequest(describe(jobType, PARAMS_SCHEMAS[jobType as JobType], validate.errors![0]));
  refusePrivateInputs(PARAMS_SCHEMAS[jobType as JobType], copy as Record<string, unknown>);
  return copy as Record<string, unknown>;
}

/**
 * Input URLs (x-input-url) are fetched by the provider's machine, inside its network: one naming a
 * loopback, private, link-local (cloud metadata) or internal host would reach the provider's own
 * services. Names are judged as written (src/domain/shared/address.ts isPrivateHost).
 */
function refusePrivateInputs(schema: Schema, params: Record<string, unknown>): void {
  for (const [name, prop] of Object.entries((schema.properties ?? {}) as Record<string, Schema>)) {
    const value = params[name];
    if (prop["x-input-url"] !== true || typeof value !== "string" || !/^https?:/i.test(value)) continue;
    let host: string;
    try {
      host = new URL(value).hostname;
    } catch {
      throw badRequest(`params.${name} is not a valid URL`);
    }
    if (isPrivateHost(host)) {
      throw badRequest(`params.${name}: ${host} is not a public host; the provider's machine fetches it, so only public hosts are taken`);
    }
  }
}
