// GET /api/receipts/keys needs no credential. A page of provider keys reads
// every key before its offset (SQL OFFSET), and the count goes one past the
// page: an offset without bound made one call count and walk the whole
// provider_keys table. The offset is at most PROVIDER_KEYS_OFFSET_MAX (past
// it: 400 naming the bound, no statement run), so a call's work stays within
// the count's bound plus a page whatever the table holds; the keys past it come
// in keyset pages (after_provider_id), which `svc receipt keys` walks to write
// every key. Work is measured as
// rows the server's statements visit (EXPLAIN ANALYZE of each statement it
// ran, with its parameters), over real HTTP.
import fs from "node:fs";
import path from "node:path";
import { beforeAll, describe, expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { PROVIDER_KEYS_COUNTED, PROVIDER_KEYS_OFFSET_MAX } from "../../src/domain/money/receipts.js";
import { workOf } from "../providers/statement-work.js";
import { tempDir } from "../daemon/helpers.js";
import { runSvc } from "../cli/run-svc.js";

const srv = useTestServer({ SVC_LIVENESS_SWEEP_SECONDS: "3600", SVC_JOB_SWEEP_MS: "60000" });
/** Keys in the table: well past what one call may read (the count's bound plus a page of 1,000). */
const N = 3 * PROVIDER_KEYS_COUNTED;
const PAGE_MAX = 1000;

beforeAll(async () => {
  await srv.sql`
    INSERT INTO providers (name, email, gpu_model, os, status, approval_status)
    SELECT 'Rig ' || g, 'keys-' || g || '@example.test', 'NVIDIA RTX 4090', 'linux', 'offline', 'approved'
    FROM generate_series(1, ${N / 10}) g`;
  await srv.sql`
    INSERT INTO provider_keys (key_id, provider_id, public_key)
    SELECT 'prv-' || p.id || '-' || k, p.id, 'pk-' || p.id || '-' || k FROM providers p, generate_series(1, 10) k`;
  await srv.sql`ANALYZE providers`;
  await srv.sql`ANALYZE provider_keys`;
}, 60_000);

const keys = (q: string) => client(srv.url).get(`/api/receipts/keys${q}`);

describe("provider-key offsets on GET /api/receipts/keys", () => {
  it("an offset past the bound is 400 naming it, and reads no key", async () => {
    for (const offset of [PROVIDER_KEYS_OFFSET_MAX + 1, N, 1_000_000_000]) {
      let status = 0;
      let error = "";
      const work = await workOf(srv, "provider_keys", async () => {
        const r = await keys(`?limit=1&offset=${offset}`);
        status = r.status;
        error = r.body.error;
      });
      // Without the bound these walk and count the whole table: N rows each.
      expect(work.rows, `offset ${offset}`).toBe(0);
      expect(work.statements).toHaveLength(0);
      expect(status, `offset ${offset}`).toBe(400);
      expect(error).toMatch(new RegExp(`offset must be an integer between 0 and ${PROVIDER_KEYS_OFFSET_MAX}`));
      expect(error).toMatch(/provider_id/);
    }
  });

  it("the deepest page taken reads at most the count's bound plus a page, not the table", async () => {
    let body: { provider_keys: { key_id: string }[]; provider_keys_total: number } | undefined;
    const deepest = await workOf(srv, "provider_keys", async () => {
      const r = await keys(`?limit=${PAGE_MAX}&offset=${PROVIDER_KEYS_OFFSET_MAX}`);
      expect(r.status, r.text).toBe(200);
      body = r.body;
    });
    expect(body!.provider_keys).toHaveLength(PAGE_MAX);
    expect(body!.provider_keys_total).toBe(PROVIDER_KEYS_OFFSET_MAX + PAGE_MAX + 1); // one past the page: more follow
    // The page (offset plus its rows) and the count (one past the page), nothing more.
    expect(deepest.statements).toHaveLength(2);
    expect(deepest.rows).toBeLessThanOrEqual(2 * (PROVIDER_KEYS_OFFSET_MAX + PAGE_MAX + 1));
    expect(deepest.rows).toBeLessThan(N);
    // The same keys in the same order as the table holds them there.
    const expected = await srv.sql<{ key_id: string }[]>`
      SELECT key_id FROM provider_keys ORDER BY provider_id, registered_at, key_id LIMIT ${PAGE_MAX} OFFSET ${PROVIDER_KEYS_OFFSET_MAX}`;
    expect(body!.provider_keys.map((k) => k.key_id)).toEqual(expected.map((k) => k.key_id));

    // A first page counts to the bound only.
    const first = await workOf(srv, "provider_keys", async () => {
      const r = await keys("?limit=1");
      expect(r.body.provider_keys_total).toBe(PROVIDER_KEYS_COUNTED);
    });
    expect(first.rows).toBeLessThanOrEqual(PROVIDER_KEYS_COUNTED + 50); // the count, and a page of one (with the keys that share its sort prefix)
  });

  it("keys past the bound are listed in keyset pages after a provider, each reading a page, not the keys before it", async () => {
    const all = await srv.sql<{ key_id: string; provider_id: number }[]>`SELECT key_id, provider_id::int FROM provider_keys ORDER BY provider_id, registered_at, key_id`;
    const after = all[PROVIDER_KEYS_OFFSET_MAX + PAGE_MAX + 5].provider_id; // past what an offset reaches
    let body: { provider_keys: { key_id: string }[] } | undefined;
    const work = await workOf(srv, "provider_keys", async () => {
      const r = await keys(`?limit=${PAGE_MAX}&after_provider_id=${after}`);
      expect(r.status, r.text).toBe(200);
      body = r.body;
    });
    expect(body!.provider_keys.map((k) => k.key_id)).toEqual(all.filter((k) => k.provider_id > after).slice(0, PAGE_MAX).map((k) => k.key_id));
    expect(work.rows).toBeLessThanOrEqual(2 * (PROVIDER_KEYS_COUNTED + PAGE_MAX + 1));
    for (const bad of ["0", "-1", "x"]) expect((await keys(`?after_provider_id=${bad}`)).status, bad).toBe(400);
  });

  it("svc receipt keys writes every key, those past the offset bound too", async () => {
    const home = tempDir("svc-receipt-keys-all");
    const r = await runSvc(["receipt", "keys", "--url", srv.url, "-o", "keys.json"], { home });
    expect(r.code, r.stdout + r.stderr).toBe(0);
    const file = JSON.parse(fs.readFileSync(path.join(home, "keys.json"), "utf8"));
    const stored = await srv.sql<{ key_id: string }[]>`SELECT key_id FROM provider_keys ORDER BY key_id`;
    expect(file.provider_keys).toHaveLength(N);
    expect(file.provider_keys.map((k: { key_id: string }) => k.key_id).sort()).toEqual(stored.map((k) => k.key_id).sort());
    expect(file.server_keys).toHaveLength(1);
  });

  it("keys past the bound are listed by provider", async () => {
    const [last] = await srv.sql<{ provider_id: number }[]>`SELECT max(provider_id)::int AS provider_id FROM provider_keys`;
    const r = await keys(`?provider_id=${last.provider_id}`);
    expect(r.status, r.text).toBe(200);
    expect(r.body.provider_keys).toHaveLength(10);
    expect(r.body.provider_keys_total).toBe(10);
  });
});
