// Admin management of renters and jobs over real HTTP: lists with filters and
// paging, suspension (the renter then gets 403), balance adjustments through
// the ledger, quotas, and the audit trail each action leaves.
import { describe, expect, it } from "vitest";
import { client, uniqueEmail } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { startTestServer, useTestServer } from "../helpers/server.js";
import { ADMIN, seedJob } from "./helpers.js";
import { releaseTokenBudget, reserveTokenBudget } from "../../src/domain/money/usage-billing.js";

// Rows seeded straight into jobs must stay as seeded: no background sweep during the test.
const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000" });
const api = client(srv);

async function audit(query = "") {
  const r = await api.get(`/api/admin/audit${query}`, ADMIN);
  expect(r.status).toBe(200);
  return r.body;
}

describe("admin renters", () => {
  it("lists with a text filter, status filter and paging", async () => {
    const tag = `acme${Date.now()}`;
    for (let i = 0; i < 5; i++) {
      const r = await api.post("/api/renters/register", { name: `${tag} user ${i}`, email: uniqueEmail(tag) });
      expect(r.status).toBe(201);
    }
    const first = await api.get(`/api/admin/renters?q=${tag}&limit=2`, ADMIN);
    expect(first.status).toBe(200);
    expect(first.body.total).toBe(5);
    expect(first.body.limit).toBe(2);
    expect(first.body.offset).toBe(0);
    expect(first.body.renters.map((r: any) => r.name)).toEqual([`${tag} user 4`, `${tag} user 3`]);
    const last = await api.get(`/api/admin/renters?q=${tag}&limit=2&offset=4`, ADMIN);
    expect(last.body.renters.map((r: any) => r.name)).toEqual([`${tag} user 0`]);
    const past = await api.get(`/api/admin/renters?q=${tag}&limit=2&offset=10`, ADMIN);
    expect(past.body).toMatchObject({ renters: [], total: 5 });
    // LIKE's own characters are literal.
    expect((await api.get(`/api/admin/renters?q=%25`, ADMIN)).body.total).toBe(0);
    const bad = await api.get(`/api/admin/renters?status=frozen`, ADMIN);
    expect(bad.status).toBe(400);
    expect(bad.body.error).toMatch(/status must be one of active, suspended/);
    expect((await api.get(`/api/admin/renters?limit=0`, ADMIN)).status).toBe(400);
    expect((await api.get(`/api/admin/renters?limit=abc`, ADMIN)).status).toBe(400);
  });

  it("gives each renter of a page its own balance, hold and job count, as its own page does", async () => {
    const tag = `page${Date.now()}`;
    const ids: number[] = [];
    for (const [funds, queued, completed] of [[500, 2, 0], [0, 0, 3], [1200, 1, 1]]) {
      const r = await makeRenter(srv, funds);
      await srv.sql`UPDATE renters SET name = ${`${tag} ${r.id}`} WHERE id = ${r.id}`;
      for (let i = 0; i < queued; i++) await seedJob(srv, { renterId: r.id, cost: 100 });
      for (let i = 0; i < completed; i++) {
        await srv.sql`
          INSERT INTO jobs (job_id, renter_id, job_type, status, duration_minutes, max_duration_seconds, rate_halala_per_minute, cost_halala)
          VALUES (${`job-${tag}-${r.id}-${i}`}, ${r.id}, 'llm-inference', 'completed', 10, 1800, 10, 100)`;
      }
      ids.push(r.id);
    }
    const list = await api.get(`/api/admin/renters?q=${tag}`, ADMIN);
    expect(list.status).toBe(200);
    const byId = new Map(list.body.renters.map((r: any) => [r.id, r]));
    expect([...byId.keys()].sort()).toEqual([...ids].sort());
    for (const id of ids) {
      const one = await api.get(`/api/admin/renters/${id}`, ADMIN);
      expect(byId.get(id)).toEqual(one.body.renter);
    }
    expect(ids.map((id) => [(byId.get(id) as any).balance_halala, (byId.get(id) as any).held_halala, (byId.get(id) as any).total_jobs])).toEqual([
      [500, 200, 2],
      [0, 0, 3],
      [1200, 100, 2],
    ]);
  });

  it("shows one renter with balance, hold and quota; 404 for an unknown id", async () => {
    const renter = await makeRenter(srv, 2_000);
    await seedJob(srv, { renterId: renter.id, cost: 300 });
    const r = await api.get(`/api/admin/renters/${renter.id}`, ADMIN);
    expect(r.status).toBe(200);
    expect(r.body.renter).toMatchObject({ id: renter.id, balance_halala: 2_000, held_halala: 300, status: "active" });
    expect(r.body.quota).toEqual({ daily_jobs_limit: 500, monthly_spend_limit_halala: 10_000_000 });
    expect((await api.get(`/api/admin/renters/999999`, ADMIN)).status).toBe(404);
    expect((await api.get(`/api/admin/renters/0`, ADMIN)).status).toBe(400);
    expect((await api.get(`/api/admin/renters/abc`, ADMIN)).status).toBe(400);
  });

  it("suspends (the renter gets 403) and unsuspends, each audited with its reason", async () => {
    const renter = await makeRenter(srv);
    expect((await api.get("/api/renters/me", renter.headers)).status).toBe(200);
    const s = await api.post(`/api/admin/renters/${renter.id}/suspend`, { reason: "chargeback" }, ADMIN);
    expect(s.status).toBe(200);
    expect(s.body.renter.status).toBe("suspended");
    const me = await api.get("/api/renters/me", renter.headers);
    expect(me.status).toBe(403);
    expect(me.body.error).toMatch(/suspended/);
    expect((await api.get(`/api/admin/renters?status=suspended`, ADMIN)).body.renters.map((r: any) => r.id)).toContain(renter.id);
    const u = await api.post(`/api/admin/renters/${renter.id}/unsuspend`, {}, ADMIN);
    expect(u.body.renter.status).toBe("active");
    expect((await api.get("/api/renters/me", renter.headers)).status).toBe(200);

    const log = await audit(`?target_type=renter&target_id=${renter.id}`);
    expect(log.entries.map((e: any) => e.action)).toEqual(["renter.unsuspend", "renter.suspend"]);
    expect(log.entries[1]).toMatchObject({ actor: "admin", target_type: "renter", target_id: String(renter.id), details: { reason: "chargeback", changed: true } });
    expect(new Date(log.entries[1].created_at).toISOString()).toBe(log.entries[1].created_at);
    expect((await api.post(`/api/admin/renters/999999/suspend`, {}, ADMIN)).status).toBe(404);
  });

  it("refuses a suspended renter at once in every process, /v1 included, though its key was cached", async () => {
    const other = await startTestServer({ SVC_JOB_SWEEP_MS: "60000" }, srv.databaseUrl);
    try {
      const renter = await makeRenter(srv);
      const there = client(other.url);
      // Both processes have the key's owner cached (active).
      expect((await api.get("/api/renters/me", renter.headers)).status).toBe(200);
      expect((await there.get("/api/renters/me", renter.headers)).status).toBe(200);
      expect((await there.get("/v1/models", renter.headers)).status).toBe(200);

      expect((await api.post(`/api/admin/renters/${renter.id}/suspend`, { reason: "fraud" }, ADMIN)).status).toBe(200);
      expect((await api.get("/api/renters/me", renter.headers)).status).toBe(403);
      // The other process hears of it at commit (NOTIFY).
      await expect.poll(async () => (await there.get("/api/renters/me", renter.headers)).status, { timeout: 5_000 }).toBe(403);
      const v1 = await there.get("/v1/models", renter.headers);
      expect(v1.status).toBe(403);
      expect(v1.body.error.code).toBe("account_suspended");

      expect((await api.post(`/api/admin/renters/${renter.id}/unsuspend`, {}, ADMIN)).status).toBe(200);
      await expect.poll(async () => (await there.get("/api/renters/me", renter.headers)).status, { timeout: 5_000 }).toBe(200);
    } finally {
      await other.close();
    }
  });

  it("does not debit what the renter's /v1 requests in flight reserved (409), and does once they ended", async () => {
    const renter = await makeRenter(srv, 1_000);
    const requestId = `test-adjust-${renter.id}`;
    // 10 prompt + 590 completion tokens at 1 halala each: 600 of the 1,000 reserved.
    await srv.sql.begin((tx) =>
      reserveTokenBudget(tx, { requestId, renterId: renter.id, model: "m", stream: false, rate: { input: 1_000_000, output: 1_000_000 }, promptTokens: 10, maxTokens: 590, choices: 1, ttlSeconds: 60 }),
    );
    const taking = await api.post(`/api/admin/renters/${renter.id}/adjust-balance`, { amount_halala: -500, reason: "correction" }, ADMIN);
    expect(taking.status).toBe(409);
    expect(taking.body.error).toMatch(/reserved \(available 1000 halala, 600 reserved\); retry when they end/);
    const free = await api.post(`/api/admin/renters/${renter.id}/adjust-balance`, { amount_halala: -400, reason: "correction" }, ADMIN);
    expect(free.status, free.text).toBe(200);
    expect(free.body.renter.balance_halala).toBe(600);
    expect(await releaseTokenBudget(srv.sql, requestId)).toBe(true);
    const after = await api.post(`/api/admin/renters/${renter.id}/adjust-balance`, { amount_halala: -500, reason: "correction" }, ADMIN);
    expect(after.body.renter.balance_halala).toBe(100);
  });

  it("adjusts a balance through the ledger, never below available funds, once per Idempotency-Key", async () => {
    const renter = await makeRenter(srv, 1_000);
    await seedJob(srv, { renterId: renter.id, cost: 400 });
    const credit = await api.post(`/api/admin/renters/${renter.id}/adjust-balance`, { amount_halala: 250, reason: "goodwill" }, ADMIN);
    expect(credit.status).toBe(200);
    expect(credit.body.renter.balance_halala).toBe(1_250);
    // available is 850 now (400 held): a debit of 900 is refused, nothing moves.
    const over = await api.post(`/api/admin/renters/${renter.id}/adjust-balance`, { amount_halala: -900, reason: "x" }, ADMIN);
    expect(over.status).toBe(400);
    expect(over.body.error).toMatch(/available 850/);
    const debit = await api.post(`/api/admin/renters/${renter.id}/adjust-balance`, { amount_halala: -850, reason: "correction" }, ADMIN);
    expect(debit.body.renter).toMatchObject({ balance_halala: 400, held_halala: 400 });

    for (const body of [{ amount_halala: 0, reason: "x" }, { amount_halala: 5 }, { amount_halala: 5, reason: "  " }, { amount_halala: 1.5, reason: "x" }, { amount_halala: "ten", reason: "x" }]) {
      const r = await api.post(`/api/admin/renters/${renter.id}/adjust-balance`, body, ADMIN);
      expect(r.status, JSON.stringify(body)).toBe(400);
      expect(typeof r.body.error).toBe("string");
    }
    const key = { ...ADMIN, "idempotency-key": `adj-${renter.id}` };
    const a = await api.post(`/api/admin/renters/${renter.id}/adjust-balance`, { amount_halala: 100, reason: "retry-safe" }, key);
    const b = await api.post(`/api/admin/renters/${renter.id}/adjust-balance`, { amount_halala: 100, reason: "retry-safe" }, key);
    expect(a.body.renter.balance_halala).toBe(500);
    expect(b.body.renter.balance_halala).toBe(500);
    expect((await api.post(`/api/admin/renters/${renter.id}/adjust-balance`, { amount_halala: 7, reason: "other" }, key)).status).toBe(409);

    const bal = await api.get("/api/renters/balance", renter.headers);
    if (bal.status === 200) expect(bal.body.balance_halala).toBe(500);
    const [ledger] = await srv.sql<{ n: number; sum: number }[]>`
      SELECT count(*)::int AS n, coalesce(sum(CASE WHEN t.credit_account_id = a.id THEN t.amount ELSE -t.amount END), 0)::int AS sum
      FROM ledger_transfers t JOIN ledger_accounts a ON a.kind = 'renter_available' AND a.owner_id = ${renter.id}
      WHERE t.kind = 'adjustment' AND (t.debit_account_id = a.id OR t.credit_account_id = a.id)`;
    expect(ledger).toEqual({ n: 3, sum: 250 - 850 + 100 });
    const log = await audit(`?action=renter.adjust_balance&target_id=${renter.id}`);
    expect(log.total).toBe(3);
    expect(log.entries.map((e: any) => e.details.amount_halala)).toEqual([100, -850, 250]);
    expect(log.entries[2].details.reason).toBe("goodwill");
  });

  it("sets a quota while a submit of that renter is mid-transaction, without deadlocking it", async () => {
    const renter = await makeRenter(srv);
    expect((await api.put(`/api/admin/renters/${renter.id}/quota`, { daily_jobs_limit: 50 }, ADMIN)).status).toBe(200);
    const submit = await srv.sql.reserve();
    try {
      // A transaction holding the quota row and then writing the renter row, as submits once did.
      await submit`BEGIN`;
      await submit`SELECT * FROM renter_quota WHERE renter_id = ${renter.id} FOR NO KEY UPDATE`;
      const admin = api.put(`/api/admin/renters/${renter.id}/quota`, { daily_jobs_limit: 70 }, ADMIN);
      await new Promise((r) => setTimeout(r, 300)); // the admin call is now waiting on the quota row
      await submit`UPDATE renters SET total_jobs = total_jobs + 1 WHERE id = ${renter.id}`;
      await submit`COMMIT`;
      const r = await admin;
      expect(r.status, r.text).toBe(200);
      expect(r.body.quota.daily_jobs_limit).toBe(70);
    } finally {
      await submit`ROLLBACK`.catch(() => {});
      submit.release();
    }
  });

  it("sets quotas (one or both limits), audited with before and after", async () => {
    const renter = await makeRenter(srv);
    const one = await api.put(`/api/admin/renters/${renter.id}/quota`, { daily_jobs_limit: 3 }, ADMIN);
    expect(one.status).toBe(200);
    expect(one.body.quota).toEqual({ daily_jobs_limit: 3, monthly_spend_limit_halala: 10_000_000 });
    const both = await api.post(`/api/admin/renters/${renter.id}/quota`, { daily_jobs_limit: 0, monthly_spend_limit_halala: 5_000 }, ADMIN);
    expect(both.body.quota).toEqual({ daily_jobs_limit: 0, monthly_spend_limit_halala: 5_000 });
    for (const body of [{}, { daily_jobs_limit: -1 }, { monthly_spend_limit_halala: "x" }, { daily_jobs_limit: 1e15 }]) {
      const r = await api.put(`/api/admin/renters/${renter.id}/quota`, body, ADMIN);
      expect(r.status, JSON.stringify(body)).toBe(400);
    }
    expect((await api.put(`/api/admin/renters/999999/quota`, { daily_jobs_limit: 1 }, ADMIN)).status).toBe(404);
    const log = await audit(`?action=renter.set_quota&target_id=${renter.id}`);
    expect(log.entries[0].details).toMatchObject({
      before: { daily_jobs_limit: 3, monthly_spend_limit_halala: 10_000_000 },
      after: { daily_jobs_limit: 0, monthly_spend_limit_halala: 5_000 },
    });
  });
});

describe("admin jobs", () => {
  it("lists jobs with status, renter, provider and type filters and paging", async () => {
    const renter = await makeRenter(srv, 10_000);
    const other = await makeRenter(srv, 10_000);
    const provider = await makeProvider(srv);
    await seedJob(srv, { renterId: renter.id, status: "queued", jobType: "training" });
    await seedJob(srv, { renterId: renter.id, providerId: provider.id, status: "running", jobType: "rendering" });
    await seedJob(srv, { renterId: other.id, status: "queued", jobType: "training" });
    const mine = await api.get(`/api/admin/jobs?renter_id=${renter.id}`, ADMIN);
    expect(mine.status).toBe(200);
    expect(mine.body.total).toBe(2);
    expect(mine.body.jobs[0]).toMatchObject({ renter_id: renter.id, job_type: "rendering", provider_id: provider.id });
    expect((await api.get(`/api/admin/jobs?renter_id=${renter.id}&status=queued`, ADMIN)).body.total).toBe(1);
    expect((await api.get(`/api/admin/jobs?provider_id=${provider.id}`, ADMIN)).body.total).toBe(1);
    const training = await api.get(`/api/admin/jobs?job_type=training&limit=1`, ADMIN);
    expect(training.body.total).toBeGreaterThanOrEqual(2);
    expect(training.body.jobs).toHaveLength(1);
    expect((await api.get(`/api/admin/jobs?status=done`, ADMIN)).status).toBe(400);
    expect((await api.get(`/api/admin/jobs?job_type=mining`, ADMIN)).status).toBe(400);
    expect((await api.get(`/api/admin/jobs?renter_id=-3`, ADMIN)).status).toBe(400);
  });
});
