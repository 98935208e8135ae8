// Admin job actions (cancel, re-queue: the jobs engine's own paths, audited)
// and the payments list, over real HTTP.
import { describe, expect, it } from "vitest";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { useTestServer } from "../helpers/server.js";
import { ADMIN } from "./helpers.js";

const srv = useTestServer();
const api = client(srv);

describe("admin job actions", () => {
  it("re-queues and cancels a job through the jobs engine, releasing the hold, each audited", async () => {
    const renter = await makeRenter(srv, 5_000);
    const provider = await makeProvider(srv);
    const sub = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 2, provider_id: provider.id }, renter.headers);
    expect(sub.status).toBe(201);
    const jobId: string = sub.body.job.job_id;
    expect((await api.get("/api/renters/balance", renter.headers)).body.held_halala).toBe(20);

    const rq = await api.post(`/api/admin/jobs/${jobId}/requeue`, { reason: "provider stuck" }, ADMIN);
    expect(rq.status).toBe(200);
    expect(rq.body).toMatchObject({ job_id: jobId, attempt: 2 });
    expect(["queued", "pending"]).toContain(rq.body.status);

    const c = await api.post(`/api/admin/jobs/${jobId}/cancel`, { reason: "renter asked" }, ADMIN);
    expect(c.status).toBe(200);
    expect(c.body).toMatchObject({ job_id: jobId, status: "cancelled" });
    const bal = (await api.get("/api/renters/balance", renter.headers)).body;
    expect(bal).toMatchObject({ balance_halala: 5_000, held_halala: 0, available_halala: 5_000 });

    const again = await api.post(`/api/admin/jobs/${jobId}/cancel`, {}, ADMIN);
    expect(again.status).toBe(409);
    expect(again.body).toEqual({ error: expect.stringContaining("cancelled") });
    expect((await api.post(`/api/admin/jobs/job-nope/cancel`, {}, ADMIN)).status).toBe(404);
    expect((await api.post(`/api/admin/jobs/${jobId}/cancel`, {}, renter.headers)).status).toBe(401);

    const log = (await api.get(`/api/admin/audit?target_type=job&target_id=${jobId}`, ADMIN)).body;
    expect(log.entries.map((e: any) => e.action)).toEqual(["job.cancel", "job.requeue"]);
    expect(log.entries[0].details).toMatchObject({ reason: "renter asked", ip: "127.0.0.1" });
    expect(log.entries[1].details).toMatchObject({ reason: "provider stuck", ip: "127.0.0.1" });
    const listed = (await api.get(`/api/admin/jobs?renter_id=${renter.id}&status=cancelled`, ADMIN)).body;
    expect(listed.jobs.map((j: any) => j.job_id)).toEqual([jobId]);
  });

  it("re-queues a job onto another provider, never back onto the one it was taken off; a pinned job goes back to its own", async () => {
    const renter = await makeRenter(srv, 5_000);
    const stuck = await makeProvider(srv);
    await srv.sql`UPDATE providers SET approval_status = 'pending' WHERE approval_status = 'approved' AND id <> ${stuck.id}`;
    const sub = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 2 }, renter.headers);
    expect(sub.status, sub.text).toBe(201);
    const jobId: string = sub.body.job.job_id;
    const providerOf = async () => (await srv.sql`SELECT provider_id, status FROM jobs WHERE job_id = ${jobId}`)[0];
    expect(await providerOf()).toMatchObject({ provider_id: stuck.id, status: "pending" });

    // The only provider that fits is the one it was taken off: it waits.
    const rq = await api.post(`/api/admin/jobs/${jobId}/requeue`, { reason: "provider stuck" }, ADMIN);
    expect(rq.status, rq.text).toBe(200);
    expect(await providerOf()).toMatchObject({ provider_id: null, status: "queued" });
    await api.post("/api/providers/heartbeat", { api_key: stuck.key, gpu_status: {} });
    expect(await providerOf()).toMatchObject({ provider_id: null, status: "queued" });
    // Another comes online and gets it.
    const other = await makeProvider(srv, { online: false });
    await api.post("/api/providers/heartbeat", { api_key: other.key, gpu_status: {} });
    expect(await providerOf()).toMatchObject({ provider_id: other.id, status: "pending" });
    await api.post(`/api/admin/jobs/${jobId}/cancel`, {}, ADMIN);

    const pinned = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 2, provider_id: stuck.id }, renter.headers);
    expect(pinned.status, pinned.text).toBe(201);
    const back = await api.post(`/api/admin/jobs/${pinned.body.job.job_id}/requeue`, {}, ADMIN);
    expect(back.body).toMatchObject({ attempt: 2, status: "pending", provider_id: stuck.id });
  });

  it("audits an admin cancel through POST /api/jobs/{job_id}/cancel with the client IP; a renter's own cancel is not audited", async () => {
    const renter = await makeRenter(srv, 5_000);
    const provider = await makeProvider(srv);
    const submit = async () => {
      const sub = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 2, provider_id: provider.id }, renter.headers);
      expect(sub.status).toBe(201);
      return sub.body.job.job_id as string;
    };
    const byAdmin = await submit();
    const c = await api.post(`/api/jobs/${byAdmin}/cancel`, { reason: "operator stop" }, ADMIN);
    expect(c.status).toBe(200);
    expect(c.body).toMatchObject({ success: true, job: { job_id: byAdmin, status: "cancelled" } });
    const log = (await api.get(`/api/admin/audit?target_type=job&target_id=${byAdmin}`, ADMIN)).body;
    expect(log.entries).toHaveLength(1);
    expect(log.entries[0]).toMatchObject({ actor: "admin", action: "job.cancel", target_id: byAdmin });
    expect(log.entries[0].details).toEqual({ status: expect.any(String), reason: "operator stop", ip: "127.0.0.1" });

    const byRenter = await submit();
    expect((await api.post(`/api/jobs/${byRenter}/cancel`, {}, renter.headers)).status).toBe(200);
    expect((await api.get(`/api/admin/audit?target_type=job&target_id=${byRenter}`, ADMIN)).body.entries).toEqual([]);
  });
});

describe("admin payments", () => {
  it("lists payments with status and renter filters and paging", async () => {
    const alice = await makeRenter(srv);
    const bob = await makeRenter(srv);
    const a1 = await api.post("/api/payments/topup", { amount_halala: 1_000, source_type: "sandbox" }, alice.headers);
    const a2 = await api.post("/api/payments/topup", { amount_halala: 2_000, source_type: "sandbox" }, alice.headers);
    await api.post("/api/payments/topup", { amount_halala: 3_000, source_type: "sandbox" }, bob.headers);
    expect(a1.status).toBe(201);
    expect((await api.post(`/api/payments/${a2.body.payment.payment_id}/sandbox-confirm`, {}, alice.headers)).status).toBe(200);

    const all = await api.get(`/api/admin/payments?renter_id=${alice.id}`, ADMIN);
    expect(all.status).toBe(200);
    expect(all.body).toMatchObject({ total: 2, limit: 50, offset: 0 });
    expect(all.body.payments.map((p: any) => p.amount_halala)).toEqual([2_000, 1_000]);
    expect(all.body.payments[0]).toMatchObject({ status: "paid", renter_id: alice.id, source_type: "sandbox" });
    const paid = await api.get(`/api/admin/payments?status=paid&renter_id=${alice.id}`, ADMIN);
    expect(paid.body.payments.map((p: any) => p.payment_id)).toEqual([a2.body.payment.payment_id]);
    expect((await api.get(`/api/admin/payments?limit=1`, ADMIN)).body.payments).toHaveLength(1);
    expect((await api.get(`/api/admin/payments?status=lost`, ADMIN)).status).toBe(400);
  });
});
