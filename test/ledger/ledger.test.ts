// The ledger functions the jobs engineer calls, directly inside transactions:
// once-only holds, settlements and releases (also when they race), the
// overdraft guard, and the submit quota.
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from "vitest";
import { connect, type Sql } from "../../src/db/index.js";
import { accountBalance, accountId, adjust, credit, debit, hold, ledgerProblems, release, renterFunds, settle, transfer } from "../../src/domain/money/ledger.js";
import { checkSubmitQuota, quotaUsage } from "../../src/domain/money/quota.js";
import { lockRenterFunds } from "../../src/domain/money/settlement.js";
import { reserveTokenBudget } from "../../src/domain/money/usage-billing.js";
import { useTestServer } from "../helpers/server.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";

let sql: Sql;

const srv = useTestServer();
beforeAll(async () => {
  sql = connect(srv.databaseUrl, 16);
});
afterAll(() => sql?.end());

let seq = 0;
async function newJob(renterId: number, cost: number, submittedAt = new Date()): Promise<number> {
  const [j] = await sql<{ id: number }[]>`
    INSERT INTO jobs (job_id, renter_id, job_type, status, duration_minutes, max_duration_seconds, rate_halala_per_minute, cost_halala, submitted_at)
    VALUES (${`job-ledger-${process.pid}-${++seq}`}, ${renterId}, 'training', 'queued', 1, 600, 25, ${cost}, ${submittedAt}) RETURNING id`;
  return j.id;
}

describe("hold, settle, release", () => {
  it("settles 75/25 once: a repeat answers the same figures and moves nothing; a later release moves nothing", async () => {
    const r = await makeRenter(srv, 1000);
    const p = await makeProvider(srv);
    const job = await newJob(r.id, 400);
    expect(await sql.begin((tx) => hold(tx, r.id, job, 400))).toBe(true);
    expect(await sql.begin((tx) => hold(tx, r.id, job, 400))).toBe(false);
    expect(await renterFunds(sql, r.id)).toEqual({ available: 600, held: 400, balance: 1000 });

    const first = await sql.begin((tx) => settle(tx, r.id, p.id, job, 400, 250));
    expect(first).toEqual({ cost: 250, providerEarned: 187, platformFee: 63, moved: true, state: "settled", owed: 0 });
    const again = await sql.begin((tx) => settle(tx, r.id, p.id, job, 400, 250));
    expect(again).toEqual({ ...first, moved: false });
    // A retried result with other figures still answers the first settlement.
    expect(await sql.begin((tx) => settle(tx, r.id, p.id, job, 400, 10))).toEqual({ ...first, moved: false });
    expect(await sql.begin((tx) => release(tx, r.id, job, 400))).toBe(false);

    expect(await renterFunds(sql, r.id)).toEqual({ available: 750, held: 0, balance: 750 });
    expect(await accountBalance(sql, await accountId(sql, "provider_earnings", p.id))).toBe(187);
    const [renter] = await sql`SELECT total_spent_halala FROM renters WHERE id = ${r.id}`;
    expect(renter.total_spent_halala).toBe(250);
    const [prov] = await sql`SELECT total_earnings_halala, total_jobs FROM providers WHERE id = ${p.id}`;
    expect(prov).toEqual({ total_earnings_halala: 187, total_jobs: 1 });
    expect(await ledgerProblems(sql)).toEqual([]);
  });

  it("releases once; a settle after the release moves nothing and says released", async () => {
    const r = await makeRenter(srv, 500);
    const p = await makeProvider(srv);
    const job = await newJob(r.id, 500);
    await sql.begin((tx) => hold(tx, r.id, job, 500));
    expect(await sql.begin((tx) => release(tx, r.id, job))).toBe(true);
    expect(await sql.begin((tx) => release(tx, r.id, job, 500))).toBe(false);
    expect(await sql.begin((tx) => settle(tx, r.id, p.id, job, 500, 500))).toEqual({ cost: 0, providerEarned: 0, platformFee: 0, moved: false, state: "released", owed: 0 });
    expect(await renterFunds(sql, r.id)).toEqual({ available: 500, held: 0, balance: 500 });
  });

  it("a release after a settle cannot take other jobs' holds (the bug the hold rows fix)", async () => {
    const r = await makeRenter(srv, 1000);
    const p = await makeProvider(srv);
    const a = await newJob(r.id, 300);
    const b = await newJob(r.id, 300);
    await sql.begin((tx) => hold(tx, r.id, a, 300));
    await sql.begin((tx) => hold(tx, r.id, b, 300));
    await sql.begin((tx) => settle(tx, r.id, p.id, a, 300, 100));
    expect(await sql.begin((tx) => release(tx, r.id, a, 300))).toBe(false);
    expect(await renterFunds(sql, r.id)).toEqual({ available: 600, held: 300, balance: 900 });
    expect(await ledgerProblems(sql)).toEqual([]);
  });

  it("a settle racing a release and a retried settle: exactly one closes the hold", async () => {
    const r = await makeRenter(srv, 10_000);
    const p = await makeProvider(srv);
    for (let round = 0; round < 10; round++) {
      const job = await newJob(r.id, 200);
      await sql.begin((tx) => hold(tx, r.id, job, 200));
      const results = await Promise.all([
        sql.begin((tx) => settle(tx, r.id, p.id, job, 200, 120)),
        sql.begin((tx) => release(tx, r.id, job, 200)),
        sql.begin((tx) => settle(tx, r.id, p.id, job, 200, 120)),
        sql.begin((tx) => release(tx, r.id, job)),
      ]);
      const moved = results.filter((x) => (typeof x === "boolean" ? x : x.moved));
      expect(moved).toHaveLength(1);
    }
    expect((await renterFunds(sql, r.id)).held).toBe(0);
    expect(await ledgerProblems(sql)).toEqual([]);
  });

  it("rejects costs above the hold and settling without a hold", async () => {
    const r = await makeRenter(srv, 100);
    const p = await makeProvider(srv);
    const job = await newJob(r.id, 100);
    await expect(sql.begin((tx) => settle(tx, r.id, p.id, job, 100, 50))).rejects.toThrow(/no hold/);
    await sql.begin((tx) => hold(tx, r.id, job, 100));
    await expect(sql.begin((tx) => settle(tx, r.id, p.id, job, 100, 101))).rejects.toThrow(/above the 100 held/);
    await expect(sql.begin((tx) => settle(tx, r.id, p.id, job, 90, 50))).rejects.toThrow(/90 given as held, 100 held/);
    await expect(sql.begin((tx) => release(tx, r.id + 1, job))).rejects.toThrow(/belongs to renter/);
    expect(await renterFunds(sql, r.id)).toEqual({ available: 0, held: 100, balance: 100 });
  });
});

describe("accounts", () => {
  it("creating an account another transaction is creating at the same moment leaves no row lock behind", async () => {
    // Two settles paying a provider for the first time both create its earnings account. The second
    // waits for the first; it must not come out of that wait holding a lock on the account, or it
    // holds it outside the id order in which settle locks accounts (a deadlock, seen under load).
    const p = await makeProvider(srv);
    const first = await sql.reserve();
    const second = await sql.reserve();
    try {
      await first`BEGIN`;
      const [{ id }] = await first<{ id: number }[]>`SELECT ledger_account('provider_earnings', ${p.id}::bigint) AS id`;
      await second`BEGIN`;
      const waiting = second<{ id: number }[]>`SELECT ledger_account('provider_earnings', ${p.id}::bigint) AS id`.execute();
      await new Promise((r) => setTimeout(r, 200)); // the second is now waiting on the first's insert
      await first`COMMIT`;
      const [{ id: again }] = await waiting;
      expect(again).toBe(id);
      // Another transaction can lock the account at once: the second holds nothing on it.
      const locked = await sql.begin((tx) => tx`SELECT id FROM ledger_accounts WHERE id = ${id} FOR NO KEY UPDATE NOWAIT`);
      expect(locked).toHaveLength(1);
      await second`COMMIT`;
    } finally {
      // Back to the pool with no transaction open, whatever happened above.
      for (const c of [first, second]) {
        await c`ROLLBACK`.catch(() => {});
        c.release();
      }
    }
  });
});

describe("lock order", () => {
  it("a settlement locking a renter's funds does not deadlock with a transfer of that renter under way", async () => {
    // A transfer inserts its row first (foreign keys: KEY SHARE on both accounts), then locks the
    // accounts FOR NO KEY UPDATE. A settlement locking the funds FOR UPDATE would wait for that key
    // share, queued in front of the transfer's own lock on the same rows (see migration 009): it must
    // take the same NO KEY UPDATE strength as the ledger and not wait for a key share at all.
    const renter = await makeRenter(srv, 1_000);
    const acct = await renterFunds(sql, renter.id);
    const [{ available, held }] = await sql<{ available: number; held: number }[]>`
      SELECT ledger_account('renter_available', ${renter.id}::bigint) AS available, ledger_account('renter_held', ${renter.id}::bigint) AS held`;
    const transferTx = await sql.reserve();
    try {
      await transferTx`BEGIN`;
      await transferTx`
        INSERT INTO ledger_transfers (debit_account_id, credit_account_id, amount, kind, idempotency_key)
        VALUES (${available}, ${held}, 1, 'hold', ${`lock-order-${renter.id}`})`;
      const settling = sql.begin(async (tx) => {
        await tx`SET LOCAL lock_timeout = '2s'`;
        await lockRenterFunds(tx, renter.id);
        await new Promise((r) => setTimeout(r, 300));
      });
      await new Promise((r) => setTimeout(r, 100)); // the settlement holds (or waits for) the funds now
      await transferTx`SELECT id FROM ledger_accounts WHERE id IN (${available}, ${held}) ORDER BY id FOR NO KEY UPDATE`;
      await settling;
    } finally {
      await transferTx`ROLLBACK`.catch(() => {});
      transferTx.release();
    }
    expect(await renterFunds(sql, renter.id)).toEqual(acct);
  });
});

describe("no overdraft", () => {
  it("a short hold is 402, writes nothing and leaves the transaction usable", async () => {
    const r = await makeRenter(srv, 100);
    const job = await newJob(r.id, 101);
    const outcome = await sql.begin(async (tx) => {
      const err = await hold(tx, r.id, job, 101).catch((e) => e);
      await tx`UPDATE renters SET organization = 'still usable' WHERE id = ${r.id}`;
      return err;
    });
    expect(outcome.message).toMatch(/insufficient balance: 100 halala available, 101 needed/);
    const [row] = await sql`SELECT organization FROM renters WHERE id = ${r.id}`;
    expect(row.organization).toBe("still usable");
    expect(await sql`SELECT * FROM ledger_holds WHERE job_id = ${job}`).toHaveLength(0);
    expect(await renterFunds(sql, r.id)).toEqual({ available: 100, held: 0, balance: 100 });
  });

  it("many concurrent holds never hold more than the renter has", async () => {
    const r = await makeRenter(srv, 1000);
    const jobs = await Promise.all(Array.from({ length: 30 }, () => newJob(r.id, 70)));
    const results = await Promise.allSettled(jobs.map((j) => sql.begin((tx) => hold(tx, r.id, j, 70))));
    const ok = results.filter((x) => x.status === "fulfilled").length;
    expect(ok).toBe(Math.floor(1000 / 70));
    for (const x of results) if (x.status === "rejected") expect(String(x.reason.message)).toMatch(/insufficient balance/);
    expect(await renterFunds(sql, r.id)).toEqual({ available: 1000 - ok * 70, held: ok * 70, balance: 1000 });
    expect(await ledgerProblems(sql)).toEqual([]);
  });

  it("debit and negative adjustments stop at the available funds; the CHECK backs it up", async () => {
    const r = await makeRenter(srv, 300);
    await expect(sql.begin((tx) => debit(tx, r.id, 301, `t-debit-${r.id}`))).rejects.toThrow(/insufficient balance/);
    await expect(sql.begin((tx) => adjust(tx, r.id, -301, `t-adj-${r.id}`, "too much"))).rejects.toThrow(/insufficient balance/);
    expect(await sql.begin((tx) => adjust(tx, r.id, -100, `t-adj2-${r.id}`, "fee"))).toBe(true);
    expect(await sql.begin((tx) => adjust(tx, r.id, -100, `t-adj2-${r.id}`, "fee"))).toBe(false);
    expect(await sql.begin((tx) => adjust(tx, r.id, 50, `t-adj3-${r.id}`, "goodwill"))).toBe(true);
    expect((await renterFunds(sql, r.id)).available).toBe(250);
    const acct = await accountId(sql, "renter_available", r.id);
    await expect(sql`UPDATE ledger_accounts SET balance = -1 WHERE id = ${acct}`).rejects.toThrow(/check constraint/);
    await expect(sql.begin((tx) => transfer(tx, { from: acct, to: acct, amount: 1, kind: "x", key: "self" }))).rejects.toThrow(/same account/);
    await expect(sql.begin((tx) => credit(tx, r.id, -5, "neg"))).rejects.toThrow(/invalid transfer amount/);
    expect(await ledgerProblems(sql)).toEqual([]);
  });
});

describe("checkSubmitQuota", () => {
  it("429 once today's job count reaches daily_jobs_limit (UTC day)", async () => {
    const r = await makeRenter(srv, 10_000);
    await sql`UPDATE renter_quota SET daily_jobs_limit = 2 WHERE renter_id = ${r.id}`;
    await newJob(r.id, 10, new Date(Date.now() - 2 * 86_400_000)); // an old job does not count
    await sql.begin((tx) => checkSubmitQuota(tx, r.id, 10));
    await newJob(r.id, 10);
    await sql.begin((tx) => checkSubmitQuota(tx, r.id, 10));
    await newJob(r.id, 10);
    const err = await sql.begin((tx) => checkSubmitQuota(tx, r.id, 10)).catch((e) => e);
    expect(err.message).toMatch(/renter quota exceeded: daily_jobs_limit is 2 jobs per UTC day and 2 were submitted today/);
    expect(err.status).toBe(429);
  });

  it("429 when settled this month + held + the new estimate exceed monthly_spend_limit_halala", async () => {
    const r = await makeRenter(srv, 10_000);
    const p = await makeProvider(srv);
    await sql`UPDATE renter_quota SET monthly_spend_limit_halala = 1000 WHERE renter_id = ${r.id}`;
    const a = await newJob(r.id, 600);
    await sql.begin((tx) => hold(tx, r.id, a, 600));
    await sql.begin((tx) => settle(tx, r.id, p.id, a, 600, 300)); // 300 spent
    const b = await newJob(r.id, 400);
    await sql.begin((tx) => hold(tx, r.id, b, 400)); // 400 held
    expect(await sql.begin((tx) => quotaUsage(tx, r.id))).toMatchObject({ spentAndHeldHalala: 700, monthlySpendLimitHalala: 1000 });
    await sql.begin((tx) => checkSubmitQuota(tx, r.id, 300));
    const err = await sql.begin((tx) => checkSubmitQuota(tx, r.id, 301)).catch((e) => e);
    expect(err.message).toMatch(/monthly_spend_limit_halala is 1000; 700 halala spent, held or reserved this UTC month and this job would hold 301 more/);
    // A release frees the quota again.
    await sql.begin((tx) => release(tx, r.id, b));
    await sql.begin((tx) => checkSubmitQuota(tx, r.id, 700));
    // /v1 token charges are spending too.
    await sql.begin(async (tx) =>
      transfer(tx, { from: await accountId(tx, "renter_available", r.id), to: await accountId(tx, "platform_fees"), amount: 50, kind: "v1_charge_platform", key: `v1-test-${r.id}` }),
    );
    expect((await sql.begin((tx) => quotaUsage(tx, r.id))).spentAndHeldHalala).toBe(350);
    await expect(sql.begin((tx) => checkSubmitQuota(tx, r.id, 700))).rejects.toThrow(/monthly_spend_limit_halala/);
  });
});

describe("the monthly spend limit's Retry-After (/v1 reservation)", () => {
  afterEach(() => {
    vi.useRealTimers();
  });

  it("runs to the next UTC month of the database's clock, which counts the month, whatever this host's clock says", async () => {
    const renter = await makeRenter(srv, 100_000);
    await sql`UPDATE renter_quota SET monthly_spend_limit_halala = 1 WHERE renter_id = ${renter.id}`;
    // This process's clock (Date only, still advancing) 30 s into the next UTC month while the
    // database's is still in this one: what a 30 s skew gives in the last 30 s of every month (the
    // skew is larger here only because the database's clock cannot be moved to its month's end).
    const dbNow = async () => (await sql<{ now: Date }[]>`SELECT clock_timestamp() AS now`)[0].now;
    const db = await dbNow();
    const appNow = Date.UTC(db.getUTCFullYear(), db.getUTCMonth() + 1, 1) + 30_000;
    vi.useFakeTimers({ toFake: ["Date"], shouldAdvanceTime: true });
    vi.setSystemTime(new Date(appNow + (performance.timeOrigin + performance.now() - db.getTime())));
    const err = await sql
      .begin((tx) =>
        reserveTokenBudget(tx, {
          requestId: `retry-after-${process.pid}-${++seq}`, renterId: renter.id, model: "m", stream: false,
          rate: { input: 1_000_000, output: 1_000_000 }, promptTokens: 100, maxTokens: 100, choices: 1, ttlSeconds: 60,
        }),
      )
      .catch((e) => e);
    vi.useRealTimers();
    expect(err?.status, String(err)).toBe(429);
    const now = await dbNow();
    const expected = (Date.UTC(now.getUTCFullYear(), now.getUTCMonth() + 1, 1) - now.getTime()) / 1000;
    const retry = Number(err.headers["retry-after"]);
    expect(Math.abs(retry - expected), `Retry-After ${retry} s; the database's month ends in ${Math.round(expected)} s`).toBeLessThan(60);
  });
});

describe("reads by owner at scale", () => {
  it("a renter's accounts are found through an index on the owner, not by scanning every renter's accounts", async () => {
    const r = await makeRenter(srv, 100);
    const plan = await srv.sql.begin(async (tx) => {
      // Small test tables favour scans; forbid them to see whether an index can answer at all.
      await tx`SET LOCAL enable_seqscan = off`;
      await tx`SET LOCAL enable_bitmapscan = off`;
      const rows = await tx.unsafe(`EXPLAIN SELECT kind, balance FROM ledger_accounts WHERE owner_id = ${Number(r.id)} AND kind IN ('renter_available', 'renter_held')`);
      return rows.map((x) => x["QUERY PLAN"] as string).join("\n");
    });
    expect(plan).toMatch(/Index (Only )?Scan using ledger_accounts_owner_idx/);
    expect(plan).toMatch(/Index Cond: \(+owner_id = /);
    expect(await renterFunds(srv.sql, r.id)).toMatchObject({ available: 100, held: 0 });
  });
});
