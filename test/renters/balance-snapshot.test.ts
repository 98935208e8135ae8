// GET /api/renters/balance answers figures of one moment: a job settling while the balance is read
// is in all of them or in none, so what the renter has plus what it spent is always what it paid in.
import { describe, expect, it } from "vitest";
import { hold, settle } from "../../src/domain/money/ledger.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { client } from "../helpers/http.js";
import { useTestServer } from "../helpers/server.js";

const srv = useTestServer();
const api = client(srv);

describe("balance under settlements", () => {
  it("balance_halala + total_spent_halala is what was paid in, read while jobs settle", { timeout: 120_000 }, async () => {
    const FUNDED = 1_000_000;
    const r = await makeRenter(srv, FUNDED);
    const p = await makeProvider(srv);
    let settling = true;
    const settler = (async () => {
      try {
        for (let i = 0; i < 60; i++) {
          const [j] = await srv.sql<{ id: number }[]>`
            INSERT INTO jobs (job_id, renter_id, job_type, status, duration_minutes, max_duration_seconds, rate_halala_per_minute, cost_halala)
            VALUES (${`balance-snapshot-${r.id}-${i}`}, ${r.id}, 'training', 'queued', 1, 600, 25, 100) RETURNING id`;
          await srv.sql.begin(async (tx) => {
            await hold(tx, r.id, j.id, 100);
            await settle(tx, r.id, p.id, j.id, 100, 100);
          });
        }
      } finally {
        settling = false;
      }
    })();
    const torn: unknown[] = [];
    let reads = 0;
    while (settling) {
      for (const b of await Promise.all(Array.from({ length: 4 }, () => api.get("/api/renters/balance", r.headers)))) {
        expect(b.status, b.text).toBe(200);
        reads++;
        if (b.body.balance_halala + b.body.total_spent_halala !== FUNDED) torn.push(b.body);
      }
    }
    await settler;
    expect(reads).toBeGreaterThan(0);
    expect(torn).toEqual([]);
    const end = (await api.get("/api/renters/balance", r.headers)).body;
    expect(end).toMatchObject({ balance_halala: FUNDED - 6_000, total_spent_halala: 6_000 });
  });
});
