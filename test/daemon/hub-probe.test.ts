// The LISTEN hub's probe (src/workers/job-signals.ts): a LISTEN connection can
// go silent without an error (its host gone without a reset) until TCP's
// keepalive notices, minutes later, and the notices of that time are lost. The
// hub sends itself a notice now and then: while one is not heard back within
// PROBE_GRACE_MS it does not count as hearing everything (a stream then reads
// its provider on each heartbeat), and once it hears again every subscriber
// reads the database again. The pool reaches PostgreSQL through a TCP proxy
// that can hold back what the LISTEN connection is sent.
import { afterAll, beforeAll, expect, it } from "vitest";
import { connect, type Sql } from "../../src/db/index.js";
import { createLogger } from "../../src/log.js";
import { JobSignalHub, PROBE_GRACE_MS } from "../../src/workers/job-signals.js";
import { SETTINGS_CHANNEL } from "../../src/domain/notify/provider-notices.js";
import { freshDatabase } from "../helpers/server.js";
import { DbProxy } from "../helpers/db-proxy.js";
import { waitFor } from "./helpers.js";

let db: Awaited<ReturnType<typeof freshDatabase>>;
let proxy: DbProxy;
let sql: Sql;
let direct: Sql;
let hub: JobSignalHub;

beforeAll(async () => {
  db = await freshDatabase();
  const front = await DbProxy.inFrontOf(db.url);
  proxy = front.proxy;
  sql = connect(front.url, 2);
  direct = connect(db.url, 1);
  hub = new JobSignalHub(sql, createLogger("silent"));
});
afterAll(async () => {
  await hub?.stop();
  await sql?.end();
  await direct?.end();
  await proxy?.close();
  await db?.drop();
});

it("counts as deaf while its probe goes unanswered, and reads again once it hears", async () => {
  const settings: number[] = [];
  let resyncs = 0;
  const off = await hub.subscribe(7, { assigned: () => {}, cancel: () => {}, settings: () => settings.push(Date.now()), resync: () => resyncs++ });
  try {
    const generation = hub.generation;
    await direct`SELECT pg_notify(${SETTINGS_CHANNEL}, '7')`;
    await waitFor(() => settings.length === 1, 5_000, "the first notice");
    await hub.probe();
    await waitFor(() => hub.heardAllSince(generation), 5_000, "its probe back");

    // The LISTEN connection goes silent: a notice sent now does not arrive, nor does the next probe.
    proxy.holdListeners();
    await direct`SELECT pg_notify(${SETTINGS_CHANNEL}, '7')`;
    await hub.probe();
    expect(hub.heardAllSince(generation)).toBe(true); // within the grace
    await new Promise((r) => setTimeout(r, PROBE_GRACE_MS + 300));
    expect(settings).toHaveLength(1);
    expect(hub.heardAllSince(generation)).toBe(false);
    expect(resyncs).toBe(0);

    // It speaks again: the probe comes back, what was held too, and every subscriber reads again.
    proxy.releaseAnswers();
    await waitFor(() => resyncs === 1, 5_000, "a resync");
    expect(hub.generation).toBe(generation + 1);
    expect(hub.heardAllSince(hub.generation)).toBe(true);
    await waitFor(() => settings.length === 2, 5_000, "the held notice");
  } finally {
    off();
  }
});
