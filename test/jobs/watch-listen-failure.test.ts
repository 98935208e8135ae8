// The job-watch hub (src/workers/job-watch.ts) when its first LISTEN fails: a
// watch started while the database takes no new connection is refused, and
// once it is back each change of a watched job is read once, as by a hub whose
// start never failed. The hub's pool reaches PostgreSQL through a TCP proxy
// that can refuse new connections; the job is made and changed through a
// server on the database itself.
import { afterAll, beforeAll, expect, it } from "vitest";
import { connect } from "../../src/db/index.js";
import { createLogger } from "../../src/log.js";
import { JobWatchHub } from "../../src/workers/job-watch.js";
import type { JobEventInit } from "../../src/domain/jobs/job-watch.js";
import { freshDatabase, startTestServer, type TestServer } from "../helpers/server.js";
import { DbProxy } from "../helpers/db-proxy.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";

let db: Awaited<ReturnType<typeof freshDatabase>>;
let proxy: DbProxy;
let proxied = "";
let srv: TestServer;

beforeAll(async () => {
  db = await freshDatabase();
  const front = await DbProxy.inFrontOf(db.url);
  proxy = front.proxy;
  proxied = front.url;
  srv = await startTestServer({ SVC_JOB_SWEEP_MS: "60000" }, db.url);
});
afterAll(async () => {
  await srv?.close();
  await proxy?.close();
  await db?.drop();
});

it("reads a watched job once per change after a start that failed", async () => {
  const renter = await makeRenter(srv, 10_000);
  const provider = await makeProvider(srv);
  const api = client(srv.url);
  const r = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 3 }, renter.headers);
  expect(r.status, r.text).toBe(201);
  const jobId = r.body.job.job_id as string;
  expect((await api.get(`/api/providers/${provider.key}/jobs`)).body.job.job_id).toBe(jobId);
  const [{ id }] = await srv.sql<{ id: number }[]>`SELECT id FROM jobs WHERE job_id = ${jobId}`;

  const sql = connect(proxied, 2);
  const hub = new JobWatchHub(sql, createLogger("silent"));
  const ac = new AbortController();
  try {
    proxy.refusing = true;
    await expect(hub.watch(id, { role: "admin" }, 0, ac.signal).next()).rejects.toThrow();
    expect(hub.watchers).toBe(0);
    // postgres.js listens again by itself for what it was asked; the database comes back meanwhile.
    await new Promise((r) => setTimeout(r, 500));
    proxy.refusing = false;
    await new Promise((r) => setTimeout(r, 1_500));

    const events = hub.watch(id, { role: "admin" }, 0, ac.signal);
    const next = async (): Promise<JobEventInit> => (await events.next()).value as JobEventInit;
    expect((await next()).event?.case).toBe("snapshot");
    const before = hub.reads;
    expect((await client(srv.url).post(`/api/jobs/${jobId}/logs`, { api_key: provider.key, logs: ["one line"] })).status).toBe(200);
    const e = await next();
    expect(e.event?.case).toBe("log");
    // The change's one notice was read once (a read it asked for again would have begun by now).
    expect(hub.reads - before).toBe(1);
    ac.abort();
    await events.return(undefined);
  } finally {
    proxy.refusing = false;
    ac.abort();
    await hub.stop();
    await sql.end();
  }
});
