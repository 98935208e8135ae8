// Submit quotas (429, nothing held), templates at submit, renter webhooks
// queued with each terminal move, and the admin re-queue of a job, over HTTP.
import { beforeEach, describe, expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import { admin, clearMarketplace, pickUp } from "./helpers.js";

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0" });
const api = client(srv);
beforeEach(() => clearMarketplace(srv));

const balance = async (key: string) => (await api.get("/api/renters/balance", { "x-renter-key": key })).body;

describe("quotas at submit", () => {
  it("answers 429 past the daily job count or the monthly spend, holding nothing", async () => {
    const renter = await makeRenter(srv, 100_000);
    const provider = await makeProvider(srv);
    await srv.sql`UPDATE providers SET gpu_count = 10, approved_gpu_count = 10 WHERE id = ${provider.id}`;
    await srv.sql`UPDATE renter_quota SET daily_jobs_limit = 2, monthly_spend_limit_halala = 350 WHERE renter_id = ${renter.id}`;
    expect((await api.post("/api/jobs/submit", { job_type: "benchmark" }, renter.headers)).status).toBe(201);
    const spend = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 26 }, renter.headers);
    expect(spend.status).toBe(429);
    expect(spend.body.error).toMatch(/monthly_spend_limit_halala/);
    expect((await api.post("/api/jobs/submit", { job_type: "benchmark" }, renter.headers)).status).toBe(201);
    const daily = await api.post("/api/jobs/submit", { job_type: "benchmark" }, renter.headers);
    expect(daily.status).toBe(429);
    expect(daily.body.error).toMatch(/daily_jobs_limit/);
    expect(await balance(renter.key)).toMatchObject({ held_halala: 200, total_jobs: 2 });
  });
});

describe("admin re-queue", () => {
  it("moves a running job to a new attempt elsewhere; refuses finished jobs", async () => {
    const renter = await makeRenter(srv, 10_000);
    const first = await makeProvider(srv);
    const job = (await api.post("/api/jobs/submit", { job_type: "benchmark" }, renter.headers)).body.job.job_id;
    await api.get(`/api/providers/${first.key}/jobs`);
    await srv.sql`UPDATE providers SET is_paused = true WHERE id = ${first.id}`;
    const second = await makeProvider(srv);
    const r = await api.post(`/api/admin/jobs/${job}/requeue`, { reason: "stuck" }, admin(srv));
    expect(r.status).toBe(200);
    expect(r.body).toMatchObject({ job_id: job, status: "pending", provider_id: second.id, attempt: 2 });
    const hist = (await api.get(`/api/jobs/${job}/history`, renter.headers)).body.attempts;
    expect(hist[0]).toMatchObject({ attempt: 1, provider_id: first.id, status: "requeued", end_reason: "admin_requeued", fault: "platform" });
    expect((await api.post(`/api/admin/jobs/${job}/requeue`, {}, renter.headers)).status).toBe(401);
    await api.post(`/api/jobs/${job}/cancel`, {}, renter.headers);
    expect((await api.post(`/api/admin/jobs/${job}/requeue`, {}, admin(srv))).status).toBe(409);
    expect(await balance(renter.key)).toMatchObject({ held_halala: 0, balance_halala: 10_000 });
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });
});

describe("templates and webhooks", () => {
  it("submits from a template: its job type, image and minimum VRAM", async () => {
    const renter = await makeRenter(srv, 10_000);
    await makeProvider(srv, { vramMib: 8192 });
    const big = await makeProvider(srv, { vramMib: 24564 });
    const r = await api.post("/api/jobs/submit", { template_id: "llm-inference", params: { prompt: "hi" } }, renter.headers);
    expect(r.status).toBe(201);
    expect(r.body.job).toMatchObject({ job_type: "llm-inference", provider_id: big.id, gpu_requirements: { min_vram_gb: 16 } });
    expect(r.body.job.container_spec.image).toBe("huggingface/transformers-pytorch-gpu:4.41.3"); // its job type's default image
    expect((await api.post("/api/jobs/submit", { template_id: "nope" }, renter.headers)).status).toBe(404);
    expect((await api.post("/api/jobs/submit", { template_id: "llm-inference", job_type: "benchmark" }, renter.headers)).status).toBe(400);
  });

  it("queues a renter webhook in the same transaction as completed, failed and cancelled", async () => {
    const renter = await makeRenter(srv, 10_000);
    const provider = await makeProvider(srv);
    await srv.sql`UPDATE providers SET gpu_count = 3, approved_gpu_count = 3 WHERE id = ${provider.id}`;
    await srv.sql`UPDATE renters SET webhook_url = 'https://hooks.example.com/svc' WHERE id = ${renter.id}`;
    const ids: string[] = [];
    for (let i = 0; i < 3; i++) ids.push((await api.post("/api/jobs/submit", { job_type: "benchmark" }, renter.headers)).body.job.job_id);
    for (const id of ids.slice(0, 2)) expect((await pickUp(api, provider.key))?.job_id).toBe(id);
    await api.post("/api/providers/job-result", { api_key: provider.key, job_id: ids[0], success: true, result: {} });
    await api.post("/api/providers/job-result", { api_key: provider.key, job_id: ids[1], success: false, error: "boom" });
    await api.post(`/api/jobs/${ids[2]}/cancel`, {}, renter.headers);
    await api.post("/api/providers/job-result", { api_key: provider.key, job_id: ids[0], success: true, result: {} }); // repeat: no second event
    const events = await srv.sql<{ event: string; body: string }[]>`SELECT event, body FROM webhook_outbox WHERE renter_id = ${renter.id} ORDER BY id`;
    expect(events.map((e) => [e.event, JSON.parse(e.body).data.job_id])).toEqual([
      ["job.completed", ids[0]],
      ["job.failed", ids[1]],
      ["job.cancelled", ids[2]],
    ]);
    expect(JSON.parse(events[0].body).data).toMatchObject({ status: "completed", actual_cost_halala: 10, cost_halala: 100 });
  });
});
