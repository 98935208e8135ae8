// A revocation whose notice never arrives (the LISTEN connection went silent
// and was replaced, or no notice was sent at all) still ends the streams
// opened with the revoked key (src/domain/accounts/open-streams.ts): when the
// listener reconnects, and at every period of the key cache, the keys of every
// open stream are checked against the database, in one query for them all,
// and the streams of a revoked key or a suspended renter end with 401.
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { connect, type Sql } from "../../src/db/index.js";
import { KEY_CACHE_TTL_MS, keyHashOf } from "../../src/domain/accounts/key-cache.js";
import { newKey } from "../../src/domain/accounts/keys.js";
import { openStreamCount, recheckOpenStreams, watchRevocation } from "../../src/domain/accounts/open-streams.js";
import { freshDatabase, startTestServer, type TestServer } from "../helpers/server.js";
import { DbProxy } from "../helpers/db-proxy.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { openSse } from "../jobs/watch-helpers.js";
import { openStream } from "../daemon/grpc-stream.js";

let db: Awaited<ReturnType<typeof freshDatabase>>;
let proxy: DbProxy;
let srv: TestServer;
let direct: Sql;

beforeAll(async () => {
  db = await freshDatabase();
  const front = await DbProxy.inFrontOf(db.url);
  proxy = front.proxy;
  srv = await startTestServer({ SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0" }, front.url);
  direct = connect(db.url, 1);
});
afterAll(async () => {
  await direct?.end();
  await srv?.close();
  await proxy?.close();
  await db?.drop();
});

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const within = <T>(p: Promise<T>, ms: number, what: string) =>
  Promise.race([p, sleep(ms).then(() => Promise.reject(new Error(`${what} within ${ms} ms`)))]);

/** A running job of a fresh renter, and a watch of it opened with the renter's key. */
async function watchedJob() {
  const api = client(srv.url);
  const renter = await makeRenter(srv, 10_000);
  const provider = await makeProvider(srv);
  const sub = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 3, provider_id: provider.id }, renter.headers);
  expect(sub.status, sub.text).toBe(201);
  const jobId = sub.body.job.job_id as string;
  expect((await api.get(`/api/providers/${provider.key}/jobs`)).body.job.job_id).toBe(jobId); // now running
  const sse = await openSse(`${srv.url}/api/jobs/${jobId}/events`, renter.headers);
  expect(sse.status).toBe(200);
  await sse.until((es) => es.length >= 1);
  let ended = false;
  void sse.ended.then(() => (ended = true));
  return { renter, provider, jobId, sse, ended: () => ended };
}

/** The service's pool, counting the statements sent through it (a scope of its own in open-streams). */
function countingPool(): { pool: Sql; queries: () => number } {
  let n = 0;
  const real = srv.app.sql as unknown as (...a: unknown[]) => unknown;
  const pool = ((...args: unknown[]) => {
    n++;
    return real(...args);
  }) as unknown as Sql;
  return { pool, queries: () => n };
}

async function daemonStream() {
  const provider = await makeProvider(srv);
  const stream = openStream(srv.port, provider.key);
  stream.send({ case: "hello", value: { daemonVersion: "5.2.1", gpus: [{ name: "NVIDIA GeForce RTX 4090", vram_mib: 24564 }] } });
  await stream.next("welcome");
  return { provider, stream };
}

describe("streams of a key revoked while the revocation's notice is lost", () => {
  it("end when the invalidation listener reconnects: a renter's job watch and a provider's daemon stream", async () => {
    const api = client(srv.url);
    const watch = await watchedJob();
    const daemon = await daemonStream();
    const bystander = await watchedJob();
    try {
      // The LISTEN connection goes silent; both keys are rotated meanwhile; the silent connection is then
      // reset (a network blip), so the held notices are never delivered.
      proxy.holdListeners();
      expect((await api.post("/api/renters/rotate-key", {}, watch.renter.headers)).status).toBe(200);
      expect((await api.post("/api/providers/rotate-key", undefined, daemon.provider.headers)).status).toBe(200);
      proxy.cut();
      proxy.releaseAnswers();

      await within(watch.sse.ended, 10_000, "the watch did not end");
      expect(watch.sse.events.at(-1)!.data).toMatchObject({ status: 401, error: expect.stringMatching(/key this stream was opened with was revoked/) });
      const ended = await within(daemon.stream.ended, 10_000, "the daemon stream did not end");
      expect(ended.code).toBe(16); // UNAUTHENTICATED

      // A watch opened with a valid key goes on receiving its job's events.
      const before = bystander.sse.events.length;
      const p = await api.post(`/api/jobs/${bystander.jobId}/progress`, { api_key: bystander.provider.key, progress_pct: 42, phase: "after" });
      expect(p.status, p.text).toBe(200);
      await within(bystander.sse.until((es) => es.length > before), 5000, "the bystander's watch got no event");
      expect(bystander.ended()).toBe(false);
    } finally {
      watch.sse.cut();
      bystander.sse.cut();
      daemon.stream.cancel();
    }
  });

  it("end at the periodic check when no notice was sent at all: a revoked key, a suspended renter", async () => {
    const revoked = await watchedJob();
    const suspended = await watchedJob();
    const kept = await watchedJob();
    try {
      // Changed behind the service's back: no NOTIFY, so only a check of the database can tell.
      await direct`UPDATE api_keys SET revoked_at = now() WHERE renter_id = ${revoked.renter.id}`;
      await direct`UPDATE renters SET status = 'suspended' WHERE id = ${suspended.renter.id}`;
      await sleep(300);
      expect([revoked.ended(), suspended.ended()]).toEqual([false, false]);

      expect(await recheckOpenStreams(srv.app.sql)).toBe(2);
      await within(Promise.all([revoked.sse.ended, suspended.sse.ended]), 5000, "the streams did not end");
      for (const w of [revoked, suspended]) expect(w.sse.events.at(-1)!.data).toMatchObject({ status: 401 });
      await sleep(100);
      expect(kept.ended()).toBe(false);
      expect(await recheckOpenStreams(srv.app.sql)).toBe(0);
    } finally {
      for (const w of [revoked, suspended, kept]) w.sse.cut();
    }
  });

  it("the check runs every KEY_CACHE_TTL_MS while streams are open", async () => {
    const renter = await makeRenter(srv);
    await direct`UPDATE api_keys SET revoked_at = now() WHERE renter_id = ${renter.id}`;
    const { pool, queries } = countingPool();
    let ended = false;
    // Only the period's interval is faked, and only while no other code runs (no await in between).
    vi.useFakeTimers({ toFake: ["setInterval", "clearInterval"] });
    try {
      watchRevocation(pool, { role: "renter", accountId: renter.id, keyHash: keyHashOf(renter.key) }, () => (ended = true));
      vi.advanceTimersByTime(KEY_CACHE_TTL_MS - 1);
      expect(queries()).toBe(0);
      vi.advanceTimersByTime(1);
      expect(queries()).toBe(1);
    } finally {
      vi.useRealTimers();
    }
    for (let i = 0; i < 100 && !ended; i++) await sleep(20);
    expect(ended).toBe(true);
    expect(openStreamCount(pool)).toBe(0);
  });

  it("checks 10,000 open streams in one query", async () => {
    const renter = await makeRenter(srv);
    const suspendedRenter = await makeRenter(srv);
    await direct`UPDATE renters SET status = 'suspended' WHERE id = ${suspendedRenter.id}`;
    const N = 10_000;
    const keys = Array.from({ length: N }, () => keyHashOf(newKey("renter")));
    // Every third key revoked, every third of another renter who is suspended, the rest valid.
    const kind = (i: number) => (i % 3 === 0 ? "revoked" : i % 3 === 1 ? "suspended" : "valid");
    await direct`
      INSERT INTO api_keys (key_hash, role, renter_id, revoked_at)
      SELECT decode(t.h, 'base64'), 'renter', t.renter_id, CASE WHEN t.kind = 'revoked' THEN now() END
      FROM unnest(${keys}::text[], ${keys.map((_, i) => (kind(i) === "suspended" ? suspendedRenter.id : renter.id))}::bigint[],
                  ${keys.map((_, i) => kind(i))}::text[]) AS t(h, renter_id, kind)`;

    const { pool: counting, queries } = countingPool();
    const ended: string[] = [];
    const releases = keys.map((keyHash, i) =>
      watchRevocation(counting, { role: "renter", accountId: kind(i) === "suspended" ? suspendedRenter.id : renter.id, keyHash }, () => ended.push(kind(i))),
    );
    expect(openStreamCount(counting)).toBe(N);
    const started = performance.now();
    const n = await recheckOpenStreams(counting);
    const ms = performance.now() - started;
    console.log(`checked ${N} open streams in ${ms.toFixed(0)} ms`);
    expect(queries()).toBe(1);
    expect(n).toBe(ended.length);
    expect(ended.filter((k) => k === "valid")).toEqual([]);
    expect(ended.length).toBe(keys.filter((_, i) => kind(i) !== "valid").length);
    expect(openStreamCount(counting)).toBe(N - n);
    for (const release of releases) release();
    expect(openStreamCount(counting)).toBe(0);
  });
});
