// Retention of daemon events and finished webhook deliveries: the sweep deletes
// those past the days the operator keeps them (SVC_DAEMON_EVENTS_KEPT_DAYS,
// SVC_WEBHOOKS_KEPT_DAYS); newer ones, and deliveries still pending however old,
// stay. 0 keeps them for ever.
import { describe, expect, it } from "vitest";
import { ADMIN_TOKEN, useTestServer, type TestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { deleteExpiredDaemonEvents } from "../../src/domain/providers/daemon-events.js";
import { deleteFinishedWebhooks } from "../../src/domain/notify/webhooks.js";

const admin = { "x-admin-token": ADMIN_TOKEN };

async function postEvent(srv: TestServer, key: string, eventType: string): Promise<number> {
  const r = await client(srv.url).post("/api/providers/daemon-event", { api_key: key, event_type: eventType, details: "x".repeat(100) });
  expect(r.status).toBe(200);
  const [row] = await srv.sql<{ id: number }[]>`SELECT id FROM daemon_events WHERE event_type = ${eventType}`;
  return row.id;
}

const ageEvent = (srv: TestServer, id: number, days: number) =>
  srv.sql`UPDATE daemon_events SET created_at = now() - make_interval(days => ${days}) WHERE id = ${id}`;

/** An outbox row enqueued `days` ago; a pending one is next due tomorrow, so that the outbox worker leaves it pending. */
async function outboxRow(srv: TestServer, renterId: number, status: "pending" | "delivered" | "dead", days: number): Promise<string> {
  const eventId = `evt-${status}-${days}-${Math.random().toString(36).slice(2)}`;
  await srv.sql`
    INSERT INTO webhook_outbox (event_id, renter_id, event, url, body, status, created_at, delivered_at, next_attempt_at)
    VALUES (${eventId}, ${renterId}, 'job.completed', 'https://hooks.example.com/x', '{}', ${status},
            now() - make_interval(days => ${days}), ${status === "delivered" ? srv.sql`now() - make_interval(days => ${days})` : null},
            now() + interval '1 day')`;
  return eventId;
}

const outboxIds = async (srv: TestServer, renterId: number) =>
  (await srv.sql<{ event_id: string }[]>`SELECT event_id FROM webhook_outbox WHERE renter_id = ${renterId} ORDER BY event_id`).map((r) => r.event_id);

describe("the retention sweep, every second, keeping events 10 days and finished deliveries 5", () => {
  const srv = useTestServer({ SVC_RETENTION_SWEEP_SECONDS: "1", SVC_DAEMON_EVENTS_KEPT_DAYS: "10", SVC_WEBHOOKS_KEPT_DAYS: "5" });

  it("deletes what is past its keeping and nothing else", async () => {
    const p = await makeProvider(srv);
    const old = await postEvent(srv, p.key, "old_event");
    const kept = await postEvent(srv, p.key, "kept_event");
    await ageEvent(srv, old, 11);
    await ageEvent(srv, kept, 9);

    const r = await makeRenter(srv);
    const gone = [await outboxRow(srv, r.id, "delivered", 6), await outboxRow(srv, r.id, "dead", 6)];
    const stay = [await outboxRow(srv, r.id, "pending", 40), await outboxRow(srv, r.id, "delivered", 4), await outboxRow(srv, r.id, "dead", 1)];

    const deadline = Date.now() + 15_000;
    for (;;) {
      const [{ n }] = await srv.sql<{ n: number }[]>`
        SELECT (SELECT count(*) FROM daemon_events WHERE id = ${old}) + (SELECT count(*) FROM webhook_outbox WHERE event_id = ANY(${gone})) AS n`;
      if (Number(n) === 0) break;
      if (Date.now() > deadline) throw new Error(`the sweep left ${n} expired rows`);
      await new Promise((res) => setTimeout(res, 200));
    }
    expect(await outboxIds(srv, r.id)).toEqual([...stay].sort());
    const listed = await client(srv.url).get(`/api/admin/providers/${p.id}/events`, admin);
    expect(listed.status).toBe(200);
    expect(listed.body.events.map((e: { event_type: string }) => e.event_type)).toEqual(["kept_event"]);
    expect((await srv.sql`SELECT id FROM daemon_events WHERE id = ${kept}`).length).toBe(1);
  });
});

describe("the retention sweep's deletions", () => {
  const srv = useTestServer({ SVC_RETENTION_SWEEP_SECONDS: "0" });

  it("keep everything at 0 days", async () => {
    const p = await makeProvider(srv);
    const id = await postEvent(srv, p.key, "ancient_event");
    await ageEvent(srv, id, 3650);
    const r = await makeRenter(srv);
    const done = await outboxRow(srv, r.id, "delivered", 3650);
    expect(await deleteExpiredDaemonEvents(srv.sql, 0)).toBe(0);
    expect(await deleteFinishedWebhooks(srv.sql, 0)).toBe(0);
    expect((await srv.sql`SELECT id FROM daemon_events WHERE id = ${id}`).length).toBe(1);
    expect(await outboxIds(srv, r.id)).toEqual([done]);
  });

  it("delete a backlog larger than one batch", async () => {
    const p = await makeProvider(srv);
    await srv.sql`
      INSERT INTO daemon_events (provider_id, event_type, severity, created_at)
      SELECT ${p.id}, 'backlog', 'info', now() - make_interval(days => 31 + g % 50) FROM generate_series(1, 25000) g`;
    const fresh = await postEvent(srv, p.key, "fresh_event");
    const r = await makeRenter(srv);
    await srv.sql`
      INSERT INTO webhook_outbox (event_id, renter_id, event, url, body, status, created_at)
      SELECT 'backlog-' || g, ${r.id}, 'job.failed', 'https://hooks.example.com/x', '{}', 'dead', now() - make_interval(days => 31 + g % 50)
      FROM generate_series(1, 25000) g`;
    expect(await deleteExpiredDaemonEvents(srv.sql, 30)).toBeGreaterThanOrEqual(25_000);
    expect(await deleteFinishedWebhooks(srv.sql, 30)).toBeGreaterThanOrEqual(25_000);
    expect((await srv.sql<{ id: number }[]>`SELECT id FROM daemon_events WHERE provider_id = ${p.id}`).map((e) => e.id)).toEqual([fresh]);
    expect(await outboxIds(srv, r.id)).toEqual([]);
  });
});
