// The available-providers list at fleet size: pages walked over real HTTP
// hold every available provider once, in the list's order (VRAM, then
// reliability, NULLs last, then id), each with the same total; a page is read
// along providers_available_idx (migration 038) instead of sorting every
// available provider. The total of a page that ends the list is exact; a full
// page takes a count that one process reuses for a few seconds.
import { describe, expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { genericPlanOf } from "../helpers/plans.js";
import { AVAILABLE_COUNT_REUSE_MS, availablePageSql, availableProviders } from "../../src/domain/providers/marketplace.js";

const srv = useTestServer({ SVC_LIVENESS_SWEEP_SECONDS: "3600" });

interface Listed {
  id: number;
  vram_mib: number;
  reliability_score: number | null;
}

describe("available-providers at fleet size", () => {
  it("pages through 2,500 available providers in order, each once, with one total; a page reads the index, not a sort", async () => {
    // 2,500 available (VRAM and score repeat, some of each unknown), and 2,500 that are not:
    // paused, unapproved, or offline (silent past the live window, or marked so).
    await srv.sql`
      INSERT INTO providers (name, email, gpu_model, os, status, approval_status, is_paused, last_heartbeat, gpu_vram_mib, reliability_score)
      SELECT 'Rig ' || g, 'fleet-' || g || '@example.test', 'NVIDIA RTX 4090', 'linux',
             CASE WHEN g % 10 IN (3, 9) THEN 'offline' ELSE 'online' END,
             CASE WHEN g % 10 = 5 THEN 'pending' ELSE 'approved' END,
             g % 10 = 7,
             now() - CASE WHEN g % 10 = 9 THEN interval '10 minutes' ELSE interval '5 seconds' END,
             CASE WHEN g % 97 = 0 THEN NULL ELSE 8192 * (1 + g % 6) END,
             CASE WHEN g % 13 = 0 THEN NULL ELSE (g % 40)::float8 END
      FROM generate_series(1, 5000) g
      WHERE g % 2 = 0 OR g % 10 IN (3, 5, 7, 9)`;
    await srv.sql`ANALYZE providers`;
    const expected = await srv.sql<{ id: number }[]>`
      SELECT id FROM providers
      WHERE status = 'online' AND NOT is_paused AND approval_status = 'approved'`;
    expect(expected.length).toBe(2500);

    const api = client(srv.url);
    const seen: Listed[] = [];
    for (let offset = 0; ; offset += 1000) {
      const r = await api.get(`/api/renters/available-providers?limit=1000&offset=${offset}`);
      expect(r.status).toBe(200);
      expect(r.body.total).toBe(2500);
      if (r.body.providers.length === 0) break;
      seen.push(...r.body.providers);
    }
    expect(seen.map((p) => p.id).sort((a, b) => a - b)).toEqual(expected.map((p) => p.id).sort((a, b) => a - b));
    // VRAM descending, unknown VRAM (listed as 0) last; then score descending, unknown last; then id.
    const key = (p: Listed) => [p.vram_mib === 0 ? -1 : p.vram_mib, p.reliability_score ?? -1, -p.id];
    for (let i = 1; i < seen.length; i++) {
      const [a, b] = [key(seen[i - 1]), key(seen[i])];
      const before = a[0] > b[0] || (a[0] === b[0] && (a[1] > b[1] || (a[1] === b[1] && a[2] > b[2])));
      expect(before, `${JSON.stringify(seen[i - 1])} before ${JSON.stringify(seen[i])}`).toBe(true);
    }
    expect(seen.at(-1)!.vram_mib).toBe(0);

    // Past the end: no providers, the total still.
    expect((await api.get("/api/renters/available-providers?limit=10&offset=2500")).body).toMatchObject({ providers: [], total: 2500 });

    // The statement as postgres.js runs it after a few executions (a generic plan): the page along the index.
    const plan = await genericPlanOf(srv.sql, availablePageSql(srv.sql, 100, 0));
    expect(plan).toContain("Index Scan using providers_available_idx");
    expect(plan).not.toMatch(/\bSort\b/);
  });

  it("counts for a page at an offset or a full page: a page that ends the list exact, a full page never below its end, past the count nothing read", async () => {
    let counts = 0;
    const count = (n: number) => async () => {
      counts++;
      return n;
    };
    // A first page that ends the list: its rows, not counted.
    expect((await availableProviders(srv.sql, 3000, 0, count(9))).total).toBe(2500);
    expect(counts).toBe(0);
    // A page at an offset is checked against the count first (available-offsets.test.ts); one that ends
    // the list is still exact, offset plus its rows, when a reused count is behind.
    expect((await availableProviders(srv.sql, 1000, 2000, count(2100))).total).toBe(2500);
    // A full page: the count, raised to the rows up to the page's end when a reused count is behind.
    expect((await availableProviders(srv.sql, 100, 0, count(2600))).total).toBe(2600);
    expect((await availableProviders(srv.sql, 100, 1000, count(1050))).total).toBe(1100);
    // At or past the count: no providers, and the count.
    expect(await availableProviders(srv.sql, 100, 4000, count(2400))).toEqual({ providers: [], total: 2400 });
    // Past the end inside a count that is ahead: never more than the offset (there are fewer).
    expect((await availableProviders(srv.sql, 100, 2600, count(2700))).total).toBe(2600);
    expect(counts).toBe(5);
  });

  it("a server reuses the count for a few seconds; a page that ends the list is exact at once", async () => {
    const api = client(srv.url);
    await new Promise((r) => setTimeout(r, AVAILABLE_COUNT_REUSE_MS)); // a count the tests above read has expired
    const counted = Date.now();
    expect((await api.get("/api/renters/available-providers?limit=10")).body.total).toBe(2500);
    // 300 more come online: full pages keep the count read just now, a page that reaches the end is exact.
    await srv.sql`
      INSERT INTO providers (name, email, gpu_model, os, status, approval_status, last_heartbeat, gpu_vram_mib)
      SELECT 'Late ' || g, 'late-' || g || '@example.test', 'NVIDIA L4', 'linux', 'online', 'approved', now(), 4096
      FROM generate_series(1, 300) g`;
    expect((await api.get("/api/renters/available-providers?limit=10")).body.total).toBe(2500);
    const end = (await api.get("/api/renters/available-providers?limit=1000&offset=2000")).body;
    expect(end.providers.length).toBe(800);
    expect(end.total).toBe(2800);
    expect(Date.now() - counted).toBeLessThan(AVAILABLE_COUNT_REUSE_MS);
    await new Promise((r) => setTimeout(r, AVAILABLE_COUNT_REUSE_MS + 100));
    expect((await api.get("/api/renters/available-providers?limit=10")).body.total).toBe(2800);
  });
});
