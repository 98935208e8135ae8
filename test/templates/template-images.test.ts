// What a job made from each template runs on a provider: the task the daemon is handed, planned
// into the TypeScript daemon's docker command line. A template runs in its job type's default
// image, where the daemon's program for the type can run, unless the submit names another that
// any job of the type may name; vLLM's image, whose entrypoint is its API server, takes only
// vllm_serve (and custom_container) jobs.
import { describe, expect, it } from "vitest";
import type { JsonObject } from "@bufbuild/protobuf";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { useTestServer } from "../helpers/server.js";
import { dockerRunArgs } from "../../src/daemon/ts/executors/docker.js";
import { checkImageRunsJobType, DEFAULT_CONTAINERS } from "../../src/domain/jobs/job-schemas.js";
import type { JobType } from "../../src/domain/money/pricing.js";

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000" });
const api = client(srv);

const opts = { docker: "docker", workRoot: "/tmp/svc-template-plan", gpus: true, scriptsDir: "/opt/svc/scripts", defaultMemoryMb: 4096 };

/** What the daemon runs after the image: its program for each job type the templates cover (benchmark runs no container). */
const COMMANDS: Partial<Record<JobType, string[]>> = {
  "llm-inference": ["python", "/svc-scripts/llm.py"],
  image_generation: ["python", "/svc-scripts/image.py"],
  training: ["python", "/svc-scripts/train.py"],
  rendering: ["python", "/svc-scripts/render.py"],
  // vLLM's entrypoint is its API server: the daemon hands it the server's arguments.
  vllm_serve: ["--model", "Qwen/Qwen2.5-7B-Instruct", "--port", "8000", "--max-model-len", "8192", "--dtype", "auto", "--gpu-memory-utilization", "0.9"],
};

describe("what a template's job runs", () => {
  it("each template's job is handed its job type's default image and planned as the type's program there", async () => {
    const renter = await makeRenter(srv, 500_000);
    const templates = (await api.get("/api/templates")).body.templates as { id: string; job_type: JobType; image: string }[];
    for (const t of templates) {
      expect(t.image, t.id).toBe(DEFAULT_CONTAINERS[t.job_type].image);
      const prov = await makeProvider(srv);
      const sub = await api.post("/api/jobs/submit", { template_id: t.id, duration_minutes: 1, provider_id: prov.id }, renter.headers);
      expect(sub.status, `${t.id}: ${sub.text}`).toBe(201);
      const job = (await api.get(`/api/providers/${prov.key}/jobs`)).body.job;
      expect(job.job_id, t.id).toBe(sub.body.job.job_id);
      const taskSpec = (typeof job.task_spec === "string" ? JSON.parse(job.task_spec) : job.task_spec) as JsonObject;
      expect((taskSpec.container as JsonObject).image, t.id).toBe(t.image);
      const command = COMMANDS[t.job_type];
      if (!command) continue;
      const plan = dockerRunArgs({ jobId: job.job_id, jobType: job.job_type, taskSpec, maxDurationSeconds: 1800, gpus: [0] }, opts, 8000, "key", {});
      expect(plan.argv.slice(plan.argv.lastIndexOf(t.image)), t.id).toEqual([t.image, ...command]);
      expect(plan.argv, t.id).not.toContain("--entrypoint");
    }
  });

  it("a template's job may name another image under the rules of any job of its type: a built-in one that runs the type", async () => {
    const renter = await makeRenter(srv, 500_000);
    const prov = await makeProvider(srv);
    const tpl = (await api.get("/api/templates/llm-inference")).body;
    const other = "pytorch/pytorch:2.4.1-cuda12.1-cudnn9-runtime";
    expect(tpl.image).not.toBe(other);
    const sub = await api.post("/api/jobs/submit", { template_id: tpl.id, duration_minutes: 1, provider_id: prov.id, container_spec: { image: other } }, renter.headers);
    expect(sub.status, sub.text).toBe(201);
    expect(sub.body.job).toMatchObject({ job_type: tpl.job_type, container_spec: { image: other }, gpu_requirements: { min_vram_gb: tpl.resource_requirements.min_vram_gb } });
    const job = (await api.get(`/api/providers/${prov.key}/jobs`)).body.job;
    expect(job.job_id).toBe(sub.body.job.job_id);
    const taskSpec = (typeof job.task_spec === "string" ? JSON.parse(job.task_spec) : job.task_spec) as JsonObject;
    expect((taskSpec.container as JsonObject).image).toBe(other);
    // Refused as without a template: vLLM's image, which cannot start the type's program, and an image not built in.
    const vllm = DEFAULT_CONTAINERS.vllm_serve.image;
    const refused = await api.post("/api/jobs/submit", { template_id: tpl.id, duration_minutes: 1, container_spec: { image: vllm } }, renter.headers);
    expect(refused.status, refused.text).toBe(400);
    expect(refused.body.error).toMatch(new RegExp(`^container_spec\\.image ${vllm} .*runs vllm_serve jobs only`));
    const own = `ghcr.io/acme/solver:3.2.1@sha256:${"f".repeat(64)}`;
    const notBuiltin = await api.post("/api/jobs/submit", { template_id: tpl.id, duration_minutes: 1, container_spec: { image: own } }, renter.headers);
    expect(notBuiltin.status, notBuiltin.text).toBe(400);
    expect(notBuiltin.body.error).toContain(`container_spec.image ${own} is not one of the platform's built-in images`);
  });

  it("judges vLLM's image by its repository, whatever its tag or digest", () => {
    for (const image of ["vllm/vllm-openai:v0.8.5", "docker.io/vllm/vllm-openai:latest", `vllm/vllm-openai@sha256:${"a".repeat(64)}`, "vllm/vllm-openai"]) {
      expect(() => checkImageRunsJobType("vllm_serve", image), image).not.toThrow();
      expect(() => checkImageRunsJobType("llm-inference", image), image).toThrow(/runs vllm_serve jobs only/);
    }
    for (const image of ["vllm/vllm-openai-fork:1", "example/vllm/vllm-openai:1", "pytorch/pytorch:2.4.1-cuda12.1-cudnn9-runtime"]) {
      expect(() => checkImageRunsJobType("vllm_serve", image), image).toThrow(/vllm_serve jobs run in vLLM's image/);
      expect(() => checkImageRunsJobType("llm-inference", image), image).not.toThrow();
    }
  });

  it("refuses vLLM's image for a job type whose program it cannot start, and vllm_serve in an image that is not vLLM's", async () => {
    const renter = await makeRenter(srv, 500_000);
    await makeProvider(srv);
    const vllm = DEFAULT_CONTAINERS.vllm_serve.image;
    for (const job_type of ["llm-inference", "llm_inference", "image_generation", "training", "rendering", "benchmark"]) {
      const r = await api.post("/api/jobs/submit", { job_type, duration_minutes: 1, container_spec: { image: vllm } }, renter.headers);
      expect(r.status, `${job_type}: ${r.text}`).toBe(400);
      expect(r.body.error).toMatch(new RegExp(`^container_spec\\.image ${vllm} .*runs vllm_serve jobs only`));
    }
    const serve = await api.post("/api/jobs/submit", { job_type: "vllm_serve", duration_minutes: 1, container_spec: { image: "pytorch/pytorch:2.4.1-cuda12.1-cudnn9-runtime" } }, renter.headers);
    expect(serve.status, serve.text).toBe(400);
    expect(serve.body.error).toMatch(/^container_spec\.image pytorch\/pytorch:2\.4\.1-cuda12\.1-cudnn9-runtime: vllm_serve jobs run in vLLM's image \(vllm\/vllm-openai\) only/);
    expect((await api.get("/api/renters/balance", renter.headers)).body.held_halala).toBe(0);
    // Its own image, and a custom container's command run as that image's arguments, are taken.
    const own = await api.post("/api/jobs/submit", { job_type: "vllm_serve", duration_minutes: 1, container_spec: { image: vllm } }, renter.headers);
    expect(own.status, own.text).toBe(201);
    const custom = await api.post(
      "/api/jobs/submit",
      { job_type: "custom_container", duration_minutes: 1, container_spec: { image: vllm }, params: { command: ["--model", "Qwen/Qwen2.5-7B-Instruct"] } },
      renter.headers,
    );
    expect(custom.status, custom.text).toBe(201);
  });
});
