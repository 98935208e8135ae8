// The counters that keep submit and job reads from growing with the history
// (migration 030): each renter's charges per UTC month (the monthly spend
// quota) and its ended jobs per status (job totals). They must agree with the
// rows they summarise, however those rows were written (the trigger) and for
// rows written before the migration (the backfill), and the reads that use
// them must not visit the history.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { connect, type Sql, type Tx } from "../../src/db/index.js";
import { migrate } from "../../src/db/migrate.js";
import { accountId, CHARGE_KINDS, credit, hold, settle, transfer } from "../../src/domain/money/ledger.js";
import { quotaUsage } from "../../src/domain/money/quota.js";
import { renterJobCount } from "../../src/domain/accounts/renters.js";
import { jobCountSql } from "../../src/domain/shared/job-counts.js";
import { listJobs } from "../../src/domain/jobs/jobs.js";
import { listJobs as listAdminJobs } from "../../src/domain/admin/admin.js";
import { freshDatabase, useTestServer } from "../helpers/server.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";

let sql: Sql;

// No sweeps: the reads counted below include index entries of rows' older versions, and a sweep
// placing or re-queueing this file's jobs meanwhile would add some.
const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0" });
beforeAll(async () => {
  sql = connect(srv.databaseUrl, 8);
});
afterAll(() => sql?.end());

let seq = 0;
async function newJob(db: Sql, renterId: number, status = "queued", cost = 100, jobType = "training", providerId: number | null = null): Promise<number> {
  const [j] = await db<{ id: number }[]>`
    INSERT INTO jobs (job_id, renter_id, job_type, status, duration_minutes, max_duration_seconds, rate_halala_per_minute, cost_halala, provider_id)
    VALUES (${`job-counters-${process.pid}-${++seq}`}, ${renterId}, ${jobType}, ${status}, 1, 600, 25, ${cost}, ${providerId}) RETURNING id`;
  return j.id;
}

/** A charge entry written as-is (as an earlier month's would be): no balance moves. */
async function chargeAt(db: Sql, renterId: number, amount: number, at: Date, kind = "charge_platform") {
  const from = await accountId(db, "renter_held", renterId);
  const to = await accountId(db, "platform_fees");
  await db`
    INSERT INTO ledger_transfers (debit_account_id, credit_account_id, amount, kind, idempotency_key, created_at)
    VALUES (${from}, ${to}, ${amount}, ${kind}, ${`test-charge-${process.pid}-${++seq}`}, ${at})`;
}

/** The first instant of the UTC month `delta` months from now's. */
function monthStart(delta = 0): Date {
  const now = new Date();
  return new Date(Date.UTC(now.getUTCFullYear(), now.getUTCMonth() + delta, 1));
}

/** What the counters should say, recomputed from the rows they summarise. */
async function fromLedger(db: Sql, renterId: number) {
  return db<{ month: string; spent: number }[]>`
    SELECT to_char(date_trunc('month', t.created_at AT TIME ZONE 'UTC'), 'YYYY-MM-DD') AS month, sum(t.amount)::bigint AS spent
    FROM ledger_transfers t JOIN ledger_accounts a ON a.id = t.debit_account_id
    WHERE a.owner_id = ${renterId} AND a.kind IN ('renter_available', 'renter_held') AND t.kind = ANY(${CHARGE_KINDS as string[]}::text[])
    GROUP BY 1 ORDER BY 1`;
}
async function fromCounter(db: Sql, renterId: number) {
  return db<{ month: string; spent: number }[]>`
    SELECT to_char(month, 'YYYY-MM-DD') AS month, spent_halala AS spent FROM renter_monthly_spend
    WHERE renter_id = ${renterId} AND spent_halala > 0 ORDER BY 1`;
}
async function endsFromJobs(db: Sql, renterId: number) {
  return db<{ status: string; job_type: string; n: number }[]>`
    SELECT status, job_type, count(*)::bigint AS n FROM jobs WHERE renter_id = ${renterId} AND status IN ('completed', 'failed', 'cancelled')
    GROUP BY 1, 2 ORDER BY 1, 2`;
}
async function endsFromCounter(db: Sql, renterId: number) {
  return db<{ status: string; job_type: string; n: number }[]>`
    SELECT status, job_type, jobs AS n FROM renter_job_ends WHERE renter_id = ${renterId} AND jobs > 0 ORDER BY 1, 2`;
}

async function providerEnds(db: Sql, providerId: number) {
  const [fromJobs, fromCounter] = await Promise.all([
    db<{ status: string; job_type: string; n: number }[]>`
      SELECT status, job_type, count(*)::bigint AS n FROM jobs WHERE provider_id = ${providerId} AND status IN ('completed', 'failed', 'cancelled')
      GROUP BY 1, 2 ORDER BY 1, 2`,
    db<{ status: string; job_type: string; n: number }[]>`
      SELECT status, job_type, jobs AS n FROM provider_job_ends WHERE provider_id = ${providerId} AND jobs > 0 ORDER BY 1, 2`,
  ]);
  return { fromJobs: [...fromJobs], fromCounter: [...fromCounter] };
}

/** The platform's counter (the sum of its shards) against the rows, by status and type. */
async function platformEnds(db: Sql) {
  const [fromJobs, fromCounter] = await Promise.all([
    db<{ status: string; job_type: string; n: number }[]>`
      SELECT status, job_type, count(*)::bigint AS n FROM jobs WHERE status IN ('completed', 'failed', 'cancelled')
      GROUP BY 1, 2 ORDER BY 1, 2`,
    db<{ status: string; job_type: string; n: number }[]>`
      SELECT status, job_type, sum(jobs)::bigint AS n FROM job_ends GROUP BY 1, 2 HAVING sum(jobs) <> 0 ORDER BY 1, 2`,
  ]);
  return { fromJobs: [...fromJobs], fromCounter: [...fromCounter] };
}

/** Entries and rows a transaction read from a table and its indexes so far (this transaction's statistics). */
async function readFrom(tx: Tx, table: string): Promise<number> {
  const [r] = await tx<{ n: number }[]>`
    SELECT (pg_stat_get_xact_tuples_returned(${table}::regclass) + pg_stat_get_xact_tuples_fetched(${table}::regclass)
            + coalesce((SELECT sum(pg_stat_get_xact_tuples_returned(i.indexrelid)) FROM pg_index i WHERE i.indrelid = ${table}::regclass), 0))::bigint AS n`;
  return Number(r.n);
}

describe("monthly spend counter", () => {
  it("counts exactly the charge kinds of ledger.ts CHARGE_KINDS", async () => {
    const [t] = await sql<{ def: string }[]>`SELECT pg_get_triggerdef(oid) AS def FROM pg_trigger WHERE tgname = 'ledger_count_spend'`;
    const kinds = [...t.def.matchAll(/'([a-z0-9_]+)'/g)].map((m) => m[1]);
    expect(new Set(kinds)).toEqual(new Set(CHARGE_KINDS));
  });

  it("agrees with the ledger's charges per UTC month, across a month boundary; the quota reads this month's", async () => {
    const r = await makeRenter(srv, 10_000);
    const p = await makeProvider(srv);
    // A job settled through the ledger: its provider share and platform fee are charges, its hold and released rest are not.
    const job = await newJob(sql, r.id);
    await sql.begin((tx) => hold(tx, r.id, job, 600));
    await sql.begin((tx) => settle(tx, r.id, p.id, job, 600, 301));
    // A /v1 charge of each leg.
    await sql.begin(async (tx) => {
      const from = await accountId(tx, "renter_available", r.id);
      await transfer(tx, { from, to: await accountId(tx, "platform_fees"), amount: 7, kind: "v1_charge_platform", key: `t-v1p-${r.id}` });
      await transfer(tx, { from, to: await accountId(tx, "provider_earnings", p.id), amount: 20, kind: "v1_charge_provider", key: `t-v1e-${r.id}` });
    });
    // Charges on either side of the month's first instant, and one of last month.
    await chargeAt(sql, r.id, 11, new Date(monthStart().getTime() - 1));
    await chargeAt(sql, r.id, 13, monthStart());
    await chargeAt(sql, r.id, 17, new Date(monthStart(-1).getTime() + 86_400_000), "charge_provider");

    const ledger = await fromLedger(sql, r.id);
    expect(ledger).toHaveLength(2);
    expect(await fromCounter(sql, r.id)).toEqual(ledger);
    const thisMonth = ledger.find((m) => m.month === monthStart().toISOString().slice(0, 10))!;
    expect(Number(thisMonth.spent)).toBe(301 + 7 + 20 + 13);
    expect(await sql.begin((tx) => quotaUsage(tx, r.id))).toMatchObject({ spentAndHeldHalala: 301 + 7 + 20 + 13 });
  });

  it("does not count a charge the ledger refused for want of funds", async () => {
    const r = await makeRenter(srv, 50);
    const spent = await sql.begin(async (tx) => {
      const from = await accountId(tx, "renter_available", r.id);
      const to = await accountId(tx, "platform_fees");
      await transfer(tx, { from, to, amount: 30, kind: "v1_charge_platform", key: `t-ok-${r.id}` });
      await expect(transfer(tx, { from, to, amount: 30, kind: "v1_charge_platform", key: `t-short-${r.id}` })).rejects.toThrow(/insufficient balance/);
      return (await quotaUsage(tx, r.id)).spentAndHeldHalala;
    });
    expect(spent).toBe(30);
    expect(await fromCounter(sql, r.id)).toEqual(await fromLedger(sql, r.id));
  });

  it("the quota read visits none of the renter's charge entries, however many there are", async () => {
    const r = await makeRenter(srv, 1_000);
    for (let i = 0; i < 40; i++) await chargeAt(sql, r.id, 1, new Date());
    const read = await sql.begin(async (tx) => {
      const before = await readFrom(tx, "ledger_transfers");
      expect((await quotaUsage(tx, r.id)).spentAndHeldHalala).toBe(40);
      return (await readFrom(tx, "ledger_transfers")) - before;
    });
    expect(read).toBe(0);
  });
});

describe("ended jobs counter", () => {
  it("follows every way a job enters or leaves an end status", async () => {
    const r = await makeRenter(srv);
    const a = await newJob(sql, r.id);
    const b = await newJob(sql, r.id);
    await newJob(sql, r.id, "completed"); // written ended
    await sql`UPDATE jobs SET status = 'completed' WHERE id = ${a}`;
    await sql`UPDATE jobs SET status = 'cancelled' WHERE id = ${b}`;
    await sql`UPDATE jobs SET status = 'failed' WHERE id = ${a}`; // from one end to another
    await newJob(sql, r.id);
    expect(await endsFromCounter(sql, r.id)).toEqual(await endsFromJobs(sql, r.id));
    await sql`UPDATE jobs SET job_type = 'rendering' WHERE id = ${a}`; // an ended job's type
    expect(await endsFromCounter(sql, r.id)).toEqual(await endsFromJobs(sql, r.id));
    await sql`UPDATE jobs SET status = 'queued' WHERE id = ${b}`; // back out of an end
    await sql`DELETE FROM jobs WHERE id = ${a}`;
    expect(await endsFromCounter(sql, r.id)).toEqual(await endsFromJobs(sql, r.id));
    expect(await renterJobCount(sql, r.id)).toBe(3);
    const platform = await platformEnds(sql);
    expect(platform.fromCounter.length).toBeGreaterThan(0);
    expect(platform.fromCounter).toEqual(platform.fromJobs);
  });

  it("counts a provider's ended jobs through ends, a change of provider and deletes, and its total reads none of them", async () => {
    const r = await makeRenter(srv);
    const [p1, p2] = [await makeProvider(srv), await makeProvider(srv)];
    const a = await newJob(sql, r.id, "pending", 100, "benchmark", p1.id);
    const b = await newJob(sql, r.id, "pending", 100, "training", p1.id);
    const c = await newJob(sql, r.id, "completed", 100, "benchmark", p2.id); // written ended
    const d = await newJob(sql, r.id, "queued", 100, "benchmark");
    await sql`UPDATE jobs SET status = 'completed' WHERE id = ${a}`;
    await sql`UPDATE jobs SET status = 'cancelled' WHERE id = ${b}`;
    await sql`UPDATE jobs SET status = 'cancelled' WHERE id = ${d}`; // never held a provider: no provider's count
    for (const p of [p1, p2]) {
      const ends = await providerEnds(sql, p.id);
      expect(ends.fromCounter).toEqual(ends.fromJobs);
    }
    expect((await providerEnds(sql, p1.id)).fromCounter).toHaveLength(2);
    await sql`UPDATE jobs SET provider_id = ${p2.id} WHERE id = ${a}`; // an ended job's provider changed
    await sql`DELETE FROM jobs WHERE id = ${c}`;
    for (const p of [p1, p2]) {
      const ends = await providerEnds(sql, p.id);
      expect(ends.fromCounter).toEqual(ends.fromJobs);
    }
    // Many ended jobs: the provider's total reads its counter and its active jobs, not its history.
    await sql`
      INSERT INTO jobs (job_id, renter_id, provider_id, job_type, status, duration_minutes, max_duration_seconds, rate_halala_per_minute, cost_halala, submitted_at)
      SELECT 'job-prov-' || ${p1.id} || '-' || g, ${r.id}, ${p1.id}, 'training', (ARRAY['completed', 'failed', 'cancelled'])[1 + g % 3], 1, 600, 25, 25,
             now() - make_interval(mins => g)
      FROM generate_series(1, 90) g`;
    await newJob(sql, r.id, "pending", 100, "training", p1.id);
    await sql`ANALYZE jobs`;
    const reader = { role: "provider" as const, providerId: p1.id };
    // One snapshot for the page and the rows: the server's dispatch may give p1 a queued job of an earlier test meanwhile.
    const { page, rows, countRead } = await sql.begin("isolation level repeatable read", async (tx) => {
      await tx`SET LOCAL enable_seqscan = off`;
      await tx`SET LOCAL enable_bitmapscan = off`;
      const page = await listJobs(tx, reader, { limit: 5, offset: 0 });
      const before = await readFrom(tx, "jobs");
      await tx`SELECT ${jobCountSql(tx, { providerId: p1.id })} AS n`;
      const countRead = (await readFrom(tx, "jobs")) - before;
      const [c] = await tx<{ n: number }[]>`SELECT count(*)::bigint AS n FROM jobs WHERE provider_id = ${p1.id}`;
      return { page, rows: Number(c.n), countRead };
    });
    expect(page.total).toBe(rows);
    expect(rows).toBeGreaterThanOrEqual(92);
    expect(countRead).toBeLessThan(5);
  });

  it("jobs ending at once on two connections do not wait for each other's count, and an end undone elsewhere still sums", async () => {
    const r = await makeRenter(srv);
    const [x, y] = [await newJob(sql, r.id, "queued", 100, "benchmark"), await newJob(sql, r.id, "queued", 100, "benchmark")];
    // Two connections that write different shards of the platform's counter (their backend pids, mod 16).
    const pool = connect(srv.databaseUrl, 16);
    const held: Awaited<ReturnType<Sql["reserve"]>>[] = [];
    try {
      const shardOf = async (c: (typeof held)[number]) => Number((await c<{ s: number }[]>`SELECT pg_backend_pid() % 16 AS s`)[0].s);
      const a = await pool.reserve();
      let b = await pool.reserve();
      held.push(a, b);
      while ((await shardOf(a)) === (await shardOf(b)) && held.length < 16) {
        b = await pool.reserve();
        held.push(b);
      }
      expect(await shardOf(a)).not.toBe(await shardOf(b));
      // A job of another renter: a renter's own counter row would make ends of one renter's jobs wait anyway.
      const other = await makeRenter(srv);
      // Its id in the same class mod 16 as x's, so that a counter sharded by job id would make it wait.
      let z = await newJob(sql, other.id, "queued", 100, "benchmark");
      while (z % 16 !== x % 16) z = await newJob(sql, other.id, "queued", 100, "benchmark");
      await a`BEGIN`;
      await a`UPDATE jobs SET status = 'completed' WHERE id = ${x}`;
      await b`SET lock_timeout = '2s'`;
      await b`UPDATE jobs SET status = 'completed' WHERE id = ${z}`; // committed at once: no wait for a's shard
      await a`COMMIT`;
      await b`UPDATE jobs SET status = 'completed' WHERE id = ${y}`;
      // An end undone on the other connection: that shard goes down by one, the sum stays the rows'.
      await b`UPDATE jobs SET status = 'queued' WHERE id = ${x}`;
    } finally {
      for (const c of held) c.release();
      await pool.end();
    }
    const platform = await platformEnds(sql);
    expect(platform.fromCounter).toEqual(platform.fromJobs);
    expect(await endsFromCounter(sql, r.id)).toEqual(await endsFromJobs(sql, r.id));
  });

  it("the admin job list's totals by renter, status and job type are the rows', read without the history", async () => {
    const r = await makeRenter(srv);
    await sql`
      INSERT INTO jobs (job_id, renter_id, job_type, status, duration_minutes, max_duration_seconds, rate_halala_per_minute, cost_halala, submitted_at)
      SELECT 'job-typed-' || ${r.id} || '-' || g, ${r.id}, (ARRAY['training', 'rendering', 'benchmark'])[1 + g % 3],
             (ARRAY['completed', 'failed', 'cancelled', 'completed'])[1 + g % 4], 1, 600, 25, 25, now() - make_interval(mins => g)
      FROM generate_series(1, 120) g`;
    await newJob(sql, r.id, "queued", 100, "rendering");
    await newJob(sql, r.id, "queued", 100, "training");
    await sql`ANALYZE jobs`;
    const fromRows = async (f: { renterId?: number; status?: string; jobType?: string }) => {
      const [c] = await sql<{ n: number }[]>`
        SELECT count(*)::bigint AS n FROM jobs WHERE true
          ${f.renterId ? sql`AND renter_id = ${f.renterId}` : sql``} ${f.status ? sql`AND status = ${f.status}` : sql``}
          ${f.jobType ? sql`AND job_type = ${f.jobType}` : sql``}`;
      return Number(c.n);
    };
    for (const renterId of [r.id, undefined]) {
      for (const status of [undefined, "completed", "cancelled", "queued"]) {
        for (const jobType of ["rendering", "benchmark"]) {
          const f = { renterId, status, jobType };
          const page = await listAdminJobs(sql, { ...f, limit: 3, offset: 0 });
          expect(Number(page.total), JSON.stringify(f)).toBe(await fromRows(f));
          expect(page.rows.every((j) => j.job_type === jobType && (!status || j.status === status))).toBe(true);
        }
      }
    }
    expect(await fromRows({ renterId: r.id, jobType: "rendering" })).toBe(41);
    const platform = await platformEnds(sql);
    expect(platform.fromCounter).toEqual(platform.fromJobs);
    // Every renter's total by type reads the platform's counter (at most 16 rows per status and type), not every renter's.
    const everyRenterRead = await sql.begin(async (tx) => {
      const before = await readFrom(tx, "renter_job_ends");
      await tx`SELECT ${jobCountSql(tx, { jobType: "rendering" })} AS n`;
      return (await readFrom(tx, "renter_job_ends")) - before;
    });
    expect(everyRenterRead).toBe(0);
    // The total of one renter's jobs of one type visits its active jobs, not its 40 ended ones.
    const countRead = await sql.begin(async (tx) => {
      await tx`SET LOCAL enable_seqscan = off`;
      await tx`SET LOCAL enable_bitmapscan = off`;
      const before = await readFrom(tx, "jobs");
      await tx`SELECT ${jobCountSql(tx, { renterId: r.id, jobType: "rendering" })} AS n`;
      return (await readFrom(tx, "jobs")) - before;
    });
    expect(countRead).toBeLessThan(8);
  });

  it("job totals of a renter with many ended jobs read its page, not its history", async () => {
    const r = await makeRenter(srv);
    await sql`
      INSERT INTO jobs (job_id, renter_id, job_type, status, duration_minutes, max_duration_seconds, rate_halala_per_minute, cost_halala, submitted_at)
      SELECT 'job-many-' || ${r.id} || '-' || g, ${r.id}, 'training', (ARRAY['completed', 'failed', 'cancelled'])[1 + g % 3], 1, 600, 25, 25,
             now() - make_interval(mins => g)
      FROM generate_series(1, 90) g`;
    await newJob(sql, r.id, "queued");
    await sql`ANALYZE jobs`;
    const reader = { role: "renter" as const, renterId: r.id };
    const { all, completed, queued, read, count, countRead } = await sql.begin(async (tx) => {
      // Small test tables favour scans that read every row; forbid them to see what the indexes make the reads visit.
      await tx`SET LOCAL enable_seqscan = off`;
      await tx`SET LOCAL enable_bitmapscan = off`;
      const before = await readFrom(tx, "jobs");
      const all = await listJobs(tx, reader, { limit: 5, offset: 0 });
      const completed = await listJobs(tx, reader, { status: "completed", limit: 5, offset: 0 });
      const queued = await listJobs(tx, reader, { status: "queued", limit: 5, offset: 0 });
      const read = (await readFrom(tx, "jobs")) - before;
      const count = await renterJobCount(tx, r.id);
      return { all, completed, queued, read, count, countRead: (await readFrom(tx, "jobs")) - before - read };
    });
    expect(all.total).toBe(91);
    expect(all.rows).toHaveLength(5);
    expect(completed.total).toBe(30);
    expect(completed.rows.every((j) => j.status === "completed")).toBe(true);
    expect(queued.total).toBe(1);
    expect(count).toBe(91);
    // Three pages of five (index entry and row each, and a row or two past each page, where its order
    // is settled) and the one active job: about 25. Counting the history visited the 91 again per page (132).
    expect(read).toBeLessThan(45);
    expect(countRead).toBeLessThan(5);
    // Past the last page the total is still answered.
    expect((await listJobs(sql, reader, { limit: 5, offset: 500 })).total).toBe(91);
  });
});

describe("backfill", () => {
  it("counts what was written before the migration: this month's charges and every ended job", async () => {
    const db = await freshDatabase();
    const pool = connect(db.url, 2);
    try {
      await migrate(pool, { through: 24 });
      const [{ id: renter }] = await pool<{ id: number }[]>`INSERT INTO renters (name, email) VALUES ('Old', 'old@example.com') RETURNING id`;
      const [{ id: other }] = await pool<{ id: number }[]>`INSERT INTO renters (name, email) VALUES ('Other', 'other@example.com') RETURNING id`;
      await pool.begin((tx) => credit(tx, renter, 1_000, "old-topup"));
      for (const [who, status] of [[renter, "completed"], [renter, "completed"], [renter, "failed"], [renter, "queued"], [other, "cancelled"]] as const) {
        await newJob(pool, who, status);
      }
      await chargeAt(pool, renter, 40, new Date());
      await chargeAt(pool, renter, 2, new Date(), "v1_charge_provider");
      await chargeAt(pool, renter, 9, new Date(monthStart().getTime() - 1)); // last month: not backfilled, not read
      expect(await migrate(pool)).toEqual(expect.arrayContaining([30]));

      const month = monthStart().toISOString().slice(0, 10);
      expect(await fromCounter(pool, renter)).toEqual([{ month, spent: 42 }]);
      expect((await fromLedger(pool, renter)).find((m) => m.month === month)).toEqual({ month, spent: 42 });
      expect(await endsFromCounter(pool, renter)).toEqual(await endsFromJobs(pool, renter));
      expect(await endsFromCounter(pool, other)).toEqual([{ status: "cancelled", job_type: "training", n: 1 }]);
      expect(await renterJobCount(pool, renter)).toBe(4);
      expect(await pool.begin((tx) => quotaUsage(tx, renter))).toMatchObject({ spentAndHeldHalala: 42 });
    } finally {
      await pool.end();
      await db.drop();
    }
  });

  it("recounts the ended jobs by job type (migration 042), whatever the counter held before", async () => {
    const db = await freshDatabase();
    const pool = connect(db.url, 2);
    try {
      await migrate(pool, { through: 41 });
      const [{ id: renter }] = await pool<{ id: number }[]>`INSERT INTO renters (name, email) VALUES ('Typed', 'typed@example.com') RETURNING id`;
      const [{ id: provider }] = await pool<{ id: number }[]>`
        INSERT INTO providers (name, email, gpu_model, os) VALUES ('Old GPU', 'gpu@example.com', 'RTX 4090', 'linux') RETURNING id`;
      const rows = [["completed", "training"], ["completed", "rendering"], ["completed", "rendering"], ["failed", "benchmark"], ["cancelled", "rendering"], ["queued", "rendering"]];
      for (const [status, jobType] of rows) await newJob(pool, renter, status, 100, jobType, status === "completed" ? provider : null);
      expect(await migrate(pool, { through: 42 })).toEqual([42]);
      expect(await endsFromCounter(pool, renter)).toEqual([
        { status: "cancelled", job_type: "rendering", n: 1 },
        { status: "completed", job_type: "rendering", n: 2 },
        { status: "completed", job_type: "training", n: 1 },
        { status: "failed", job_type: "benchmark", n: 1 },
      ]);
      // The readers below are today's: they read today's columns, so the rest of the migrations first.
      await migrate(pool);
      expect(Number((await listAdminJobs(pool, { renterId: renter, jobType: "rendering", limit: 10, offset: 0 })).total)).toBe(4);
      expect(Number((await listAdminJobs(pool, { jobType: "rendering", status: "completed", limit: 10, offset: 0 })).total)).toBe(2);
      const platform = await platformEnds(pool);
      expect(platform.fromCounter.reduce((n, r) => n + Number(r.n), 0)).toBe(5);
      expect(platform.fromCounter).toEqual(platform.fromJobs);
      expect((await providerEnds(pool, provider)).fromCounter).toEqual([
        { status: "completed", job_type: "rendering", n: 2 },
        { status: "completed", job_type: "training", n: 1 },
      ]);
    } finally {
      await pool.end();
      await db.drop();
    }
  });
});
