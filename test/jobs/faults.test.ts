// Fault-attributed job endings over both daemon wires (the legacy JSON
// job-result and the gRPC stream): each end reason records its fault on the
// job and the attempt, and money, dispatch and reliability follow it in the
// settlement transaction. Every job is a benchmark (10 halala a minute)
// submitted for 3 minutes (30 held) that "ran" 90 s (started_at moved back):
// 2 billable minutes = 20 halala when the renter pays for the time used.
import { afterAll, beforeEach, describe, expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import { refreshReputation } from "../../src/domain/providers/reputation.js";
import { TIMEOUT_REPORT_SLACK_SECONDS } from "../../src/domain/shared/job-end.js";
import type { JobResultResponse } from "../../gen/svc/v1/jobs_pb.js";
import { openStream, type TestStream } from "../daemon/grpc-stream.js";
import { waitFor } from "../daemon/helpers.js";
import { admin, clearMarketplace, pickUp } from "./helpers.js";

const streams: TestStream[] = [];

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0", SVC_JOB_MAX_ATTEMPTS: "3" });
const api = client(srv);
afterAll(() => {
  for (const s of streams) s.cancel();
});
beforeEach(async () => {
  for (const s of streams.splice(0)) s.cancel();
  await clearMarketplace(srv);
});

type Renter = Awaited<ReturnType<typeof makeRenter>>;
type Provider = Awaited<ReturnType<typeof makeProvider>>;
type Wire = "legacy" | "stream";

interface Failure {
  success?: boolean;
  error?: string;
  fault?: string;
  end_reason?: string;
}

/** A provider speaking one wire: picks jobs up and reports their end. */
interface Daemon {
  provider: Provider;
  start(jobId: string): Promise<void>;
  report(jobId: string, r: Failure): Promise<{ status: number; body: Record<string, unknown> }>;
  refuse(jobId: string, endReason: string): Promise<void>;
  /** Reports a serving job's endpoint (endpoint-ready). */
  endpoint(jobId: string, url: string): Promise<void>;
}

const jobRow = async (jobId: string) => (await srv.sql`SELECT * FROM jobs WHERE job_id = ${jobId}`)[0];
const attempts = async (jobId: string) =>
  srv.sql`SELECT a.* FROM job_attempts a JOIN jobs j ON j.id = a.job_id WHERE j.job_id = ${jobId} ORDER BY a.attempt`;
const balance = async (r: Renter) => (await api.get("/api/renters/balance", r.headers)).body;
/** As if the job had been running for `seconds` (no wall-clock wait): its start and deadline moved back together. */
const ranFor = (jobId: string, seconds: number) =>
  srv.sql`UPDATE jobs SET started_at = now() - make_interval(secs => ${seconds}),
                          timeout_at = now() - make_interval(secs => ${seconds}) + make_interval(secs => max_duration_seconds)
          WHERE job_id = ${jobId}`;

async function daemon(wire: Wire): Promise<Daemon> {
  const provider = await makeProvider(srv);
  // A record long enough that the score moves only with the job's fault.
  await srv.sql`UPDATE providers SET first_heartbeat_at = now() - interval '40 days' WHERE id = ${provider.id}`;
  if (wire === "legacy") {
    return {
      provider,
      async start(jobId) {
        expect((await pickUp(api, provider.key))?.job_id).toBe(jobId);
      },
      async report(jobId, r) {
        const res = await api.post("/api/providers/job-result", { api_key: provider.key, job_id: jobId, success: false, ...r });
        return { status: res.status, body: res.body };
      },
      async refuse(jobId, endReason) {
        const res = await api.post("/api/providers/job-result", { api_key: provider.key, job_id: jobId, success: false, error: "refused", end_reason: endReason });
        expect(res.status, res.text).toBe(200);
      },
      async endpoint(jobId, url) {
        const res = await api.post(`/api/jobs/${jobId}/endpoint-ready`, { api_key: provider.key, endpoint_url: url });
        expect(res.status, res.text).toBe(200);
      },
    };
  }
  const s = openStream(srv.port, provider.key);
  streams.push(s);
  const answered = new Set<unknown>();
  s.send({ case: "hello", value: { daemonVersion: "3.2.0", runningJobIds: [], gpus: [{ name: "NVIDIA GeForce RTX 4090", vram_mib: 24564 }] } });
  await s.next("welcome");
  return {
    provider,
    async start(jobId) {
      expect((await s.next("job")).jobId).toBe(jobId);
      s.send({ case: "jobAccepted", value: { jobId } });
      await waitFor(async () => (await jobRow(jobId)).status === "running", 5_000, "running");
    },
    async report(jobId, r) {
      s.send({ case: "result", value: { jobId, success: r.success ?? false, error: r.error, fault: r.fault, endReason: r.end_reason } });
      // The answer: a result_ack, or an error naming the refused report.
      const k = await waitFor(async () => {
        const m = s.received.find((x) => (x.kind.case === "resultAck" || x.kind.case === "error") && !answered.has(x));
        if (m) answered.add(m);
        return m?.kind;
      }, 5_000, "result answer");
      if (k.case === "error") return { status: k.value.code === "invalid_argument" ? 400 : 409, body: { error: k.value.message } };
      const m = k.value as JobResultResponse;
      return { status: 200, body: { status: m.status, cost_halala: Number(m.costHalala), end_reason: m.endReason, fault: m.fault } };
    },
    async refuse(jobId, endReason) {
      expect((await s.next("job")).jobId).toBe(jobId);
      s.send({ case: "jobRejected", value: { jobId, reason: "refused", endReason } });
      await waitFor(async () => (await attempts(jobId))[0]?.ended_at, 5_000, "refusal");
    },
    async endpoint(jobId, url) {
      s.send({ case: "endpointReady", value: { jobId, endpointUrl: url } });
      await waitFor(async () => (await jobRow(jobId)).endpoint_url === url, 5_000, "endpoint");
    },
  };
}

async function submit(renter: Renter, body: Record<string, unknown> = {}) {
  const r = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 3, ...body }, renter.headers);
  expect(r.status, r.text).toBe(201);
  return r.body.job.job_id as string;
}

/** A job running on `d` for 90 s. */
async function running(d: Daemon, renter: Renter, body: Record<string, unknown> = {}) {
  const jobId = await submit(renter, body);
  await d.start(jobId);
  await ranFor(jobId, 90);
  return jobId;
}

const reliability = async (id: number) => {
  await refreshReputation(srv.sql, [id]);
  return Number((await srv.sql`SELECT reliability_score FROM providers WHERE id = ${id}`)[0].reliability_score);
};

describe.each(["legacy", "stream"] as const)("job endings over the %s wire", (wire) => {
  it("completed: fault none, the time used billed 75/25", async () => {
    const renter = await makeRenter(srv, 1_000);
    const d = await daemon(wire);
    const jobId = await running(d, renter);
    const r = await d.report(jobId, { success: true });
    expect(r).toMatchObject({ status: 200, body: { status: "completed", cost_halala: 20, end_reason: "completed", fault: "none" } });
    expect((await api.get(`/api/jobs/${jobId}`, renter.headers)).body).toMatchObject({ end_reason: "completed", fault: "none", actual_cost_halala: 20 });
    expect(await balance(renter)).toMatchObject({ balance_halala: 980, held_halala: 0 });
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it.each([
    { name: "runtime_error", reason: "runtime_error", report: { error: "ValueError: bad prompt", fault: "renter" }, body: {} },
    // It ran 90 s: past its max_duration_seconds of 61 (billed up to it: 2 minutes), and within the slack of one a little above 90.
    { name: "timeout past max_duration_seconds", reason: "timeout", report: { error: "max_duration_seconds exceeded; killed", end_reason: "timeout" }, body: { max_duration_seconds: 61 } },
    {
      name: "timeout a little before max_duration_seconds (the daemons' clocks)",
      reason: "timeout",
      report: { error: "max_duration_seconds exceeded; killed", end_reason: "timeout", fault: "renter" },
      body: { max_duration_seconds: 90 + TIMEOUT_REPORT_SLACK_SECONDS - 5 },
    },
  ])("$name: the renter's fault after it ran, so the time used is billed (20 of 30), the provider paid, not docked", async ({ reason, report, body }) => {
    const renter = await makeRenter(srv, 1_000);
    const d = await daemon(wire);
    const before = await reliability(d.provider.id);
    const jobId = await running(d, renter, body);
    const r = await d.report(jobId, report);
    expect(r).toMatchObject({ status: 200, body: { status: "failed", cost_halala: 20, end_reason: reason, fault: "renter" } });
    const job = (await api.get(`/api/jobs/${jobId}`, renter.headers)).body;
    expect(job).toMatchObject({ status: "failed", end_reason: reason, fault: "renter", actual_cost_halala: 20, provider_earned_halala: 15, platform_fee_halala: 5 });
    expect((await api.get(`/api/jobs/${jobId}/history`, renter.headers)).body.attempts).toEqual([
      expect.objectContaining({ status: "failed", end_reason: reason, fault: "renter", cost_halala: 20 }),
    ]);
    expect(await balance(renter)).toMatchObject({ balance_halala: 980, held_halala: 0, total_spent_halala: 20 });
    expect((await api.get(`/api/providers/me?key=${d.provider.key}`)).body.provider.total_earnings_halala).toBe(15);
    expect(await reliability(d.provider.id)).toBeGreaterThanOrEqual(before);
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("a failure that names no one: unattributed, the hold released in full", async () => {
    const renter = await makeRenter(srv, 1_000);
    const d = await daemon(wire);
    const jobId = await running(d, renter);
    const r = await d.report(jobId, { error: "CUDA error" });
    expect(r).toMatchObject({ status: 200, body: { status: "failed", cost_halala: 0, end_reason: "runtime_error", fault: "unattributed" } });
    expect(await jobRow(jobId)).toMatchObject({ status: "failed", fault: "unattributed", actual_cost_halala: 0 });
    expect(await balance(renter)).toMatchObject({ balance_halala: 1_000, held_halala: 0 });
    // A repeat of the same report answers the same figures and moves nothing.
    expect(await d.report(jobId, { error: "CUDA error" })).toMatchObject({ status: 200, body: { fault: "unattributed" } });
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("provider_error: the provider's fault, re-queued to another provider at no charge, nothing earned, reliability docked", async () => {
    const renter = await makeRenter(srv, 1_000);
    const d = await daemon(wire);
    const before = await reliability(d.provider.id);
    const jobId = await running(d, renter);
    const r = await d.report(jobId, { error: "GPU fell off the bus (Xid 79)", fault: "provider" });
    expect(r).toMatchObject({ status: 200, body: { status: "failed", cost_halala: 0, end_reason: "provider_error", fault: "provider" } });
    const other = await makeProvider(srv);
    expect(await jobRow(jobId)).toMatchObject({ status: "queued", attempt: 2, fault: null, end_reason: null });
    const [first] = await attempts(jobId);
    expect(first).toMatchObject({ status: "requeued", end_reason: "provider_error", fault: "provider", cost_halala: 0 });
    // The next provider finishes it: the renter pays that attempt only.
    expect((await api.get(`/api/providers/${other.key}/jobs`)).body.job.job_id).toBe(jobId);
    const done = await api.post("/api/providers/job-result", { api_key: other.key, job_id: jobId, success: true, result: {} });
    expect(done.body).toMatchObject({ status: "completed", cost_halala: 10 });
    expect(await balance(renter)).toMatchObject({ balance_halala: 990, held_halala: 0 });
    expect((await api.get(`/api/providers/me?key=${d.provider.key}`)).body.provider.total_earnings_halala).toBe(0);
    expect(await reliability(d.provider.id)).toBeLessThan(before);
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it.each([
    { name: "at once, of its 1800 s", ran: 0, body: {} },
    { name: "just outside the slack", ran: 90, body: { max_duration_seconds: 90 + TIMEOUT_REPORT_SLACK_SECONDS + 5 } },
  ])("a timeout reported before the job ran its max_duration_seconds ($name) is the provider's failure: re-queued at no charge, docked", async ({ ran, body }) => {
    const renter = await makeRenter(srv, 1_000);
    const d = await daemon(wire);
    const before = await reliability(d.provider.id);
    const jobId = await submit(renter, body);
    await d.start(jobId);
    if (ran > 0) await ranFor(jobId, ran);
    const max = (await jobRow(jobId)).max_duration_seconds;
    const r = await d.report(jobId, { error: "max_duration_seconds exceeded; killed", end_reason: "timeout", fault: "renter" });
    expect(r).toMatchObject({ status: 200, body: { status: "failed", cost_halala: 0, end_reason: "provider_error", fault: "provider" } });
    expect(await jobRow(jobId)).toMatchObject({ status: "queued", attempt: 2, actual_cost_halala: null });
    const [first] = await attempts(jobId);
    expect(first).toMatchObject({ status: "requeued", end_reason: "provider_error", fault: "provider", cost_halala: 0 });
    expect(first.error).toMatch(new RegExp(`the report claimed a timeout after ${ran === 0 ? "[01]" : "9[01]"} s of ${max} s`));
    expect(first.error).toMatch(/the daemon said: max_duration_seconds exceeded; killed/);
    expect(await balance(renter)).toMatchObject({ balance_halala: 1_000, held_halala: 30, total_spent_halala: 0 });
    expect((await api.get(`/api/providers/me?key=${d.provider.key}`)).body.provider.total_earnings_halala).toBe(0);
    expect(await reliability(d.provider.id)).toBeLessThan(before);
    expect(await srv.sql`SELECT 1 FROM job_receipts r JOIN jobs j ON j.id = r.job_id WHERE j.job_id = ${jobId}`).toEqual([]);
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("a vllm_serve job's timeout reported without its endpoint ever reported is the provider's failure; with it, the renter's as before", async () => {
    const renter = await makeRenter(srv, 1_000);
    const d = await daemon(wire);
    const before = await reliability(d.provider.id);
    // Each ran 30 s past its max_duration_seconds. vllm_serve: 20 halala a minute, 60 held. The silent one's limit
    // gave an engine all the time it is given to start (10 minutes): a shorter one is the renter's (time.test.ts).
    const silent = await running(d, renter, { job_type: "vllm_serve", max_duration_seconds: 600 });
    await ranFor(silent, 630);
    const r1 = await d.report(silent, { error: "max_duration_seconds exceeded; killed", end_reason: "timeout" });
    expect(r1).toMatchObject({ status: 200, body: { status: "failed", cost_halala: 0, end_reason: "provider_error", fault: "provider" } });
    expect(await jobRow(silent)).toMatchObject({ status: "queued", attempt: 2 });
    const [first] = await attempts(silent);
    expect(first).toMatchObject({ status: "requeued", end_reason: "provider_error", fault: "provider", cost_halala: 0 });
    expect(first.error).toMatch(/never reported the job's endpoint/);
    expect(await balance(renter)).toMatchObject({ balance_halala: 1_000, held_halala: 60 });
    expect(await reliability(d.provider.id)).toBeLessThan(before);

    const served = await submit(renter, { job_type: "vllm_serve", max_duration_seconds: 61 }); // billed up to its limit: 2 minutes
    await d.start(served);
    await d.endpoint(served, "http://203.0.113.7:8000");
    await ranFor(served, 90);
    const r2 = await d.report(served, { error: "max_duration_seconds exceeded; killed", end_reason: "timeout" });
    expect(r2).toMatchObject({ status: 200, body: { status: "failed", cost_halala: 40, end_reason: "timeout", fault: "renter" } });
    expect(await jobRow(served)).toMatchObject({ status: "failed", end_reason: "timeout", fault: "renter", actual_cost_halala: 40, provider_earned_halala: 30 });
  });

  it("a vllm_serve job's success reported without its endpoint ever reported is the provider's failure; with it, completed and billed as before", async () => {
    const renter = await makeRenter(srv, 1_000);
    const d = await daemon(wire);
    const before = await reliability(d.provider.id);
    // Both ran 90 s of the 3 minutes held (vllm_serve: 20 halala a minute, 60 held): 2 minutes, 40, when billed.
    const silent = await running(d, renter, { job_type: "vllm_serve" });
    expect((await api.get(`/api/jobs/${silent}`, renter.headers)).body.running_cost_halala).toBe(0);
    const r1 = await d.report(silent, { success: true });
    expect(r1).toMatchObject({ status: 200, body: { status: "failed", cost_halala: 0, end_reason: "provider_error", fault: "provider" } });
    expect(await jobRow(silent)).toMatchObject({ status: "queued", attempt: 2, actual_cost_halala: null });
    const [first] = await attempts(silent);
    expect(first).toMatchObject({ status: "requeued", end_reason: "provider_error", fault: "provider", cost_halala: 0 });
    expect(first.error).toMatch(/claimed success, but the provider never reported the job's endpoint/);
    expect(await balance(renter)).toMatchObject({ balance_halala: 1_000, held_halala: 60, total_spent_halala: 0 });
    expect((await api.get(`/api/providers/me?key=${d.provider.key}`)).body.provider.total_earnings_halala).toBe(0);
    expect(await reliability(d.provider.id)).toBeLessThan(before);

    const served = await submit(renter, { job_type: "vllm_serve" });
    await d.start(served);
    await d.endpoint(served, "http://203.0.113.7:8000");
    await ranFor(served, 90);
    expect((await api.get(`/api/jobs/${served}`, renter.headers)).body.running_cost_halala).toBe(40);
    const r2 = await d.report(served, { success: true });
    expect(r2).toMatchObject({ status: 200, body: { status: "completed", cost_halala: 40, end_reason: "completed", fault: "none" } });
    expect(await jobRow(served)).toMatchObject({ status: "completed", actual_cost_halala: 40, provider_earned_halala: 30, platform_fee_halala: 10 });
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("a vllm_serve job without its endpoint that fails by the renter's fault is charged nothing, the provider neither paid nor docked", async () => {
    const renter = await makeRenter(srv, 1_000);
    const d = await daemon(wire);
    const before = await reliability(d.provider.id);
    const jobId = await running(d, renter, { job_type: "vllm_serve" });
    const r = await d.report(jobId, { error: "model not found on the hub", fault: "renter" });
    expect(r).toMatchObject({ status: 200, body: { status: "failed", cost_halala: 0, end_reason: "runtime_error", fault: "renter" } });
    expect(await jobRow(jobId)).toMatchObject({ status: "failed", end_reason: "runtime_error", fault: "renter", actual_cost_halala: 0, actual_minutes: 0, provider_earned_halala: 0 });
    expect(await balance(renter)).toMatchObject({ balance_halala: 1_000, held_halala: 0, total_spent_halala: 0 });
    expect(await reliability(d.provider.id)).toBe(before);
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("a provider's failure of a job pinned to it fails the job with the fault shown, refunded", async () => {
    const renter = await makeRenter(srv, 1_000);
    const d = await daemon(wire);
    const jobId = await running(d, renter, { provider_id: d.provider.id });
    const r = await d.report(jobId, { error: "out of disk", end_reason: "provider_error" });
    expect(r).toMatchObject({ status: 200, body: { status: "failed", fault: "provider", cost_halala: 0 } });
    const job = (await api.get(`/api/jobs/${jobId}`, renter.headers)).body;
    expect(job).toMatchObject({ status: "failed", end_reason: "provider_error", fault: "provider", actual_cost_halala: 0 });
    expect(job.error).toMatch(/asked for this provider/);
    expect(await balance(renter)).toMatchObject({ balance_halala: 1_000, held_halala: 0 });
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("a daemon's platform fault is the provider's failure: re-queued at no charge, the provider docked", async () => {
    // Only the server records the platform's failures: a daemon's word for one would let a provider drop
    // the jobs it does not want (failed, unpaid) while its reliability stayed as it was.
    const renter = await makeRenter(srv, 1_000);
    const d = await daemon(wire);
    const before = await reliability(d.provider.id);
    for (const report of [{ fault: "platform" }, { end_reason: "platform_error" }]) {
      const jobId = await running(d, renter);
      const r = await d.report(jobId, { error: "the task named a volume the platform never created", ...report });
      expect(r).toMatchObject({ status: 200, body: { status: "failed", cost_halala: 0, end_reason: "provider_error", fault: "provider" } });
      expect(await jobRow(jobId)).toMatchObject({ status: "queued", attempt: 2 });
      const [first] = await attempts(jobId);
      expect(first).toMatchObject({ status: "requeued", end_reason: "provider_error", fault: "provider", cost_halala: 0 });
      expect(first.error).toMatch(/cannot put a failure on the platform.*the daemon said: the task named a volume/);
    }
    expect(await reliability(d.provider.id)).toBeLessThan(before);
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it.each(["signature_mismatch", "unsupported_on_provider"])("%s refusal: the provider's fault, re-queued, never offered to it again", async (reason) => {
    const renter = await makeRenter(srv, 1_000);
    const d = await daemon(wire);
    const jobId = await submit(renter);
    if (wire === "legacy") await d.start(jobId);
    await d.refuse(jobId, reason);
    expect(await attempts(jobId)).toEqual([expect.objectContaining({ status: "requeued", end_reason: reason, fault: "provider", cost_halala: 0 })]);
    expect(await jobRow(jobId)).toMatchObject({ status: "queued", attempt: 2 });
    expect((await api.get(`/api/jobs/${jobId}`, renter.headers)).body.queue_reason_code).toBe("providers_declined");
    expect(await balance(renter)).toMatchObject({ balance_halala: 1_000, held_halala: 30 });
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("refuses an attribution it cannot take, naming the field, and moves nothing", async () => {
    const renter = await makeRenter(srv, 1_000);
    const d = await daemon(wire);
    const jobId = await running(d, renter);
    const bad = await d.report(jobId, { error: "x", fault: "cosmic_rays" });
    expect(bad.status).toBe(400);
    expect(String(bad.body.error)).toMatch(/^fault must be one of renter, provider, platform/);
    const clash = await d.report(jobId, { error: "x", fault: "provider", end_reason: "timeout" });
    expect(clash.status).toBe(400);
    expect(String(clash.body.error)).toMatch(/end_reason timeout/);
    expect(await jobRow(jobId)).toMatchObject({ status: "running" });
    expect(await balance(renter)).toMatchObject({ held_halala: 30 });
  });
});

describe("cancel and the server's own ends", () => {
  it("renter cancel: pending is released in full (fault recorded), running pays the time used; admin cancel refunds in full", async () => {
    const renter = await makeRenter(srv, 1_000);
    const p = await makeProvider(srv);
    await srv.sql`UPDATE providers SET gpu_count = 3, approved_gpu_count = 3 WHERE id = ${p.id}`;
    const pending = await submit(renter);
    const c1 = await api.post(`/api/jobs/${pending}/cancel`, {}, renter.headers);
    expect(c1.body).toMatchObject({ refunded_halala: 30, charged_halala: 0, job: { end_reason: "renter_cancelled", fault: "renter" } });

    const run1 = await submit(renter);
    const run2 = await submit(renter);
    await pickUp(api, p.key);
    await pickUp(api, p.key);
    await ranFor(run1, 90);
    await ranFor(run2, 90);
    const c2 = await api.post(`/api/jobs/${run1}/cancel`, {}, renter.headers);
    expect(c2.body).toMatchObject({ refunded_halala: 10, charged_halala: 20, job: { status: "cancelled", end_reason: "renter_cancelled", fault: "renter", provider_earned_halala: 15 } });
    const c3 = await api.post(`/api/jobs/${run2}/cancel`, { reason: "policy" }, admin(srv));
    expect(c3.body).toMatchObject({ refunded_halala: 30, charged_halala: 0, job: { end_reason: "admin_cancelled", fault: "platform" } });
    expect(await balance(renter)).toMatchObject({ balance_halala: 980, held_halala: 0 });
    // Admin lists show it too.
    const list = (await api.get("/api/admin/jobs?limit=10", admin(srv))).body.jobs;
    expect(list.find((j: { job_id: string }) => j.job_id === run2)).toMatchObject({ end_reason: "admin_cancelled", fault: "platform" });
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("renter cancel of a running vllm_serve job that never reported its endpoint charges nothing; with its endpoint, the time used as before", async () => {
    const renter = await makeRenter(srv, 1_000);
    const p = await makeProvider(srv);
    await srv.sql`UPDATE providers SET gpu_count = 2, approved_gpu_count = 2 WHERE id = ${p.id}`;
    // vllm_serve: 20 halala a minute, 60 held; both ran 90 s: 2 minutes, 40, when billed.
    const silent = await submit(renter, { job_type: "vllm_serve" });
    const served = await submit(renter, { job_type: "vllm_serve" });
    await pickUp(api, p.key);
    await pickUp(api, p.key);
    expect((await api.post(`/api/jobs/${served}/endpoint-ready`, { api_key: p.key, endpoint_url: "http://203.0.113.7:8000" })).status).toBe(200);
    await ranFor(silent, 90);
    await ranFor(served, 90);
    const c1 = await api.post(`/api/jobs/${silent}/cancel`, {}, renter.headers);
    expect(c1.body).toMatchObject({
      refunded_halala: 60,
      charged_halala: 0,
      job: { status: "cancelled", end_reason: "renter_cancelled", fault: "renter", actual_cost_halala: 0, provider_earned_halala: 0 },
    });
    const receipt = (await api.get(`/api/jobs/${silent}/receipt`, renter.headers)).body.receipt;
    expect(receipt.billing).toMatchObject({ billed_seconds: 0, billed_minutes: 0, charged_halala: 0, refunded_halala: 60 });
    const c2 = await api.post(`/api/jobs/${served}/cancel`, {}, renter.headers);
    expect(c2.body).toMatchObject({
      refunded_halala: 20,
      charged_halala: 40,
      job: { status: "cancelled", end_reason: "renter_cancelled", fault: "renter", actual_cost_halala: 40, provider_earned_halala: 30 },
    });
    expect(await balance(renter)).toMatchObject({ balance_halala: 960, held_halala: 0, total_spent_halala: 40 });
    expect((await api.get(`/api/providers/me?key=${p.key}`)).body.provider.total_earnings_halala).toBe(30);
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("webhooks carry the end reason and the fault", async () => {
    const renter = await makeRenter(srv, 1_000);
    await srv.sql`UPDATE renters SET webhook_url = 'https://hooks.example.com/svc' WHERE id = ${renter.id}`;
    const p = await makeProvider(srv);
    const jobId = await submit(renter);
    await pickUp(api, p.key);
    await ranFor(jobId, 90);
    await api.post("/api/providers/job-result", { api_key: p.key, job_id: jobId, success: false, error: "bad input", fault: "renter" });
    const [row] = await srv.sql`SELECT body FROM webhook_outbox WHERE renter_id = ${renter.id} AND event = 'job.failed'`;
    expect(JSON.parse(row.body).data).toMatchObject({ job_id: jobId, end_reason: "runtime_error", fault: "renter", actual_cost_halala: 20 });
  });
});
