// The periodic ledger audit keeps its own schedule, and with it the daily full run,
// however often an operator or a monitor asks for an on-demand audit.
import { afterEach, describe, expect, it, vi } from "vitest";
import { latestLedgerAudit, runScheduledLedgerAudit } from "../../src/domain/money/ledger-audit.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { useTestServer } from "../helpers/server.js";
import { ADMIN, seedJob, settleJob } from "../admin/helpers.js";

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000", SVC_LEDGER_AUDIT_SECONDS: "0" });
const api = client(srv);
const PERIOD = 900;
const FULL = 86_400;

async function onDemand() {
  const r = await api.get("/api/admin/ledger/audit", ADMIN);
  expect(r.status, r.text).toBe(200);
  return r.body;
}

describe("the periodic ledger audit", () => {
  it("is not skipped for on-demand runs, so the full run comes when due and finds what only it sees", async () => {
    const renter = await makeRenter(srv, 10_000);
    const provider = await makeProvider(srv);
    const job = await seedJob(srv, { renterId: renter.id, providerId: provider.id, status: "running", cost: 100 });
    await settleJob(srv, job, renter.id, provider.id, 100, 60);
    await srv.sql`UPDATE jobs SET actual_cost_halala = 60 WHERE id = ${job.id}`;
    expect(await runScheduledLedgerAudit(srv.sql, PERIOD, FULL)).toMatchObject({ mode: "full", discrepancyCount: 0 });
    // Within the period, the periodic run is not repeated.
    expect(await runScheduledLedgerAudit(srv.sql, PERIOD, FULL)).toBeUndefined();

    // A job row changed after its hold was settled, which only a full run sees.
    await srv.sql`UPDATE jobs SET actual_cost_halala = 99 WHERE id = ${job.id}`;
    // A period later for the incremental run, and two days later for the full one; on-demand runs just now.
    await srv.sql`UPDATE ledger_audits SET finished_at = finished_at - interval '2 days'`;
    expect(await onDemand()).toMatchObject({ mode: "incremental", ok: true });
    expect(await onDemand()).toMatchObject({ mode: "incremental", ok: true });
    const due = await runScheduledLedgerAudit(srv.sql, PERIOD, FULL);
    expect(due).toMatchObject({ mode: "full", fromEntryId: 0 });
    expect(due!.discrepancies.map((d) => d.kind)).toEqual(["settlement_disagrees_with_job"]);

    // A period later, with more on-demand runs meanwhile: an incremental periodic run.
    await srv.sql`UPDATE ledger_audits SET finished_at = finished_at - make_interval(secs => ${PERIOD}) WHERE trigger = 'schedule'`;
    await onDemand();
    expect(await runScheduledLedgerAudit(srv.sql, PERIOD, FULL)).toMatchObject({ mode: "incremental" });
    const rows = await srv.sql<{ trigger: string; mode: string }[]>`SELECT trigger, mode FROM ledger_audits ORDER BY id`;
    expect(rows.map((r) => `${r.trigger}:${r.mode}`)).toEqual([
      "schedule:full",
      "admin:incremental",
      "admin:incremental",
      "schedule:full",
      "admin:incremental",
      "schedule:incremental",
    ]);
  });
});

describe("the periodic ledger audit keeps the database's clock", () => {
  // This process's clock (Date only, still advancing) is moved while PostgreSQL keeps the real time,
  // which decides whether a run is due.
  const skewAppClock = (ms: number) => {
    vi.useFakeTimers({ toFake: ["Date"], shouldAdvanceTime: true });
    vi.setSystemTime(new Date(performance.timeOrigin + performance.now() + ms));
  };
  afterEach(() => {
    vi.useRealTimers();
  });
  /** The periodic runs so far as if an hour old: the next one is due. */
  const ageRuns = () => srv.sql`UPDATE ledger_audits SET finished_at = finished_at - interval '1 hour' WHERE trigger = 'schedule'`;

  it("a run by a process whose clock is an hour ahead is recorded at the database's time and does not suppress the next periods' runs", async () => {
    await ageRuns();
    skewAppClock(3600_000);
    const first = await runScheduledLedgerAudit(srv.sql, 1, FULL);
    expect(first).toBeDefined();
    vi.useRealTimers();
    const [row] = await srv.sql<{ started_at: Date; finished_at: Date; now: Date }[]>`
      SELECT started_at, finished_at, clock_timestamp() AS now FROM ledger_audits WHERE id = ${first!.auditId!}`;
    expect(row.finished_at.getTime()).toBeLessThanOrEqual(row.now.getTime());
    expect(row.now.getTime() - row.finished_at.getTime()).toBeLessThan(10_000);
    expect(row.finished_at.getTime()).toBeGreaterThanOrEqual(row.started_at.getTime());
    expect(row.finished_at.getTime() - row.started_at.getTime()).toBeLessThanOrEqual(first!.ms + 5);
    // 1.5 periods later the next run is due.
    await new Promise((r) => setTimeout(r, 1500));
    expect(await runScheduledLedgerAudit(srv.sql, 1, FULL)).toBeDefined();
  });

  it("the last run's age (/metrics) carries no skew between this process's clock and the database's", async () => {
    await ageRuns();
    expect(await runScheduledLedgerAudit(srv.sql, 1, FULL)).toBeDefined();
    for (const skew of [-3600_000, 3600_000]) {
      skewAppClock(skew);
      const last = await latestLedgerAudit(srv.sql);
      const age = Date.now() - last!.finishedAt.getTime();
      vi.useRealTimers();
      expect(age, `app clock ${skew / 1000} s off`).toBeGreaterThanOrEqual(0);
      expect(age, `app clock ${skew / 1000} s off`).toBeLessThan(10_000);
    }
  });
});
