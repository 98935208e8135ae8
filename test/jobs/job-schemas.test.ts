// The params validator shared by submit and templates: documented bounds,
// allowed models, defaults for absent fields, 400 naming the field.
import { describe, expect, it } from "vitest";
import { Ajv } from "ajv";
import { JOB_TYPES } from "../../src/domain/money/pricing.js";
import { IMAGE_MODELS, LLM_MODELS, PARAMS_SCHEMAS, validateParams } from "../../src/domain/jobs/job-schemas.js";

const err = (type: string, params: unknown) => {
  try {
    validateParams(type, params);
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

  it("allows only the listed models and fills defaults", () => {
    expect(validateParams("image_generation", { prompt: "p" })).toMatchObject({ model: IMAGE_MODELS[0], steps: 30 });
    expect(validateParams("llm-inference", { prompt: "p" }).model).toBe(LLM_MODELS[2]);
    expect(err("image_generation", { prompt: "p", model: LLM_MODELS[0] })).toMatch(/^params\.model must be one of /);
    expect(err("vllm_serve", { model: "evil/model" })).toMatch(/^params\.model must be one of /);
  });

  it("names missing, unknown and malformed fields", () => {
    expect(err("image_generation", {})).toBe("params.prompt is required for image_generation");
    expect(err("image_generation", { prompt: "p", stpes: 3 })).toBe("params.stpes is not a parameter of image_generation");
    expect(err("training", { base_model: LLM_MODELS[0], dataset_url: "ftp://x" })).toBe("params.dataset_url must be an http(s) URL");
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
