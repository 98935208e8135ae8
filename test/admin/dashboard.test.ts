// GET /api/admin/dashboard: every figure from the database, checked against
// a known fleet, jobs and ledger (job settlements and /v1 token charges);
// today = UTC day, also for a database whose TimeZone is not UTC; admin auth.
// The console reads it every 10 s, so it reads counters and today's rows,
// never the whole history of jobs and ledger entries.
import crypto from "node:crypto";
import { describe, expect, it } from "vitest";
import postgres from "postgres";
import { connect } from "../../src/db/index.js";
import type { Tx } from "../../src/db/index.js";
import { CHARGE_KINDS, PLATFORM_FEE_KINDS, release } from "../../src/domain/money/ledger.js";
import { dashboardIn } from "../../src/domain/admin/dashboard.js";
import { chargeTokenUsage, reserveTokenBudget } from "../../src/domain/money/usage-billing.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { ADMIN_TOKEN, startTestServer, useTestServer } from "../helpers/server.js";
import { ADMIN, seedJob, settleJob } from "./helpers.js";

/**
 * Empties tables for a test that counts from zero. Receipts refuse TRUNCATE
 * (they are immutable, migration 023); replica mode skips that trigger for
 * this test-only reset.
 */
const sqlText = {
  everything: "TRUNCATE renters, providers, jobs, job_ends, ledger_transfers, api_keys, renter_quota, job_attempts, job_logs CASCADE",
  providers: "TRUNCATE providers CASCADE",
};
async function wipe(srv: { sql: { begin: (fn: (tx: any) => Promise<unknown>) => Promise<unknown> } }, statement: string): Promise<void> {
  await srv.sql.begin(async (tx) => {
    await tx.unsafe("SET LOCAL session_replication_role = replica");
    await tx.unsafe(statement);
  });
}

/** Back-dates ledger entries: they are append-only (migration 025), and replica mode skips that trigger for this test-only change. */
async function behindTriggers(fn: (tx: any) => Promise<unknown>): Promise<void> {
  await srv.sql.begin(async (tx) => {
    await tx.unsafe("SET LOCAL session_replication_role = replica");
    await fn(tx);
  });
}

// Rows seeded straight into jobs must stay as seeded: no background sweep during the test.
const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000" });
const api = client(srv);

/**
 * A /v1 request billed the way the gateway bills it (reserveTokenBudget, then
 * chargeTokenUsage): `cost` halala from the renter, 75/25 to the provider and
 * the platform. `at` back-dates its ledger legs. Returns the request id.
 */
async function chargeV1(renterId: number, providerId: number, cost: number, at?: Date): Promise<string> {
  const requestId = `req-${crypto.randomBytes(8).toString("hex")}`;
  // 1 halala per token: the cap is prompt + max_tokens halala.
  const rate = { input: 1_000_000, output: 1_000_000 };
  await srv.sql.begin((tx) => reserveTokenBudget(tx as never, {
    requestId, renterId, model: "test/model", stream: false, rate, promptTokens: 10, maxTokens: cost, choices: 1, ttlSeconds: 600,
  }));
  const c = await srv.sql.begin((tx) => chargeTokenUsage(tx as never, renterId, providerId, requestId, BigInt(cost) * 1_000_000n, { promptTokens: 10, completionTokens: cost - 10 }));
  expect(c).toMatchObject({ charged: cost, moved: true });
  if (at) await behindTriggers((tx) => tx`UPDATE ledger_transfers SET created_at = ${at} WHERE idempotency_key LIKE ${`v1:${requestId}:%`}`);
  return requestId;
}

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
    await wipe(srv, sqlText.everything);
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
    await behindTriggers((tx) => tx`UPDATE ledger_transfers SET created_at = ${yesterday} WHERE job_id = ${j5.id}`);
    // /v1 per-token billing is revenue too: 40 today (30 provider / 10 platform), 20 yesterday (15 / 5).
    await chargeV1(r1.id, p1.id, 40);
    await chargeV1(r1.id, p1.id, 20, yesterday);

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
      // 10 500 funded, 80 + 60 paid for jobs and 40 + 20 for /v1; holds still count in the balance.
      total_renter_balance_halala: 10_500 - 140 - 60,
      total_jobs: 5,
      completed_jobs: 2,
      failed_jobs: 1,
      active_jobs: 2,
      total_revenue_halala: 140 + 60,
      // jobs: 80 -> 60/20, 60 -> 45/15; /v1: 40 -> 30/10, 20 -> 15/5
      total_svc_fees_halala: 35 + 15,
      today_revenue_halala: 80 + 40,
      today_svc_fees_halala: 20 + 10,
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

  it("lists only the 10 most recent heartbeats, newest first", async () => {
    await wipe(srv, sqlText.providers);
    const ps = [];
    for (let i = 0; i < 12; i++) ps.push(await makeProvider(srv));
    // Provider i was heard from i minutes ago; one more never was.
    for (const [i, p] of ps.entries()) {
      await srv.sql`UPDATE providers SET last_heartbeat = now() - make_interval(mins => ${i}) WHERE id = ${p.id}`;
    }
    await makeProvider(srv, { online: false });
    const r = await api.get("/api/admin/dashboard", ADMIN);
    expect(r.status).toBe(200);
    expect(r.body.stats.total_providers).toBe(13);
    expect(r.body.recent_heartbeats.map((h: any) => h.provider_id)).toEqual(ps.slice(0, 10).map((p) => p.id));
  });

  it("counts today from 00:00 UTC, also when the database's TimeZone is not UTC", async () => {
    // The dashboard's day start is date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC':
    // UTC wall clock, truncated, read back as UTC, so the session TimeZone cannot move it. Proven
    // below with rows one second either side of 00:00 UTC, read by a server whose connections run
    // in Asia/Riyadh (UTC+3): there a local-day rule would start the day at 21:00 UTC and count
    // the wrong side of one of the two rows at any hour.
    const dayMs = 86_400_000;
    const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
    // Near a midnight the row "after" could be in the future or the day could turn mid-test: wait until 3 s past it.
    const msOfDay = () => Date.now() % dayMs;
    if (msOfDay() < 3_000) await sleep(3_000 - msOfDay());
    else if (dayMs - msOfDay() < 10_000) await sleep(dayMs - msOfDay() + 3_000);
    const start = Date.now() - msOfDay();
    const before = new Date(start - 1000);
    const after = new Date(start + 1000);

    await wipe(srv, sqlText.everything);
    await srv.sql`UPDATE ledger_accounts SET balance = 0`;
    const p = await makeProvider(srv);
    const r1 = await makeRenter(srv, 10_000);
    const jBefore = await seedJob(srv, { renterId: r1.id, providerId: p.id, status: "running", cost: 100, submittedAt: before });
    await settleJob(srv, jBefore, r1.id, p.id, 100, 80); // 60 / 20
    await behindTriggers((tx) => tx`UPDATE ledger_transfers SET created_at = ${before} WHERE job_id = ${jBefore.id}`);
    const jAfter = await seedJob(srv, { renterId: r1.id, providerId: p.id, status: "running", cost: 100, submittedAt: after });
    await settleJob(srv, jAfter, r1.id, p.id, 100, 40); // 30 / 10
    await behindTriggers((tx) => tx`UPDATE ledger_transfers SET created_at = ${after} WHERE job_id = ${jAfter.id}`);
    await chargeV1(r1.id, p.id, 200, before); // 150 / 50
    await chargeV1(r1.id, p.id, 100, after); // 75 / 25

    const expected = {
      total_jobs: 2,
      today_jobs: 1,
      total_revenue_halala: 80 + 40 + 200 + 100,
      total_svc_fees_halala: 20 + 10 + 50 + 25,
      today_revenue_halala: 40 + 100,
      today_svc_fees_halala: 10 + 25,
    };
    const utc = await api.get("/api/admin/dashboard", ADMIN);
    expect(utc.status).toBe(200);
    expect(utc.body.stats).toMatchObject(expected);

    const dbName = new URL(srv.databaseUrl).pathname.slice(1);
    await srv.sql.unsafe(`ALTER DATABASE ${dbName} SET timezone TO 'Asia/Riyadh'`);
    // The setting applies to new connections: one shows it, and that a day taken in the session's zone starts elsewhere.
    // (A plain client: the service's own connect() keeps its sessions in UTC.)
    const probe = postgres(srv.databaseUrl, { max: 1, onnotice: () => {} });
    try {
      const [z] = await probe<{ tz: string; local_start: Date }[]>`SELECT current_setting('TimeZone') AS tz, date_trunc('day', now()) AS local_start`;
      expect(z.tz).toBe("Asia/Riyadh");
      expect(z.local_start.getTime()).not.toBe(start);
    } finally {
      await probe.end();
    }
    // A second server process on the same database, whose default zone is now Asia/Riyadh (its own sessions are set to UTC).
    const riyadh = await startTestServer({ SVC_JOB_SWEEP_MS: "60000" }, srv.databaseUrl);
    try {
      const r = await client(riyadh.url).get("/api/admin/dashboard", ADMIN);
      expect(r.status).toBe(200);
      expect(r.body.stats).toMatchObject(expected);
      expect(r.body.stats.timestamp).toMatch(/Z$/);
    } finally {
      await riyadh.close();
      await srv.sql.unsafe(`ALTER DATABASE ${dbName} RESET timezone`);
    }
  });

  it("reads counters and today's rows, not the history of jobs and ledger entries, and agrees with them", async () => {
    await wipe(srv, sqlText.everything);
    await srv.sql`UPDATE ledger_accounts SET balance = 0`;
    const provider = await makeProvider(srv);
    const renter = await makeRenter(srv, 1_000_000);
    // History: 60 jobs settled on earlier days, 60 more ended without a charge, 30 /v1 requests.
    const days = (n: number) => new Date(Date.now() - n * 86_400_000);
    for (let i = 0; i < 60; i++) {
      const j = await seedJob(srv, { renterId: renter.id, providerId: provider.id, status: "running", cost: 100, submittedAt: days(2 + (i % 30)) });
      await settleJob(srv, j, renter.id, provider.id, 100, 41 + i);
      const f = await seedJob(srv, { renterId: renter.id, status: i % 2 ? "failed" : "cancelled", cost: 100, submittedAt: days(2 + (i % 30)) });
      await srv.sql.begin((tx) => release(tx as never, renter.id, f.id, 100));
    }
    for (let i = 0; i < 30; i++) await chargeV1(renter.id, provider.id, 20 + i, days(2 + i));
    await behindTriggers((tx) => tx`UPDATE ledger_transfers SET created_at = created_at - interval '3 days' WHERE kind <> 'topup'`);
    // Today: one settlement, one /v1 request, one job still queued.
    const today = await seedJob(srv, { renterId: renter.id, providerId: provider.id, status: "running", cost: 100 });
    await settleJob(srv, today, renter.id, provider.id, 100, 77);
    await chargeV1(renter.id, provider.id, 33);
    await seedJob(srv, { renterId: renter.id, status: "queued", cost: 100 });
    // What autovacuum does after such writes: the ended jobs' entries leave the index of active ones.
    await srv.sql`VACUUM ANALYZE jobs`;
    await srv.sql`VACUUM ANALYZE ledger_transfers`;

    /** Rows and index entries a transaction read from a table so far (its own statistics). */
    const readFrom = async (tx: Tx, table: string) => {
      const [r] = await tx<{ n: number }[]>`
        SELECT (pg_stat_get_xact_tuples_returned(${table}::regclass) + pg_stat_get_xact_tuples_fetched(${table}::regclass)
                + coalesce((SELECT sum(pg_stat_get_xact_tuples_returned(i.indexrelid)) FROM pg_index i WHERE i.indrelid = ${table}::regclass), 0))::bigint AS n`;
      return Number(r.n);
    };
    const { d, jobsRead, entriesRead } = await srv.sql.begin("ISOLATION LEVEL REPEATABLE READ", async (tx) => {
      // Small test tables favour scans that read every row; forbid them to see what the indexes make the reads visit.
      await tx`SET LOCAL enable_seqscan = off`;
      await tx`SET LOCAL enable_bitmapscan = off`;
      const jobs = await readFrom(tx, "jobs");
      const entries = await readFrom(tx, "ledger_transfers");
      const d = await dashboardIn(tx);
      return { d, jobsRead: (await readFrom(tx, "jobs")) - jobs, entriesRead: (await readFrom(tx, "ledger_transfers")) - entries };
    });
    // The same figures counted from the rows.
    const [want] = await srv.sql<{ total: number; completed: number; failed: number; active: number; revenue: number; fees: number }[]>`
      SELECT (SELECT count(*) FROM jobs)::int AS total,
             (SELECT count(*) FROM jobs WHERE status = 'completed')::int AS completed,
             (SELECT count(*) FROM jobs WHERE status = 'failed')::int AS failed,
             (SELECT count(*) FROM jobs WHERE status IN ('queued', 'pending', 'running'))::int AS active,
             (SELECT sum(amount) FROM ledger_transfers WHERE kind = ANY(${CHARGE_KINDS as string[]}::text[]))::int AS revenue,
             (SELECT sum(amount) FROM ledger_transfers WHERE kind = ANY(${PLATFORM_FEE_KINDS as string[]}::text[]))::int AS fees`;
    expect(want).toMatchObject({ total: 122, completed: 61, failed: 30, active: 1 });
    expect(d.stats).toMatchObject({
      totalJobs: BigInt(want.total),
      completedJobs: BigInt(want.completed),
      failedJobs: BigInt(want.failed),
      activeJobs: BigInt(want.active),
      totalRevenueHalala: BigInt(want.revenue),
      totalSvcFeesHalala: BigInt(want.fees),
      todayJobs: 2n,
      todayRevenueHalala: BigInt(77 + 33),
    });
    // Today's two jobs (the queued one counted again as active), today's four charge entries: an index entry
    // and a row each, and one past each range. The 120 earlier jobs and 180 earlier charge entries are not visited.
    expect(jobsRead).toBeLessThanOrEqual(2 * 3 + 4);
    expect(entriesRead).toBeLessThanOrEqual(2 * 4 * 2 + 4);
  });
});
