// Retention of Idempotency-Key rows: a key is honoured for KEY_KEPT_HOURS after
// its first request, then the sweep deletes it (and the same key starts a new
// request); keys inside the window and keys whose request is still in flight stay.
import { describe, expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeRenter } from "../helpers/fixtures.js";
import { KEY_KEPT_HOURS, deleteExpiredKeys } from "../../src/domain/money/idempotency.js";

// Its own sweep off: these tests run it themselves.
const srv = useTestServer({ SVC_RETENTION_SWEEP_SECONDS: "0" });
const api = () => client(srv.url);

/** Moves a key's first request `hours` into the past. */
const age = (scope: string, key: string, hours: number) =>
  srv.sql`UPDATE idempotency_keys SET created_at = now() - make_interval(hours => ${hours}) WHERE scope = ${scope} AND key = ${key}`;
const keysOf = async (scope: string) =>
  (await srv.sql<{ key: string }[]>`SELECT key FROM idempotency_keys WHERE scope = ${scope} ORDER BY key`).map((r) => r.key);

describe("retention of Idempotency-Key rows", () => {
  it("deletes keys past the window; keeps those inside it and those whose request is still in flight", async () => {
    const r = await makeRenter(srv);
    const scope = `renter-topup:${r.id}`;
    const topup = (key: string, amount = 1000) => api().post("/api/renters/topup", { amount_halala: amount }, { ...r.headers, "idempotency-key": key });
    for (const key of ["old", "recent"]) expect((await topup(key)).status).toBe(200);
    await age(scope, "old", KEY_KEPT_HOURS + 1);
    await age(scope, "recent", KEY_KEPT_HOURS - 1);
    // A claim made long ago whose request is still in flight (taken over recently), and one whose process died.
    await srv.sql`
      INSERT INTO idempotency_keys (scope, key, request_hash, claim_token, claimed_until, created_at)
      VALUES (${scope}, 'in-flight', 'h', 't1', now() + interval '60 seconds', now() - make_interval(hours => ${KEY_KEPT_HOURS + 5})),
             (${scope}, 'dead-claim', 'h', 't2', now() - interval '1 hour', now() - make_interval(hours => ${KEY_KEPT_HOURS + 5}))`;
    // A key past the window whose row a request holds right now (a duplicate waiting on it).
    expect((await topup("held")).status).toBe(200);
    await age(scope, "held", KEY_KEPT_HOURS + 2);
    let release!: () => void;
    const released = new Promise<void>((res) => (release = res));
    let locked!: () => void;
    const isLocked = new Promise<void>((res) => (locked = res));
    const holder = srv.sql.begin(async (tx) => {
      await tx`SELECT 1 FROM idempotency_keys WHERE scope = ${scope} AND key = 'held' FOR UPDATE`;
      locked();
      await released;
    });
    await isLocked;
    try {
      expect(await deleteExpiredKeys(srv.sql)).toBeGreaterThanOrEqual(2);
      expect(await keysOf(scope)).toEqual(["held", "in-flight", "recent"]);
    } finally {
      release();
      await holder;
    }
    expect(await deleteExpiredKeys(srv.sql)).toBeGreaterThanOrEqual(1);
    expect(await keysOf(scope)).toEqual(["in-flight", "recent"]);

    // Inside the window the key still replays, and another body is still refused.
    const balance = async () => Number((await api().get("/api/renters/balance", r.headers)).body.balance_halala);
    const before = await balance();
    const replay = await topup("recent");
    expect(replay.status).toBe(200);
    expect(await balance()).toBe(before);
    expect((await topup("recent", 2000)).status).toBe(409);
    // Past it, the same key is a new request.
    const again = await topup("old", 2000);
    expect(again.status).toBe(200);
    expect(await balance()).toBe(before + 2000);
  });

  it("deletes a backlog larger than one batch", async () => {
    const scope = `backlog-${Date.now()}`;
    await srv.sql`
      INSERT INTO idempotency_keys (scope, key, request_hash, response, created_at)
      SELECT ${scope}, 'k' || g, 'h', '{}'::jsonb, now() - make_interval(hours => ${KEY_KEPT_HOURS} + 1 + g % 100)
      FROM generate_series(1, 25000) g`;
    await srv.sql`INSERT INTO idempotency_keys (scope, key, request_hash, response) VALUES (${scope}, 'new', 'h', '{}'::jsonb)`;
    expect(await deleteExpiredKeys(srv.sql)).toBeGreaterThanOrEqual(25_000);
    expect(await keysOf(scope)).toEqual(["new"]);
  });
});
