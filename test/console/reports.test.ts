// ReportService: figures per UTC day for the console's charts, checked
// against rows and ledger transfers whose days the test chose.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startTestServer, type TestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { ADMIN, seedJob, settleJob } from "../admin/helpers.js";
import { chargeTokenUsage, reserveTokenBudget } from "../../src/domain/money/usage-billing.js";

let srv: TestServer;
beforeAll(async () => {
  srv = await startTestServer();
});
afterAll(() => srv?.close());

const today = () => new Date().toISOString().slice(0, 10);

describe("daily reports", () => {
  it("a provider's earnings per day come from its ledger credits, every day of the window present", async () => {
    const renter = await makeRenter(srv, 10_000);
    const p = await makeProvider(srv);
    const other = await makeProvider(srv);
    for (const [prov, cost] of [[p, 40], [p, 21], [other, 100]] as const) {
      const job = await seedJob(srv, { renterId: renter.id, providerId: prov.id, status: "running", cost: 100 });
      await settleJob(srv, job, renter.id, prov.id, 100, cost);
    }
    const r = await client(srv.url).get("/api/providers/earnings?days=3", p.headers);
    expect(r.status, r.text).toBe(200);
    expect(r.body.days.map((d: { day: string }) => d.day).at(-1)).toBe(today());
    expect(r.body.days).toHaveLength(3);
    // floor(40 x 75%) + floor(21 x 75%) = 30 + 15; the other provider's job is not here.
    expect(r.body.days.at(-1)).toMatchObject({ jobs: 2, earned_halala: 45 });
    expect(r.body.days[0]).toMatchObject({ jobs: 0, earned_halala: 0 });
    expect(r.body.total_earned_halala).toBe(45);
    expect((await client(srv.url).get("/api/providers/earnings?days=91", p.headers)).status).toBe(400);
    // 0 is out of range as -3 is, not the default.
    const zero = await client(srv.url).get("/api/providers/earnings?days=0", p.headers);
    expect(zero.status).toBe(400);
    expect(zero.body.error).toMatch(/days/);
    expect((await client(srv.url).get("/api/providers/earnings", p.headers)).body.days).toHaveLength(14);
  });

  it("the platform's revenue today matches the dashboard's, and jobs are counted by the day they were submitted", async () => {
    const renter = await makeRenter(srv, 1_000);
    const yesterday = new Date(Date.now() - 86_400_000);
    await seedJob(srv, { renterId: renter.id, status: "queued", cost: 10, submittedAt: yesterday });
    const api = client(srv.url);
    const [daily, dash] = await Promise.all([api.get("/api/admin/daily?days=2", ADMIN), api.get("/api/admin/dashboard", ADMIN)]);
    expect(daily.status, daily.text).toBe(200);
    const [y, t] = daily.body.days;
    expect(y.day).toBe(yesterday.toISOString().slice(0, 10));
    expect(y.jobs).toBe(1);
    expect(t.revenue_halala).toBe(dash.body.stats.today_revenue_halala);
    expect(t.svc_fees_halala).toBe(dash.body.stats.today_svc_fees_halala);
    expect(t.revenue_halala).toBe(161); // 40 + 21 + 100 charged in the test above
    expect(t.jobs).toBe(dash.body.stats.today_jobs);
    expect(t.completed_jobs).toBe(3);
  });

  it("a renter's /v1 usage per day and per model counts settled requests only", async () => {
    const renter = await makeRenter(srv);
    const other = await makeRenter(srv);
    const row = (id: string, renterId: number, model: string, state: string, prompt: number, completion: number, cost: number) =>
      srv.sql`INSERT INTO v1_usage (request_id, renter_id, model, state, reserved_halala, prompt_tokens, completion_tokens, cost_halala, ended_at)
              VALUES (${id}, ${renterId}, ${model}, ${state}, 0, ${prompt}, ${completion}, ${cost}, ${state === "settled" ? new Date() : null})`;
    await row("u1", renter.id, "m-a", "settled", 100, 20, 3);
    await row("u2", renter.id, "m-a", "settled", 50, 10, 2);
    await row("u3", renter.id, "m-b", "settled", 7, 1, 1);
    await row("u4", renter.id, "m-b", "open", 1000, 0, 0);
    await row("u5", other.id, "m-a", "settled", 999, 999, 99);
    const r = await client(srv.url).get("/api/renters/usage", renter.headers);
    expect(r.status, r.text).toBe(200);
    expect(r.body.days).toHaveLength(14);
    expect(r.body.days.at(-1)).toMatchObject({ day: today(), requests: 3, prompt_tokens: 157, completion_tokens: 31, cost_halala: 6 });
    expect(r.body.models).toEqual([
      { model: "m-a", requests: 2, prompt_tokens: 150, completion_tokens: 30, cost_halala: 5 },
      { model: "m-b", requests: 1, prompt_tokens: 7, completion_tokens: 1, cost_halala: 1 },
    ]);
  });

  it("a /v1 request reserved before UTC midnight and charged after it counts on the day it was charged, as in the ledger", async () => {
    const renter = await makeRenter(srv, 10_000);
    const provider = await makeProvider(srv);
    const requestId = `req-midnight-${renter.id}`;
    await srv.sql.begin((tx) =>
      reserveTokenBudget(tx, {
        requestId, renterId: renter.id, model: "m-late", stream: true, rate: { input: 1_000_000, output: 1_000_000 },
        promptTokens: 10, maxTokens: 100, choices: 1, ttlSeconds: 600,
      }),
    );
    // Reserved 2 s before today's UTC midnight; its streamed answer ran past it and was charged now.
    await srv.sql`
      UPDATE v1_usage SET created_at = date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' - interval '2 seconds'
      WHERE request_id = ${requestId}`;
    const charged = await srv.sql.begin((tx) => chargeTokenUsage(tx, renter.id, provider.id, requestId, 40_000_000n, { promptTokens: 10, completionTokens: 30 }));
    expect(charged.charged).toBe(40);
    const earnings = await client(srv.url).get("/api/providers/earnings?days=2", provider.headers);
    expect(earnings.body.days[1]).toMatchObject({ day: today(), earned_halala: 30 });
    const usage = await client(srv.url).get("/api/renters/usage?days=2", renter.headers);
    expect(usage.status, usage.text).toBe(200);
    expect(usage.body.days.map((d: { cost_halala: number }) => d.cost_halala)).toEqual([0, 40]);
    const late = await client(srv.url).get("/api/renters/usage?days=1", renter.headers);
    expect(late.body.models).toEqual([{ model: "m-late", requests: 1, prompt_tokens: 10, completion_tokens: 30, cost_halala: 40 }]);
  });

  it("the platform's days that are over are written once and read back; the open day is read from the rows", async () => {
    const api = client(srv.url);
    const renter = await makeRenter(srv, 10_000);
    const p = await makeProvider(srv);
    const dayAgo = (n: number) => new Date(Date.UTC(new Date().getUTCFullYear(), new Date().getUTCMonth(), new Date().getUTCDate() - n, 12));
    // A job submitted, completed and charged three days ago (its rows' times moved there).
    const backdated = async (cost: number) => {
      const job = await seedJob(srv, { renterId: renter.id, providerId: p.id, status: "running", cost: 100, submittedAt: dayAgo(3) });
      await settleJob(srv, job, renter.id, p.id, 100, cost);
      await srv.sql`UPDATE jobs SET completed_at = ${dayAgo(3)} WHERE id = ${job.id}`;
      // Ledger entries are append-only (migration 025); replica mode skips that trigger for this test-only change.
      await srv.sql.begin(async (tx) => {
        await tx.unsafe("SET LOCAL session_replication_role = replica");
        await tx`UPDATE ledger_transfers SET created_at = ${dayAgo(3)} WHERE job_id = ${job.id}`;
      });
    };
    await backdated(80);
    const first = await api.get("/api/admin/daily?days=5", ADMIN);
    expect(first.status, first.text).toBe(200);
    expect(first.body.days.map((d: { day: string }) => d.day)).toEqual([4, 3, 2, 1, 0].map((n) => dayAgo(n).toISOString().slice(0, 10)));
    // 80 charged: the provider's floor(80 x 75%) = 60, the platform's 20.
    expect(first.body.days[1]).toEqual({ day: dayAgo(3).toISOString().slice(0, 10), jobs: 1, completed_jobs: 1, revenue_halala: 80, svc_fees_halala: 20 });
    const stored = await srv.sql<{ day: string; jobs: number; revenue_halala: number }[]>`
      SELECT to_char(day, 'YYYY-MM-DD') AS day, jobs, revenue_halala FROM platform_days ORDER BY day`;
    expect(stored.map((d) => d.day)).toEqual(first.body.days.slice(0, 4).map((d: { day: string }) => d.day).filter((d: string) => d < new Date(Date.now() - 10 * 60_000).toISOString().slice(0, 10)));
    expect(stored.find((d) => d.day === first.body.days[1].day)).toMatchObject({ jobs: 1, revenue_halala: 80 });

    // Rows dated in a day already written (the service never dates a row in the past) do not change it;
    // today's figures follow the rows.
    await backdated(40);
    await seedJob(srv, { renterId: renter.id, status: "queued", cost: 10 });
    const second = await api.get("/api/admin/daily?days=5", ADMIN);
    expect(second.body.days[1]).toEqual(first.body.days[1]);
    expect(second.body.days[4].jobs).toBe(first.body.days[4].jobs + 1);
    expect(await srv.sql`SELECT 1 FROM platform_days WHERE day = ${today()}::date`).toHaveLength(0);
  });

  it("a provider's jobs per day count each settled job, a share that rounds down to 0 halala included", async () => {
    const api = client(srv.url);
    const renter = await makeRenter(srv, 10_000);
    const p = await makeProvider(srv);
    /** A job run on p to completion through the routes, charged `rate` for its one minute. */
    const run = async (rate: number) => {
      const sub = await api.post("/api/jobs/submit", { job_type: "llm-inference", duration_minutes: 2, provider_id: p.id }, renter.headers);
      expect(sub.status, sub.text).toBe(201);
      expect((await api.get(`/api/providers/${p.key}/jobs`)).body.job.job_id).toBe(sub.body.job.job_id);
      await srv.sql`UPDATE jobs SET rate_halala_per_minute = ${rate} WHERE job_id = ${sub.body.job.job_id}`;
      const done = await api.post("/api/providers/job-result", { api_key: p.key, job_id: sub.body.job.job_id, success: true, result: { response: "ok" } });
      expect(done.status, done.text).toBe(200);
    };
    await run(1); // 1 halala charged: the provider's floor(0.75) = 0, no transfer to it
    await run(8); // 8 charged: 6 to the provider
    const [{ total_jobs }] = await srv.sql<{ total_jobs: number }[]>`SELECT total_jobs FROM providers WHERE id = ${p.id}`;
    expect(total_jobs).toBe(2);
    const r = await api.get("/api/providers/earnings?days=2", p.headers);
    expect(r.status, r.text).toBe(200);
    expect(r.body.days.at(-1)).toMatchObject({ day: today(), jobs: 2, earned_halala: 6 });
    expect(r.body.days[0]).toMatchObject({ jobs: 0, earned_halala: 0 });
  });
});

