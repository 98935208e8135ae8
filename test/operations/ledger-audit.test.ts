// The ledger audit against a real server: 0 drift on books written by real
// flows (top-ups, holds, settlements, cancels, adjustments), every kind of
// deliberate break found and named, incremental runs from the last clean
// run's watermark (what they find, what only a full run finds, a watermark
// that neither passes a run with discrepancies nor an entry still being
// written), append-only entries, the periodic run elected once across pools
// and full once a day, and its figures on /metrics.
import { describe, expect, it } from "vitest";
import { connect } from "../../src/db/index.js";
import { accountId, ledgerProblems, transfer } from "../../src/domain/money/ledger.js";
import { auditLedgerNow, runScheduledLedgerAudit } from "../../src/domain/money/ledger-audit.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { ADMIN_TOKEN, useTestServer } from "../helpers/server.js";

const admin = { "x-admin-token": ADMIN_TOKEN };

const srv = useTestServer({ SVC_METRICS_DB_SECONDS: "1", SVC_LEDGER_AUDIT_SECONDS: "0" });

async function audit(query = "") {
  const r = await client(srv.url).get(`/api/admin/ledger/audit${query}`, admin);
  expect(r.status, r.text).toBe(200);
  return r.body;
}

/** Changes the ledger behind the append-only trigger's back, as only a bug outside the service or a repair could. */
async function behindTriggers(fn: (tx: any) => Promise<unknown>): Promise<void> {
  await srv.sql.begin(async (tx) => {
    await tx.unsafe("SET LOCAL session_replication_role = replica");
    await fn(tx);
  });
}

type Found = { kind: string; subject: string; expected_halala: number; actual_halala: number };
const about = (r: { discrepancies: Found[] }, kind: string, jobId: string) => r.discrepancies.filter((d) => d.kind === kind && d.subject.includes(jobId));

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

  /** A job of fx's renter run to completion on a provider of its own; its job_id. */
  async function completedJob(): Promise<string> {
    const api = client(srv.url);
    const provider = await makeProvider(srv);
    const sub = await api.post("/api/jobs/submit", { job_type: "llm-inference", duration_minutes: 2, provider_id: provider.id }, fx.renter.headers);
    expect(sub.status, sub.text).toBe(201);
    expect((await api.get(`/api/providers/${provider.key}/jobs`)).body.job.job_id).toBe(sub.body.job.job_id);
    const done = await api.post("/api/providers/job-result", { api_key: provider.key, job_id: sub.body.job.job_id, success: true, result: { response: "ok" } });
    expect(done.status, done.text).toBe(200);
    return sub.body.job.job_id;
  }

  it("reports 0 drift and no discrepancy on books written by the real flows", async () => {
    fx = await realTraffic();
    const r = await audit();
    expect(r).toMatchObject({ ok: true, drift_halala: 0, discrepancy_count: 0, books_sum_halala: 0, discrepancies: [] });
    expect(r.entries).toBeGreaterThanOrEqual(8);
    // No clean run before it: a full run, which becomes the base of the next one.
    const [{ max }] = await srv.sql<{ max: number }[]>`SELECT max(id) AS max FROM ledger_transfers`;
    expect(r).toMatchObject({ mode: "full", from_entry_id: 0, to_entry_id: max, base_audit_id: null });
    expect(r.watermark_entry_id).toBeGreaterThanOrEqual(max);
    expect(r.accounts).toBeGreaterThanOrEqual(6);
    expect(r.settled_jobs).toBe(2);
    expect(r.open_holds).toBe(1);
    expect(typeof r.duration_ms).toBe("number");
    expect(Date.parse(r.finished_at)).toBeGreaterThanOrEqual(Date.parse(r.started_at));
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("refuses to change or delete a ledger entry", async () => {
    const [e] = await srv.sql<{ id: number }[]>`SELECT id FROM ledger_transfers ORDER BY id LIMIT 1`;
    await expect(srv.sql`UPDATE ledger_transfers SET amount = amount + 1 WHERE id = ${e.id}`).rejects.toThrow(/append-only \(UPDATE refused\)/);
    await expect(srv.sql`DELETE FROM ledger_transfers WHERE id = ${e.id}`).rejects.toThrow(/append-only \(DELETE refused\)/);
    await expect(srv.sql`TRUNCATE ledger_transfers CASCADE`).rejects.toThrow(/append-only \(TRUNCATE refused\)/);
    // A short debit is still refused, and now writes nothing at all; a repeat of a key that moved still does nothing.
    const poor = await makeRenter(srv, 100);
    const from = await accountId(srv.sql, "renter_available", poor.id);
    const to = await accountId(srv.sql, "adjustments");
    const move = (amount: number, key: string) => srv.sql.begin((tx) => transfer(tx, { from, to, amount, kind: "adjustment", key }));
    const entries = async () => (await srv.sql<{ n: number; last: number }[]>`SELECT count(*)::int AS n, (SELECT last_value FROM ledger_transfers_id_seq) AS last FROM ledger_transfers`)[0];
    const before = await entries();
    await expect(move(101, `overdraft:${poor.id}`)).rejects.toMatchObject({ status: 402 });
    expect(await entries()).toEqual(before); // not even an id taken
    expect(await move(60, `once:${poor.id}`)).toBe(true);
    expect(await move(60, `once:${poor.id}`)).toBe(false); // 40 left: a repeat, not a refusal
    expect((await entries()).n).toBe(before.n + 1);
  });

  it("reads only the entries after the last clean run, and finds a broken settlement there; its watermark holds until repaired", async () => {
    const clean = await audit();
    expect(clean).toMatchObject({ ok: true, mode: "incremental", discrepancy_count: 0 });
    expect(clean.base_audit_id).toBeGreaterThan(0);
    expect(clean.watermark_entry_id).toBeGreaterThanOrEqual(clean.from_entry_id);

    // A job settled after that run's watermark; a leg of its settlement written twice (no balance moved).
    const jobId = await completedJob();
    const [job] = await srv.sql<{ id: number }[]>`SELECT id FROM jobs WHERE job_id = ${jobId}`;
    const [held] = await srv.sql<{ id: number }[]>`SELECT id FROM ledger_accounts WHERE kind = 'renter_held' AND owner_id = ${fx.renter.id}`;
    const [fees] = await srv.sql<{ id: number }[]>`SELECT id FROM ledger_accounts WHERE kind = 'platform_fees'`;
    await srv.sql`
      INSERT INTO ledger_transfers (debit_account_id, credit_account_id, amount, kind, idempotency_key, job_id)
      VALUES (${held.id}, ${fees.id}, 7, 'charge_platform', ${`planted:${job.id}`}, ${job.id})`;

    const broken = await audit();
    expect(broken).toMatchObject({ ok: false, mode: "incremental", from_entry_id: clean.watermark_entry_id, base_audit_id: clean.audit_id, watermark_entry_id: null });
    expect(broken.entries).toBeGreaterThanOrEqual(4);
    const [charged] = about(broken, "settlement_mismatch", jobId);
    expect(charged).toMatchObject({ actual_halala: charged.expected_halala + 7 });

    // The run that found it is no base: the next one reads the same range and finds it again.
    const again = await audit();
    expect(again).toMatchObject({ ok: false, mode: "incremental", from_entry_id: clean.watermark_entry_id, base_audit_id: clean.audit_id, watermark_entry_id: null });
    expect(about(again, "settlement_mismatch", jobId)).toHaveLength(1);

    // Repaired, the next run is clean and moves the watermark on.
    await behindTriggers((tx) => tx`DELETE FROM ledger_transfers WHERE idempotency_key = ${`planted:${job.id}`}`);
    const repaired = await audit();
    expect(repaired).toMatchObject({ ok: true, mode: "incremental", from_entry_id: clean.watermark_entry_id });
    expect(repaired.watermark_entry_id).toBeGreaterThanOrEqual(repaired.to_entry_id);
    expect((await audit()).from_entry_id).toBe(repaired.watermark_entry_id);
  });

  it("does not move the watermark past an entry still being written: the next run reads it", async () => {
    const base = await audit();
    expect(base).toMatchObject({ ok: true, mode: "incremental" });
    const [job] = await srv.sql<{ id: number }[]>`SELECT id FROM jobs WHERE job_id = ${fx.completedJobId}`;
    const [held] = await srv.sql<{ id: number }[]>`SELECT id FROM ledger_accounts WHERE kind = 'renter_held' AND owner_id = ${fx.renter.id}`;
    const [available] = await srv.sql<{ id: number }[]>`SELECT id FROM ledger_accounts WHERE kind = 'renter_available' AND owner_id = ${fx.renter.id}`;
    // A transaction takes an entry id and stays open (an extra release of an old job, no balance moved) ...
    const writer = await srv.sql.reserve();
    try {
      await writer`BEGIN`;
      const [late] = await writer<{ id: number }[]>`
        INSERT INTO ledger_transfers (debit_account_id, credit_account_id, amount, kind, idempotency_key, job_id)
        VALUES (${held.id}, ${available.id}, 3, 'release', ${`late:${job.id}`}, ${job.id}) RETURNING id`;
      // ... while later entries commit: a top-up.
      expect((await client(srv.url).post("/api/renters/topup", { amount_halala: 1_000 }, fx.renter.headers)).status).toBe(200);
      const [{ max }] = await srv.sql<{ max: number }[]>`SELECT max(id) AS max FROM ledger_transfers`;
      expect(max).toBeGreaterThan(late.id);
      // A run that cannot wait for it reads the later entries but does not become a base.
      const during = await auditLedgerNow(srv.sql, { writersWaitMs: 200 });
      expect(during).toMatchObject({ discrepancyCount: 0, mode: "incremental", fromEntryId: base.watermark_entry_id, toEntryId: max, watermark: null });
      await writer`COMMIT`;
    } finally {
      writer.release();
    }
    // The next run starts where the last base left off, and sees the late entry.
    const after = await audit();
    expect(after).toMatchObject({ ok: false, mode: "incremental", from_entry_id: base.watermark_entry_id });
    expect(about(after, "settlement_mismatch", fx.completedJobId)).toHaveLength(1);
    expect(after.discrepancies.some((d: Found) => d.kind === "balance_mismatch" && d.subject.includes(`renter_held of renter ${fx.renter.id}`))).toBe(true);
    await behindTriggers((tx) => tx`DELETE FROM ledger_transfers WHERE idempotency_key = ${`late:${job.id}`}`);
    expect(await audit()).toMatchObject({ ok: true, mode: "incremental" });
  });

  it("runs a full audit on the schedule once per full period, incremental ones between", async () => {
    // The last run (incremental) and the last full one are an hour old.
    await srv.sql`UPDATE ledger_audits SET finished_at = finished_at - interval '1 hour'`;
    const between = await runScheduledLedgerAudit(srv.sql, 60, 86_400);
    expect(between).toMatchObject({ mode: "incremental", discrepancyCount: 0 });
    // Two days later: full.
    await srv.sql`UPDATE ledger_audits SET finished_at = finished_at - interval '2 days'`;
    const daily = await runScheduledLedgerAudit(srv.sql, 60, 86_400);
    expect(daily).toMatchObject({ mode: "full", fromEntryId: 0, discrepancyCount: 0 });
    expect(daily!.watermark).toBeGreaterThanOrEqual(daily!.toEntryId);
    // An operator asks for a full run; a bad value is a 400.
    expect(await audit("?full=true")).toMatchObject({ ok: true, mode: "full", from_entry_id: 0 });
    const bad = await client(srv.url).get("/api/admin/ledger/audit?full=maybe", admin);
    expect(bad.status).toBe(400);
    expect(bad.body.error).toMatch(/full/);
  });

  it("finds a deliberately broken balance, held amount and settlement, and names each; a broken old job only in a full run", async () => {
    const [available] = await srv.sql<{ id: number }[]>`SELECT id FROM ledger_accounts WHERE kind = 'renter_available' AND owner_id = ${fx.renter.id}`;
    const [held] = await srv.sql<{ id: number }[]>`SELECT id FROM ledger_accounts WHERE kind = 'renter_held' AND owner_id = ${fx.renter.id}`;
    const [job] = await srv.sql<{ id: number }[]>`SELECT id FROM jobs WHERE job_id = ${fx.completedJobId}`;
    // A balance moved without an entry, a held amount off its holds, a settlement leg lost.
    await srv.sql`UPDATE ledger_accounts SET balance = balance + 500 WHERE id = ${available.id}`;
    await srv.sql`UPDATE ledger_holds SET amount = amount + 40 WHERE job_id = (SELECT id FROM jobs WHERE job_id = ${fx.openJobId})`;
    let leg = { amount: 0 };
    await behindTriggers(async (tx) => {
      [leg] = await tx`DELETE FROM ledger_transfers WHERE idempotency_key = ${`settle:job:${job.id}:platform`} RETURNING amount`;
    });
    await srv.sql`UPDATE ledger_accounts SET balance = balance + ${leg.amount} WHERE id = ${held.id}`;

    // The completed job's entries are older than the watermark: an incremental run finds the
    // balances and the renter's held amount off its holds (checked on every run), not the job's lost leg.
    const inc = await audit();
    expect(inc).toMatchObject({ ok: false, mode: "incremental" });
    expect(inc.discrepancies.some((d: Found) => d.kind === "balance_mismatch" && d.subject.includes(`renter_available of renter ${fx.renter.id}`))).toBe(true);
    expect(inc.discrepancies.some((d: Found) => d.kind === "held_mismatch" && d.subject === `renter ${fx.renter.id}`)).toBe(true);
    expect(about(inc, "settlement_mismatch", fx.completedJobId)).toEqual([]);

    const r = await audit("?full=true");
    expect(r).toMatchObject({ mode: "full", from_entry_id: 0, watermark_entry_id: null });
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

    // A job ended without its hold being closed (no ledger movement): every run sees the open hold.
    await srv.sql`UPDATE jobs SET status = 'failed' WHERE job_id = ${fx.openJobId}`;
    const ended = await audit();
    expect(ended.mode).toBe("incremental");
    expect(about(ended, "hold_open_on_ended_job", fx.openJobId)).toHaveLength(1);
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
