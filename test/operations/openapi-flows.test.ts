// The OpenAPI document (GET /api/openapi.json) against a real server's answers
// along the ways clients use it: providers coming online, jobs that succeed,
// fail, are cancelled or serve an endpoint, payments, admin reads and failures.
// Every answer must have a documented status and validate against its schema.
import { beforeAll, describe, expect, it } from "vitest";
import { Ajv2020 } from "ajv/dist/2020.js";
import { client, uniqueEmail, type Reply } from "../helpers/http.js";
import { ADMIN_TOKEN, useTestServer } from "../helpers/server.js";

const srv = useTestServer();
const api = client(srv);
let doc: any;
const ajv = new Ajv2020({ strict: false, validateFormats: false, allErrors: true });

beforeAll(async () => {
  const r = await api.get("/api/openapi.json");
  doc = r.body;
  ajv.addSchema({ $id: "https://svc.invalid/openapi.json", components: doc.components });
});

/** The documented operation of a concrete method + path. */
function opOf(method: string, path: string): { template: string; op: any } | undefined {
  const p = path.split("?")[0];
  let best: { template: string; op: any; lit: number } | undefined;
  for (const [template, ops] of Object.entries<any>(doc.paths)) {
    const re = new RegExp("^" + template.replace(/\{\w+\}/g, "[^/]+") + "$");
    if (!re.test(p) || !ops[method.toLowerCase()]) continue;
    const lit = template.split("/").filter((s) => s && !s.startsWith("{")).length;
    if (!best || lit > best.lit) best = { template, op: ops[method.toLowerCase()], lit };
  }
  return best;
}

/** Every way the answer departs from what the document declares for it. */
function mismatches(method: string, path: string, reply: Reply): string[] {
  const found = opOf(method, path);
  if (!found) return [`${method} ${path}: not in the document`];
  const { template, op } = found;
  const at = `${method} ${template} -> ${reply.status}`;
  const out: string[] = [];
  let res = op.responses[String(reply.status)];
  if (!res && reply.status < 300 && op.responses["2XX"]) res = op.responses["2XX"];
  if (!res && reply.status < 300) out.push(`${at}: success status not declared (declares ${Object.keys(op.responses)})`);
  res ??= op.responses.default;
  if (res.$ref) res = doc.components.responses[res.$ref.split("/").pop()];
  const ct = reply.headers.get("content-type") ?? "";
  const media = res.content?.["application/json"];
  if (media) {
    if (!ct.startsWith("application/json")) {
      out.push(`${at}: declared application/json, got ${ct}`);
      return out;
    }
    const ref = media.schema.$ref as string;
    const validate = ajv.getSchema(`https://svc.invalid/openapi.json${ref}`)!;
    if (!validate(reply.body)) out.push(`${at}: ${ajv.errorsText(validate.errors, { separator: "; " })} :: ${reply.text.slice(0, 300)}`);
  } else if (ct.startsWith("application/json") && res.content && !res.content["*/*"]) {
    out.push(`${at}: JSON answered where ${Object.keys(res.content)} declared`);
  }
  return out;
}

const seen: string[] = [];
async function call(method: string, path: string, body?: unknown, headers: Record<string, string> = {}): Promise<Reply> {
  const r = await api.call(method, path, method === "GET" ? undefined : (body ?? {}), headers);
  seen.push(...mismatches(method, path, r));
  return r;
}
const admin = { "x-admin-token": ADMIN_TOKEN };

const GPU_STATUS = {
  gpu_name: "NVIDIA GeForce RTX 4090",
  gpu_vram_mib: 24564,
  driver_version: "550.54.14",
  gpu_util_pct: 3.5,
  temp_c: 41,
  power_w: 35.2,
  free_vram_mib: 23000,
  daemon_version: "5.5.0",
  python_version: "3.11.7",
  os_info: "Linux 6.5.0",
  compute_capability: "8.9",
  cuda_version: "12.4",
  gpu_count: 1,
  all_gpus: [{ index: 0, name: "NVIDIA GeForce RTX 4090", vram_mib: 24564 }],
};

async function newProvider(approve = true) {
  const email = uniqueEmail("oa-p");
  const r = await call("POST", "/api/providers/register", {
    name: "Rig", email, gpu_model: "NVIDIA GeForce RTX 4090", os: "linux", phone: "+966500000000", resource_spec: { cpu_count: 16, ram_gb: 64 },
  });
  expect(r.status, r.text).toBe(200);
  const p = { id: r.body.provider_id as number, key: r.body.api_key as string, email };
  if (approve) {
    const a = await call("POST", `/api/admin/providers/${p.id}/approve`, { reason: "ok" }, admin);
    expect(a.status, a.text).toBe(200);
  }
  return p;
}
async function beat(key: string, extra: Record<string, unknown> = {}) {
  return call("POST", "/api/providers/heartbeat", {
    api_key: key, gpu_status: GPU_STATUS, uptime: 1234.5, provider_ip: "10.0.0.5", provider_hostname: "rig-1",
    cached_models: ["meta-llama/Llama-3-8B"], resource_spec: { cpu_count: 16, ram_gb: 64 }, ...extra,
  });
}
async function newRenter(fund = 100_000) {
  const email = uniqueEmail("oa-r");
  const r = await call("POST", "/api/renters/register", { name: "Lab", email, organization: "Org", use_case: "llm", phone: null });
  expect(r.status, r.text).toBe(201);
  const rt = { id: r.body.renter_id as number, key: r.body.api_key as string, email, h: { "x-renter-key": r.body.api_key as string } };
  if (fund) {
    const t = await call("POST", "/api/renters/topup", { amount_halala: fund }, rt.h);
    expect(t.status, t.text).toBe(200);
  }
  return rt;
}

describe("realistic flows validate against the document", () => {
  it("walks providers, renters, jobs (success, failure, cancel), payments and admin reads", async () => {
    const p = await newProvider();
    const pq = `key=${encodeURIComponent(p.key)}`;
    await call("POST", "/api/providers/login-email", { email: p.email });
    await call("GET", `/api/providers/me?${pq}`);
    const hb = await beat(p.key);
    expect(hb.status, hb.text).toBe(200);
    await call("POST", "/api/providers/readiness", { api_key: p.key, daemon_version: "5.5.0", checks: { cuda: true, pytorch: true, vram_gb: 24, driver: "550.54.14" } });
    await call("POST", "/api/providers/daemon-event", {
      api_key: p.key, event_type: "startup", severity: "info", daemon_version: "5.5.0", timestamp: new Date().toISOString(),
      hostname: "rig-1", os_info: "Linux", python_version: "3.11", details: "started", job_id: null,
    });
    await call("POST", "/api/providers/preferences", { key: p.key, run_mode: "scheduled", scheduled_start: "08:00", scheduled_end: "20:00", gpu_usage_cap_pct: 80, vram_reserve_gb: 2.5, temp_limit_c: 85 });
    await call("POST", "/api/providers/preferences", { key: p.key, run_mode: "always-on" });
    await call("POST", "/api/providers/pause", { key: p.key });
    await call("POST", "/api/providers/resume", { key: p.key });
    await beat(p.key);
    await call("GET", `/api/providers/status/${p.key}`);
    await call("GET", `/api/providers/${p.key}/jobs`);
    await call("GET", `/api/providers/earnings?${pq}&days=7`);
    await call("GET", `/api/providers/download/daemon?${pq}&check_only=true`);
    await call("GET", "/api/providers/marketplace");
    await call("GET", "/api/renters/available-providers");
    await call("GET", "/api/job-types");
    await call("GET", "/api/job-types/llm-inference/estimate?duration_minutes=5");
    await call("GET", "/api/templates");
    await call("GET", "/api/registry/images");
    await call("GET", "/api/receipts/keys");

    const r = await newRenter();
    await call("GET", "/api/renters/me", undefined, r.h);
    await call("GET", `/api/renters/me?key=${encodeURIComponent(r.key)}`);
    await call("PATCH", "/api/renters/me", { organization: "Org2", webhook_url: "https://example.com/hook" }, r.h);
    await call("GET", "/api/renters/balance", undefined, r.h);
    await call("POST", "/api/renters/topup", { amount_sar: 12.5 }, r.h);
    await call("POST", "/api/renters/login-email", { email: r.email });
    await call("GET", "/api/renters/usage?days=7", undefined, r.h);

    // An llm job: submitted, polled, progress, logs, result, output, receipt.
    const s = await call("POST", "/api/jobs/submit", {
      job_type: "llm-inference", duration_minutes: 2, params: { prompt: "hi", max_tokens: 64, temperature: 0.7 }, priority: 1, max_duration_seconds: 600, gpu_requirements: { min_vram_gb: 16 },
    }, r.h);
    expect(s.status, s.text).toBe(201);
    const jobId = s.body.job.job_id as string;
    await call("GET", `/api/jobs/${jobId}`, undefined, r.h);
    await call("GET", `/api/jobs/${jobId}/output`, undefined, r.h);
    const poll = await call("GET", `/api/providers/${p.key}/jobs`);
    expect(poll.body.job?.job_id).toBe(jobId);
    await call("POST", `/api/jobs/${jobId}/preparing`, { api_key: p.key, detail: "pulling image" });
    await call("POST", `/api/jobs/${jobId}/progress`, { api_key: p.key, progress_pct: 40, phase: "generating" });
    await call("POST", `/api/jobs/${jobId}/logs`, { api_key: p.key, logs: ["line 1", "line 2"] });
    await call("GET", `/api/jobs/${jobId}/output`, undefined, r.h);
    await call("GET", `/api/jobs/${jobId}/logs`, undefined, r.h);
    await call("GET", `/api/jobs/${jobId}/logs?attempt=1`, undefined, r.h);
    await call("GET", `/api/jobs/${jobId}/history`, undefined, r.h);
    await call("GET", `/api/jobs/${jobId}`, undefined, { "x-provider-key": p.key });
    await call("GET", `/api/providers/me?${pq}`);
    const done = await call("POST", "/api/providers/job-result", { api_key: p.key, job_id: jobId, success: true, result: { response: "hello", tokens: 12 }, error: null, metrics: { tokens_per_sec: 40 } });
    expect(done.status, done.text).toBe(200);
    await call("GET", `/api/jobs/${jobId}`, undefined, r.h);
    await call("GET", `/api/jobs/${jobId}/output`, undefined, r.h);
    await call("GET", `/api/jobs/${jobId}/output/json`, undefined, r.h);
    await call("GET", `/api/jobs/${jobId}/receipt`, undefined, r.h);
    await call("GET", `/api/jobs?status=completed`, undefined, r.h);
    await call("GET", `/api/jobs`, undefined, { "x-provider-key": p.key });

    // A job that fails: 410 on output.
    await beat(p.key);
    const s2 = await call("POST", "/api/jobs/submit", { job_type: "image_generation", duration_minutes: 1, params: { prompt: "cat", steps: 20, width: 512, height: 512, seed: 1 } }, r.h);
    expect(s2.status, s2.text).toBe(201);
    const job2 = s2.body.job.job_id as string;
    await call("GET", `/api/providers/${p.key}/jobs`);
    await call("POST", "/api/providers/job-result", { api_key: p.key, job_id: job2, success: false, error: "CUDA out of memory" });
    await call("GET", `/api/jobs/${job2}/output`, undefined, r.h);
    await call("GET", `/api/jobs/${job2}`, undefined, r.h);

    // A job cancelled by its renter.
    await beat(p.key);
    const s3 = await call("POST", "/api/jobs/submit", { job_type: "benchmark", duration_minutes: 1 }, r.h);
    expect(s3.status, s3.text).toBe(201);
    await call("POST", `/api/jobs/${s3.body.job.job_id}/cancel`, { reason: "changed my mind" }, r.h);
    await call("GET", `/api/jobs/${s3.body.job.job_id}/output`, undefined, r.h);

    // vllm endpoint-ready and complete.
    await beat(p.key);
    const s4 = await call("POST", "/api/jobs/submit", { job_type: "custom_container", duration_minutes: 1, container_spec: { image_type: "custom", image: "pytorch/pytorch:latest" } }, r.h);
    if (s4.status === 201) {
      const j4 = s4.body.job.job_id;
      await call("GET", `/api/providers/${p.key}/jobs`);
      await call("POST", `/api/jobs/${j4}/endpoint-ready`, { api_key: p.key, endpoint_url: "http://10.0.0.5:8000/v1" });
      await call("POST", `/api/jobs/${j4}/complete`, { api_key: p.key, response: "ok" });
      await call("GET", `/api/jobs/${j4}`, undefined, r.h);
    }
    // queued job (no provider online)
    await call("POST", "/api/providers/pause", { key: p.key });
    await call("POST", "/api/jobs/submit", { job_type: "training", duration_minutes: 1 }, r.h);

    // payments
    const pay = await call("POST", "/api/payments/topup", { amount_halala: 5000, source_type: "sandbox", description: "top up" }, r.h);
    if (pay.status === 201) {
      await call("POST", `/api/payments/${pay.body.payment.payment_id}/sandbox-confirm`, { outcome: "paid" }, r.h);
      await call("GET", `/api/payments/${pay.body.payment.payment_id}`, undefined, r.h);
    }
    await call("GET", "/api/payments/history", undefined, r.h);

    // admin reads
    for (const path of [
      "/api/admin/dashboard", "/api/admin/providers", `/api/admin/providers/${p.id}`, `/api/admin/providers/${p.id}/events`,
      "/api/admin/renters", `/api/admin/renters/${r.id}`, "/api/admin/jobs", "/api/admin/payments", "/api/admin/audit",
      "/api/admin/ledger/audit", "/api/admin/daily", "/api/registry/requests",
    ]) await call("GET", path, undefined, admin);
    await call("POST", `/api/admin/providers/${p.id}/preload-model`, { model_name: "meta-llama/Llama-3-8B" }, admin);
    await call("POST", "/api/providers/resume", { key: p.key });
    await beat(p.key);
    await call("GET", `/api/providers/me?${pq}`);
    await call("POST", `/api/admin/renters/${r.id}/adjust-balance`, { amount_halala: 100, reason: "goodwill" }, admin);
    await call("PUT", `/api/admin/renters/${r.id}/quota`, { daily_jobs_limit: 50, monthly_spend_limit_halala: 1_000_000 }, admin);

    // error answers
    await call("GET", "/api/jobs/job-doesnotexist", undefined, r.h);
    await call("GET", "/api/renters/me");
    await call("POST", "/api/jobs/submit", { job_type: "nope", duration_minutes: 1 }, r.h);
    await call("POST", "/api/providers/heartbeat", { api_key: "svc-provider-bogus" });
    await call("POST", "/api/renters/register", "{not json", {});

    await call("POST", "/api/renters/rotate-key", {}, r.h);
    expect(seen).toEqual([]);
  }, 120_000);
});
