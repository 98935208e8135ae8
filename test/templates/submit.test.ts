// Templates and the registry as submit sees them: a template's schema checks
// params, its resource_requirements become gpu_requirements (dispatch skips a
// GPU too small), custom_container runs only approved images, and the other
// job types only the platform's built-in ones; a template takes either spelling
// of its job type.
import { describe, expect, it } from "vitest";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { useTestServer } from "../helpers/server.js";
import { ADMIN } from "../admin/helpers.js";

const srv = useTestServer();
const api = client(srv);

describe("submit with templates and the registry", () => {
  it("validates params with the template's schema and carries its resource_requirements into gpu_requirements", async () => {
    const renter = await makeRenter(srv, 50_000);
    // 16 GiB: too small for fine-tuning (24 GB), enough for the benchmark (4 GB).
    const small = await makeProvider(srv, { vramMib: 16_384, gpuModel: "RTX 4080" });
    const tpl = (await api.get("/api/templates/fine-tuning")).body;
    const bad = await api.post("/api/jobs/submit", { template_id: "fine-tuning", duration_minutes: 5, params: { base_model: "x" } }, renter.headers);
    expect(bad.status).toBe(400);
    expect(bad.body.error).toMatch(/^params\./);
    const params = { base_model: tpl.params_schema.properties.base_model.enum[0], dataset_url: "https://data.example.com/set.jsonl" };
    const big = await api.post("/api/jobs/submit", { template_id: "fine-tuning", duration_minutes: 5, params }, renter.headers);
    // The template asks for 24 GB and only a 16 GiB GPU is online: 503, nothing held (DESIGN §3).
    expect(big.status).toBe(503);
    expect((await api.get("/api/renters/balance", renter.headers)).body.held_halala).toBe(0);
    await makeProvider(srv, { vramMib: 49_152, gpuModel: "RTX 6000 Ada" });
    const fits = await api.post("/api/jobs/submit", { template_id: "fine-tuning", duration_minutes: 5, params }, renter.headers);
    expect(fits.status).toBe(201);
    expect(fits.body.job.gpu_requirements).toMatchObject({ min_vram_gb: 24 });
    expect(fits.body.job.provider_id).not.toBe(small.id);
    const bench = await api.post("/api/jobs/submit", { template_id: "gpu-benchmark", duration_minutes: 1 }, renter.headers);
    expect(bench.status).toBe(201);
    expect(bench.body.job).toMatchObject({ job_type: "benchmark", gpu_requirements: { min_vram_gb: 4 }, provider_id: small.id });
    expect(bench.body.job.container_spec.image).toBe((await api.get("/api/templates/gpu-benchmark")).body.image);
    expect((await api.post("/api/jobs/submit", { template_id: "nope", duration_minutes: 1 }, renter.headers)).status).toBe(404);
  });

  it("runs custom_container only with an approved image", async () => {
    const renter = await makeRenter(srv, 50_000);
    await makeProvider(srv);
    const image = `ghcr.io/acme/solver:3.2.1@sha256:${"e".repeat(64)}`;
    const job = { job_type: "custom_container", duration_minutes: 1, container_spec: { image }, params: { command: ["solve"] } };
    const before = await api.post("/api/jobs/submit", job, renter.headers);
    expect(before.status).toBe(400);
    expect(before.body.error).toMatch(/^container_spec\.image .* not an approved image/);
    const req = await api.post("/api/registry/requests", { image, reason: "solver" }, renter.headers);
    expect((await api.post(`/api/admin/registry/requests/${req.body.id}/approve`, {}, ADMIN)).status).toBe(200);
    const after = await api.post("/api/jobs/submit", job, renter.headers);
    expect(after.status).toBe(201);
    expect(after.body.job.container_spec).toMatchObject({ image });

    // Approved for custom_container (no network) only: the built-in types run the platform's program with
    // the network it needs (and vllm_serve a public port), so they take the platform's own images only.
    for (const job_type of ["llm_inference", "image_generation", "training", "rendering", "vllm_serve", "benchmark"]) {
      const other = await api.post("/api/jobs/submit", { job_type, duration_minutes: 1, container_spec: { image } }, renter.headers);
      expect(other.status, `${job_type}: ${other.text}`).toBe(400);
      expect(other.body.error).toContain(`container_spec.image ${image} is not one of the platform's built-in images, which ${job_type} jobs run on`);
    }
    // A built-in image there is taken (which one runs which type: template-images.test.ts).
    const builtin = await api.post("/api/jobs/submit", { job_type: "llm-inference", duration_minutes: 1, container_spec: { image: "huggingface/transformers-pytorch-gpu:4.41.3" } }, renter.headers);
    expect(builtin.status, builtin.text).toBe(201);
  });

  it("takes a template with either spelling of its job type, as the template list does, and refuses another type", async () => {
    const renter = await makeRenter(srv, 50_000);
    await makeProvider(srv);
    const found = (await api.get("/api/templates?job_type=llm_inference")).body.templates;
    expect(found.map((t: any) => t.id)).toEqual(["llm-inference"]);
    for (const job_type of ["llm_inference", "llm-inference"]) {
      const sub = await api.post("/api/jobs/submit", { template_id: found[0].id, job_type, duration_minutes: 1, params: { prompt: "hi" } }, renter.headers);
      expect(sub.status, `${job_type}: ${sub.text}`).toBe(201);
      expect(sub.body.job).toMatchObject({ job_type, gpu_requirements: { min_vram_gb: 16 } });
    }
    const other = await api.post("/api/jobs/submit", { template_id: "llm-inference", job_type: "training", duration_minutes: 1 }, renter.headers);
    expect(other.status, other.text).toBe(400);
    expect(other.body.error).toBe("job_type must be llm-inference for template llm-inference");
  });
});
