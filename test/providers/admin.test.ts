// Admin approval paths over real HTTP: approve (POST and PATCH), reject with a
// reason, suspend, unsuspend, preload requests, listing with filters, and an
// audit entry written with every action.
import { describe, expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { ADMIN, flushHeartbeats, gpuStatus, heartbeat, newProvider } from "./helpers.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";

const srv = useTestServer({ SVC_LIVENESS_SWEEP_SECONDS: "0" });
const api = client(srv);

async function auditOf(id: number) {
  return srv.sql<{ actor: string; action: string; details: Record<string, any> }[]>`
    SELECT actor, action, details FROM audit_log WHERE target_type = 'provider' AND target_id = ${String(id)} ORDER BY id`;
}

describe("approval", () => {
  it("a new provider is pending; approve (POST) makes its heartbeat accepted, with an audit entry", async () => {
    const p = await newProvider(srv, { approve: false });
    const got = await api.get(`/api/admin/providers/${p.id}`, ADMIN);
    expect(got.status).toBe(200);
    expect(got.body).toMatchObject({ id: p.id, approval_status: "pending", status: "registered", rejection_reason: null });
    expect((await heartbeat(srv, p.key)).status).toBe(403);

    const r = await api.post(`/api/admin/providers/${p.id}/approve`, {}, ADMIN);
    expect(r.status).toBe(200);
    expect(r.body.success).toBe(true);
    expect(r.body.provider).toMatchObject({ id: p.id, approval_status: "approved" });
    const hb = await heartbeat(srv, p.key);
    expect(hb.status).toBe(200);
    expect(hb.body).toMatchObject({ approval_status: "approved", approved: true });

    const audit = await auditOf(p.id);
    expect(audit).toHaveLength(1);
    expect(audit[0]).toMatchObject({
      actor: "admin",
      action: "provider.approve",
      details: { changed: true, from: { approval_status: "pending" }, to: { approval_status: "approved" }, ip: expect.any(String) },
    });
  });

  it("PATCH approve works too and repeating it is a no-op (audited as unchanged)", async () => {
    const p = await newProvider(srv, { approve: false });
    expect((await api.patch(`/api/admin/providers/${p.id}/approve`, {}, ADMIN)).status).toBe(200);
    const again = await api.patch(`/api/admin/providers/${p.id}/approve`, {}, ADMIN);
    expect(again.status).toBe(200);
    expect(again.body.provider.approval_status).toBe("approved");
    const audit = await auditOf(p.id);
    expect(audit.map((a) => [a.action, a.details.changed])).toEqual([["provider.approve", true], ["provider.approve", false]]);
  });

  it("reject needs a reason (400), stores it, takes an online provider offline and shows the reason on heartbeat", async () => {
    const p = await newProvider(srv);
    await heartbeat(srv, p.key);
    const noReason = await api.post(`/api/admin/providers/${p.id}/reject`, {}, ADMIN);
    expect(noReason.status).toBe(400);
    expect(noReason.body.error).toMatch(/reason/);
    const r = await api.post(`/api/admin/providers/${p.id}/reject`, { reason: "failed verification" }, ADMIN);
    expect(r.status).toBe(200);
    expect(r.body.provider).toMatchObject({ approval_status: "rejected", rejection_reason: "failed verification", status: "offline" });
    const hb = await heartbeat(srv, p.key);
    expect(hb.status).toBe(403);
    expect(hb.body.error).toMatch(/rejected: failed verification/);
    expect((await auditOf(p.id)).at(-1)).toMatchObject({ action: "provider.reject", details: { reason: "failed verification", changed: true } });
    // A rejected provider can be approved later.
    expect((await api.post(`/api/admin/providers/${p.id}/approve`, {}, ADMIN)).body.provider).toMatchObject({ approval_status: "approved", rejection_reason: null });
  });

  it("a rejected provider's own pause and resume do not bring it back online (nor into the dashboard's online count)", async () => {
    const p = await newProvider(srv);
    expect((await heartbeat(srv, p.key)).status).toBe(200);
    await flushHeartbeats(srv);
    const onlineNow = async () => (await api.get("/api/admin/dashboard", ADMIN)).body.stats.online_now as number;
    const before = await onlineNow();
    expect((await api.post(`/api/admin/providers/${p.id}/reject`, { reason: "failed verification" }, ADMIN)).body.provider.status).toBe("offline");
    expect(await onlineNow()).toBe(before - 1);
    expect((await api.post("/api/providers/pause", { key: p.key })).body.status).toBe("paused");
    const resumed = await api.post("/api/providers/resume", { key: p.key });
    expect(resumed.status).toBe(200);
    expect(resumed.body.status).toBe("connected");
    expect((await api.get(`/api/admin/providers/${p.id}`, ADMIN)).body).toMatchObject({ status: "connected", is_paused: false, approval_status: "rejected" });
    expect(await onlineNow()).toBe(before - 1);
  });

  it("suspend refuses heartbeats and hides the provider; unsuspend restores offline (or paused) until the next beat", async () => {
    const p = await newProvider(srv);
    await heartbeat(srv, p.key);
    const s = await api.post(`/api/admin/providers/${p.id}/suspend`, { reason: "chargeback" }, ADMIN);
    expect(s.status).toBe(200);
    expect(s.body.provider).toMatchObject({ status: "suspended", approval_status: "approved" });
    expect((await heartbeat(srv, p.key)).status).toBe(403);
    const listed = await api.get("/api/renters/available-providers");
    expect(listed.body.providers.map((x: { id: number }) => x.id)).not.toContain(p.id);

    const u = await api.post(`/api/admin/providers/${p.id}/unsuspend`, {}, ADMIN);
    expect(u.status).toBe(200);
    expect(u.body.provider.status).toBe("offline");
    expect((await heartbeat(srv, p.key)).status).toBe(200);
    expect((await api.get(`/api/providers/status/${p.key}`)).body.status).toBe("online");

    // Paused before the suspension: paused again after it.
    await api.post("/api/providers/pause", { key: p.key });
    await api.post(`/api/admin/providers/${p.id}/suspend`, {}, ADMIN);
    expect((await api.post(`/api/admin/providers/${p.id}/unsuspend`, {}, ADMIN)).body.provider.status).toBe("paused");
    expect((await auditOf(p.id)).map((a) => a.action)).toEqual([
      "provider.approve", "provider.suspend", "provider.unsuspend", "provider.suspend", "provider.unsuspend",
    ]);
  });

  it("404 for an unknown provider, 400 for a bad id, 401 without or with a wrong admin token", async () => {
    for (const action of ["approve", "reject", "suspend", "unsuspend"]) {
      const r = await api.post(`/api/admin/providers/999999/${action}`, { reason: "x" }, ADMIN);
      expect(r.status, action).toBe(404);
    }
    expect((await api.get("/api/admin/providers/999999", ADMIN)).status).toBe(404);
    expect((await api.post("/api/admin/providers/0/approve", {}, ADMIN)).status).toBe(400);
    expect((await api.post("/api/admin/providers/abc/approve", {}, ADMIN)).status).toBe(400);
    expect((await api.post("/api/admin/providers/1/approve", {})).status).toBe(401);
    expect((await api.post("/api/admin/providers/1/approve", {}, { "x-admin-token": "wrong-token-wrong-token" })).status).toBe(401);
    const p = await newProvider(srv, { approve: false });
    const asProvider = await api.post(`/api/admin/providers/${p.id}/approve`, {}, { "x-provider-key": p.key });
    expect([401, 403]).toContain(asProvider.status);
    expect((await api.get(`/api/admin/providers/${p.id}`, ADMIN)).body.approval_status).toBe("pending");
    // Bearer is accepted as the admin token.
    expect((await api.post(`/api/admin/providers/${p.id}/approve`, {}, { authorization: `Bearer ${ADMIN["x-admin-token"]}` })).status).toBe(200);
  });

  it("preload-model sets and clears the request, audited", async () => {
    const p = await newProvider(srv);
    await heartbeat(srv, p.key);
    const set = await api.post(`/api/admin/providers/${p.id}/preload-model`, { model_name: "sdxl-turbo" }, ADMIN);
    expect(set.status).toBe(200);
    expect((await heartbeat(srv, p.key)).body.preload_model).toEqual({ model_name: "sdxl-turbo", status: "downloading" });
    expect((await api.post(`/api/admin/providers/${p.id}/preload-model`, { model_name: "" }, ADMIN)).status).toBe(200);
    expect((await heartbeat(srv, p.key)).body.preload_model).toBeNull();
    expect((await auditOf(p.id)).slice(-2).map((a) => a.action)).toEqual(["provider.preload_model", "provider.preload_model_cleared"]);
  });
});

describe("listing", () => {
  it("filters by status, approval_status, gpu_model and q, newest first, with paging and totals", async () => {
    const tag = `Lst${Date.now()}`;
    const a = await newProvider(srv, { approve: false, name: `${tag} alpha`, gpuModel: "NVIDIA A100 80GB" });
    const b = await newProvider(srv, { name: `${tag} beta`, gpuModel: "NVIDIA H100" });
    const c = await newProvider(srv, { name: `${tag} gamma`, gpuModel: "RTX 3090" });
    await heartbeat(srv, b.key);

    const all = await api.get(`/api/admin/providers?q=${tag}`, ADMIN);
    expect(all.status).toBe(200);
    expect(all.body.total).toBe(3);
    expect(all.body.providers.map((x: { id: number }) => x.id)).toEqual([c.id, b.id, a.id]);
    expect(all.body).toMatchObject({ limit: 50, offset: 0 });

    const pending = await api.get(`/api/admin/providers?q=${tag}&approval_status=pending`, ADMIN);
    expect(pending.body.providers.map((x: { id: number }) => x.id)).toEqual([a.id]);
    const online = await api.get(`/api/admin/providers?q=${tag}&status=online`, ADMIN);
    expect(online.body.providers.map((x: { id: number }) => x.id)).toEqual([b.id]);
    const gpu = await api.get(`/api/admin/providers?q=${tag}&gpu_model=a100`, ADMIN);
    expect(gpu.body.providers.map((x: { id: number }) => x.id)).toEqual([a.id]);
    const paged = await api.get(`/api/admin/providers?q=${tag}&limit=1&offset=1`, ADMIN);
    expect(paged.body.providers.map((x: { id: number }) => x.id)).toEqual([b.id]);
    expect(paged.body.total).toBe(3);
    const byEmail = await api.get(`/api/admin/providers?q=${encodeURIComponent(a.email)}`, ADMIN);
    expect(byEmail.body.providers.map((x: { id: number }) => x.id)).toEqual([a.id]);
    // LIKE wildcards in q are literal.
    expect((await api.get(`/api/admin/providers?q=${tag}%25`, ADMIN)).body.total).toBe(0);
  });

  it("400 for an unknown status or approval_status and out-of-range paging", async () => {
    expect((await api.get("/api/admin/providers?status=sleeping", ADMIN)).body.error).toMatch(/status must be one of/);
    expect((await api.get("/api/admin/providers?approval_status=maybe", ADMIN)).status).toBe(400);
    expect((await api.get("/api/admin/providers?limit=1000", ADMIN)).status).toBe(400);
    expect((await api.get("/api/admin/providers?offset=-1", ADMIN)).status).toBe(400);
    expect((await api.get("/api/admin/providers")).status).toBe(401);
  });

  it("places jobs on the hardware an admin approved, whatever the provider reports later; approving again accepts more", async () => {
    // Approved before its daemon reported anything: its first report is what was approved.
    const p = await newProvider(srv);
    expect((await heartbeat(srv, p.key)).status).toBe(200); // 1 GPU of 24,564 MiB
    await flushHeartbeats(srv);
    // Then it claims 1,024 GPUs of 16 TB each.
    expect((await heartbeat(srv, p.key, { gpu_status: gpuStatus(16_000_000, { gpu_count: 1024 }) })).status).toBe(200);
    await flushHeartbeats(srv);
    const listed = async () => (await api.get("/api/admin/providers?limit=200", ADMIN)).body.providers.find((x: { id: number }) => x.id === p.id);
    expect(await listed()).toMatchObject({ gpu_count_reported: 1024, gpu_vram_mib: 16_000_000, gpu_count_approved: 1, gpu_vram_mib_approved: 24564, hardware_needs_approval: true });

    const renter = await makeRenter(srv, 100_000);
    const submit = (extra: Record<string, unknown> = {}) =>
      api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 1, provider_id: p.id, ...extra }, renter.headers);
    // One approved GPU: one job at a time; no job asking for more memory than the approved card has.
    expect((await submit()).body.job).toMatchObject({ status: "pending", provider_id: p.id });
    const second = (await submit()).body.job;
    expect(second.status).toBe("queued");
    const big = await submit({ gpu_requirements: { min_vram_gb: 640 } });
    expect(big.status, big.text).toBe(503);

    // Approved again, as it reports itself now: the queued job is placed on its second GPU.
    expect((await api.post(`/api/admin/providers/${p.id}/approve`, {}, ADMIN)).status).toBe(200);
    expect(await listed()).toMatchObject({ gpu_count_approved: 1024, gpu_vram_mib_approved: 16_000_000, hardware_needs_approval: false });
    await expect.poll(async () => (await api.get(`/api/jobs/${second.job_id}`, renter.headers)).body.status, { timeout: 10_000 }).toBe("pending");
  });
});

async function balance(headers: Record<string, string>) {
  return (await api.get("/api/renters/balance", headers)).body as { balance_halala: number; held_halala: number; available_halala: number };
}
async function jobRow(jobId: string) {
  const [j] = await srv.sql<{ status: string; provider_id: number | null; attempt: number; end_reason: string | null }[]>`
    SELECT status, provider_id, attempt, end_reason FROM jobs WHERE job_id = ${jobId}`;
  return j;
}
async function ledgerAuditOk() {
  const r = await api.get("/api/admin/ledger/audit?full=true", ADMIN);
  expect(r.status, r.text).toBe(200);
  return r.body;
}

describe("the jobs of a provider an admin takes out", () => {
  it("re-queues its running job: the renter's hold stays whole, the provider earns nothing, the books stay clean, audited with the actor", async () => {
    await srv.sql`UPDATE providers SET approval_status = 'pending' WHERE approval_status = 'approved'`;
    const renter = await makeRenter(srv, 5_000);
    const p = await makeProvider(srv);
    const sub = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 2 }, renter.headers);
    expect(sub.status, sub.text).toBe(201);
    const jobId: string = sub.body.job.job_id;
    const polled = await api.get(`/api/providers/${p.key}/jobs`);
    expect(polled.status, polled.text).toBe(200);
    expect((await jobRow(jobId)).status).toBe("running");

    const s = await api.post(`/api/admin/providers/${p.id}/suspend`, { reason: "abuse" }, ADMIN);
    expect(s.status, s.text).toBe(200);
    expect(await jobRow(jobId)).toMatchObject({ status: "queued", provider_id: null, attempt: 2 });
    expect(await balance(renter.headers)).toMatchObject({ balance_halala: 5_000, held_halala: 20 });
    const [earned] = await srv.sql`SELECT total_earnings_halala AS e FROM providers WHERE id = ${p.id}`;
    expect(Number(earned.e)).toBe(0);

    // The old run's result is refused: the job is no longer its.
    const late = await api.post("/api/providers/job-result", { api_key: p.key, job_id: jobId, success: true, result: { ok: 1 } });
    expect(late.status).toBeGreaterThanOrEqual(400);
    expect(await balance(renter.headers)).toMatchObject({ balance_halala: 5_000, held_halala: 20 });

    const audit = (await ledgerAuditOk());
    expect(audit.ok, JSON.stringify(audit.discrepancies)).toBe(true);
    const log = (await api.get(`/api/admin/audit?target_type=provider&target_id=${p.id}`, ADMIN)).body;
    expect(log.entries[0]).toMatchObject({ actor: "admin", action: "provider.suspend" });
    expect(log.entries[0].details).toMatchObject({ reason: "abuse", changed: true });
    // The job's own trail says who took it off, as an admin's re-queue of it would.
    const trail = (await api.get(`/api/admin/audit?target_type=job&target_id=${jobId}`, ADMIN)).body.entries;
    expect(trail).toMatchObject([
      { actor: "admin", action: "job.requeue", details: { from_provider: p.id, attempt: 1, outcome: "requeued", reason: "provider suspended by an administrator: abuse" } },
    ]);
    await api.post(`/api/admin/jobs/${jobId}/cancel`, {}, ADMIN);
  });

  it("rejecting a provider ends the jobs pinned to it that still wait in the queue and releases their holds, as it does its running pinned ones", async () => {
    const renter = await makeRenter(srv, 5_000);
    const p = await makeProvider(srv);
    // One pinned job runs on it, a second one (same provider, GPU busy) waits in the queue.
    const a = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 2, provider_id: p.id }, renter.headers);
    expect(a.status, a.text).toBe(201);
    await api.get(`/api/providers/${p.key}/jobs`);
    const b = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 3, provider_id: p.id }, renter.headers);
    expect(b.status, b.text).toBe(201);
    const running = a.body.job.job_id as string;
    const queued = b.body.job.job_id as string;
    expect((await jobRow(running)).status).toBe("running");
    expect((await jobRow(queued)).status).toBe("queued");
    expect((await balance(renter.headers)).held_halala).toBe(50);

    const r = await api.post(`/api/admin/providers/${p.id}/reject`, { reason: "fraudulent hardware" }, ADMIN);
    expect(r.status, r.text).toBe(200);
    // The running pinned job: failed (the platform's doing), its hold released.
    expect(await jobRow(running)).toMatchObject({ status: "failed", end_reason: "admin_requeued" });
    // The queued pinned job can never run (only this provider may take it): it must not keep 30 halala held.
    const q = await jobRow(queued);
    expect(["failed", "cancelled"], `queued pinned job is still ${q.status}, holding the renter's funds`).toContain(q.status);
    expect((await balance(renter.headers)).held_halala).toBe(0);
    // Each has its own audit entry: ended, not re-queued (it asked for this provider).
    for (const [jobId, from] of [[running, p.id], [queued, null]] as const) {
      const trail = (await api.get(`/api/admin/audit?target_type=job&target_id=${jobId}`, ADMIN)).body.entries;
      expect(trail, jobId).toMatchObject([
        { action: "job.requeue", details: { from_provider: from, outcome: "failed", reason: "provider rejected by an administrator: fraudulent hardware" } },
      ]);
    }
  });

  it("a job on its last attempt whose provider an admin suspends is re-queued (the platform's doing, as an admin re-queue is), not failed as 'gave up after 3 attempts'", async () => {
    await srv.sql`UPDATE providers SET approval_status = 'pending' WHERE approval_status = 'approved'`;
    const renter = await makeRenter(srv, 5_000);
    const p = await makeProvider(srv);
    const sub = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 2 }, renter.headers);
    expect(sub.status, sub.text).toBe(201);
    const jobId: string = sub.body.job.job_id;
    expect((await jobRow(jobId))).toMatchObject({ status: "pending", provider_id: p.id, attempt: 1 });
    // Its third attempt (two earlier ones handed back by admins, "beyond the retry limit"): written directly.
    await srv.sql`UPDATE job_attempts SET attempt = 3 WHERE job_id = (SELECT id FROM jobs WHERE job_id = ${jobId})`;
    await srv.sql`UPDATE jobs SET attempt = 3 WHERE job_id = ${jobId}`;
    expect(await jobRow(jobId)).toMatchObject({ attempt: 3, provider_id: p.id });

    const s = await api.post(`/api/admin/providers/${p.id}/suspend`, { reason: "maintenance" }, ADMIN);
    expect(s.status, s.text).toBe(200);
    const after = await jobRow(jobId);
    expect(after.status, `job ended ${after.status} (${after.end_reason}) because an admin suspended its provider`).toBe("queued");
    await api.post(`/api/admin/jobs/${jobId}/cancel`, {}, ADMIN);
  });
});
