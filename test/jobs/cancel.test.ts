// Cancel over real HTTP: from queued, pending and running, by the owner or an
// admin. The renter's cancel is the renter's fault: a job that had not started
// gets the whole hold back, a running one pays the GPU time it used (DESIGN
// §3); an admin's cancel refunds in full. The provider is told to stop and its
// GPU refilled; a terminal job answers 409 and moves nothing.
import { beforeEach, describe, expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import { admin, clearMarketplace, pickUp } from "./helpers.js";

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0" });
const api = client(srv);
beforeEach(() => clearMarketplace(srv));

const submit = (headers: Record<string, string>, body: Record<string, unknown> = {}) =>
  api.post("/api/jobs/submit", { job_type: "rendering", params: { scene_url: "https://example.com/a.blend" }, ...body }, headers);
const balance = async (key: string) => (await api.get("/api/renters/balance", { "x-renter-key": key })).body;

describe("cancel", () => {
  it("cancels from queued and pending with a full refund, and from running paying the time used", async () => {
    const renter = await makeRenter(srv, 10_000);
    const provider = await makeProvider(srv);
    const running = (await submit(renter.headers)).body.job.job_id;
    await pickUp(api, provider.key);
    const queued = (await submit(renter.headers)).body.job.job_id;
    expect(await balance(renter.key)).toMatchObject({ held_halala: 400, available_halala: 9_600 });

    const q = await api.post(`/api/jobs/${queued}/cancel`, { reason: "changed my mind" }, renter.headers);
    expect(q.status).toBe(200);
    expect(q.body).toMatchObject({ success: true, refunded_halala: 200, charged_halala: 0 });
    expect(q.body.job).toMatchObject({ job_id: queued, status: "cancelled", actual_cost_halala: 0, end_reason: "renter_cancelled", fault: "renter" });
    expect(q.body.job.error).toMatch(/changed my mind/);

    await new Promise((r) => setTimeout(r, 50));
    const r = await api.post(`/api/jobs/${running}/cancel`, {}, renter.headers);
    // It ran (under a minute): one billable minute of rendering (20), 75/25; the rest of the hold back.
    expect(r.body).toMatchObject({ success: true, refunded_halala: 180, charged_halala: 20 });
    expect(r.body.job).toMatchObject({ status: "cancelled", end_reason: "renter_cancelled", fault: "renter", actual_cost_halala: 20, provider_earned_halala: 15, platform_fee_halala: 5 });
    expect(await balance(renter.key)).toMatchObject({ balance_halala: 9_980, held_halala: 0, total_spent_halala: 20 });

    const out = await api.get(`/api/jobs/${running}/output`, renter.headers);
    expect(out.status).toBe(410);
    expect(out.body).toEqual({ status: "cancelled", error: "cancelled by renter", job_id: running });
    // The provider's late report is refused and moves nothing.
    const late = await api.post("/api/providers/job-result", { api_key: provider.key, job_id: running, success: true, result: {} });
    expect(late.status).toBe(409);
    expect((await api.post(`/api/jobs/${running}/progress`, { api_key: provider.key, progress_pct: 50 })).status).toBe(409);
    expect(await balance(renter.key)).toMatchObject({ balance_halala: 9_980, held_halala: 0 });
    const hist = (await api.get(`/api/jobs/${running}/history`, renter.headers)).body.attempts;
    expect(hist).toEqual([expect.objectContaining({ status: "cancelled", end_reason: "renter_cancelled", fault: "renter", cost_halala: 20 })]);
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("refills the provider's GPU from the queue", async () => {
    const renter = await makeRenter(srv, 10_000);
    const provider = await makeProvider(srv);
    const first = (await submit(renter.headers)).body.job.job_id;
    const next = (await submit(renter.headers)).body.job.job_id;
    await api.post(`/api/jobs/${first}/cancel`, {}, renter.headers);
    const j = (await api.get(`/api/jobs/${next}`, renter.headers)).body;
    expect(j).toMatchObject({ status: "pending", provider_id: provider.id });
  });

  it("answers 409 for a finished job and moves no money; 403 for others; admins may cancel", async () => {
    const renter = await makeRenter(srv, 10_000);
    const other = await makeRenter(srv, 10_000);
    const provider = await makeProvider(srv);
    await srv.sql`UPDATE providers SET gpu_count = 4, approved_gpu_count = 4 WHERE id = ${provider.id}`;
    const done = (await submit(renter.headers)).body.job.job_id;
    expect((await pickUp(api, provider.key))?.job_id).toBe(done);
    await api.post("/api/providers/job-result", { api_key: provider.key, job_id: done, success: true, result: {} });
    const before = await balance(renter.key);
    const again = await api.post(`/api/jobs/${done}/cancel`, {}, renter.headers);
    expect(again.status).toBe(409);
    expect(again.body.error).toMatch(/already completed/);
    expect(await balance(renter.key)).toEqual(before);

    const live = (await submit(renter.headers)).body.job.job_id;
    expect((await api.post(`/api/jobs/${live}/cancel`, {}, other.headers)).status).toBe(403);
    expect((await api.post(`/api/jobs/${live}/cancel`, {}, provider.headers)).status).toBe(403);
    expect((await api.post("/api/jobs/job-missing/cancel", {}, renter.headers)).status).toBe(404);
    // A reason past 1,000 characters is refused as every action's is, naming it, and cancels nothing.
    const long = await api.post(`/api/jobs/${live}/cancel`, { reason: "x".repeat(1001) }, admin(srv));
    expect(long.status).toBe(400);
    expect(long.body.error).toMatch(/reason/);
    expect((await api.get(`/api/jobs/${live}`, renter.headers)).body.status).not.toBe("cancelled");
    const byAdmin = await api.post(`/api/jobs/${live}/cancel`, { reason: "abuse report" }, admin(srv));
    expect(byAdmin.status).toBe(200);
    expect(byAdmin.body.job.error).toBe("cancelled by admin: abuse report");
    // The platform's doing: the whole hold back, nothing charged.
    expect(byAdmin.body).toMatchObject({ refunded_halala: 200, charged_halala: 0 });
    expect(byAdmin.body.job).toMatchObject({ end_reason: "admin_cancelled", fault: "platform", actual_cost_halala: 0 });
    expect((await api.post(`/api/jobs/${live}/cancel`, {}, admin(srv))).status).toBe(409);
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("lets exactly one of a racing cancel and result win", async () => {
    const renter = await makeRenter(srv, 100_000);
    const provider = await makeProvider(srv);
    await srv.sql`UPDATE providers SET gpu_count = 20, approved_gpu_count = 20 WHERE id = ${provider.id}`;
    const ids: string[] = [];
    for (let i = 0; i < 16; i++) ids.push((await submit(renter.headers)).body.job.job_id);
    for (let i = 0; i < 16; i++) await pickUp(api, provider.key);
    const pairs = await Promise.all(
      ids.map((id) =>
        Promise.all([
          api.post(`/api/jobs/${id}/cancel`, {}, renter.headers),
          api.post("/api/providers/job-result", { api_key: provider.key, job_id: id, success: true, result: {} }),
        ]),
      ),
    );
    let spent = 0;
    for (const [c, r] of pairs) {
      expect([c.status, r.status].sort()).toEqual([200, 409]);
      // Whichever wins, the minute run is billed once: by the result, or by the cancel (the renter's fault).
      spent += r.status === 200 ? r.body.cost_halala : c.body.charged_halala;
    }
    expect(await balance(renter.key)).toMatchObject({ held_halala: 0, balance_halala: 100_000 - spent, total_spent_halala: spent });
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });
});
