// The job lifecycle over real HTTP: submit (201, every documented field),
// the legacy daemon protocol (poll, logs, progress, result), settlement
// figures, reads and who may make them.
import { beforeEach, describe, expect, it } from "vitest";
import { useTestServer, HMAC_SECRET } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { verifyTask } from "../../src/shared/task-signature.js";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import { clearMarketplace, pickUp } from "./helpers.js";

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000" });
const api = client(srv);
// Each test sees only the providers it makes: earlier ones go offline.
beforeEach(() => clearMarketplace(srv));

const SUBMISSION_FIELDS = [
  "id", "job_id", "job_type", "status", "submitted_at", "started_at", "completed_at", "cost_halala", "actual_cost_halala",
  "provider_earned_halala", "platform_fee_halala", "provider_id", "renter_id", "duration_minutes", "max_duration_seconds",
  "timeout_at", "gpu_requirements", "container_spec", "workspace_volume_name", "checkpoint_enabled", "task_spec_signed",
  "priority", "pricing_class", "prewarm_requested", "queue_position", "model",
];

async function balance(key: string) {
  return (await api.get("/api/renters/balance", { "x-renter-key": key })).body;
}

describe("submit", () => {
  it("answers 201 with every documented submission field and holds the estimate", async () => {
    const renter = await makeRenter(srv, 10_000);
    const provider = await makeProvider(srv, { vramMib: 24564 });
    const r = await api.post(
      "/api/jobs/submit",
      { job_type: "llm-inference", duration_minutes: 2.5, params: { prompt: "hello", max_tokens: 64 }, gpu_requirements: { min_vram_gb: 24 } },
      renter.headers,
    );
    expect(r.status).toBe(201);
    expect(r.body.success).toBe(true);
    expect(r.body.queued).toBe(false);
    expect(typeof r.body.message).toBe("string");
    const job = r.body.job;
    for (const f of SUBMISSION_FIELDS) expect(job).toHaveProperty(f);
    expect(job.job_id).toMatch(/^job-/);
    expect(job).toMatchObject({
      job_type: "llm-inference",
      status: "pending",
      provider_id: provider.id,
      renter_id: renter.id,
      duration_minutes: 2.5,
      max_duration_seconds: 1800,
      priority: 2,
      cost_halala: 38, // ceil(15 x 2.5)
      actual_cost_halala: null,
      task_spec_signed: true,
      checkpoint_enabled: false,
      prewarm_requested: false,
      queue_position: null,
      gpu_requirements: { min_vram_gb: 24 },
      model: "Qwen/Qwen2.5-7B-Instruct",
      pricing_class: "inference",
      queue_reason: null,
    });
    expect(job.container_spec).toMatchObject({ image_type: "llm", pricing_class: "inference" });
    expect(job.workspace_volume_name).toContain(job.job_id);
    expect(job.timeout_at).toMatch(/^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}$/);
    expect(job.submitted_at).toMatch(/Z$/);

    const b = await balance(renter.key);
    expect(b).toMatchObject({ balance_halala: 10_000, held_halala: 38, available_halala: 9_962, total_jobs: 1 });
  });

  it("validates every field with a 400 naming it, before any money moves", async () => {
    const renter = await makeRenter(srv, 10_000);
    await makeProvider(srv);
    const cases: [Record<string, unknown>, RegExp][] = [
      [{}, /job_type/],
      [{ job_type: "quantum" }, /job_type must be one of/],
      [{ job_type: "benchmark", duration_minutes: 0.001 }, /duration_minutes/],
      [{ job_type: "benchmark", duration_minutes: 1441 }, /duration_minutes/],
      [{ job_type: "benchmark", priority: 4 }, /priority/],
      [{ job_type: "benchmark", priority: 0 }, /priority/],
      [{ job_type: "benchmark", max_duration_seconds: 0 }, /max_duration_seconds/],
      [{ job_type: "benchmark", max_duration_seconds: 1.5 }, /max_duration_seconds/],
      [{ job_type: "benchmark", provider_id: 0 }, /provider_id/],
      [{ job_type: "image_generation", params: { prompt: "x", steps: 101 } }, /params\.steps/],
      [{ job_type: "image_generation", params: { prompt: "x", width: 2048 } }, /params\.width/],
      [{ job_type: "llm_inference", params: { prompt: "x", temperature: 2.5 } }, /params\.temperature/],
      [{ job_type: "llm_inference", params: { prompt: "x", model: "gpt-4" } }, /params\.model/],
      [{ job_type: "llm_inference", params: "hi" }, /./],
      [{ job_type: "benchmark", gpu_requirements: { min_vram_gb: "lots" } }, /gpu_requirements\.min_vram_gb/],
      [{ job_type: "benchmark", gpu_requirements: { cores: 4 } }, /gpu_requirements\.cores/],
      [{ job_type: "benchmark", container_spec: { image_type: "vm" } }, /container_spec\.image_type/],
      // Left out, the image has a documented default (docs/jobs.md: Job defaults); present and not approved, it is refused.
      [{ job_type: "custom_container", container_spec: { image: "ghcr.io/unknown/unapproved:1" }, params: { command: ["python"] } }, /container_spec\.image/],
    ];
    for (const [body, msg] of cases) {
      const r = await api.post("/api/jobs/submit", body, renter.headers);
      expect(r.status, JSON.stringify(body)).toBe(400);
      expect(r.body.error).toMatch(msg);
    }
    expect((await balance(renter.key)).held_halala).toBe(0);
    expect((await balance(renter.key)).total_jobs).toBe(0);
  });

  it("prices every job type by its rate and accepts the documented defaults", async () => {
    const renter = await makeRenter(srv, 100_000);
    const rates: Record<string, [number, Record<string, unknown>]> = {
      "llm-inference": [15, { prompt: "p" }],
      llm_inference: [15, { prompt: "p" }],
      training: [25, { base_model: "Qwen/Qwen2.5-7B-Instruct", dataset_url: "https://example.com/d.jsonl" }],
      rendering: [20, { scene_url: "https://example.com/s.blend" }],
      image_generation: [20, { prompt: "p" }],
      vllm_serve: [20, {}],
      benchmark: [10, {}],
      custom_container: [10, { command: ["nvidia-smi"] }],
    };
    for (const [type, [rate, params]] of Object.entries(rates)) {
      await makeProvider(srv);
      const body: Record<string, unknown> = { job_type: type, params };
      if (type === "custom_container") body.container_spec = { image: "nvidia/cuda:12.4.1-runtime-ubuntu22.04" };
      const r = await api.post("/api/jobs/submit", body, renter.headers);
      expect(r.status, `${type}: ${r.text}`).toBe(201);
      expect(r.body.job.cost_halala).toBe(rate * 10);
      expect(r.body.job.duration_minutes).toBe(10);
      expect(r.body.job.container_spec.image_type).toBeTypeOf("string");
    }
    const small = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 0.01 }, renter.headers);
    expect(small.status).toBe(201);
    expect(small.body.job.cost_halala).toBe(1); // ceil(10 x 0.01) = 1, and never below 1
  });

  it("refuses unapproved images for custom containers", async () => {
    const renter = await makeRenter(srv, 10_000);
    await makeProvider(srv);
    const r = await api.post("/api/jobs/submit", { job_type: "custom_container", container_spec: { image: "evil/miner:1.0" }, params: { command: ["x"] } }, renter.headers);
    expect(r.status).toBe(400);
    expect(r.body.error).toMatch(/^container_spec\.image .* not an approved image/);
    const latest = await api.post("/api/jobs/submit", { job_type: "custom_container", container_spec: { image: "evil/miner:latest" } }, renter.headers);
    expect(latest.status).toBe(400);
  });

  it("answers 402 for an empty wallet or a short one, holding nothing", async () => {
    await makeProvider(srv);
    const broke = await makeRenter(srv, 0);
    const r = await api.post("/api/jobs/submit", { job_type: "benchmark" }, broke.headers);
    expect(r.status).toBe(402);
    expect(r.body.error).toMatch(/balance/);
    const poor = await makeRenter(srv, 99);
    const r2 = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 10 }, poor.headers);
    expect(r2.status).toBe(402);
    expect(r2.body.error).toMatch(/100 halala/);
    expect(await balance(poor.key)).toMatchObject({ balance_halala: 99, held_halala: 0, total_jobs: 0 });
    const exact = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 9.9 }, poor.headers);
    expect(exact.status).toBe(201);
  });

  it("answers 503 when no approved online provider matches, holding nothing", async () => {
    const renter = await makeRenter(srv, 10_000);
    const r = await api.post("/api/jobs/submit", { job_type: "benchmark", gpu_requirements: { min_vram_gb: 900 } }, renter.headers);
    expect(r.status).toBe(503);
    expect(r.body.error).toMatch(/no providers available/);
    const pending = await makeProvider(srv, { approved: false });
    const r2 = await api.post("/api/jobs/submit", { job_type: "benchmark", provider_id: pending.id }, renter.headers);
    expect(r2.status).toBe(503);
    const offline = await makeProvider(srv, { online: false });
    const r3 = await api.post("/api/jobs/submit", { job_type: "benchmark", provider_id: offline.id }, renter.headers);
    expect(r3.status).toBe(503);
    expect((await api.post("/api/jobs/submit", { job_type: "benchmark", provider_id: 999_999 }, renter.headers)).status).toBe(404);
    expect(await balance(renter.key)).toMatchObject({ held_halala: 0, total_jobs: 0 });
  });

  it("needs a renter key", async () => {
    const provider = await makeProvider(srv);
    expect((await api.post("/api/jobs/submit", { job_type: "benchmark" })).status).toBe(400);
    expect((await api.post("/api/jobs/submit", { job_type: "benchmark" }, provider.headers)).status).toBe(403);
    expect((await api.post("/api/jobs/submit", { job_type: "benchmark" }, { "x-renter-key": "svc-renter-nope" })).status).toBe(401);
  });

  it("replays an Idempotency-Key submit instead of holding twice", async () => {
    const renter = await makeRenter(srv, 10_000);
    await makeProvider(srv);
    const h = { ...renter.headers, "idempotency-key": "submit-1" };
    const a = await api.post("/api/jobs/submit", { job_type: "benchmark" }, h);
    const b = await api.post("/api/jobs/submit", { job_type: "benchmark" }, h);
    expect(a.status).toBe(201);
    expect(b.status).toBe(201);
    expect(b.body.job.job_id).toBe(a.body.job.job_id);
    expect(await balance(renter.key)).toMatchObject({ held_halala: 100, total_jobs: 1 });
    expect((await api.post("/api/jobs/submit", { job_type: "benchmark", priority: 1 }, h)).status).toBe(409);
  });
});

describe("submit placed after its transaction", () => {
  it("a replay of its Idempotency-Key repeats the final answer (assigned once the contended provider was free)", async () => {
    const renter = await makeRenter(srv, 10_000);
    const provider = await makeProvider(srv);
    // Another transaction holds the provider's load row: placement skips it and the submit commits queued,
    // then the service fills the contended provider once the lock is gone.
    const conn = await srv.sql.reserve();
    await conn`BEGIN`;
    await conn`SELECT active FROM provider_load WHERE provider_id = ${provider.id} FOR UPDATE`;
    const h = { ...renter.headers, "idempotency-key": "contended-1" };
    const first = api.post("/api/jobs/submit", { job_type: "benchmark" }, h);
    await new Promise((r) => setTimeout(r, 300));
    await conn`COMMIT`;
    conn.release();
    const a = await first;
    expect(a.status).toBe(201);
    expect(a.body.job).toMatchObject({ status: "pending", provider_id: provider.id });
    const b = await api.post("/api/jobs/submit", { job_type: "benchmark" }, h);
    expect(b.status).toBe(201);
    expect(b.body).toEqual(a.body);
  });
});

describe("the legacy daemon protocol", () => {
  it("polls the signed task, runs it, reports logs and progress, and settles 75/25", async () => {
    const renter = await makeRenter(srv, 10_000);
    const provider = await makeProvider(srv);
    const other = await makeProvider(srv, { online: false });
    const sub = await api.post("/api/jobs/submit", { job_type: "image_generation", duration_minutes: 3, params: { prompt: "a cat", steps: 20 } }, renter.headers);
    const jobId = sub.body.job.job_id;
    expect(sub.body.job.status).toBe("pending");

    // Output while pending: 202 with a null phase.
    const o1 = await api.get(`/api/jobs/${jobId}/output`, renter.headers);
    expect(o1.status).toBe(202);
    expect(o1.body).toMatchObject({ status: "pending", progress_phase: null, job_id: jobId });
    expect(typeof o1.body.message).toBe("string");

    const poll = await api.get(`/api/providers/${provider.key}/jobs`);
    expect(poll.status).toBe(200);
    const task = poll.body.job;
    expect(task).toMatchObject({ job_id: jobId, job_type: "image_generation", duration_minutes: 3, max_duration_seconds: 1800, gpu_requirements: null });
    expect(task.task_spec).toMatchObject({ job_id: jobId, model: "stabilityai/stable-diffusion-xl-base-1.0", inputs: { prompt: "a cat", steps: 20, width: 1024 } });
    expect(task.task_spec_hmac).toMatch(/^[0-9a-f]{64}$/);
    expect(verifyTask(HMAC_SECRET, task.task_spec, task.task_spec_hmac)).toBe(true);
    expect(verifyTask(HMAC_SECRET, { ...task.task_spec, inputs: { prompt: "a dog" } }, task.task_spec_hmac)).toBe(false);
    expect((await api.get(`/api/providers/${provider.key}/jobs`)).body).toEqual({ job: null });

    const running = await api.get(`/api/jobs/${jobId}`, renter.headers);
    expect(running.body.status).toBe("running");
    expect(running.body.started_at).toMatch(/Z$/);

    const logs = await api.post(`/api/jobs/${jobId}/logs`, { api_key: provider.key, logs: ["loading model", { level: "warn", message: "slow disk" }] });
    expect(logs.status).toBe(200);
    expect(logs.body).toMatchObject({ success: true, count: 2 });
    expect((await api.post(`/api/jobs/${jobId}/logs`, { api_key: provider.key, logs: [42] })).status).toBe(400);
    expect((await api.post(`/api/jobs/${jobId}/logs`, { api_key: other.key, logs: ["x"] })).status).toBe(403);
    const prog = await api.post(`/api/jobs/${jobId}/progress`, { api_key: provider.key, progress_pct: 40, phase: "generating" });
    expect(prog.status).toBe(200);
    expect((await api.post(`/api/jobs/${jobId}/progress`, { api_key: provider.key, progress_pct: 101 })).status).toBe(400);
    expect((await api.post(`/api/jobs/${jobId}/progress`, { api_key: other.key, progress_pct: 5 })).status).toBe(403);

    const o2 = await api.get(`/api/jobs/${jobId}/output`, renter.headers);
    expect(o2.status).toBe(202);
    expect(o2.body).toMatchObject({ status: "running", progress_phase: "generating", job_id: jobId });

    const readLogs = await api.get(`/api/jobs/${jobId}/logs`, renter.headers);
    expect(readLogs.body.attempt).toBe(1);
    expect(readLogs.body.logs.map((l: { level: string; message: string }) => [l.level, l.message])).toEqual([["info", "loading model"], ["warning", "slow disk"]]);

    // A tiny valid PNG (1x1) as the result.
    const png = Buffer.from("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==", "base64");
    const wrong = await api.post("/api/providers/job-result", { api_key: other.key, job_id: jobId, success: true, result: { data: "x" } });
    expect(wrong.status).toBe(403);
    const res = await api.post("/api/providers/job-result", { api_key: provider.key, job_id: jobId, success: true, result: { data: png.toString("base64"), format: "png" }, metrics: { it_s: 3.2 } });
    expect(res.status).toBe(200);
    // Ran well under a minute: 1 billable minute x 20 = 20, under the 60 estimate; 75% = 15.
    expect(res.body).toEqual({ success: true, job_id: jobId, status: "completed", actual_minutes: 1, cost_halala: 20, provider_earned_halala: 15, platform_fee_halala: 5, end_reason: "completed", fault: "none" });
    const again = await api.post("/api/providers/job-result", { api_key: provider.key, job_id: jobId, success: true, result: { data: "other" } });
    expect(again.status).toBe(200);
    expect(again.body).toEqual(res.body);

    expect(await balance(renter.key)).toMatchObject({ balance_halala: 9_980, held_halala: 0, available_halala: 9_980, total_spent_halala: 20 });
    const me = await api.get(`/api/providers/me?key=${provider.key}`);
    expect(me.body.provider.total_earnings_halala).toBe(15);
    expect(me.body.recent_jobs[0]).toMatchObject({ job_id: jobId, status: "completed", actual_cost_halala: 20 });

    const job = await api.get(`/api/jobs/${jobId}`, renter.headers);
    expect(job.body).toMatchObject({ status: "completed", actual_cost_halala: 20, provider_earned_halala: 15, platform_fee_halala: 5 });
    expect(job.body.completed_at).toMatch(/Z$/);

    const out = await api.get(`/api/jobs/${jobId}/output`, renter.headers);
    expect(out.status).toBe(200);
    expect(out.body).toEqual({ data: png.toString("base64"), format: "png", job_id: jobId, status: "completed" });
    const pngOut = await fetch(`${srv.url}/api/jobs/${jobId}/output/png`, { headers: renter.headers });
    expect(pngOut.status).toBe(200);
    expect(pngOut.headers.get("content-type")).toBe("image/png");
    expect(Buffer.from(await pngOut.arrayBuffer()).equals(png)).toBe(true);
    const jsonOut = await api.get(`/api/jobs/${jobId}/output/json`, renter.headers);
    expect(jsonOut.body.job_id).toBe(jobId);
    const rawOut = await fetch(`${srv.url}/api/jobs/${jobId}/output/raw`, { headers: renter.headers });
    expect(rawOut.headers.get("content-type")).toBe("image/png");
    expect((await api.get(`/api/jobs/${jobId}/output/gif`, renter.headers)).status).toBe(400);

    const hist = await api.get(`/api/jobs/${jobId}/history`, renter.headers);
    expect(hist.body.attempts).toEqual([
      expect.objectContaining({ attempt: 1, provider_id: provider.id, status: "completed", end_reason: "completed", fault: "none", cost_halala: 20 }),
    ]);
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("answers text results under `response`, /complete and failure refunds", async () => {
    const renter = await makeRenter(srv, 10_000);
    const provider = await makeProvider(srv);
    const a = (await api.post("/api/jobs/submit", { job_type: "llm-inference", params: { prompt: "hi" } }, renter.headers)).body.job.job_id;
    await api.get(`/api/providers/${provider.key}/jobs`);
    const done = await api.post(`/api/jobs/${a}/complete`, { api_key: provider.key, response: "hello there", tokens: 3 });
    expect(done.status).toBe(200);
    expect(done.body.status).toBe("completed");
    const out = await api.get(`/api/jobs/${a}/output`, renter.headers);
    expect(out.body).toEqual({ response: "hello there", tokens: 3, job_id: a, status: "completed" });
    const raw = await fetch(`${srv.url}/api/jobs/${a}/output/raw`, { headers: renter.headers });
    expect(await raw.text()).toBe("hello there");
    expect((await api.get(`/api/jobs/${a}/output/png`, renter.headers)).status).toBe(404);

    const b = (await api.post("/api/jobs/submit", { job_type: "llm-inference", params: { prompt: "hi" } }, renter.headers)).body.job.job_id;
    expect((await pickUp(api, provider.key))?.job_id).toBe(b);
    const failed = await api.post("/api/providers/job-result", { api_key: provider.key, job_id: b, success: false, error: "CUDA out of memory" });
    expect(failed.status).toBe(200);
    // A legacy failure that names no one: unattributed, the hold released in full (the documented refund).
    expect(failed.body).toEqual({ success: true, job_id: b, status: "failed", actual_minutes: 0, cost_halala: 0, provider_earned_halala: 0, platform_fee_halala: 0, end_reason: "runtime_error", fault: "unattributed" });
    const gone = await api.get(`/api/jobs/${b}/output`, renter.headers);
    expect(gone.status).toBe(410);
    expect(gone.body).toEqual({ status: "failed", error: "CUDA out of memory", job_id: b });
    expect((await api.get(`/api/jobs/${b}/output/json`, renter.headers)).status).toBe(410);

    const c = (await api.post("/api/jobs/submit", { job_type: "llm-inference", params: { prompt: "hi" } }, renter.headers)).body.job.job_id;
    expect((await pickUp(api, provider.key))?.job_id).toBe(c);
    const viaComplete = await api.post(`/api/jobs/${c}/complete`, { api_key: provider.key, error: "model download failed" });
    expect(viaComplete.body.status).toBe("failed");
    const b2 = await balance(renter.key);
    expect(b2.held_halala).toBe(0);
    expect(b2.balance_halala).toBe(10_000 - 15);

    // /complete with nothing but the key: completed, with no output (404, as the interface says of a job without one).
    const d = (await api.post("/api/jobs/submit", { job_type: "llm-inference", params: { prompt: "hi" } }, renter.headers)).body.job.job_id;
    expect((await pickUp(api, provider.key))?.job_id).toBe(d);
    expect((await api.post(`/api/jobs/${d}/complete`, { api_key: provider.key })).body.status).toBe("completed");
    const none = await api.get(`/api/jobs/${d}/output`, renter.headers);
    expect(none.status).toBe(404);
    expect(none.body.error).toMatch(/no output/);
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("answers an image job's bare string result (its base64 PNG) under `data`, as the spec's image results, and serves it as PNG", async () => {
    const p = await makeProvider(srv);
    const r = await makeRenter(srv, 100_000);
    const s = await api.post("/api/jobs/submit", { job_type: "image_generation", duration_minutes: 1 }, r.headers);
    expect(s.status, s.text).toBe(201);
    const jobId = s.body.job.job_id;
    await pickUp(api, p.key);
    const png = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0, 0, 0, 0]).toString("base64");
    const done = await api.post("/api/providers/job-result", { api_key: p.key, job_id: jobId, success: true, result: png });
    expect(done.status, done.text).toBe(200);
    const out = await api.get(`/api/jobs/${jobId}/output`, r.headers);
    expect(out.status).toBe(200);
    expect(out.body).toMatchObject({ data: png, job_id: jobId, status: "completed" });
    expect(out.body.response).toBeUndefined();
    const raw = await fetch(`${srv.url}/api/jobs/${jobId}/output/png`, { headers: r.headers });
    expect(raw.status).toBe(200);
    expect(Buffer.from(await raw.arrayBuffer()).toString("base64")).toBe(png);
  });

  it("stores the endpoint of a serving job", async () => {
    const renter = await makeRenter(srv, 10_000);
    const provider = await makeProvider(srv);
    const id = (await api.post("/api/jobs/submit", { job_type: "vllm_serve", params: { model: "mistralai/Mistral-7B-Instruct-v0.3" } }, renter.headers)).body.job.job_id;
    // A report on a job the provider has not polled is refused (an earlier attempt's run, test/jobs/attempt-handout.test.ts).
    expect((await api.post(`/api/jobs/${id}/endpoint-ready`, { api_key: provider.key, endpoint_url: "https://node-7.example.com:8000/v1" })).status).toBe(409);
    expect((await pickUp(api, provider.key))?.job_id).toBe(id);
    expect((await api.post(`/api/jobs/${id}/endpoint-ready`, { api_key: provider.key, endpoint_url: "ftp://x" })).status).toBe(400);
    const r = await api.post(`/api/jobs/${id}/endpoint-ready`, { api_key: provider.key, endpoint_url: "https://node-7.example.com:8000/v1" });
    expect(r.status).toBe(200);
    expect(r.body).toEqual({ success: true, job_id: id, endpoint_url: "https://node-7.example.com:8000/v1" });
    // The provider and an admin see the endpoint; the renter reaches the model through /v1 (billed per token).
    expect((await api.get(`/api/jobs/${id}`, provider.headers)).body).toMatchObject({ status: "running", endpoint_url: "https://node-7.example.com:8000/v1" });
    expect((await api.get(`/api/jobs/${id}`, { "x-admin-token": srv.config.adminToken })).body.endpoint_url).toBe("https://node-7.example.com:8000/v1");
    const job = await api.get(`/api/jobs/${id}`, renter.headers);
    expect(job.body).toMatchObject({ status: "running", endpoint_url: null });
    const listed = await api.get("/api/jobs?status=running", renter.headers);
    expect(listed.body.jobs.find((j: { job_id: string }) => j.job_id === id).endpoint_url).toBeNull();
    expect(JSON.stringify((await api.post(`/api/jobs/${id}/cancel`, {}, renter.headers)).body)).not.toContain("node-7.example.com");
  });
});

describe("reads", () => {
  it("lets the owner, the assigned provider and an admin read; others get 403, unknown 404", async () => {
    const owner = await makeRenter(srv, 10_000);
    const stranger = await makeRenter(srv, 0);
    const provider = await makeProvider(srv);
    const outsider = await makeProvider(srv, { online: false });
    const id = (await api.post("/api/jobs/submit", { job_type: "benchmark" }, owner.headers)).body.job.job_id;
    for (const path of [`/api/jobs/${id}`, `/api/jobs/${id}/output`, `/api/jobs/${id}/logs`, `/api/jobs/${id}/history`]) {
      expect([200, 202]).toContain((await api.get(path, owner.headers)).status);
      expect([200, 202]).toContain((await api.get(path, provider.headers)).status);
      expect([200, 202]).toContain((await api.get(path, { "x-admin-token": srv.config.adminToken })).status);
      expect((await api.get(path, stranger.headers)).status).toBe(403);
      expect((await api.get(path, outsider.headers)).status).toBe(403);
    }
    expect((await api.get("/api/jobs/job-nope", owner.headers)).status).toBe(404);
    expect((await api.get("/api/jobs/job-nope/output", owner.headers)).status).toBe(404);
    expect((await api.get(`/api/jobs/${id}/logs?attempt=2`, owner.headers)).status).toBe(404);
    expect((await api.get(`/api/jobs/${id}/logs?attempt=0`, owner.headers)).status).toBe(400);
  });

  it("lists the caller's jobs, newest first, paginated and filtered by status", async () => {
    const renter = await makeRenter(srv, 10_000);
    const provider = await makeProvider(srv);
    const ids: string[] = [];
    for (let i = 0; i < 3; i++) ids.push((await api.post("/api/jobs/submit", { job_type: "benchmark" }, renter.headers)).body.job.job_id);
    await api.post(`/api/jobs/${ids[0]}/cancel`, {}, renter.headers);
    const all = await api.get("/api/jobs?limit=2", renter.headers);
    expect(all.status).toBe(200);
    expect(all.body.total).toBe(3);
    expect(all.body.jobs.map((j: { job_id: string }) => j.job_id)).toEqual([ids[2], ids[1]]);
    const next = await api.get("/api/jobs?limit=2&offset=2", renter.headers);
    expect(next.body.jobs.map((j: { job_id: string }) => j.job_id)).toEqual([ids[0]]);
    const cancelled = await api.get("/api/jobs?status=cancelled", renter.headers);
    expect(cancelled.body.jobs.map((j: { job_id: string }) => j.job_id)).toEqual([ids[0]]);
    expect((await api.get("/api/jobs?status=lost", renter.headers)).status).toBe(400);
    // One GPU: the first job ran there, was cancelled, and the next one moved up at once.
    const mine = await api.get("/api/jobs", provider.headers);
    expect(mine.body.jobs.map((j: { job_id: string; status: string }) => [j.job_id, j.status])).toEqual([[ids[1], "pending"], [ids[0], "cancelled"]]);
    expect((await api.get(`/api/jobs/${ids[2]}`, renter.headers)).body).toMatchObject({ status: "queued", queue_reason_code: "providers_busy" });
    expect((await api.get("/api/jobs", (await makeRenter(srv, 0)).headers)).body).toMatchObject({ jobs: [], total: 0 });
  });
});
