// Renter webhooks from the transactional outbox: queued only when the
// transaction commits, delivered signed (HMAC over "<timestamp>.<body>"),
// retried with backoff, given up after the last attempt, never sent to
// private addresses in production, and several at a time, a renter's slow
// receiver holding up only its own renter's deliveries.
import crypto from "node:crypto";
import http from "node:http";
import net, { type AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { connect, PROCESS_TAG, type Sql } from "../../src/db/index.js";
import { migrate } from "../../src/db/migrate.js";
import { createLogger } from "../../src/log.js";
import { registerRenter, updateRenter } from "../../src/domain/accounts/renters.js";
import { claimDue, enqueueRenterWebhook, webhookSignature, SIGNATURE_TOLERANCE_SECONDS, WEBHOOK_REMOVED } from "../../src/domain/notify/webhooks.js";
import { isPrivateAddress, publicOnlyLookup } from "../../src/domain/shared/address.js";
import { retryDelayMs, webhookOutboxWorker } from "../../src/workers/webhook-outbox.js";
import postgres from "postgres";
import { dbLink } from "../helpers/db-link.js";
import { freshDatabase, startTestServer } from "../helpers/server.js";
import { client, uniqueEmail } from "../helpers/http.js";

interface Hit {
  headers: http.IncomingHttpHeaders;
  body: string;
}

/** A renter's webhook receiver; `replies` are the statuses of successive calls (then 200). */
function receiver(replies: number[] = []) {
  const hits: Hit[] = [];
  const waiting: (() => void)[] = [];
  const server = http.createServer((req, res) => {
    let body = "";
    req.on("data", (c) => (body += c));
    req.on("end", () => {
      hits.push({ headers: req.headers, body });
      res.writeHead(replies.shift() ?? 200).end();
      waiting.splice(0).forEach((w) => w());
    });
  });
  return {
    hits,
    async listen() {
      await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
      return `http://127.0.0.1:${(server.address() as AddressInfo).port}/hook`;
    },
    async waitFor(n: number, ms = 5000) {
      const end = Date.now() + ms;
      while (hits.length < n) {
        if (Date.now() > end) throw new Error(`expected ${n} deliveries, got ${hits.length}`);
        await new Promise<void>((r) => {
          waiting.push(r);
          setTimeout(r, 100);
        });
      }
    },
    close: () => new Promise<void>((r) => server.close(() => r())),
  };
}

let db: Awaited<ReturnType<typeof freshDatabase>>;
let sql: Sql;
const log = createLogger("silent");

beforeAll(async () => {
  db = await freshDatabase();
  sql = connect(db.url, 6);
  await migrate(sql);
});
afterAll(async () => {
  await sql?.end();
  await db?.drop();
});

async function renterWithHook(url: string | undefined) {
  return sql.begin((tx) => registerRenter(tx, { name: "Hooked", email: uniqueEmail("hook"), webhookUrl: url }, 0));
}

async function outbox(renterId: number) {
  return sql`SELECT status, attempts, last_status, last_error, next_attempt_at, delivered_at FROM webhook_outbox WHERE renter_id = ${renterId} ORDER BY id`;
}

describe("outbox delivery", () => {
  it("delivers a signed, timestamped notification once the transaction commits, and nothing for a rolled-back one", async () => {
    const rx = receiver();
    const url = await rx.listen();
    const r = await renterWithHook(url);
    const worker = webhookOutboxWorker({ sql, log, production: false, pollMs: 50 });
    await worker.start();
    try {
      await sql
        .begin(async (tx) => {
          await enqueueRenterWebhook(tx, r.id, "job.failed", { job_id: "job-rolled-back" });
          throw new Error("state change failed");
        })
        .catch(() => {});
      const eventId = await sql.begin((tx) => enqueueRenterWebhook(tx, r.id, "job.completed", { job_id: "job-1", status: "completed", cost_halala: 42 }));
      expect(eventId).toMatch(/^evt_/);
      await rx.waitFor(1);
      await new Promise((res) => setTimeout(res, 200));
      expect(rx.hits).toHaveLength(1);
      const hit = rx.hits[0];
      const body = JSON.parse(hit.body);
      expect(body).toMatchObject({ id: eventId, event: "job.completed", renter_id: r.id, data: { job_id: "job-1", status: "completed", cost_halala: 42 } });
      expect(hit.headers["x-svc-event"]).toBe("job.completed");
      expect(hit.headers["x-svc-delivery"]).toBe(eventId);
      const ts = Number(hit.headers["x-svc-timestamp"]);
      expect(Math.abs(Date.now() / 1000 - ts)).toBeLessThan(SIGNATURE_TOLERANCE_SECONDS);
      // The receiver checks: HMAC-SHA256(secret, "<timestamp>.<raw body>"), lowercase hex after "v1=".
      const expected = crypto.createHmac("sha256", r.webhookSecret!).update(`${ts}.${hit.body}`).digest("hex");
      expect(hit.headers["x-svc-signature"]).toBe(`v1=${expected}`);
      expect(webhookSignature(r.webhookSecret!, ts, hit.body)).toBe(expected);
      expect(webhookSignature(r.webhookSecret!, ts + 1, hit.body)).not.toBe(expected);
      const rows = await outbox(r.id);
      expect(rows).toHaveLength(1);
      expect(rows[0]).toMatchObject({ status: "delivered", attempts: 1, last_status: 200 });
    } finally {
      await worker.stop();
      await rx.close();
    }
  });

  it("queues nothing for a renter without a webhook_url", async () => {
    const r = await renterWithHook(undefined);
    expect(await sql.begin((tx) => enqueueRenterWebhook(tx, r.id, "job.completed", {}))).toBeUndefined();
    expect(await outbox(r.id)).toHaveLength(0);
  });

  it("retries a failing receiver with backoff, then delivers the same signed bytes", async () => {
    const rx = receiver([500, 503]);
    const url = await rx.listen();
    const r = await renterWithHook(url);
    // Retries a second apart: the state between them is read before the next one, on a loaded machine too.
    const worker = webhookOutboxWorker({ sql, log, production: false, pollMs: 50, baseDelayMs: 1000, maxDelayMs: 1000 });
    await worker.start();
    const settled = { timeout: 10_000, interval: 20 };
    try {
      await sql.begin((tx) => enqueueRenterWebhook(tx, r.id, "job.failed", { job_id: "job-2" }));
      await rx.waitFor(1);
      await expect.poll(async () => (await outbox(r.id))[0], settled).toMatchObject({ status: "pending", attempts: 1, last_status: 500, last_error: "HTTP 500" });
      await rx.waitFor(3);
      await expect.poll(async () => (await outbox(r.id))[0], settled).toMatchObject({ status: "delivered", attempts: 3, last_status: 200 });
      expect(new Set(rx.hits.map((h) => h.body)).size).toBe(1);
    } finally {
      await worker.stop();
      await rx.close();
    }
  });

  it("a retry goes to the renter's webhook as it is now: to a new URL, signed with its secret; nowhere once it is removed", async () => {
    const oldRx = receiver([500, 500]);
    const newRx = receiver();
    const oldUrl = await oldRx.listen();
    const newUrl = await newRx.listen();
    const moved = await renterWithHook(oldUrl);
    const removed = await renterWithHook(oldUrl);
    // The retry waits long enough for the changes below to commit first, on a loaded machine too.
    const worker = webhookOutboxWorker({ sql, log, production: false, pollMs: 50, baseDelayMs: 1500, maxDelayMs: 1500 });
    await worker.start();
    try {
      await sql.begin((tx) => enqueueRenterWebhook(tx, moved.id, "job.completed", { job_id: "job-moved" }));
      await sql.begin((tx) => enqueueRenterWebhook(tx, removed.id, "job.completed", { job_id: "job-removed" }));
      await oldRx.waitFor(2); // both first tries fail: each event waits for a retry
      await sql.begin((tx) => updateRenter(tx, moved.id, { webhookUrl: newUrl }));
      await sql.begin((tx) => updateRenter(tx, removed.id, { webhookUrl: null }));
      await newRx.waitFor(1);
      const [{ webhook_secret: secret }] = await sql<{ webhook_secret: string }[]>`SELECT webhook_secret FROM renters WHERE id = ${moved.id}`;
      const hit = newRx.hits[0];
      expect(JSON.parse(hit.body).data).toEqual({ job_id: "job-moved" });
      const ts = Number(hit.headers["x-svc-timestamp"]);
      expect(hit.headers["x-svc-signature"]).toBe(`v1=${webhookSignature(secret, ts, hit.body)}`);
      // The removed webhook's event is dead at its retry, never sent again (signed or not).
      const settled = async (renterId: number) => {
        for (let i = 0; i < 100 && (await outbox(renterId))[0].status === "pending"; i++) await new Promise((res) => setTimeout(res, 50));
        return (await outbox(renterId))[0];
      };
      expect(await settled(removed.id)).toMatchObject({ status: "dead", last_error: WEBHOOK_REMOVED, attempts: 1 });
      expect(await settled(moved.id)).toMatchObject({ status: "delivered", attempts: 2 });
      expect(oldRx.hits).toHaveLength(2);
    } finally {
      await worker.stop();
      await oldRx.close();
      await newRx.close();
    }
  });

  it("a claim whose process is gone is released at once; a live process's claim and a scheduled retry are not", async () => {
    const rx = receiver();
    const url = await rx.listen();
    const r = await renterWithHook(url);
    // Three deliveries that wait for another minute: claimed by a process with no connection left,
    // claimed by this one (its pool is connected), and a retry scheduled by backoff (claimed by none).
    for (const [n, claimedBy] of [[1, "svc:0:gone"], [2, PROCESS_TAG], [3, null]] as const) {
      await sql.begin((tx) => enqueueRenterWebhook(tx, r.id, "job.completed", { job_id: `job-claim-${n}` }));
      await sql`UPDATE webhook_outbox SET next_attempt_at = now() + interval '60 seconds', attempts = 1, claimed_by = ${claimedBy}
                WHERE renter_id = ${r.id} AND body LIKE ${`%job-claim-${n}"%`}`;
    }
    const worker = webhookOutboxWorker({ sql, log, production: false, pollMs: 50 });
    await worker.start();
    try {
      await rx.waitFor(1);
      await new Promise((res) => setTimeout(res, 300));
      expect(rx.hits.map((h) => JSON.parse(h.body).data.job_id)).toEqual(["job-claim-1"]);
      const rows = await sql<{ body: string; status: string; attempts: number; claimed_by: string | null }[]>`
        SELECT body, status, attempts, claimed_by FROM webhook_outbox WHERE renter_id = ${r.id} ORDER BY id`;
      expect(rows.map((x) => [x.status, x.attempts, x.claimed_by])).toEqual([["delivered", 2, null], ["pending", 1, PROCESS_TAG], ["pending", 1, null]]);
    } finally {
      await worker.stop();
      await rx.close();
    }
  });

  it("gives up after the last attempt, and at once on 410 Gone", async () => {
    const rx = receiver([500, 500, 410]);
    const url = await rx.listen();
    const a = await renterWithHook(url);
    const worker = webhookOutboxWorker({ sql, log, production: false, pollMs: 50, baseDelayMs: 50, maxAttempts: 2 });
    await worker.start();
    try {
      await sql.begin((tx) => enqueueRenterWebhook(tx, a.id, "job.failed", { n: 1 }));
      await rx.waitFor(2);
      await new Promise((res) => setTimeout(res, 150));
      expect((await outbox(a.id))[0]).toMatchObject({ status: "dead", attempts: 2, last_status: 500 });
      await sql.begin((tx) => enqueueRenterWebhook(tx, a.id, "job.cancelled", { n: 2 }));
      await rx.waitFor(3);
      await new Promise((res) => setTimeout(res, 150));
      expect((await outbox(a.id))[1]).toMatchObject({ status: "dead", attempts: 1, last_status: 410 });
      await new Promise((res) => setTimeout(res, 300));
      expect(rx.hits).toHaveLength(3);
    } finally {
      await worker.stop();
      await rx.close();
    }
  });

  it("a receiver that never answers times out without holding anything else up", async () => {
    const hang = http.createServer(() => {});
    await new Promise<void>((r) => hang.listen(0, "127.0.0.1", r));
    const rx = receiver();
    const good = await rx.listen();
    const slow = await renterWithHook(`http://127.0.0.1:${(hang.address() as AddressInfo).port}/`);
    const fast = await renterWithHook(good);
    const worker = webhookOutboxWorker({ sql, log, production: false, pollMs: 50, timeoutMs: 300 });
    await worker.start();
    try {
      await sql.begin(async (tx) => {
        await enqueueRenterWebhook(tx, slow.id, "job.completed", {});
        await enqueueRenterWebhook(tx, fast.id, "job.completed", {});
      });
      await rx.waitFor(1);
      const end = Date.now() + 3000;
      while ((await outbox(slow.id))[0].attempts < 1 || (await outbox(slow.id))[0].last_error === null) {
        if (Date.now() > end) throw new Error("no timeout recorded");
        await new Promise((res) => setTimeout(res, 50));
      }
      expect((await outbox(slow.id))[0]).toMatchObject({ status: "pending", last_error: "no answer within 300 ms" });
    } finally {
      await worker.stop();
      await rx.close();
      hang.closeAllConnections();
      await new Promise<void>((r) => hang.close(() => r()));
    }
  });

  it("a receiver that never answers, with a backlog, delays only its own renter: other renters' deliveries go out at once", async () => {
    const warnings: string[] = [];
    const onWarning = (w: Error) => warnings.push(w.name);
    process.on("warning", onWarning);
    let held = 0;
    let mostHeld = 0;
    const hang = http.createServer(() => {
      mostHeld = Math.max(mostHeld, ++held);
    }); // accepts, never answers
    hang.on("connection", (s) => s.on("close", () => held--));
    await new Promise<void>((r) => hang.listen(0, "127.0.0.1", r));
    const rx = receiver();
    const slow = await renterWithHook(`http://127.0.0.1:${(hang.address() as AddressInfo).port}/`);
    const fast = await renterWithHook(await rx.listen());
    // Many ended jobs (queued ones cancelled cost nothing): more than the whole pool of deliveries.
    await sql.begin(async (tx) => {
      for (let i = 0; i < 100; i++) await enqueueRenterWebhook(tx, slow.id, "job.cancelled", { job_id: `job-slow-${i}` });
    });
    const worker = webhookOutboxWorker({ sql, log, production: false, pollMs: 50, timeoutMs: 1000 });
    await worker.start();
    try {
      await expect.poll(() => held, { timeout: 5_000 }).toBeGreaterThan(0);
      const t0 = Date.now();
      await sql.begin((tx) => enqueueRenterWebhook(tx, fast.id, "job.completed", { job_id: "job-fast" }));
      await rx.waitFor(1, 15_000);
      const waited = Date.now() - t0;
      // Sooner than one try at the hanging receiver times out: it waited behind none of them.
      expect(waited, `the other renter's webhook waited ${waited} ms behind the hanging receiver's backlog`).toBeLessThan(1000);
      await expect.poll(async () => (await outbox(fast.id))[0], { timeout: 5_000 }).toMatchObject({ status: "delivered", attempts: 1 });
      // The hanging receiver's tries time out a few at a time, never the whole pool, and go on being tried.
      await expect.poll(async () => (await sql`SELECT count(*)::int AS n FROM webhook_outbox WHERE renter_id = ${slow.id} AND last_error IS NOT NULL`)[0].n, { timeout: 5_000 }).toBeGreaterThan(4);
      expect(mostHeld).toBeLessThanOrEqual(4);
      expect(rx.hits).toHaveLength(1);
    } finally {
      await worker.stop();
      process.off("warning", onWarning);
      await rx.close();
      hang.closeAllConnections();
      await new Promise<void>((r) => hang.close(() => r()));
      await sql`DELETE FROM webhook_outbox WHERE renter_id = ${slow.id}`; // the backlog is for no later test's worker
    }
    expect(warnings).not.toContain("MaxListenersExceededWarning");
  });

  it("claims no more of a renter's deliveries than perRenter in flight, counting those other processes claimed", async () => {
    const busy = await renterWithHook("http://127.0.0.1:9/busy");
    const other = await renterWithHook("http://127.0.0.1:9/other");
    await sql.begin(async (tx) => {
      for (let i = 0; i < 6; i++) await enqueueRenterWebhook(tx, busy.id, "job.cancelled", { n: i });
      await enqueueRenterWebhook(tx, other.id, "job.completed", {});
    });
    // Another process has three of the busy renter's deliveries in flight.
    await sql`UPDATE webhook_outbox SET claimed_by = 'svc:another', next_attempt_at = now() + interval '60 seconds', attempts = 1
              WHERE id IN (SELECT id FROM webhook_outbox WHERE renter_id = ${busy.id} ORDER BY id LIMIT 3)`;
    // (Earlier tests' renters may have deliveries due too: only these two renters' are looked at.)
    const mine = (rows: { renter_id: number }[]) => rows.map((r) => r.renter_id).filter((id) => id === busy.id || id === other.id);
    expect(mine(await claimDue(sql, 1000, 4)).sort()).toEqual([busy.id, other.id].sort());
    expect(mine(await claimDue(sql, 1000, 4))).toEqual([]);
    const inFlight = await sql<{ n: number }[]>`SELECT count(*)::int AS n FROM webhook_outbox WHERE renter_id = ${busy.id} AND claimed_by IS NOT NULL`;
    expect(inFlight[0].n).toBe(4);
    await sql`DELETE FROM webhook_outbox WHERE renter_id IN (${busy.id}, ${other.id})`;
  });

  it("delivers many renters' notifications concurrently, each once, with no listener warning", async () => {
    const warnings: string[] = [];
    const onWarning = (w: Error) => warnings.push(w.name);
    process.on("warning", onWarning);
    let open = 0;
    let mostOpen = 0;
    const hits: string[] = [];
    // Answers each delivery after 300 ms: deliveries in a row would take 30 × 300 ms.
    const paced = http.createServer((req, res) => {
      mostOpen = Math.max(mostOpen, ++open);
      let body = "";
      req.on("data", (c) => (body += c));
      req.on("end", () =>
        setTimeout(() => {
          open--;
          hits.push(JSON.parse(body).data.job_id);
          res.writeHead(200).end();
        }, 300),
      );
    });
    await new Promise<void>((r) => paced.listen(0, "127.0.0.1", r));
    const url = `http://127.0.0.1:${(paced.address() as AddressInfo).port}/hook`;
    const renters = await Promise.all(Array.from({ length: 15 }, () => renterWithHook(url)));
    await sql.begin(async (tx) => {
      for (const r of renters) for (const n of [1, 2]) await enqueueRenterWebhook(tx, r.id, "job.completed", { job_id: `job-${r.id}-${n}` });
    });
    const worker = webhookOutboxWorker({ sql, log, production: false, pollMs: 50 });
    const t0 = Date.now();
    await worker.start();
    try {
      await expect.poll(() => hits.length, { timeout: 10_000 }).toBe(30);
      expect(Date.now() - t0).toBeLessThan(3_000);
      expect(mostOpen).toBeGreaterThan(10);
      expect(mostOpen).toBeLessThanOrEqual(20);
      await new Promise((r) => setTimeout(r, 200));
      expect(new Set(hits).size).toBe(30);
      expect(hits).toHaveLength(30);
    } finally {
      await worker.stop();
      process.off("warning", onWarning);
      paced.closeAllConnections();
      await new Promise<void>((r) => paced.close(() => r()));
    }
    expect(warnings).not.toContain("MaxListenersExceededWarning");
  });

  it("a receiver trickling its headers is cut off at the time limit: it holds up neither another renter's delivery nor a stop", async () => {
    // The status line, then one header byte every 100 ms for ever: each byte would reset an idle timeout.
    const trickler = net.createServer((s) => {
      s.on("error", () => {});
      s.once("data", () => {
        s.write("HTTP/1.1 200 OK\r\nX-Slow: ");
        const t = setInterval(() => s.write("a"), 100);
        s.on("close", () => clearInterval(t));
      });
    });
    await new Promise<void>((r) => trickler.listen(0, "127.0.0.1", r));
    const rx = receiver();
    const slow = await renterWithHook(`http://127.0.0.1:${(trickler.address() as AddressInfo).port}/`);
    const fast = await renterWithHook(await rx.listen());
    const worker = webhookOutboxWorker({ sql, log, production: false, pollMs: 50, timeoutMs: 400 });
    await worker.start();
    try {
      await sql.begin((tx) => enqueueRenterWebhook(tx, slow.id, "job.completed", {}));
      await new Promise((r) => setTimeout(r, 200));
      await sql.begin((tx) => enqueueRenterWebhook(tx, fast.id, "job.completed", {}));
      await rx.waitFor(1, 5_000);
      await expect.poll(async () => (await outbox(slow.id))[0].last_error, { timeout: 5_000 }).toBe("no answer within 400 ms");
      // Stopping with another trickled delivery in flight returns at once.
      await sql.begin((tx) => enqueueRenterWebhook(tx, slow.id, "job.failed", {}));
      await new Promise((r) => setTimeout(r, 150));
    } finally {
      const t0 = Date.now();
      await worker.stop();
      expect(Date.now() - t0).toBeLessThan(300);
      await rx.close();
      trickler.close();
    }
  });

  it("a stop while the receiver has not answered hands the delivery back untried: not counted, due again, not dead on its last attempt", async () => {
    let answer: (() => void) | undefined;
    const slow = http.createServer((req, res) => {
      req.resume();
      answer = () => res.writeHead(200).end();
    });
    await new Promise<void>((r) => slow.listen(0, "127.0.0.1", r));
    const r = await renterWithHook(`http://127.0.0.1:${(slow.address() as AddressInfo).port}/hook`);
    await sql.begin((tx) => enqueueRenterWebhook(tx, r.id, "job.completed", {}));
    await sql`UPDATE webhook_outbox SET attempts = 9 WHERE renter_id = ${r.id}`; // the next is the last of 10
    const first = webhookOutboxWorker({ sql, log, production: false, pollMs: 50, timeoutMs: 5_000 });
    await first.start();
    await expect.poll(() => answer !== undefined, { timeout: 5_000 }).toBe(true);
    await first.stop(); // a deploy: the receiver had not answered yet
    const [row] = await outbox(r.id);
    expect(row).toMatchObject({ status: "pending", attempts: 9 });
    expect((await sql`SELECT claimed_by IS NULL AS free, next_attempt_at <= now() AS due FROM webhook_outbox WHERE renter_id = ${r.id}`)[0]).toEqual({ free: true, due: true });
    // The next process delivers it.
    answer = undefined;
    const next = webhookOutboxWorker({ sql, log, production: false, pollMs: 50, timeoutMs: 5_000 });
    await next.start();
    try {
      await expect.poll(() => answer !== undefined, { timeout: 5_000 }).toBe(true);
      answer!();
      await expect.poll(async () => (await outbox(r.id))[0].status, { timeout: 5_000 }).toBe("delivered");
    } finally {
      await next.stop();
      slow.closeAllConnections();
      slow.close();
    }
  });

  it("a process whose claim was released settles nothing: a delivery another process made stays delivered, never dead, after the first's last try fails", async () => {
    // The receiver holds the first try; answers the second 200, then the first 500.
    let first: http.ServerResponse | undefined;
    const tries: (string | string[] | undefined)[] = [];
    const rx = http.createServer((req, res) => {
      req.resume();
      req.on("end", () => {
        tries.push(req.headers["x-svc-delivery"]);
        if (!first) first = res;
        else res.writeHead(200).end();
      });
    });
    await new Promise<void>((r) => rx.listen(0, "127.0.0.1", r));
    const r = await renterWithHook(`http://127.0.0.1:${(rx.address() as AddressInfo).port}/hook`);
    await sql.begin((tx) => enqueueRenterWebhook(tx, r.id, "job.completed", {}));
    await sql`UPDATE webhook_outbox SET attempts = 9 WHERE renter_id = ${r.id}`; // the next claim is the last of 10
    // Process A: its own connections (its own application_name), through a link cut as by a database restart.
    const link = await dbLink(db.url);
    const tagA = `svc:other-${crypto.randomBytes(4).toString("hex")}`;
    const sqlA = postgres(link.url, {
      max: 2,
      onnotice: () => {},
      connection: { application_name: tagA },
      types: { bigint: { to: 20, from: [20], serialize: (x: number) => String(x), parse: (x: string) => Number(x) } },
    }) as unknown as Sql;
    let settledA!: () => void;
    const aSettled = new Promise<void>((res) => (settledA = res));
    const a = webhookOutboxWorker({ sql: sqlA, log, production: false, pollMs: 60_000, timeoutMs: 30_000, onFailure: () => settledA() });
    const b = webhookOutboxWorker({ sql, log, production: false, pollMs: 50 });
    try {
      await a.start();
      await expect.poll(() => first !== undefined, { timeout: 5_000 }).toBe(true);
      expect((await sql`SELECT claimed_by FROM webhook_outbox WHERE renter_id = ${r.id}`)[0].claimed_by).toBe(tagA);
      // A loses its connections: its claim is released as orphaned, and B delivers the event.
      link.down();
      await expect.poll(async () => (await sql`SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = ${tagA}`)[0].n, { timeout: 5_000 }).toBe(0);
      await b.start();
      await expect.poll(async () => (await outbox(r.id))[0].status, { timeout: 5_000 }).toBe("delivered");
      // A is back; its try fails on what was its last attempt.
      link.up();
      first!.writeHead(500).end();
      await aSettled;
      expect(tries).toHaveLength(2); // at least once: the same event id twice
      expect(tries[0]).toBe(tries[1]);
      expect((await outbox(r.id))[0]).toMatchObject({ status: "delivered", last_status: 200, last_error: null });
    } finally {
      await a.stop();
      await b.stop();
      await sqlA.end({ timeout: 1 });
      await link.close();
      rx.closeAllConnections();
      rx.close();
    }
  });

  it("a process whose claim was released and taken by another hands nothing back when it stops: the other's claim stands", async () => {
    const held: http.ServerResponse[] = [];
    const rx = http.createServer((req, res) => {
      req.resume();
      held.push(res);
    });
    await new Promise<void>((r) => rx.listen(0, "127.0.0.1", r));
    const r = await renterWithHook(`http://127.0.0.1:${(rx.address() as AddressInfo).port}/hook`);
    await sql.begin((tx) => enqueueRenterWebhook(tx, r.id, "job.completed", {}));
    const link = await dbLink(db.url);
    const tagA = `svc:other-${crypto.randomBytes(4).toString("hex")}`;
    const sqlA = postgres(link.url, { max: 2, onnotice: () => {}, connection: { application_name: tagA } }) as unknown as Sql;
    const a = webhookOutboxWorker({ sql: sqlA, log, production: false, pollMs: 60_000, timeoutMs: 30_000 });
    const b = webhookOutboxWorker({ sql, log, production: false, pollMs: 50, timeoutMs: 30_000 });
    try {
      await a.start();
      await expect.poll(() => held.length, { timeout: 5_000 }).toBe(1);
      link.down();
      await expect.poll(async () => (await sql`SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = ${tagA}`)[0].n, { timeout: 5_000 }).toBe(0);
      await b.start();
      await expect.poll(() => held.length, { timeout: 5_000 }).toBe(2);
      link.up();
      await a.stop(); // its try is handed back untried: but the row is B's now
      expect((await sql`SELECT claimed_by, attempts, next_attempt_at > now() AS reserved FROM webhook_outbox WHERE renter_id = ${r.id}`)[0])
        .toEqual({ claimed_by: PROCESS_TAG, attempts: 2, reserved: true });
    } finally {
      await a.stop();
      await b.stop();
      await sqlA.end({ timeout: 1 });
      await link.close();
      rx.closeAllConnections();
      rx.close();
    }
  });

  it("closes the connection once the status is known: a receiver streaming an endless body holds no socket", async () => {
    let open = 0;
    const endless = net.createServer((s) => {
      open++;
      s.on("close", () => open--);
      s.on("error", () => {});
      s.once("data", () => {
        s.write("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
        const t = setInterval(() => s.write(`400\r\n${"x".repeat(1024)}\r\n`), 20);
        s.on("close", () => clearInterval(t));
      });
    });
    await new Promise<void>((r) => endless.listen(0, "127.0.0.1", r));
    const r = await renterWithHook(`http://127.0.0.1:${(endless.address() as AddressInfo).port}/`);
    const worker = webhookOutboxWorker({ sql, log, production: false, pollMs: 50, timeoutMs: 400 });
    await worker.start();
    try {
      await sql.begin((tx) => enqueueRenterWebhook(tx, r.id, "job.completed", {}));
      await expect.poll(async () => (await outbox(r.id))[0].status, { timeout: 5_000 }).toBe("delivered");
      await expect.poll(() => open, { timeout: 2_000 }).toBe(0);
    } finally {
      await worker.stop();
      endless.close();
    }
  });

  it("in production, refuses plain http and private targets at delivery time too", async () => {
    const rx = receiver();
    const url = await rx.listen();
    const r = await renterWithHook(url); // stored while not in production
    const worker = webhookOutboxWorker({ sql, log, production: true, pollMs: 50 });
    await worker.start();
    try {
      await sql.begin((tx) => enqueueRenterWebhook(tx, r.id, "job.completed", {}));
      const end = Date.now() + 3000;
      while ((await outbox(r.id))[0].status === "pending") {
        if (Date.now() > end) throw new Error("not refused");
        await new Promise((res) => setTimeout(res, 50));
      }
      expect((await outbox(r.id))[0]).toMatchObject({ status: "dead", last_error: "webhook_url must use https" });
      expect(rx.hits).toHaveLength(0);
    } finally {
      await worker.stop();
      await rx.close();
    }
  });
});

describe("rules", () => {
  it("classifies addresses: loopback, private, link-local, CGNAT, mapped and unique-local are private", () => {
    for (const a of ["127.0.0.1", "10.0.0.5", "172.16.3.4", "172.31.255.255", "192.168.0.1", "169.254.169.254", "100.64.0.1", "0.0.0.0", "::1", "::", "fd00::1", "fe80::1", "::ffff:127.0.0.1", "::ffff:10.0.0.1", "not-an-ip"]) {
      expect(isPrivateAddress(a), a).toBe(true);
    }
    for (const a of ["8.8.8.8", "1.1.1.1", "172.32.0.1", "2606:4700:4700::1111", "::ffff:8.8.8.8"]) {
      expect(isPrivateAddress(a), a).toBe(false);
    }
  });

  it("the production resolver refuses names that resolve to loopback (DNS cannot smuggle a private target)", async () => {
    for (const all of [true, false]) {
      const err = await new Promise<Error | null>((resolve) => publicOnlyLookup("webhook")("localhost", { all }, (e) => resolve(e)));
      expect(err?.message).toMatch(/resolves to a private address/);
    }
  });

  it("backs off exponentially with jitter, capped, and stops after the last attempt", () => {
    for (let i = 0; i < 20; i++) {
      const d1 = retryDelayMs(1, 1000, 60_000, 5)!;
      expect(d1).toBeGreaterThanOrEqual(800);
      expect(d1).toBeLessThanOrEqual(1200);
      const d4 = retryDelayMs(4, 1000, 60_000, 5)!;
      expect(d4).toBeGreaterThanOrEqual(6400);
      expect(d4).toBeLessThanOrEqual(9600);
      expect(retryDelayMs(30, 1000, 60_000, 50)!).toBeLessThanOrEqual(72_000);
    }
    expect(retryDelayMs(5, 1000, 60_000, 5)).toBeNull();
  });
});

describe("through the running server", () => {
  it("the server's own worker delivers what a state change queued, to the URL set by PATCH /api/renters/me", async () => {
    const srv = await startTestServer();
    const rx = receiver();
    try {
      const url = await rx.listen();
      const api = client(srv.url);
      const reg = await api.post("/api/renters/register", { name: "E2E", email: uniqueEmail("e2e") });
      const patch = await api.patch("/api/renters/me", { webhook_url: url }, { "x-renter-key": reg.body.api_key });
      const secret = patch.body.webhook_secret;
      await srv.sql.begin((tx) => enqueueRenterWebhook(tx, reg.body.renter_id, "job.completed", { job_id: "job-e2e" }));
      await rx.waitFor(1);
      const hit = rx.hits[0];
      expect(hit.headers["x-svc-signature"]).toBe(`v1=${webhookSignature(secret, Number(hit.headers["x-svc-timestamp"]), hit.body)}`);
    } finally {
      await rx.close();
      await srv.close();
    }
  });
});
