// The minimal submit the interface accepts, {"job_type": T, "duration_minutes": 2},
// for every job type over real HTTP: 201 on the documented defaults (README
// "Job defaults"), which the signed task spec carries, or else the documented
// 402, 429 and 503, checked in that order. A value that is present and wrong
// is still 400 naming its field.
import { beforeEach, describe, expect, it } from "vitest";
import { JOB_TYPES, RATE_HALALA_PER_MINUTE, type JobType } from "../../src/domain/money/pricing.js";
import { verifyTask } from "../../src/shared/task-signature.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { client } from "../helpers/http.js";
import { useTestServer } from "../helpers/server.js";
import { clearMarketplace } from "./helpers.js";

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0" });
const api = client(srv);
beforeEach(() => clearMarketplace(srv));

const minimal = (jobType: string) => ({ job_type: jobType, duration_minutes: 2 });
const held = async (key: string) => (await api.get("/api/renters/balance", { "x-renter-key": key })).body.held_halala;

const LLM = { model: "Qwen/Qwen2.5-7B-Instruct", inputs: { prompt: "Introduce yourself in one sentence.", max_tokens: 512, temperature: 0.7, model: "Qwen/Qwen2.5-7B-Instruct" } };

// What each minimal job runs, as the "Job defaults" table of docs/jobs.md documents it.
const DEFAULTS: Record<JobType, Record<string, unknown>> = {
  image_generation: {
    container: { image: "pytorch/pytorch:2.4.1-cuda12.1-cudnn9-runtime", image_type: "diffusion" },
    model: "stabilityai/stable-diffusion-xl-base-1.0",
    inputs: { prompt: "a lighthouse on a rocky coast at sunset, photograph", steps: 30, width: 1024, height: 1024 },
  },
  "llm-inference": { container: { image: "huggingface/transformers-pytorch-gpu:4.41.3", image_type: "llm" }, ...LLM },
  llm_inference: { container: { image: "huggingface/transformers-pytorch-gpu:4.41.3", image_type: "llm" }, ...LLM },
  vllm_serve: {
    container: { image: "vllm/vllm-openai:v0.6.3", image_type: "vllm" },
    model: "Qwen/Qwen2.5-7B-Instruct",
    inputs: { max_model_len: 8192, dtype: "auto", gpu_memory_utilization: 0.9, public: false },
  },
  training: {
    container: { image: "pytorch/pytorch:2.4.1-cuda12.1-cudnn9-runtime", image_type: "training" },
    model: "TinyLlama/TinyLlama-1.1B-Chat-v1.0",
    inputs: { base_model: "TinyLlama/TinyLlama-1.1B-Chat-v1.0", dataset_url: "builtin:tiny-instruct", method: "lora", epochs: 3, batch_size: 8 },
  },
  rendering: {
    container: { image: "linuxserver/blender:4.2.3", image_type: "render" },
    inputs: { scene_url: "builtin:benchmark-scene", engine: "cycles", frame_start: 1, frame_end: 1, samples: 128, output_format: "PNG" },
  },
  benchmark: { container: { image: "nvidia/cuda:12.4.1-runtime-ubuntu22.04", image_type: "benchmark" }, inputs: { suite: "quick", iterations: 10 } },
  custom_container: {
    container: { image: "nvidia/cuda:12.4.1-runtime-ubuntu22.04", image_type: "custom" },
    command: ["nvidia-smi"],
    inputs: { command: ["nvidia-smi"] },
  },
};

describe("the minimal submit of every job type", () => {
  it("covers the interface's job types, both llm spellings included", () => {
    expect([...JOB_TYPES].sort()).toEqual(
      ["benchmark", "custom_container", "image_generation", "llm-inference", "llm_inference", "rendering", "training", "vllm_serve"],
    );
  });

  it("is 201 on a provider that fits, and the signed task spec the provider gets carries the defaults", async () => {
    const renter = await makeRenter(srv, 100_000);
    const images = (await api.get("/api/registry/images")).body.images.map((i: { image: string }) => i.image);
    for (const t of JOB_TYPES) {
      // One free provider per job: the earlier ones are busy with theirs.
      const provider = await makeProvider(srv);
      const r = await api.post("/api/jobs/submit", minimal(t), renter.headers);
      expect(r.status, `${t}: ${r.text}`).toBe(201);
      expect(r.body.queued, t).toBe(false);
      expect(r.body.job, t).toMatchObject({ job_type: t, status: "pending", provider_id: provider.id, cost_halala: 2 * RATE_HALALA_PER_MINUTE[t] });
      expect(r.body.job.container_spec, t).toMatchObject(DEFAULTS[t].container as object);

      const polled = (await api.get(`/api/providers/${provider.key}/jobs`)).body.job;
      expect(polled.job_id, t).toBe(r.body.job.job_id);
      expect(polled.task_spec, t).toMatchObject({ job_type: t, ...DEFAULTS[t] });
      expect(verifyTask(srv.config.hmacSecret, polled.task_spec, polled.task_spec_hmac), t).toBe(true);
      // The default image is one the registry approves, so the provider may run it.
      expect(images, t).toContain(polled.task_spec.container.image);
    }
  });

  it("takes back the container_spec a submit answered (its pricing_class included)", async () => {
    const renter = await makeRenter(srv, 100_000);
    await makeProvider(srv);
    const first = await api.post("/api/jobs/submit", minimal("image_generation"), renter.headers);
    expect(first.status).toBe(201);
    expect(first.body.job.container_spec.pricing_class).toEqual(expect.any(String));
    const again = await api.post("/api/jobs/submit", { ...minimal("image_generation"), container_spec: first.body.job.container_spec }, renter.headers);
    expect(again.status, JSON.stringify(again.body)).toBe(201);
    expect(again.body.job.container_spec).toEqual(first.body.job.container_spec);
  });

  it("keeps a renter's own custom_container image on its own CMD: the smoke check is the default image's", async () => {
    const renter = await makeRenter(srv, 10_000);
    const provider = await makeProvider(srv);
    const r = await api.post("/api/jobs/submit", { ...minimal("custom_container"), container_spec: { image: "tensorflow/tensorflow:2.17.0-gpu" } }, renter.headers);
    expect(r.status, r.text).toBe(201);
    const spec = (await api.get(`/api/providers/${provider.key}/jobs`)).body.job.task_spec;
    expect(spec.container.image).toBe("tensorflow/tensorflow:2.17.0-gpu");
    expect(spec.command).toBeUndefined();
    const own = await makeProvider(srv);
    const cmd = await api.post("/api/jobs/submit", { ...minimal("custom_container"), params: { command: ["python3", "-c", "print(1)"] } }, renter.headers);
    expect(cmd.status, cmd.text).toBe(201);
    const spec2 = (await api.get(`/api/providers/${own.key}/jobs`)).body.job.task_spec;
    expect(spec2).toMatchObject({ container: { image: "nvidia/cuda:12.4.1-runtime-ubuntu22.04" }, command: ["python3", "-c", "print(1)"] });
  });

  it("is 503 with Retry-After when no provider is online, holding nothing", async () => {
    const renter = await makeRenter(srv, 100_000);
    await makeProvider(srv, { online: false });
    for (const t of JOB_TYPES) {
      const r = await api.post("/api/jobs/submit", minimal(t), renter.headers);
      expect(r.status, `${t}: ${r.text}`).toBe(503);
      expect(r.body.error, t).toMatch(/^no providers available/);
      expect(r.headers.get("retry-after"), t).toBe("30");
    }
    expect(await held(renter.key)).toBe(0);
  });

  it("is 402 without funds, ahead of the quota and capacity checks", async () => {
    const empty = await makeRenter(srv, 0);
    const short = await makeRenter(srv, 1);
    // Over quota too, and no provider online: funds are judged first.
    await srv.sql`UPDATE renter_quota SET daily_jobs_limit = 0 WHERE renter_id IN (${empty.id}, ${short.id})`;
    for (const t of JOB_TYPES) {
      const r = await api.post("/api/jobs/submit", minimal(t), empty.headers);
      expect(r.status, `${t}: ${r.text}`).toBe(402);
      expect(r.body.error, t).toMatch(/wallet balance is 0/);
      const s = await api.post("/api/jobs/submit", minimal(t), short.headers);
      expect(s.status, `${t}: ${s.text}`).toBe(402);
      expect(s.body.error, t).toContain(`this job holds ${2 * RATE_HALALA_PER_MINUTE[t]} halala`);
    }
  });

  it("is 429 over quota, ahead of the capacity check", async () => {
    const renter = await makeRenter(srv, 100_000);
    await srv.sql`UPDATE renter_quota SET daily_jobs_limit = 0 WHERE renter_id = ${renter.id}`;
    for (const t of JOB_TYPES) {
      const r = await api.post("/api/jobs/submit", minimal(t), renter.headers);
      expect(r.status, `${t}: ${r.text}`).toBe(429);
      expect(r.body.error, t).toMatch(/daily_jobs_limit/);
    }
    // With room again, the same body gets as far as capacity (no provider online).
    await srv.sql`UPDATE renter_quota SET daily_jobs_limit = 500 WHERE renter_id = ${renter.id}`;
    expect((await api.post("/api/jobs/submit", minimal("training"), renter.headers)).status).toBe(503);
    expect(await held(renter.key)).toBe(0);
  });
});

describe("present and wrong values", () => {
  it("are still 400 naming the field, with nothing held", async () => {
    const renter = await makeRenter(srv, 100_000);
    await makeProvider(srv);
    const cases: [Record<string, unknown>, RegExp][] = [
      [{ job_type: "training", params: { base_model: "evil/model" } }, /^params\.base_model must be one of /],
      [{ job_type: "training", params: { dataset_url: "file:///etc/passwd" } }, /^params\.dataset_url must be an http\(s\) URL or builtin:tiny-instruct$/],
      [{ job_type: "training", params: { epochs: 0 } }, /^params\.epochs must be an integer between 1 and 100$/],
      [{ job_type: "rendering", params: { scene_url: "builtin:other-scene" } }, /^params\.scene_url must be an http\(s\) URL or builtin:benchmark-scene$/],
      [{ job_type: "rendering", params: { samples: "many" } }, /^params\.samples /],
      [{ job_type: "image_generation", params: { prompt: 42 } }, /^params\.prompt must be of type string$/],
      [{ job_type: "llm_inference", params: { max_tokens: 5000 } }, /^params\.max_tokens must be an integer between 32 and 4096$/],
      [{ job_type: "llm-inference", params: { model: "nope" } }, /^params\.model must be one of /],
      [{ job_type: "custom_container", params: { command: "nvidia-smi" } }, /^params\.command must be of type array$/],
      [{ job_type: "custom_container", container_spec: { image: "evil/miner:1.0" } }, /^container_spec\.image evil\/miner:1\.0 is not an approved image/],
      [{ job_type: "custom_container", container_spec: { image: "nvidia/cuda:latest" } }, /^container_spec\.image must not use the moving tag 'latest'/],
      [{ job_type: "benchmark", duration_minutes: 0 }, /duration_minutes/],
      [{ job_type: "training", container_spec: { pricing_class: "free" } }, /^container_spec\.pricing_class is set by the service: training jobs are priced as /],
      [{ job_type: "gpu_mining" }, /^job_type must be one of /],
    ];
    for (const [body, error] of cases) {
      const r = await api.post("/api/jobs/submit", { duration_minutes: 2, ...body }, renter.headers);
      expect(r.status, JSON.stringify(body)).toBe(400);
      expect(r.body.error, JSON.stringify(body)).toMatch(error);
    }
    expect(await held(renter.key)).toBe(0);
  });
});
