// The ledger audit against a real server: 0 drift on books written by real
// flows (top-ups, holds, settlements, cancels, adjustments), every kind of
// deliberate break found and named, the periodic run elected once across
// pools, and its figures on /metrics.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { connect } from "../../src/db/index.js";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import { runScheduledLedgerAudit } from "../../src/domain/money/ledger-audit.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { ADMIN_TOKEN, startTestServer, type TestServer } from "../helpers/server.js";

const admin = { "x-admin-token": ADMIN_TOKEN };
let srv: TestServer;

beforeAll(async () => {
  srv = await startTestServer({ SVC_METRICS_DB_SECONDS: "1", SVC_LEDGER_AUDIT_SECONDS: "0" });
});
afterAll(() => srv?.close());

async function audit() {
  const r = await client(srv.url).get("/api/admin/ledger/audit", admin);
  expect(r.status, r.text).toBe(200);
  return r.body;
}

/** Books written by the real flows: a renter topped up, jobs completed, cancelled before and while running, one open, an adjustment. */
async function realTraffic() {
  const api = client(srv.url);
  const renter = await makeRenter(srv);
  expect((await api.post("/api/renters/topup", { amount_halala: 20_000 }, renter.headers)).status).toBe(200);
  const provider = await makeProvider(srv);
  const submit = () => api.post("/api/jobs/submit", { job_type: "llm-inference", duration_minutes: 3 }, renter.headers);
  const done = await submit();
  expect(done.status, done.text).toBe(201);
  const queued = await submit();
  expect(queued.body.queued).toBe(true);
  await api.get(`/api/providers/${provider.key}/jobs`);
  const result = await api.post("/api/providers/job-result", { api_key: provider.key, job_id: done.body.job.job_id, success: true, result: { response: "ok" } });
  expect(result.status, result.text).toBe(200);
  // The queued job was dispatched when the first ended; cancel it: its hold goes back.
  expect((await api.post(`/api/jobs/${queued.body.job.job_id}/cancel`, {}, renter.headers)).status).toBe(200);
  // A job cancelled by its renter while it runs is charged for the time used: a settlement of a cancelled job.
  const ranThenCancelled = await submit();
  expect(ranThenCancelled.status).toBe(201);
  expect((await api.get(`/api/providers/${provider.key}/jobs`)).body.job.job_id).toBe(ranThenCancelled.body.job.job_id);
  // The daemon's first report confirms it has the job: from then on its time is billable.
  expect((await api.post(`/api/jobs/${ranThenCancelled.body.job.job_id}/progress`, { api_key: provider.key, progress_pct: 1 })).status).toBe(200);
  const cancelled = await api.post(`/api/jobs/${ranThenCancelled.body.job.job_id}/cancel`, {}, renter.headers);
  expect(cancelled.status, cancelled.text).toBe(200);
  const [charged] = await srv.sql<{ status: string; actual_cost_halala: number }[]>`SELECT status, actual_cost_halala FROM jobs WHERE job_id = ${ranThenCancelled.body.job.job_id}`;
  expect(charged).toMatchObject({ status: "cancelled" });
  expect(charged.actual_cost_halala).toBeGreaterThan(0);
  const open = await submit();
  expect(open.status).toBe(201);
  expect((await api.post(`/api/admin/renters/${renter.id}/adjust-balance`, { amount_halala: 700, reason: "audit test" }, admin)).status).toBe(200);
  return { renter, provider, completedJobId: done.body.job.job_id as string, openJobId: open.body.job.job_id as string };
}

describe("ledger audit", () => {
  let fx: Awaited<ReturnType<typeof realTraffic>>;

  it("reports 0 drift and no discrepancy on books written by the real flows", async () => {
    fx = await realTraffic();
    const r = await audit();
    expect(r).toMatchObject({ ok: true, drift_halala: 0, discrepancy_count: 0, books_sum_halala: 0, discrepancies: [] });
    expect(r.entries).toBeGreaterThanOrEqual(8);
    expect(r.accounts).toBeGreaterThanOrEqual(6);
    expect(r.settled_jobs).toBe(2);
    expect(r.open_holds).toBe(1);
    expect(typeof r.duration_ms).toBe("number");
    expect(Date.parse(r.finished_at)).toBeGreaterThanOrEqual(Date.parse(r.started_at));
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("finds a deliberately broken balance, held amount and settlement, and names each", async () => {
    const [available] = await srv.sql<{ id: number }[]>`SELECT id FROM ledger_accounts WHERE kind = 'renter_available' AND owner_id = ${fx.renter.id}`;
    const [held] = await srv.sql<{ id: number }[]>`SELECT id FROM ledger_accounts WHERE kind = 'renter_held' AND owner_id = ${fx.renter.id}`;
    const [job] = await srv.sql<{ id: number }[]>`SELECT id FROM jobs WHERE job_id = ${fx.completedJobId}`;
    // A balance moved without an entry, a held amount off its holds, a settlement leg lost.
    await srv.sql`UPDATE ledger_accounts SET balance = balance + 500 WHERE id = ${available.id}`;
    await srv.sql`UPDATE ledger_holds SET amount = amount + 40 WHERE job_id = (SELECT id FROM jobs WHERE job_id = ${fx.openJobId})`;
    const [leg] = await srv.sql<{ amount: number }[]>`DELETE FROM ledger_transfers WHERE idempotency_key = ${`settle:job:${job.id}:platform`} RETURNING amount`;
    await srv.sql`UPDATE ledger_accounts SET balance = balance + ${leg.amount} WHERE id = ${held.id}`;

    const r = await audit();
    expect(r.ok).toBe(false);
    const kinds = r.discrepancies.map((d: { kind: string }) => d.kind);
    const balance = r.discrepancies.find((d: { kind: string; subject: string }) => d.kind === "balance_mismatch" && d.subject.includes(`renter_available of renter ${fx.renter.id}`));
    expect(balance).toMatchObject({ actual_halala: balance.expected_halala + 500 });
    expect(kinds).toContain("books_unbalanced");
    const heldOff = r.discrepancies.find((d: { kind: string }) => d.kind === "held_mismatch");
    expect(heldOff.subject).toBe(`renter ${fx.renter.id}`);
    const settlement = r.discrepancies.find((d: { kind: string; subject: string }) => d.kind === "settlement_mismatch" && d.subject.includes(fx.completedJobId));
    expect(settlement).toMatchObject({ expected_halala: settlement.actual_halala + leg.amount });
    // The lost leg moved money out of the platform's (derived) fees back into the held account: only the 500 unbalance the books.
    expect(r.books_sum_halala).toBe(500);
    // The open hold grown by 40 with no entry moving it.
    const hold = r.discrepancies.find((d: { kind: string; subject: string }) => d.kind === "settlement_mismatch" && d.subject.includes(fx.openJobId));
    expect(hold).toMatchObject({ expected_halala: hold.actual_halala + 40 });
    // Drift: the 500 on the balance, held off its holds by 40 - leg, the hold 40 off its entries, the leg not charged.
    expect(r.drift_halala).toBe(500 + Math.abs(40 - leg.amount) + 40 + leg.amount);
    expect(r.discrepancy_count).toBe(r.discrepancies.length);
    // The older check agrees that the books are broken.
    expect((await ledgerProblems(srv.sql)).length).toBeGreaterThan(0);
  });

  it("shows the last run's drift and discrepancy count on /metrics", async () => {
    const last = await audit();
    let text = "";
    for (let i = 0; i < 50; i++) {
      text = (await client(srv.url).get("/metrics", admin)).text;
      if (new RegExp(`^svc_ledger_drift_halala ${last.drift_halala}$`, "m").test(text)) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    expect(text).toMatch(new RegExp(`^svc_ledger_drift_halala ${last.drift_halala}$`, "m"));
    expect(text).toMatch(new RegExp(`^svc_ledger_discrepancies ${last.discrepancy_count}$`, "m"));
    expect(text).toMatch(/^svc_ledger_audit_age_seconds \d/m);
  });

  it("runs periodically in one process at a time: the advisory lock elects it, a recent run is not repeated", async () => {
    await srv.sql`DELETE FROM ledger_audits`;
    // Four pools standing for four processes, all due at once.
    const pools = [connect(srv.databaseUrl, 3), connect(srv.databaseUrl, 3), connect(srv.databaseUrl, 3), connect(srv.databaseUrl, 3)];
    try {
      const runs = await Promise.all(pools.map((p) => runScheduledLedgerAudit(p, 3600)));
      expect(runs.filter((r) => r !== undefined)).toHaveLength(1);
      expect(await runScheduledLedgerAudit(pools[0], 3600)).toBeUndefined();
      const rows = await srv.sql<{ trigger: string; drift_halala: number }[]>`SELECT trigger, drift_halala FROM ledger_audits`;
      expect(rows).toHaveLength(1);
      expect(rows[0].trigger).toBe("schedule");
      expect(rows[0].drift_halala).toBeGreaterThan(0);
      // Once the last run is older than the period, the next tick runs it again.
      await srv.sql`UPDATE ledger_audits SET finished_at = now() - interval '2 hours'`;
      expect(await runScheduledLedgerAudit(pools[1], 3600)).toBeDefined();
    } finally {
      await Promise.all(pools.map((p) => p.end()));
    }
  });
});
