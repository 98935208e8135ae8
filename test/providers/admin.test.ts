// Admin approval paths over real HTTP: approve (POST and PATCH), reject with a
// reason, suspend, unsuspend, preload requests, listing with filters, and an
// audit entry written with every action.
import { describe, expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { ADMIN, flushHeartbeats, gpuStatus, heartbeat, newProvider } from "./helpers.js";
import { makeRenter } from "../helpers/fixtures.js";

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
