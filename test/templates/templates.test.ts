// GET /api/templates: the built-in set, its documented fields, and proof that
// params_schema is the very schema submit validates with (same verdicts and
// the same defaults on generated params), and resource_requirements ->
// gpu_requirements.
import { Ajv } from "ajv";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { PARAMS_SCHEMAS, validateParams } from "../../src/domain/jobs/job-schemas.js";
import { templateById, templateGpuRequirements } from "../../src/domain/jobs/templates.js";
import { client } from "../helpers/http.js";
import { useTestServer } from "../helpers/server.js";

const srv = useTestServer();
const api = client(srv);

const FIELDS = ["description", "id", "image", "job_type", "name", "params_schema", "resource_requirements", "sort_order", "tags"];

describe("templates", () => {
  it("lists the built-in set covering every kind of work, sorted, with the documented fields", async () => {
    const r = await api.get("/api/templates");
    expect(r.status).toBe(200);
    const list = r.body.templates as any[];
    expect(new Set(list.map((t) => t.job_type))).toEqual(
      new Set(["llm-inference", "image_generation", "training", "rendering", "benchmark", "vllm_serve"]),
    );
    expect(list.map((t) => t.sort_order)).toEqual([...list.map((t) => t.sort_order)].sort((a, b) => a - b));
    for (const t of list) {
      expect(Object.keys(t).sort()).toEqual(FIELDS);
      expect(typeof t.id).toBe("string");
      expect(t.tags.every((x: unknown) => typeof x === "string")).toBe(true);
      expect(Number.isInteger(t.sort_order)).toBe(true);
      expect(Object.keys(t.resource_requirements).sort()).toEqual(["gpu_required", "min_vram_gb"]);
      expect(Number.isInteger(t.resource_requirements.min_vram_gb)).toBe(true);
      expect(typeof t.resource_requirements.gpu_required).toBe("boolean");
      // The served schema is exactly the one submit validates with.
      expect(t.params_schema).toEqual(PARAMS_SCHEMAS[t.job_type as keyof typeof PARAMS_SCHEMAS]);
    }
    const images = (await api.get("/api/registry/images")).body.images.map((i: any) => i.image);
    for (const t of list) expect(images).toContain(t.image);
  });

  it("gets one template by id, 404 for an unknown one, and filters by tag and job_type (either spelling of llm-inference)", async () => {
    const one = await api.get("/api/templates/image-generation");
    expect(one.status).toBe(200);
    expect(one.body).toMatchObject({ id: "image-generation", job_type: "image_generation", resource_requirements: { gpu_required: true } });
    const missing = await api.get("/api/templates/nope");
    expect(missing.status).toBe(404);
    expect(missing.body).toEqual({ error: expect.stringContaining("template not found") });
    const llm = await api.get("/api/templates?tag=llm");
    expect(llm.body.templates.map((t: any) => t.id).sort()).toEqual(["fine-tuning", "llm-inference", "vllm-serve"]);
    const training = await api.get("/api/templates?job_type=training");
    expect(training.body.templates.map((t: any) => t.id)).toEqual(["fine-tuning"]);
    expect((await api.get("/api/templates?job_type=mining")).body.templates).toEqual([]);
    // llm_inference is the same job type as llm-inference.
    for (const spelling of ["llm-inference", "llm_inference"]) {
      const r = await api.get(`/api/templates?job_type=${spelling}`);
      expect(r.body.templates.map((t: any) => [t.id, t.job_type]), spelling).toEqual([["llm-inference", "llm-inference"]]);
    }
  });

  it("gives the same verdict as submit's validator for generated params (served schema, fresh ajv)", async () => {
    const list = (await api.get("/api/templates")).body.templates as any[];
    const value = fc.oneof(
      fc.integer({ min: -10, max: 5000 }),
      fc.double({ min: -5, max: 5, noNaN: true }),
      fc.string({ maxLength: 8 }),
      fc.constantFrom("meta-llama/Llama-3.1-8B-Instruct", "stabilityai/sdxl-turbo", "https://example.com/x", "cycles", "quick", "lora"),
      fc.boolean(),
      fc.constant(null),
    );
    for (const t of list) {
      const props = Object.keys(t.params_schema.properties);
      const ajv = new Ajv({ strict: false, useDefaults: true });
      const check = ajv.compile(t.params_schema);
      fc.assert(
        fc.property(fc.dictionary(fc.constantFrom(...props, "unknown_field"), value, { maxKeys: 5 }), (params) => {
          const served = structuredClone(params);
          const servedOk = check(served);
          let submitted: Record<string, unknown> | undefined;
          try {
            submitted = validateParams(t.job_type, params);
          } catch (err) {
            expect((err as Error).message).toMatch(/params/);
          }
          expect(submitted !== undefined).toBe(servedOk);
          // Accepted: the served schema's defaults fill in exactly what submit runs with.
          if (submitted) expect(submitted).toEqual(served);
        }),
        { numRuns: 150 },
      );
      // No params at all: the served defaults are the whole job, and submit uses the same.
      const empty = {};
      expect(check(empty)).toBe(true);
      expect(validateParams(t.job_type, undefined)).toEqual(empty);
    }
  });

  it("turns resource_requirements into gpu_requirements for dispatch", () => {
    const t = templateById("fine-tuning");
    expect(templateGpuRequirements(t)).toEqual({ min_vram_gb: 24 });
    expect(templateGpuRequirements(t, { min_vram_gb: 40, gpu_model: "A100" })).toEqual({ min_vram_gb: 40, gpu_model: "A100" });
    expect(templateGpuRequirements(t, { min_vram_gb: 8 })).toEqual({ min_vram_gb: 24 });
    expect(() => templateById("missing")).toThrow(/template not found/);
  });
});
