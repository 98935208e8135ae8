// Retention of the reputation inputs: uptime hours and attempt days older than
// what the score reads are deleted, in batches, without changing the score;
// the server runs the sweep at start and on its period, and deletes the spent
// login codes and expired Idempotency-Key rows with them.
import crypto from "node:crypto";
import { describe, expect, it } from "vitest";
import { freshDatabase, startTestServer, useTestServer } from "../helpers/server.js";
import { makeProvider } from "../helpers/fixtures.js";
import type { Db } from "../../src/db/index.js";
import { refreshReputation } from "../../src/domain/providers/reputation.js";
import { ATTEMPT_DAYS_KEPT, UPTIME_KEPT_HOURS, deleteExpiredReputationRows } from "../../src/domain/providers/retention.js";
import { KEY_KEPT_HOURS } from "../../src/domain/money/idempotency.js";

// Its own sweep off: these tests run it themselves.
const srv = useTestServer({ SVC_RETENTION_SWEEP_SECONDS: "0" });

const hoursAgo = (providerId: number, hours: number[]) => srv.sql`
  INSERT INTO provider_uptime (provider_id, hour, covered_seconds)
  SELECT ${providerId}, date_trunc('hour', now()) - make_interval(hours => h), 1800 FROM unnest(${hours}::int[]) AS h`;
const daysAgo = (providerId: number, days: number[]) => srv.sql`
  INSERT INTO provider_attempt_days (provider_id, day, carried, faults)
  SELECT ${providerId}, (now() AT TIME ZONE 'UTC')::date - d, 3, 1 FROM unnest(${days}::int[]) AS d`;
const keptHours = async (providerId: number) =>
  (await srv.sql<{ h: number }[]>`
    SELECT round(extract(epoch FROM date_trunc('hour', now()) - hour) / 3600)::int AS h FROM provider_uptime
    WHERE provider_id = ${providerId} ORDER BY hour DESC`).map((r) => r.h);
const keptDays = async (providerId: number) =>
  (await srv.sql<{ d: number }[]>`
    SELECT (now() AT TIME ZONE 'UTC')::date - day AS d FROM provider_attempt_days WHERE provider_id = ${providerId} ORDER BY day DESC`).map((r) => r.d);
const figures = async (db: Db, providerId: number) => {
  await refreshReputation(db, [providerId]);
  const [row] = await db`SELECT uptime_percent, reliability_score FROM providers WHERE id = ${providerId}`;
  return row;
};

describe("retention of uptime hours and attempt days", () => {
  it("deletes what the score no longer reads, keeps the rest, and leaves the score as it was", async () => {
    const p = await makeProvider(srv);
    await srv.sql`UPDATE providers SET first_heartbeat_at = now() - interval '90 days', last_heartbeat = now() - interval '10 seconds' WHERE id = ${p.id}`;
    await hoursAgo(p.id, [1, 2, 23, UPTIME_KEPT_HOURS - 1, UPTIME_KEPT_HOURS, UPTIME_KEPT_HOURS + 1, 24 * 60]);
    await daysAgo(p.id, [0, 1, 29, ATTEMPT_DAYS_KEPT - 1, ATTEMPT_DAYS_KEPT, ATTEMPT_DAYS_KEPT + 1, 60]);
    // One transaction, so the score before and after is computed at the same now(): the live span
    // since the last beat and the window both grow with the clock.
    const { deleted, before, after } = await srv.sql.begin(async (tx) => {
      const before = await figures(tx, p.id);
      const deleted = await deleteExpiredReputationRows(tx);
      return { deleted, before, after: await figures(tx, p.id) };
    });
    expect(deleted.uptimeHours).toBeGreaterThanOrEqual(2);
    expect(deleted.attemptDays).toBeGreaterThanOrEqual(3);
    expect(await keptHours(p.id)).toEqual([1, 2, 23, UPTIME_KEPT_HOURS - 1, UPTIME_KEPT_HOURS]);
    expect(await keptDays(p.id)).toEqual([0, 1, 29, ATTEMPT_DAYS_KEPT - 1]);
    expect(after).toEqual(before);
    expect(before.uptime_percent).toBeGreaterThan(0);

    expect(await deleteExpiredReputationRows(srv.sql)).toEqual({ uptimeHours: 0, attemptDays: 0 });
  });

  it("deletes a backlog larger than one batch", async () => {
    const p = await makeProvider(srv);
    const old = Array.from({ length: 25_000 }, (_, i) => UPTIME_KEPT_HOURS + 1 + i);
    await hoursAgo(p.id, [5, ...old]);
    const deleted = await deleteExpiredReputationRows(srv.sql);
    expect(deleted.uptimeHours).toBe(25_000);
    expect(await keptHours(p.id)).toEqual([5]);
  });
});

describe("uptime hours are UTC hours, whatever the session's TimeZone", () => {
  // Asia/Kolkata is UTC+05:30: a session there truncates to hours that start at :30 UTC.
  const inZone = (tx: Db, zone: string) => tx`SELECT set_config('TimeZone', ${zone}, true)`;

  it("retention keeps the oldest UTC hour it should and deletes what lies before it", async () => {
    const p = await makeProvider(srv);
    // One transaction: one now() for the rows and the sweep. The kept hour is the cut-off itself;
    // a row half an hour before it is past the cut-off, which a :30 truncation would move either way.
    const left = await srv.sql.begin(async (tx) => {
      await inZone(tx, "Asia/Kolkata");
      await tx`
        INSERT INTO provider_uptime (provider_id, hour, covered_seconds)
        SELECT ${p.id}, date_trunc('hour', now(), 'UTC') - make_interval(hours => ${UPTIME_KEPT_HOURS}) - make_interval(mins => m), 60
        FROM unnest(ARRAY[0, 30]) AS m`;
      await deleteExpiredReputationRows(tx);
      return tx<{ m: number }[]>`
        SELECT round(extract(epoch FROM date_trunc('hour', now(), 'UTC') - make_interval(hours => ${UPTIME_KEPT_HOURS}) - hour) / 60)::int AS m
        FROM provider_uptime WHERE provider_id = ${p.id}`;
    });
    expect(left.map((r) => r.m)).toEqual([0]);
  });

  it("the uptime window starts on a UTC hour: the figures are the same in any session zone", async () => {
    const p = await makeProvider(srv);
    await srv.sql`UPDATE providers SET first_heartbeat_at = now() - interval '90 days', last_heartbeat = now() - interval '10 seconds' WHERE id = ${p.id}`;
    await hoursAgo(p.id, [1, 2, 5, 12, 22, 23, 24]);
    const figuresIn = await srv.sql.begin(async (tx) => {
      const out: Record<string, unknown> = {};
      for (const zone of ["UTC", "Asia/Kolkata", "America/St_Johns"]) {
        await inZone(tx, zone);
        out[zone] = await figures(tx, p.id);
      }
      return out;
    });
    expect(figuresIn["Asia/Kolkata"]).toEqual(figuresIn.UTC);
    expect(figuresIn["America/St_Johns"]).toEqual(figuresIn.UTC);
  });
});

describe("the retention sweep of a server", () => {
  it("runs at start, login codes and idempotency keys included", async () => {
    const db = await freshDatabase();
    const other = await startTestServer({ SVC_RETENTION_SWEEP_SECONDS: "0" }, db.url);
    const p = await makeProvider(other);
    await other.sql`
      INSERT INTO provider_uptime (provider_id, hour, covered_seconds)
      VALUES (${p.id}, date_trunc('hour', now()) - make_interval(hours => ${UPTIME_KEPT_HOURS + 5}), 60),
             (${p.id}, date_trunc('hour', now()) - interval '3 hours', 60)`;
    await other.sql`
      INSERT INTO provider_attempt_days (provider_id, day, carried, faults)
      VALUES (${p.id}, (now() AT TIME ZONE 'UTC')::date - ${ATTEMPT_DAYS_KEPT + 5}::int, 1, 0)`;
    // A login code spent two hours ago, and one of the last hour that the hourly limit still counts.
    await other.sql`
      INSERT INTO login_codes (role, account_id, code_hash, created_at, sent_at, expires_at, used_at)
      VALUES ('provider', ${p.id}, sha256('1'), now() - interval '2 hours', now() - interval '2 hours', now() - interval '110 minutes', now() - interval '119 minutes'),
             ('provider', ${p.id}, sha256('2'), now() - interval '20 minutes', now() - interval '20 minutes', now() - interval '10 minutes', NULL)`;
    // An Idempotency-Key past its window, and one inside it.
    const scope = `retention-start:${p.id}`;
    await other.sql`
      INSERT INTO idempotency_keys (scope, key, request_hash, response, created_at)
      VALUES (${scope}, 'old', 'h', '{}'::jsonb, now() - make_interval(hours => ${KEY_KEPT_HOURS + 1})),
             (${scope}, 'new', 'h', '{}'::jsonb, now() - make_interval(hours => ${KEY_KEPT_HOURS - 1}))`;
    await other.close();
    // A server with the sweep on, on the same database.
    const sweeping = await startTestServer({ SVC_RETENTION_SWEEP_SECONDS: "3600" }, db.url);
    try {
      let left = -1;
      for (let i = 0; i < 50 && left !== 3; i++) {
        const [r] = await sweeping.sql<{ n: number }[]>`
          SELECT (SELECT count(*) FROM provider_uptime WHERE provider_id = ${p.id})::int
               + (SELECT count(*) FROM provider_attempt_days WHERE provider_id = ${p.id})::int
               + (SELECT count(*) FROM login_codes WHERE role = 'provider' AND account_id = ${p.id})::int
               + (SELECT count(*) FROM idempotency_keys WHERE scope = ${scope})::int AS n`;
        left = r.n;
        if (left !== 3) await new Promise((resolve) => setTimeout(resolve, 100));
      }
      expect(left).toBe(3);
      expect((await sweeping.sql`SELECT key FROM idempotency_keys WHERE scope = ${scope}`).map((k) => k.key)).toEqual(["new"]);
      const codes = await sweeping.sql`SELECT code_hash FROM login_codes WHERE role = 'provider' AND account_id = ${p.id}`;
      expect(codes.map((c) => Buffer.from(c.code_hash).equals(crypto.createHash("sha256").update("2").digest()))).toEqual([true]);
    } finally {
      await sweeping.close();
      await db.drop();
    }
  });
});
