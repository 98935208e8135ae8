// GET /api/admin/dashboard: every figure from the database, checked against
// a known fleet, jobs and ledger; today = UTC day; admin auth.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { release } from "../../src/domain/ledger.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { ADMIN_TOKEN, startTestServer, type TestServer } from "../helpers/server.js";
import { ADMIN, seedJob, settleJob } from "./helpers.js";

let srv: TestServer;
let api: ReturnType<typeof client>;

beforeAll(async () => {
  // Rows seeded straight into jobs must stay as seeded: no background sweep during the test.
  srv = await startTestServer({ SVC_JOB_SWEEP_MS: "60000" });
  api = client(srv.url);
});
afterAll(() => srv?.close());

const STAT_FIELDS = [
  "total_providers", "online_now", "offline", "total_renters", "active_renters", "total_renter_balance_halala",
  "total_jobs", "completed_jobs", "failed_jobs", "active_jobs", "total_revenue_halala", "total_svc_fees_halala",
  "today_revenue_halala", "today_svc_fees_halala", "today_jobs",
];

describe("admin dashboard", () => {
  it("refuses a missing or wrong token with 401 and accepts x-admin-token or Bearer", async () => {
    const none = await api.get("/api/admin/dashboard");
    expect(none.status).toBe(401);
    expect(none.body).toEqual({ error: expect.stringContaining("admin token") });
    const wrong = await api.get("/api/admin/dashboard", { "x-admin-token": ADMIN_TOKEN + "x" });
    expect(wrong.status).toBe(401);
    const wrongBearer = await api.get("/api/admin/dashboard", { authorization: "Bearer nope" });
    expect(wrongBearer.status).toBe(401);
    const renter = await makeRenter(srv);
    expect((await api.get("/api/admin/dashboard", renter.headers)).status).toBe(401);
    expect((await api.get("/api/admin/dashboard", ADMIN)).status).toBe(200);
    expect((await api.get("/api/admin/dashboard", { authorization: `Bearer ${ADMIN_TOKEN}` })).status).toBe(200);
  });

  it("computes every stat, the GPU breakdown and the recent lists from the database", async () => {
    await srv.sql`TRUNCATE renters, providers, jobs, ledger_transfers, api_keys, renter_quota, job_attempts, job_logs CASCADE`;
    await srv.sql`UPDATE ledger_accounts SET balance = 0`;
    const p1 = await makeProvider(srv, { gpuModel: "RTX 4090", vramMib: 24576 });
    const p2 = await makeProvider(srv, { gpuModel: "RTX 4090", vramMib: 24576 });
    const p3 = await makeProvider(srv, { gpuModel: "A100", vramMib: 81920, approved: false, online: false });
    await srv.sql`UPDATE providers SET gpu_telemetry = ${srv.sql.json({ gpu_util_pct: 42.5, temp_c: 61 })} WHERE id = ${p1.id}`;
    // p2 still says online but has not been heard from for 10 minutes: not online now.
    await srv.sql`UPDATE providers SET last_heartbeat = now() - interval '10 minutes' WHERE id = ${p2.id}`;
    const r1 = await makeRenter(srv, 10_000);
    const r2 = await makeRenter(srv, 500);
    await srv.sql`UPDATE renters SET status = 'suspended' WHERE id = ${r2.id}`;

    const yesterday = new Date(Date.now() - 26 * 3600_000);
    const j1 = await seedJob(srv, { renterId: r1.id, providerId: p1.id, status: "running", cost: 100 });
    await settleJob(srv, j1, r1.id, p1.id, 100, 80);
    const j2 = await seedJob(srv, { renterId: r1.id, status: "failed", cost: 100 });
    await srv.sql.begin((tx) => release(tx as never, r1.id, j2.id, 100));
    await seedJob(srv, { renterId: r1.id, providerId: p1.id, status: "running", cost: 50 });
    await seedJob(srv, { renterId: r2.id, status: "queued", cost: 30, submittedAt: yesterday });
    const j5 = await seedJob(srv, { renterId: r1.id, providerId: p1.id, status: "running", cost: 100, submittedAt: yesterday });
    await settleJob(srv, j5, r1.id, p1.id, 100, 60);
    await srv.sql`UPDATE ledger_transfers SET created_at = ${yesterday} WHERE job_id = ${j5.id}`;

    const r = await api.get("/api/admin/dashboard", ADMIN);
    expect(r.status).toBe(200);
    for (const f of STAT_FIELDS) expect(Number.isInteger(r.body.stats[f])).toBe(true);
    expect(new Date(r.body.stats.timestamp).toISOString()).toBe(r.body.stats.timestamp);
    const { timestamp, ...stats } = r.body.stats;
    expect(stats).toEqual({
      total_providers: 3,
      online_now: 1,
      offline: 2,
      total_renters: 2,
      active_renters: 1,
      // 10 500 funded, 80 + 60 paid; holds still count in the balance.
      total_renter_balance_halala: 10_500 - 140,
      total_jobs: 5,
      completed_jobs: 2,
      failed_jobs: 1,
      active_jobs: 2,
      total_revenue_halala: 140,
      // 80 -> 60/20, 60 -> 45/15
      total_svc_fees_halala: 35,
      today_revenue_halala: 80,
      today_svc_fees_halala: 20,
      today_jobs: 3,
    });
    expect(r.body.gpu_breakdown).toEqual([
      { gpu_model: "RTX 4090", providers: 2, online: 1, total_vram_mib: 49_152 },
      { gpu_model: "A100", providers: 1, online: 0, total_vram_mib: 81_920 },
    ]);
    expect(r.body.recent_signups.map((s: any) => [s.kind, s.id])).toEqual([
      ["renter", r2.id], ["renter", r1.id], ["provider", p3.id], ["provider", p2.id], ["provider", p1.id],
    ]);
    for (const s of r.body.recent_signups) {
      expect(Object.keys(s).sort()).toEqual(["created_at", "email", "id", "kind", "name"]);
    }
    expect(r.body.recent_heartbeats).toHaveLength(2);
    expect(r.body.recent_heartbeats[0]).toEqual({
      provider_id: p1.id, name: "Rig", gpu_model: "RTX 4090", status: "online",
      last_heartbeat: expect.stringMatching(/Z$/), gpu_util_pct: 42.5, temp_c: 61,
    });
    expect(r.body.recent_heartbeats[1]).toMatchObject({ provider_id: p2.id, gpu_util_pct: null, temp_c: null });
  });

  it("keeps the recent lists bounded at 10", async () => {
    for (let i = 0; i < 12; i++) await makeRenter(srv);
    const r = await api.get("/api/admin/dashboard", ADMIN);
    expect(r.body.recent_signups).toHaveLength(10);
    expect(r.body.stats.total_renters).toBe(14);
  });
});
