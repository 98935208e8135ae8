// Operator actions sent at once (a double click, a retry, two operators): each
// audit entry says what the action found and what it left, in the order the
// changes were applied, so the trail reads as one chain that ends at the state
// the database holds.
import { describe, expect, it } from "vitest";
import { client } from "../helpers/http.js";
import { makeRenter } from "../helpers/fixtures.js";
import { useTestServer } from "../helpers/server.js";
import { ADMIN } from "./helpers.js";
import { oweRefund } from "../../src/domain/money/refund-debt.js";

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000" });
const api = client(srv);

/** A renter's audit entries of one action, oldest first. */
async function trail(action: string, renterId: number) {
  const r = await api.get(`/api/admin/audit?action=${action}&target_type=renter&target_id=${renterId}&limit=200`, ADMIN);
  expect(r.status).toBe(200);
  return (r.body.entries as { details: Record<string, any> }[]).reverse().map((e) => e.details);
}

describe("concurrent quota changes", () => {
  it("audits each change with the quota it replaced, in one chain ending at the stored quota", async () => {
    const renter = await makeRenter(srv);
    const limits = [11, 12, 13, 14, 15, 16];
    const answers = await Promise.all(
      limits.map((n, i) =>
        api.put(`/api/admin/renters/${renter.id}/quota`, i % 2 ? { daily_jobs_limit: n } : { daily_jobs_limit: n, monthly_spend_limit_halala: n * 1000 }, ADMIN),
      ),
    );
    expect(answers.map((a) => a.status)).toEqual(limits.map(() => 200));
    const log = await trail("renter.set_quota", renter.id);
    expect(log).toHaveLength(limits.length);
    // The first change found the default quota; every later one found what the one before it left.
    expect(log[0].before).toEqual({ daily_jobs_limit: 500, monthly_spend_limit_halala: 10_000_000 });
    for (let i = 1; i < log.length; i++) expect(log[i].before, `entry ${i}`).toEqual(log[i - 1].after);
    const [stored] = await srv.sql`SELECT daily_jobs_limit, monthly_spend_limit_halala FROM renter_quota WHERE renter_id = ${renter.id}`;
    expect(log.at(-1)!.after).toEqual({ daily_jobs_limit: Number(stored.daily_jobs_limit), monthly_spend_limit_halala: Number(stored.monthly_spend_limit_halala) });
    const shown = await api.get(`/api/admin/renters/${renter.id}`, ADMIN);
    expect(shown.body.quota).toEqual(log.at(-1)!.after);
  });

  it("chains the entries of a renter that had no quota row yet", async () => {
    const renter = await makeRenter(srv);
    await srv.sql`DELETE FROM renter_quota WHERE renter_id = ${renter.id}`;
    const answers = await Promise.all([21, 22, 23, 24].map((n) => api.put(`/api/admin/renters/${renter.id}/quota`, { daily_jobs_limit: n }, ADMIN)));
    expect(answers.map((a) => a.status)).toEqual([200, 200, 200, 200]);
    const log = await trail("renter.set_quota", renter.id);
    expect(log[0].before).toEqual({ daily_jobs_limit: 500, monthly_spend_limit_halala: 10_000_000 });
    for (let i = 1; i < log.length; i++) expect(log[i].before, `entry ${i}`).toEqual(log[i - 1].after);
  });
});

describe("concurrent balance adjustments", () => {
  it("audits each adjustment with the available balance it found and left, in one chain matching the ledger", async () => {
    const renter = await makeRenter(srv, 1_000);
    const amounts = [300, -400, 250, -700, 500, -100, -900, 50];
    const answers = await Promise.all(
      amounts.map((a) => api.post(`/api/admin/renters/${renter.id}/adjust-balance`, { amount_halala: a, reason: `adj ${a}` }, ADMIN)),
    );
    for (const a of answers) expect([200, 400], a.text).toContain(a.status);
    const applied = answers.filter((a) => a.status === 200).length;
    const log = await trail("renter.adjust_balance", renter.id);
    expect(log).toHaveLength(applied);
    expect(log[0].available_before).toBe(1_000);
    for (const [i, e] of log.entries()) {
      expect(e.available_after, `entry ${i}`).toBe(e.available_before + e.amount_halala);
      if (i > 0) expect(e.available_before, `entry ${i}`).toBe(log[i - 1].available_after);
    }
    const bal = await api.get(`/api/admin/renters/${renter.id}`, ADMIN);
    expect(bal.body.renter.balance_halala).toBe(log.at(-1)!.available_after);
  });

  it("says how much of a credit went to what the renter owes for a refunded payment", async () => {
    const renter = await makeRenter(srv, 0);
    await srv.sql.begin((tx) => oweRefund(tx as never, renter.id, 300));
    const r = await api.post(`/api/admin/renters/${renter.id}/adjust-balance`, { amount_halala: 1_000, reason: "goodwill" }, ADMIN);
    expect(r.status, r.text).toBe(200);
    expect(r.body.renter.balance_halala).toBe(700);
    const [entry] = await trail("renter.adjust_balance", renter.id);
    expect(entry).toMatchObject({ amount_halala: 1_000, available_before: 0, available_after: 700, refund_debt_paid_halala: 300 });
  });
});
