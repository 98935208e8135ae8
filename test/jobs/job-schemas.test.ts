// The params validator shared by submit and templates: documented bounds,
// allowed models, defaults for absent fields (every field has one or is
// optional), 400 naming the field.
import { describe, expect, it } from "vitest";
import { Ajv } from "ajv";
import { JOB_TYPES } from "../../src/domain/money/pricing.js";
import {
  BUILTIN_DATASETS, BUILTIN_SCENES, DEFAULT_CONTAINERS, DEFAULT_CUSTOM_COMMAND, DEFAULT_IMAGE_PROMPT, DEFAULT_LLM_PROMPT, DEFAULT_TRAINING_BASE_MODEL,
  IMAGE_MODELS, LLM_MODELS, PARAMS_SCHEMAS, validateParams,
} from "../../src/domain/jobs/job-schemas.js";
import { BUILTIN_IMAGES } from "../../src/domain/jobs/registry.js";
import { buildTaskSpec } from "../../src/domain/jobs/task-spec.js";

const err = (type: string, params: unknown, opts?: { defaultImage?: boolean }) => {
  try {
    validateParams(type, params, opts);
  } catch (e) {
    return (e as Error).message;
  }
  return "no error";
};

describe("job params schemas", () => {
  it("has a valid draft-07 schema for every priced job type", () => {
    expect(Object.keys(PARAMS_SCHEMAS).sort()).toEqual([...JOB_TYPES].sort());
    const plain = new Ajv({ strict: false });
    for (const t of JOB_TYPES) expect(plain.validateSchema(PARAMS_SCHEMAS[t])).toBe(true);
  });

  it("enforces the documented bounds at both edges, without clamping", () => {
    for (const [field, lo, hi] of [["steps", 5, 100], ["width", 256, 1024], ["height", 256, 1024]] as const) {
      expect(validateParams("image_generation", { prompt: "p", [field]: lo })[field]).toBe(lo);
      expect(validateParams("image_generation", { prompt: "p", [field]: hi })[field]).toBe(hi);
      expect(err("image_generation", { prompt: "p", [field]: lo - 1 })).toBe(`params.${field} must be an integer between ${lo} and ${hi}`);
      expect(err("image_generation", { prompt: "p", [field]: hi + 1 })).toBe(`params.${field} must be an integer between ${lo} and ${hi}`);
    }
    for (const t of ["llm-inference", "llm_inference"]) {
      expect(validateParams(t, { prompt: "p", max_tokens: 32, temperature: 0.1 })).toMatchObject({ max_tokens: 32, temperature: 0.1 });
      expect(validateParams(t, { prompt: "p", max_tokens: 4096, temperature: 2.0 })).toMatchObject({ max_tokens: 4096, temperature: 2 });
      expect(err(t, { prompt: "p", max_tokens: 4097 })).toBe("params.max_tokens must be an integer between 32 and 4096");
      expect(err(t, { prompt: "p", temperature: 0.09 })).toBe("params.temperature must be a number between 0.1 and 2");
      expect(err(t, { prompt: "p", max_tokens: 100.5 })).toMatch(/^params\.max_tokens/);
      expect(err(t, { prompt: "p", temperature: "1" })).toMatch(/^params\.temperature/);
    }
  });

  it("takes any integer seed the spec's clients send; a negative one (\"random\") is left out of the task so the engine draws one", () => {
    for (const seed of [-1, 0, 4_294_967_296, Number.MAX_SAFE_INTEGER, -Number.MAX_SAFE_INTEGER]) {
      expect(validateParams("image_generation", { seed })).toMatchObject({ seed });
    }
    expect(err("image_generation", { seed: 1.5 })).toMatch(/params\.seed/);
    expect(err("image_generation", { seed: 2 ** 60 })).toMatch(/params\.seed/);
    const spec = (seed: number) =>
      buildTaskSpec({
        jobId: "job-seed", jobType: "image_generation", params: validateParams("image_generation", { seed }), containerSpec: {},
        gpuRequirements: null, maxDurationSeconds: 60, workspaceVolumeName: "v", checkpointEnabled: false, model: null,
      }).inputs as Record<string, unknown>;
    expect(spec(-1)).not.toHaveProperty("seed");
    expect(spec(4_294_967_296).seed).toBe(4_294_967_296);
    expect(spec(7).seed).toBe(7);
  });

  it("allows only the listed models and fills defaults", () => {
    expect(validateParams("image_generation", { prompt: "p" })).toMatchObject({ model: IMAGE_MODELS[0], steps: 30 });
    expect(validateParams("llm-inference", { prompt: "p" }).model).toBe(LLM_MODELS[2]);
    expect(err("image_generation", { prompt: "p", model: LLM_MODELS[0] })).toMatch(/^params\.model must be one of /);
    expect(err("vllm_serve", { model: "evil/model" })).toMatch(/^params\.model must be one of /);
  });

  it("needs no field: every job type runs from no params at all, on its documented defaults", () => {
    for (const t of JOB_TYPES) expect(validateParams(t, undefined)).toEqual(validateParams(t, {}));
    expect(validateParams("image_generation", undefined)).toMatchObject({ prompt: DEFAULT_IMAGE_PROMPT, model: IMAGE_MODELS[0] });
    for (const t of ["llm-inference", "llm_inference"]) {
      expect(validateParams(t, undefined)).toEqual({ prompt: DEFAULT_LLM_PROMPT, max_tokens: 512, temperature: 0.7, model: LLM_MODELS[2] });
    }
    expect(validateParams("training", undefined)).toEqual({
      base_model: DEFAULT_TRAINING_BASE_MODEL, dataset_url: BUILTIN_DATASETS[0], method: "lora", epochs: 3, batch_size: 8, learning_rate: 0.0002,
    });
    expect(validateParams("rendering", null)).toMatchObject({ scene_url: BUILTIN_SCENES[0], engine: "cycles", frame_start: 1, frame_end: 1 });
    // custom_container: the smoke check only on the platform's image; a renter's own image keeps its own CMD.
    expect(validateParams("custom_container", undefined, { defaultImage: true })).toEqual({ command: DEFAULT_CUSTOM_COMMAND });
    expect(validateParams("custom_container", { command: ["python3", "x.py"] }, { defaultImage: true })).toEqual({ command: ["python3", "x.py"] });
    expect(validateParams("custom_container", undefined)).toEqual({});
    // A given value is kept, and a built-in input is accepted where a URL is.
    expect(validateParams("training", { dataset_url: "https://d.example.com/x.txt" }).dataset_url).toBe("https://d.example.com/x.txt");
    expect(validateParams("rendering", { scene_url: "builtin:benchmark-scene" }).scene_url).toBe("builtin:benchmark-scene");
  });

  it("documents the defaults in the job defaults table (docs/jobs.md)", async () => {
    const { readFileSync } = await import("node:fs");
    const doc = readFileSync(new URL("../../docs/jobs.md", import.meta.url), "utf8");
    const table = doc.slice(doc.indexOf("## Job defaults"), doc.indexOf("## Live job events"));
    for (const v of [
      DEFAULT_LLM_PROMPT, DEFAULT_IMAGE_PROMPT, LLM_MODELS[2], IMAGE_MODELS[0], DEFAULT_TRAINING_BASE_MODEL, ...BUILTIN_DATASETS, ...BUILTIN_SCENES,
      DEFAULT_CONTAINERS.custom_container.image, DEFAULT_CUSTOM_COMMAND.join(" "),
    ]) {
      expect(table).toContain(v);
    }
    expect(BUILTIN_IMAGES.map((b) => b.image)).toEqual(expect.arrayContaining(Object.values(DEFAULT_CONTAINERS).map((c) => c.image)));
  });

  it("refuses input URLs the provider's machine would fetch from its own network: loopback, private, link-local, internal names", () => {
    for (const url of [
      "http://127.0.0.1:8080/d.txt",
      "http://localhost/d.txt",
      "http://169.254.169.254/latest/meta-data/",
      "http://172.17.0.1:2375/containers/json",
      "https://192.168.1.10/share/d.txt",
      "http://10.0.0.5/d.txt",
      "http://[::1]/d.txt",
      "http://[::ffff:127.0.0.1]/d.txt",
      "http://nas.local/d.txt",
      "http://metadata.google.internal/computeMetadata/v1/",
      "http://intranet/d.txt",
    ]) {
      expect(err("training", { dataset_url: url }), url).toMatch(/^params\.dataset_url: .+ is not a public host; the provider's machine fetches it/);
      expect(err("rendering", { scene_url: url }), url).toMatch(/^params\.scene_url: .+ is not a public host/);
    }
    expect(validateParams("rendering", { scene_url: "https://assets.example.com/s.blend" }).scene_url).toBe("https://assets.example.com/s.blend");
    expect(validateParams("training", { dataset_url: "http://93.184.216.34/d.txt" }).dataset_url).toBe("http://93.184.216.34/d.txt");
  });

  it("names unknown and malformed fields", () => {
    expect(err("image_generation", { prompt: "" })).toBe("params.prompt must NOT have fewer than 1 characters");
    expect(err("llm-inference", { prompt: null })).toBe("params.prompt must be of type string");
    expect(err("training", { base_model: "nope/model" })).toMatch(/^params\.base_model must be one of /);
    expect(err("training", { dataset_url: "builtin:huge" })).toBe("params.dataset_url must be an http(s) URL or builtin:tiny-instruct");
    expect(err("rendering", { scene_url: "file:///etc/passwd" })).toBe("params.scene_url must be an http(s) URL or builtin:benchmark-scene");
    expect(err("custom_container", { command: [] })).toMatch(/^params\.command /);
    expect(err("custom_container", { command: "nvidia-smi" }, { defaultImage: true })).toBe("params.command must be of type array");
    expect(err("image_generation", { prompt: "p", stpes: 3 })).toBe("params.stpes is not a parameter of image_generation");
    expect(err("training", { base_model: LLM_MODELS[0], dataset_url: "ftp://x" })).toBe("params.dataset_url must be an http(s) URL or builtin:tiny-instruct");
    expect(err("custom_container", { env: { "1A": "x" } })).toBe("params.env has an invalid name '1A'");
    expect(err("benchmark", [1])).toBe("params must be an object");
    expect(err("quantum", {})).toMatch(/^job_type must be one of/);
    expect(validateParams("benchmark", undefined)).toEqual({ suite: "quick", iterations: 10 });
  });

  it("does not change the caller's object", () => {
    const p = { prompt: "p" };
    validateParams("image_generation", p);
    expect(p).toEqual({ prompt: "p" });
  });
});
