// The ledger audit lists its first MAX_LISTED discrepancies, but its count and drift
// (and the /metrics gauges read from them) cover every discrepancy found.
import crypto from "node:crypto";
import { describe, expect, it } from "vitest";
import { holdMany } from "../../src/domain/money/ledger.js";
import { MAX_LISTED } from "../../src/domain/money/ledger-audit.js";
import { client } from "../helpers/http.js";
import { makeRenter } from "../helpers/fixtures.js";
import { useTestServer } from "../helpers/server.js";
import { ADMIN } from "../admin/helpers.js";

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000", SVC_LEDGER_AUDIT_SECONDS: "0" });
const api = client(srv);

async function insertJobs(renterId: number, n: number, status: string): Promise<number[]> {
  const ids = Array.from({ length: n }, () => `job-${crypto.randomBytes(8).toString("hex")}`);
  const rows = await srv.sql<{ id: number }[]>`
    INSERT INTO jobs (job_id, renter_id, job_type, status, duration_minutes, max_duration_seconds, rate_halala_per_minute, cost_halala)
    SELECT j, ${renterId}, 'llm-inference', ${status}, 1, 1800, 10, 10 FROM unnest(${ids}::text[]) AS j RETURNING id`;
  return rows.map((r) => Number(r.id));
}

async function audit(query = "") {
  const r = await api.get(`/api/admin/ledger/audit${query}`, ADMIN);
  expect(r.status, r.text).toBe(200);
  return r.body as { mode: string; drift_halala: number; discrepancy_count: number; discrepancies: { kind: string }[] };
}

const kindCount = (r: { discrepancies: { kind: string }[] }, kind: string) => r.discrepancies.filter((d) => d.kind === kind).length;

describe("ledger audit counts past the listed discrepancies", () => {
  it("counts every charged job without a settlement", async () => {
    const renter = await makeRenter(srv, 0);
    await insertJobs(renter.id, MAX_LISTED + 60, "completed"); // completed, never settled
    const r = await audit("?full=true");
    expect(r.discrepancy_count).toBe(MAX_LISTED + 60);
    expect(r.discrepancies).toHaveLength(MAX_LISTED);
    expect(kindCount(r, "charged_without_settlement")).toBe(MAX_LISTED);
    // The /metrics gauge reads the recorded count.
    const [row] = await srv.sql<{ discrepancies: number }[]>`SELECT discrepancies FROM ledger_audits ORDER BY id DESC LIMIT 1`;
    expect(row.discrepancies).toBe(MAX_LISTED + 60);
  });

  it("sums the drift of every open hold on an ended job, full and incremental", async () => {
    await srv.sql`UPDATE jobs SET status = 'failed' WHERE status = 'completed'`; // failed at no cost: not charged
    const renter = await makeRenter(srv, 1_000_000);
    const n = MAX_LISTED * 4 + 100;
    const ids = await insertJobs(renter.id, n, "queued");
    await srv.sql.begin((tx) => holdMany(tx as never, ids.map((jobId) => ({ renterId: renter.id, jobId, amount: 10 }))));
    expect(await audit("?full=true")).toMatchObject({ discrepancy_count: 0, drift_halala: 0 }); // clean: the base of the incremental run below
    await srv.sql`UPDATE jobs SET status = 'cancelled' WHERE id = ANY(${ids}::bigint[])`; // ended, holds left open
    const full = await audit("?full=true");
    expect(full).toMatchObject({ mode: "full", drift_halala: n * 10, discrepancy_count: n });
    expect(kindCount(full, "hold_open_on_ended_job")).toBe(MAX_LISTED);
    // The holds' entries are older than the base: the incremental run finds them by their open holds.
    const inc = await audit();
    expect(inc).toMatchObject({ mode: "incremental", drift_halala: n * 10, discrepancy_count: n });
    expect(inc.discrepancies).toHaveLength(MAX_LISTED);
  });
});
