// GET /api/renters/available-providers needs no credential, and a page at an
// offset makes PostgreSQL read every available provider before it (OFFSET
// along providers_available_idx). An offset at or past the count of available
// providers (the count each process reuses a few seconds) answers no providers
// and that total without reading any: a request for one row at offset 1e9 costs
// no walk of the fleet. Pages inside the count read as they did. Work is
// measured as rows the server's statements visit (EXPLAIN ANALYZE of each
// statement it ran, with its parameters), over real HTTP.
import { beforeAll, describe, expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { availableProviders } from "../../src/domain/providers/marketplace.js";
import { workOf } from "./statement-work.js";

const srv = useTestServer({ SVC_LIVENESS_SWEEP_SECONDS: "3600", SVC_JOB_SWEEP_MS: "60000" });
const N = 20_000;

beforeAll(async () => {
  // N available (heartbeats ahead of now, so they stay live however long the file runs), and some that are not.
  await srv.sql`
    INSERT INTO providers (name, email, gpu_model, os, status, approval_status, is_paused, last_heartbeat, gpu_vram_mib, gpu_count, reliability_score)
    SELECT 'Rig ' || g, 'off-' || g || '@example.test', 'NVIDIA RTX 4090', 'linux',
           'online', CASE WHEN g > ${N} THEN 'pending' ELSE 'approved' END, false,
           now() + interval '1 hour', 8192 * (1 + g % 4), 1, (g % 50)::float8
    FROM generate_series(1, ${N + 500}) g`;
  await srv.sql`ANALYZE providers`;
}, 60_000);

const list = async (q: string) => {
  const r = await client(srv.url).get(`/api/renters/available-providers${q}`);
  expect(r.status, r.text).toBe(200);
  return r.body as { providers: { id: number }[]; total: number; discovery_mode: string; discovery_health: object };
};

/** The ids of the available providers in the list's order, from offset `from`, `n` of them. */
const expectedIds = async (from: number, n: number) =>
  (
    await srv.sql<{ id: number }[]>`
      SELECT id FROM providers
      WHERE status = 'online' AND NOT is_paused AND approval_status = 'approved'
      ORDER BY gpu_vram_mib DESC NULLS LAST, reliability_score DESC NULLS LAST, id
      LIMIT ${n} OFFSET ${from}`
  ).map((r) => r.id);

describe("available-providers offsets", () => {
  it("an offset far past the fleet reads no provider: an empty page with the total, at the cost of offset 0", async () => {
    await list("?limit=1"); // the count, read now and reused by the requests below (AVAILABLE_COUNT_REUSE_MS)
    const cheap = await workOf(srv, "providers", () => list("?limit=1"));
    expect(cheap.statements).toHaveLength(1); // the page itself (the count is reused)
    expect(cheap.rows).toBeGreaterThan(0);
    expect(cheap.rows).toBeLessThan(50);

    let far: Awaited<ReturnType<typeof list>> | undefined;
    const deep = await workOf(srv, "providers", async () => {
      far = await list("?limit=1&offset=1000000000");
    });
    // The same shape as any page: no providers, the total still, the discovery fields.
    expect(far).toMatchObject({ providers: [], total: N, discovery_mode: "sqlite" });
    expect(far!.discovery_health).toBeDefined();
    // Without the bound this statement walks all N available providers along the index.
    expect(deep.rows, JSON.stringify(deep.statements.map((s) => s.string))).toBeLessThanOrEqual(cheap.rows + 10);

    // At exactly the count: past the last one, nothing read either.
    const atEnd = await workOf(srv, "providers", async () => {
      expect(await list(`?limit=1000&offset=${N}`)).toMatchObject({ providers: [], total: N });
    });
    expect(atEnd.rows).toBeLessThanOrEqual(cheap.rows + 10);
  });

  it("a page inside the count reads as before: its rows in the list's order, with the total", async () => {
    const last = await list(`?limit=1&offset=${N - 1}`);
    expect(last.total).toBe(N);
    expect(last.providers.map((p) => p.id)).toEqual(await expectedIds(N - 1, 1));

    const tail = await list(`?limit=1000&offset=${N - 300}`);
    expect(tail.total).toBe(N);
    expect(tail.providers.map((p) => p.id)).toEqual(await expectedIds(N - 300, 300));

    const mid = await list("?limit=5&offset=7000");
    expect(mid.total).toBe(N);
    expect(mid.providers.map((p) => p.id)).toEqual(await expectedIds(7000, 5));
  });

  it("past a count that is behind, the page is empty until the count is read again; inside it, rows are read", async () => {
    // A reused count 100 behind the fleet: offsets past it answer nothing for those few seconds, with that count.
    const behind = async () => N - 100;
    expect(await availableProviders(srv.sql, 10, N - 50, behind)).toMatchObject({ providers: [], total: N - 100 });
    // Inside it: read as before, the total never below the rows up to the page's end.
    const page = await availableProviders(srv.sql, 10, N - 105, behind);
    expect(page.providers.map((p) => Number(p.id))).toEqual(await expectedIds(N - 105, 10));
    expect(page.total).toBe(N - 95);
  });
});
