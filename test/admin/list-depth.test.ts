// The lists' cost against a long history, over real HTTP: a page reads every row before its offset
// (SQL OFFSET) and a counted total every matching row, so each list takes an offset of at most 10,000
// (400 past it, naming the field and how to reach the rows past it) and counts its total up to 10,000,
// or one past the page asked for (the job lists' totals come from counters, exact); GET /api/jobs pages
// on past the bound with its `before` cursor. Work is measured
// as rows the server's statements visit (each run again under EXPLAIN ANALYZE with its parameters).
import { beforeAll, describe, expect, it } from "vitest";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { client } from "../helpers/http.js";
import { ADMIN_TOKEN, useTestServer } from "../helpers/server.js";
import { rowsVisited, workOf } from "../providers/statement-work.js";

const srv = useTestServer({ SVC_LIVENESS_SWEEP_SECONDS: "0", SVC_RETENTION_SWEEP_SECONDS: "0", SVC_JOB_SWEEP_MS: "60000" });
const api = client(srv);
const ADMIN = { "x-admin-token": ADMIN_TOKEN };
const N = 25_000;
let r: Awaited<ReturnType<typeof makeRenter>>;
let p: Awaited<ReturnType<typeof makeProvider>>;

beforeAll(async () => {
  r = await makeRenter(srv);
  p = await makeProvider(srv);
  // N of each, by set-based SQL; the job counters filled as their trigger would have (one row each).
  await srv.sql.begin(async (tx) => {
    await tx.unsafe(`SET LOCAL session_replication_role = replica`);
    await tx.unsafe(`
      INSERT INTO jobs (job_id, renter_id, provider_id, job_type, status, submitted_at, started_at, completed_at, duration_minutes,
                        max_duration_seconds, rate_halala_per_minute, cost_halala, actual_cost_halala, provider_earned_halala, platform_fee_halala)
      SELECT 'depth-' || i, ${r.id}, ${p.id}, 'training', 'completed', now() - i * interval '1 minute', now() - i * interval '1 minute',
             now() - i * interval '1 minute' + interval '30 seconds', 1, 600, 25, 100, 100, 75, 25
      FROM generate_series(1, ${N}) i`);
    await tx.unsafe(`INSERT INTO renter_job_ends (renter_id, status, job_type, jobs) VALUES (${r.id}, 'completed', 'training', ${N})`);
    await tx.unsafe(`INSERT INTO provider_job_ends (provider_id, status, job_type, jobs) VALUES (${p.id}, 'completed', 'training', ${N})`);
    await tx.unsafe(`INSERT INTO job_ends (status, job_type, shard, jobs) VALUES ('completed', 'training', 0, ${N})`);
  });
  await srv.sql.unsafe(`
    INSERT INTO payments (payment_id, renter_id, amount_halala, source_type, description, status, created_at)
    SELECT 'depth-pay-' || i, ${r.id}, 100, 'sandbox', 'top-up', 'paid', now() - i * interval '1 minute' FROM generate_series(1, ${N}) i`);
  await srv.sql.unsafe(`
    INSERT INTO audit_log (actor, action, target_type, target_id, created_at)
    SELECT 'admin', 'renter.suspend', 'renter', (i % 1000)::text, now() - i * interval '1 second' FROM generate_series(1, ${N}) i`);
  await srv.sql.unsafe(`
    INSERT INTO daemon_events (provider_id, event_type, severity, details, created_at)
    SELECT ${p.id}, 'crash', 'error', 'x', now() - i * interval '1 second' FROM generate_series(1, ${N}) i`);
  await srv.sql.unsafe(`INSERT INTO renters (name, email) SELECT 'Depth ' || i, 'depth-r' || i || '@example.test' FROM generate_series(1, ${N}) i`);
  await srv.sql.unsafe(`
    INSERT INTO providers (name, email, gpu_model, os) SELECT 'Depth ' || i, 'depth-p' || i || '@example.test', 'RTX 4090', 'linux'
    FROM generate_series(1, ${N}) i`);
  await srv.sql`VACUUM ANALYZE`;
}, 120_000);

/** Each list of a long history: its route, the caller, the table its rows come from, and what the 400 offers instead. */
const lists = () => [
  { name: "a renter's jobs", path: "/api/jobs", headers: r.headers, table: "jobs", instead: "before=<the last job_id of a page>" },
  { name: "a provider's jobs", path: "/api/jobs", headers: p.headers, table: "jobs", instead: "before=<the last job_id of a page>" },
  { name: "the operator's jobs", path: "/api/admin/jobs", headers: ADMIN, table: "jobs", instead: "renter_id, provider_id or job_type" },
  { name: "renters", path: "/api/admin/renters", headers: ADMIN, table: "renters", instead: "GET /api/admin/renters/{id}" },
  { name: "providers", path: "/api/admin/providers", headers: ADMIN, table: "providers", instead: "approval_status, gpu_model or q" },
  { name: "payments", path: "/api/admin/payments", headers: ADMIN, table: "payments", instead: "status or renter_id" },
  { name: "a payment history", path: "/api/payments/history", headers: r.headers, table: "payments", instead: "GET /api/payments/{payment_id}" },
  { name: "the audit log", path: "/api/admin/audit", headers: ADMIN, table: "audit_log", instead: "action, target_type or target_id" },
  { name: "daemon events", path: `/api/admin/providers/${p.id}/events`, headers: ADMIN, table: "daemon_events", instead: "severity or event_type" },
];

describe("deep offsets", () => {
  it("an offset past 10,000 is 400 naming offset, its bound and how to reach the rows past it, on every list", async () => {
    for (const l of lists()) {
      for (const offset of [10_001, 1_000_000_000]) {
        const res = await api.get(`${l.path}?limit=10&offset=${offset}`, l.headers);
        expect(res.status, `${l.name}: ${res.text}`).toBe(400);
        expect(res.body.error, l.name).toMatch(/^offset must be an integer between 0 and 10000: /);
        expect(res.body.error, l.name).toContain(l.instead);
      }
      // A negative or fractional one is refused as before.
      expect((await api.get(`${l.path}?offset=-1`, l.headers)).status, l.name).toBe(400);
      expect((await api.get(`${l.path}?offset=1.5`, l.headers)).status, l.name).toBe(400);
    }
  });

  it("a renter's and a provider's jobs page on past 10,000 with before=, each page reading its own rows", async () => {
    const expected = (
      await srv.sql<{ job_id: string }[]>`SELECT job_id FROM jobs WHERE renter_id = ${r.id} ORDER BY submitted_at DESC, id DESC LIMIT 40 OFFSET 20000`
    ).map((j) => j.job_id);
    const [cursor] = await srv.sql<{ job_id: string }[]>`SELECT job_id FROM jobs WHERE renter_id = ${r.id} ORDER BY submitted_at DESC, id DESC OFFSET 19999 LIMIT 1`;
    for (const headers of [r.headers, p.headers]) {
      const pages: string[][] = [];
      const work = await workOf(srv, "jobs", async () => {
        let before = cursor.job_id;
        for (let i = 0; i < 2; i++) {
          const res = await api.get(`/api/jobs?limit=20&before=${before}`, headers);
          expect(res.status, res.text).toBe(200);
          expect(res.body.total).toBe(N);
          pages.push(res.body.jobs.map((j: { job_id: string }) => j.job_id));
          before = pages[i][19];
        }
      });
      expect(pages.flat()).toEqual(expected);
      expect(work.rows).toBeLessThan(500);
    }
    // A job not in the caller's list is no cursor.
    const other = await makeRenter(srv, 100_000);
    const res = await api.get(`/api/jobs?before=${cursor.job_id}`, other.headers);
    expect(res.status).toBe(400);
    expect(res.body.error).toMatch(/^before must be the job_id of a job in this list/);
  });

  it("the available providers keep their own bound: an offset past the fleet answers an empty page", async () => {
    const res = await api.get("/api/renters/available-providers?limit=1&offset=1000000000");
    expect(res.status, res.text).toBe(200);
    expect(res.body.providers).toEqual([]);
  });

  it("the last page an offset reaches answers its rows in order, reading no more than the bound and the page", async () => {
    const expected = (
      await srv.sql<{ job_id: string }[]>`SELECT job_id FROM jobs WHERE renter_id = ${r.id} ORDER BY submitted_at DESC, id DESC LIMIT 20 OFFSET 10000`
    ).map((j) => j.job_id);
    for (const headers of [r.headers, p.headers]) {
      let body: { jobs: { job_id: string }[]; total: number; offset: number } | undefined;
      const work = await workOf(srv, "jobs", async () => {
        const res = await api.get("/api/jobs?limit=20&offset=10000", headers);
        expect(res.status, res.text).toBe(200);
        body = res.body;
      });
      expect(body!.jobs.map((j) => j.job_id)).toEqual(expected);
      expect(body).toMatchObject({ total: N, offset: 10_000 });
      expect(work.rows).toBeLessThan(10_000 + 200);
    }
    const audit = await api.get("/api/admin/audit?limit=5&offset=10000", ADMIN);
    expect(audit.status, audit.text).toBe(200);
    const ids = (await srv.sql<{ id: number }[]>`SELECT id FROM audit_log ORDER BY id DESC LIMIT 5 OFFSET 10000`).map((a) => Number(a.id));
    expect(audit.body.entries.map((e: { id: number }) => Number(e.id))).toEqual(ids);
  });
});

describe("totals", () => {
  it("a counted total reads at most 10,000 rows: a first page costs that, not the history", async () => {
    for (const l of lists()) {
      let total = 0;
      const work = await workOf(srv, l.table, async () => {
        const res = await api.get(`${l.path}?limit=50`, l.headers);
        expect(res.status, `${l.name}: ${res.text}`).toBe(200);
        total = Number(res.body.total);
      });
      const report = work.statements.map((s) => s.string.replace(/\s+/g, " ").slice(0, 140)).join("\n");
      // The job lists' totals are their counters (exact); the others are counted up to 10,000.
      expect(total, l.name).toBe(l.table === "jobs" ? N : 10_000);
      expect(work.rows, `${l.name}\n${report}`).toBeLessThanOrEqual(10_000 + 100);
    }
  });

  it("a total at the bound goes one past the page asked for, and a short list is counted exactly", async () => {
    const deep = await api.get("/api/admin/audit?limit=50&offset=10000", ADMIN);
    expect(deep.body).toMatchObject({ total: 10_051, offset: 10_000, limit: 50 });
    expect(deep.body.entries).toHaveLength(50);
    const events = await api.get(`/api/admin/providers/${p.id}/events?limit=200&offset=9900`, ADMIN);
    expect(events.body.total).toBe(10_101);
    const target = await api.get("/api/admin/audit?target_type=renter&target_id=7&limit=10", ADMIN);
    expect(target.body.total).toBe(N / 1000);
    const one = await api.get(`/api/admin/renters?q=depth-r77@example.test`, ADMIN);
    expect(one.body.total).toBe(1);
    // By renter and provider at once (counted, not from the counters), in bound.
    const both = await api.get(`/api/admin/jobs?renter_id=${r.id}&provider_id=${p.id}&limit=10`, ADMIN);
    expect(both.body.total).toBe(10_000);
    const bothWork = await workOf(srv, "jobs", () => api.get(`/api/admin/jobs?renter_id=${r.id}&provider_id=${p.id}&limit=10`, ADMIN));
    expect(bothWork.rows).toBeLessThanOrEqual(10_000 + 50);
  });
});

describe("the operator's payment list", () => {
  it("a first page reads its rows along an index, not every payment sorted", async () => {
    const work = await workOf(srv, "payments", async () => {
      const res = await api.get("/api/admin/payments?limit=20", ADMIN);
      expect(res.status, res.text).toBe(200);
      expect(res.body.payments).toHaveLength(20);
    });
    const pageStatement = work.statements.find((s) => /ORDER BY created_at DESC/i.test(s.string))!;
    expect(pageStatement).toBeDefined();
    expect(await rowsVisited(srv, pageStatement)).toBeLessThan(100);
    const newest = await srv.sql<{ payment_id: string }[]>`SELECT payment_id FROM payments ORDER BY created_at DESC, id DESC LIMIT 20`;
    const res = await api.get("/api/admin/payments?limit=20", ADMIN);
    expect(res.body.payments.map((x: { payment_id: string }) => x.payment_id)).toEqual(newest.map((x) => x.payment_id));
  });
});

// Last: its jobs add to the operator's totals counted above.
describe("the jobs cursor", () => {
  it("before= keeps the list's order among jobs submitted at the same instant", async () => {
    const t = await makeRenter(srv);
    await srv.sql.unsafe(`
      INSERT INTO jobs (job_id, renter_id, job_type, status, submitted_at, duration_minutes, max_duration_seconds, rate_halala_per_minute, cost_halala)
      SELECT 'tie-' || i, ${t.id}, 'training', 'cancelled', timestamptz '2026-01-01T00:00:00Z', 1, 600, 25, 100 FROM generate_series(1, 7) i`);
    const all = (await srv.sql<{ job_id: string }[]>`SELECT job_id FROM jobs WHERE renter_id = ${t.id} ORDER BY submitted_at DESC, id DESC`).map((j) => j.job_id);
    const seen: string[] = [];
    let before: string | undefined;
    for (;;) {
      const res = await api.get(`/api/jobs?limit=3${before ? `&before=${before}` : ""}`, t.headers);
      expect(res.status, res.text).toBe(200);
      const ids = res.body.jobs.map((j: { job_id: string }) => j.job_id);
      if (ids.length === 0) break;
      seen.push(...ids);
      before = ids[ids.length - 1];
    }
    expect(seen).toEqual(all);
  });
});
