// The LISTEN hub (src/workers/job-signals.ts) when its first LISTEN fails: a
// daemon stream that connects while the database takes no new connection (its
// pool's open ones still answer) is refused, and nothing of it stays behind in
// the hub; once the database is back the next stream listens, and each notice
// reaches it once. The pool reaches PostgreSQL through a TCP proxy that can
// refuse new connections.
import { afterAll, beforeAll, expect, it } from "vitest";
import { connect, type Sql } from "../../src/db/index.js";
import { createLogger } from "../../src/log.js";
import { JobSignalHub, jobSignalHub } from "../../src/workers/job-signals.js";
import { ASSIGNED_CHANNEL, CANCEL_CHANNEL } from "../../src/domain/notify/job-notices.js";
import { SETTINGS_CHANNEL } from "../../src/domain/notify/provider-notices.js";
import { freshDatabase, startTestServer, type TestServer } from "../helpers/server.js";
import { DbProxy } from "../helpers/db-proxy.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import * as grpc from "@grpc/grpc-js";
import { openStream, type Sent, type TestStream } from "./grpc-stream.js";
import { waitFor } from "./helpers.js";

let db: Awaited<ReturnType<typeof freshDatabase>>;
let proxy: DbProxy;
let proxied = "";
let direct: Sql;

beforeAll(async () => {
  db = await freshDatabase();
  const front = await DbProxy.inFrontOf(db.url);
  proxy = front.proxy;
  proxied = front.url;
  direct = connect(db.url, 1);
});
afterAll(async () => {
  await direct?.end();
  await proxy?.close();
  await db?.drop();
});

const noListener = { assigned: () => {}, cancel: () => {}, settings: () => {}, resync: () => {} };

it("keeps nothing of a daemon stream refused because its LISTEN failed, and the next stream gets its jobs", async () => {
  let srv: TestServer | undefined;
  try {
    srv = await startTestServer({ SVC_JOB_SWEEP_MS: "60000" }, proxied);
    const hub = jobSignalHub(srv.app.sql, srv.app.deps.log);
    const p = await makeProvider(srv);
    const renter = await makeRenter(srv, 1_000);
    const hello: Sent = { case: "hello", value: { daemonVersion: "5.0.0", gpus: [{ name: "NVIDIA GeForce RTX 4090", vram_mib: 24564 }] } };

    // No stream has subscribed yet on this process. Its LISTEN connection is lost and the database
    // takes no new connection (at max_connections, say); the pool's open connections still answer.
    // A stream's LISTEN then waits for the connection, or fails with the attempt it started: that
    // stream is refused.
    proxy.refusing = true;
    expect(proxy.cutListeners()).toBe(1);
    const waiting: TestStream[] = [];
    let refused: { code?: number; details?: string } | undefined;
    for (let i = 0; i < 20 && !refused; i++) {
      const s = openStream(srv.port, p.key);
      s.send(hello);
      const ended = await Promise.race([s.ended, new Promise<undefined>((r) => setTimeout(r, 1_000))]);
      if (ended) refused = ended;
      else waiting.push(s);
    }
    expect(refused?.code).toBe(grpc.status.UNAVAILABLE);
    proxy.refusing = false;
    // The others listen once the database is back (or were refused as well), and end.
    for (const s of waiting) {
      await s.next("welcome").catch(() => {});
      s.cancel();
    }
    await waitFor(() => hub.subscribers === 0, 5_000, "every stream to leave the hub");

    const s = openStream(srv.port, p.key);
    try {
      s.send(hello);
      await s.next("welcome");
      expect(hub.subscribers).toBe(1);
      const r = await client(srv.url).post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 1, params: { suite: "quick", iterations: 1 } }, renter.headers);
      expect(r.status, r.text).toBe(201);
      expect((await s.next("job")).jobId).toBe(r.body.job.job_id);
      s.end();
      await s.ended;
      await waitFor(() => hub.subscribers === 0, 5_000, "the stream to unsubscribe");
    } finally {
      s.cancel();
    }
  } finally {
    proxy.refusing = false;
    await srv?.close();
  }
});

it("hands each notice to a subscriber once after a start that failed", async () => {
  const sql = connect(proxied, 2);
  const hub = new JobSignalHub(sql, createLogger("silent"));
  try {
    proxy.refusing = true;
    await expect(hub.subscribe(7, noListener)).rejects.toThrow();
    expect(hub.subscribers).toBe(0);
    // postgres.js listens again by itself for what it was asked; the database comes back meanwhile.
    await new Promise((r) => setTimeout(r, 500));
    proxy.refusing = false;
    await new Promise((r) => setTimeout(r, 1_500));

    const heard: string[] = [];
    const off = await hub.subscribe(7, {
      assigned: (jobId) => heard.push(`assigned ${jobId}`),
      cancel: (jobId) => heard.push(`cancel ${jobId}`),
      settings: () => heard.push("settings"),
      resync: () => {},
    });
    try {
      await direct`SELECT pg_notify(${ASSIGNED_CHANNEL}, ${JSON.stringify({ provider_id: 7, job_id: "job-a" })})`;
      await direct`SELECT pg_notify(${CANCEL_CHANNEL}, ${JSON.stringify({ provider_id: 7, job_id: "job-a" })})`;
      await direct`SELECT pg_notify(${SETTINGS_CHANNEL}, '7')`;
      await waitFor(() => heard.includes("settings"), 5_000, "the settings notice");
      // Notices on one connection arrive in order: anything heard twice came before the last one.
      expect(heard).toEqual(["assigned job-a", "cancel job-a", "settings"]);
    } finally {
      off();
    }
  } finally {
    proxy.refusing = false;
    await hub.stop();
    await sql.end();
  }
});
