// svc_daemon.py (as the server serves it, run with the machine's python3)
// against a real server whose database link the test cuts: a result the
// server could not take is kept and sent again until the server answers it,
// also across a restart of the daemon, and given up (logged) after its keep
// time; a polled job is confirmed even when its job_started event is refused;
// a job the server sent back to the queue is stopped here, not run twice.
import fs from "node:fs";
import http from "node:http";
import path from "node:path";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { freshDatabase, startTestServer, type TestServer } from "../helpers/server.js";
import { dbLink, type DbLink } from "../helpers/db-link.js";
import { client } from "../helpers/http.js";
import { clearMarketplace } from "../helpers/isolation.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { connect, type Sql } from "../../src/db/index.js";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import { releaseUnclaimed } from "../../src/domain/dispatch/dispatch.js";
import { gatedRunner, runLegacyDaemon, tempDir, waitFor, type Spawned } from "./helpers.js";
import { jobProcesses } from "./procs.js";

let srv: TestServer;
let link: DbLink;
let database: { url: string; drop(): Promise<void> };
/** The database directly, not through the link: readable while the server's link is down. */
let db: Sql;
const daemons: Spawned[] = [];
const api = () => client(srv.url);

beforeAll(async () => {
  database = await freshDatabase();
  link = await dbLink(database.url);
  srv = await startTestServer({ SVC_JOB_SWEEP_MS: "60000" }, link.url);
  db = connect(database.url, 2);
});
afterEach(async () => {
  link.up();
  for (const d of daemons.splice(0)) {
    d.kill("SIGKILL");
    await d.exited;
  }
  await clearMarketplace(srv);
});
afterAll(async () => {
  await db?.end();
  await srv?.close();
  await link?.close();
  await database?.drop();
});

/** The served daemon file, written into a folder of its own. */
async function download(key: string): Promise<{ file: string; dir: string }> {
  const r = await api().get(`/api/providers/download/daemon?key=${key}`);
  expect(r.status).toBe(200);
  const dir = tempDir("pyd");
  const file = path.join(dir, "svc_daemon.py");
  fs.writeFileSync(file, r.text);
  return { file, dir };
}

/** Runs the daemon file; its work dir (and so its kept results) is `<dir>/work`, the same for each start in one dir. */
function runDaemon(file: string, dir: string, env: Record<string, string> = {}): Spawned {
  const d = runLegacyDaemon(file, dir, env);
  daemons.push(d);
  return d;
}

const job = async (jobId: string) => (await db`SELECT * FROM jobs WHERE job_id = ${jobId}`)[0];

/** A provider whose served daemon runs one gated llm-inference job; returns once the job runs there. */
async function gatedJob(env: Record<string, string> = {}, before?: (provider: { id: number }) => Promise<void>, pinned = false) {
  const p = await makeProvider(srv);
  const renter = await makeRenter(srv, 1_000);
  if (before) await before(p);
  const gate = gatedRunner({ quiet: true });
  const { file, dir } = await download(p.key);
  const daemon = runDaemon(file, dir, { SVC_RUNNERS: gate.runner, ...env });
  await waitFor(async () => (await db`SELECT readiness_status FROM providers WHERE id = ${p.id}`)[0].readiness_status, 45_000, `daemon up (${daemon.output()})`);
  const r = await api().post(
    "/api/jobs/submit",
    { job_type: "llm-inference", duration_minutes: 1, params: { prompt: "hi", max_tokens: 32 }, ...(pinned ? { provider_id: p.id } : {}) },
    renter.headers,
  );
  expect(r.status, r.text).toBe(201);
  const j = r.body.job as { job_id: string; provider_id: number };
  expect(j.provider_id).toBe(p.id);
  await waitFor(async () => (await job(j.job_id)).status === "running" && gate.started(), 45_000, `running (${daemon.output()})`);
  return { p, renter, gate, daemon, file, dir, jobId: j.job_id };
}

const ended = (jobId: string, timeoutMs: number, what: string) =>
  waitFor(async () => {
    const r = await job(jobId);
    return ["completed", "failed", "cancelled"].includes(r.status) ? r : undefined;
  }, timeoutMs, what);

describe("svc_daemon.py result delivery", { timeout: 90_000 }, () => {
  it("keeps a result the server could not take while its database was away, and delivers it once it is back", async () => {
    const { gate, daemon: d, jobId, renter, dir } = await gatedJob({ SVC_RESULT_RETRY_SECONDS: "0.5" });
    link.down();
    gate.open();
    await waitFor(() => d.output().includes(`job-result for ${jobId}`), 20_000, "the result's first try");
    // An outage of more than a quarter of a minute: the result is kept however long it lasts (up to its keep time).
    await new Promise((r) => setTimeout(r, 17_000));
    expect((await job(jobId)).status).toBe("running");
    // Kept on disk, naming the attempt it ends (a later attempt of the job would refuse it).
    const [kept] = fs.readdirSync(path.join(dir, "work", ".svc-results"));
    expect(JSON.parse(fs.readFileSync(path.join(dir, "work", ".svc-results", kept), "utf8")).body).toMatchObject({ job_id: jobId, attempt: 1, success: true });
    link.up();
    const done = await ended(jobId, 15_000, `job end once the database is back (${d.output()})`);
    expect(done.status, done.error).toBe("completed");
    expect(done.attempt).toBe(1);
    expect(done.result).toMatchObject({ response: "done" });
    await waitFor(() => new RegExp(`job-result for ${jobId} delivered after \\d+ earlier tries`).test(d.output()), 5_000, "the delivery logged");
    expect((await api().get("/api/renters/balance", renter.headers)).body.held_halala).toBe(0);
    expect(await ledgerProblems(db)).toEqual([]);
    // Nothing is left to send (the file goes once the daemon has the server's answer).
    await waitFor(() => fs.readdirSync(path.join(dir, "work", ".svc-results")).length === 0, 5_000, "the kept result removed");
  });

  it("stops at once on SIGTERM with a result undelivered, and sends it when started again", async () => {
    const { gate, daemon: a, jobId, file, dir } = await gatedJob({ SVC_STOP_GRACE_SECONDS: "2" });
    link.down();
    gate.open();
    await waitFor(() => a.output().includes(`job-result for ${jobId}`), 20_000, "the result's first try");
    const t0 = Date.now();
    a.kill("SIGTERM");
    const code = await Promise.race([a.exited, new Promise((r) => setTimeout(() => r("still running"), 8_000))]);
    expect(code, a.output()).toBe(0);
    expect(Date.now() - t0).toBeLessThan(8_000);
    expect(a.output()).toMatch(/1 job result\(s\) not delivered yet, kept in .*; the next start sends them/);
    link.up();
    expect((await job(jobId)).status).toBe("running");
    // The same work dir: the next start of the daemon finds the result and sends it first.
    const b = runDaemon(file, dir);
    const done = await ended(jobId, 20_000, `job end after the restart (${b.output()})`);
    expect(done.status, done.error).toBe("completed");
    expect(done.attempt).toBe(1);
    expect(done.result).toMatchObject({ response: "done" });
    expect(b.output()).toMatch(/1 job result\(s\) from an earlier run to send/);
    await waitFor(() => fs.readdirSync(path.join(dir, "work", ".svc-results")).length === 0, 5_000, "the kept result removed");
    expect(await ledgerProblems(db)).toEqual([]);
  });

  it("sends at its next start a result whose report was under way when the daemon was killed", async () => {
    // Between the daemon and the server: a proxy that takes job-result requests and answers none while
    // `hang` holds (a server that stopped answering), and passes everything else on.
    let hang = true;
    let held = 0;
    const proxy = http.createServer((req, res) => {
      if (hang && req.url === "/api/providers/job-result") {
        held++;
        return; // never answered
      }
      const up = http.request(srv.url + req.url!, { method: req.method, headers: req.headers }, (answer) => {
        res.writeHead(answer.statusCode!, answer.headers);
        answer.pipe(res);
      });
      up.on("error", () => res.destroy());
      req.pipe(up);
    });
    await new Promise<void>((r) => proxy.listen(0, "127.0.0.1", r));
    try {
      const via = `http://127.0.0.1:${(proxy.address() as { port: number }).port}`;
      const { gate, daemon: a, jobId, file, dir } = await gatedJob({ SVC_BACKEND_URL: via });
      gate.open();
      await waitFor(() => held > 0, 20_000, `the result's report under way (${a.output()})`);
      // Killed (a crash, an OOM kill, a service manager's stop timeout) while it waits for the answer.
      a.kill("SIGKILL");
      await a.exited;
      hang = false;
      const b = runDaemon(file, dir, { SVC_BACKEND_URL: via });
      const done = await ended(jobId, 20_000, `job end after the restart (${b.output()})`);
      expect(done.status, done.error).toBe("completed");
      expect(done.attempt).toBe(1);
      expect(done.result).toMatchObject({ response: "done" });
      await waitFor(() => fs.readdirSync(path.join(dir, "work", ".svc-results")).length === 0, 5_000, "the kept result removed");
    } finally {
      proxy.closeAllConnections();
      await new Promise((r) => proxy.close(r));
    }
  });

  it("keeps a result its rotated key could not report, and sends it when started again with the new key", async () => {
    const { p, gate, daemon: a, jobId, file, dir } = await gatedJob({ SVC_STOP_GRACE_SECONDS: "2" });
    // The provider rotates its key (a leaked one) while the job runs: the daemon's key stops working at once.
    const rotated = await api().post("/api/providers/rotate-key", {}, { "x-provider-key": p.key });
    expect(rotated.status, rotated.text).toBe(200);
    gate.open();
    await waitFor(() => a.output().includes(`job-result for ${jobId}`), 20_000, `the result's first try (${a.output()})`);
    expect((await job(jobId)).status).toBe("running");
    // The provider restarts its daemon with the new key, in the same work folder.
    a.kill("SIGTERM");
    expect(await a.exited).toBe(0);
    const b = runDaemon(file, dir, { SVC_API_KEY: rotated.body.api_key });
    const done = await ended(jobId, 20_000, `job end after the restart (${b.output()})`);
    expect(done.status, done.error).toBe("completed");
    expect(done.attempt).toBe(1);
    expect(done.result).toMatchObject({ response: "done" });
    await waitFor(() => fs.readdirSync(path.join(dir, "work", ".svc-results")).length === 0, 5_000, "the kept result removed");
  });

  it("stops the jobs it can no longer report on once its rotated key has been refused a while, keeps their reports, and says it needs the new key", async () => {
    // The job never ends by itself (its gate stays closed): before, it ran on to its deadline while the server,
    // hearing nothing from the provider, sent it back to the queue and on to another provider.
    const { p, gate, daemon: a, jobId, file, dir } = await gatedJob({ SVC_KEY_REFUSED_SECONDS: "3", SVC_RESULT_RETRY_SECONDS: "0.5" });
    const rotated = await api().post("/api/providers/rotate-key", {}, { "x-provider-key": p.key });
    expect(rotated.status, rotated.text).toBe(200);
    await waitFor(() => jobProcesses(jobId).length === 0, 30_000, `the job stopped (${a.output()})`);
    expect(a.output()).toMatch(/the provider key has been refused \(HTTP 401\) for \d+ s: it was rotated or revoked/);
    expect(a.output()).toMatch(/Restart the daemon with the new key/);
    // Its report (the provider's interruption, re-queued without charge) is kept for the next start.
    const kept = await waitFor(() => {
      const names = fs.readdirSync(path.join(dir, "work", ".svc-results"));
      return names.length ? JSON.parse(fs.readFileSync(path.join(dir, "work", ".svc-results", names[0]), "utf8")) : undefined;
    }, 10_000, `the report kept (${a.output()})`);
    expect(kept.body).toMatchObject({ job_id: jobId, attempt: 1, success: false, end_reason: "provider_interrupted", fault: "provider" });
    expect(kept.body.error).toMatch(/provider key was refused/);
    expect((await job(jobId)).status).toBe("running");
    // The daemon itself runs on until it is restarted with the new key, which sends the report first: the
    // attempt ends as the provider's interruption.
    a.kill("SIGTERM");
    expect(await a.exited).toBe(0);
    const b = runDaemon(file, dir, { SVC_API_KEY: rotated.body.api_key, SVC_RUNNERS: gate.runner });
    const attempt1 = await waitFor(async () => {
      const [row] = await db`SELECT a.status, a.end_reason FROM job_attempts a JOIN jobs j ON j.id = a.job_id WHERE j.job_id = ${jobId} AND a.attempt = 1`;
      return row?.end_reason ? row : undefined;
    }, 20_000, `attempt 1 ended (${b.output()})`);
    expect(attempt1).toMatchObject({ end_reason: "provider_interrupted" });
    await waitFor(() => fs.readdirSync(path.join(dir, "work", ".svc-results")).length === 0, 5_000, "the kept report removed");
    expect(await ledgerProblems(db)).toEqual([]);
  });

  it("gives a result up after its keep time, logs it, and goes on taking work", async () => {
    const { gate, daemon: d, jobId, renter, dir } = await gatedJob({ SVC_RESULT_RETRY_SECONDS: "0.3", SVC_RESULT_KEEP_SECONDS: "2" });
    link.down();
    gate.open();
    await waitFor(() => /gave up sending the result of \S+ after \d+ tries over \d+ s/.test(d.output()), 15_000, "the result given up");
    expect(d.output()).toContain(`gave up sending the result of ${jobId}`);
    link.up();
    expect(fs.readdirSync(path.join(dir, "work", ".svc-results"))).toEqual([]);
    // The daemon still works: its next job runs and settles.
    const r = await api().post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 1, params: { suite: "quick", iterations: 1 } }, renter.headers);
    expect(r.status, r.text).toBe(201);
    const next = await ended(r.body.job.job_id, 30_000, `the next job (${d.output()})`);
    expect(next.status, next.error).toBe("completed");
    // The job whose result was given up stays running on the server until its own end (its timeout).
    expect((await job(jobId)).status).toBe("running");
  });

  it("confirms a polled job with a report of its own when its job_started event is refused", async () => {
    // The provider's events for the hour are used up (600): job_started is refused with 429.
    const { gate, daemon: d, jobId } = await gatedJob({}, async (p) => {
      await db`
        INSERT INTO daemon_events (provider_id, event_type, severity)
        SELECT ${p.id}, 'filler', 'info' FROM generate_series(1, 600)`;
    });
    expect(d.output()).toMatch(/daemon-event job_started not delivered: HTTP 429/);
    // The job prints nothing, yet the server knows the daemon has it: it is not sent back to the queue.
    const row = await waitFor(async () => {
      const r = await job(jobId);
      return r.acked_at ? r : undefined;
    }, 10_000, `pickup confirmed (${d.output()})`);
    expect(row.status).toBe("running");
    gate.open();
    const done = await ended(jobId, 20_000, `job end (${d.output()})`);
    expect(done.status, done.error).toBe("completed");
    expect(done.attempt).toBe(1);
  });

  it("stops a job the server sent back to the queue, instead of running it beside its next provider", async () => {
    const { daemon: d, jobId } = await gatedJob();
    expect(jobProcesses(jobId).length).toBeGreaterThan(0);
    // What the server does when no report on a polled job reached it within the pickup window.
    await db`UPDATE jobs SET acked_at = NULL, started_at = now() - interval '10 minutes' WHERE job_id = ${jobId}`;
    // The platform steady all along (the outages of the tests above would grant a window's grace).
    await db`UPDATE platform_pulse SET up_since = '-infinity', last_at = now()`;
    expect((await releaseUnclaimed(srv.sql)).requeued).toBe(1);
    const [a] = await db`SELECT a.* FROM job_attempts a JOIN jobs j ON j.id = a.job_id WHERE j.job_id = ${jobId} AND a.attempt = 1`;
    expect(a).toMatchObject({ status: "requeued", end_reason: "not_picked_up" });
    await waitFor(() => jobProcesses(jobId).length === 0, 15_000, `the job stopped on this provider (${d.output()})`);
    await waitFor(() => d.output().includes(`job ${jobId} is no longer this provider's`), 5_000, "the stop logged");
    // It sent no result for it: the job waits in the queue for another provider.
    expect(await job(jobId)).toMatchObject({ status: "queued", attempt: 2 });
    expect(d.output()).not.toContain(`job-result for ${jobId}`);
  });

  it("stops the old run of a job assigned back to it as a new attempt, and runs the new attempt from its poll", async () => {
    const { gate, daemon: d, jobId, renter } = await gatedJob({}, undefined, true);
    // An admin re-queues it; it is pinned to this provider, so it comes back here as attempt 2.
    const rq = await api().post(`/api/admin/jobs/${jobId}/requeue`, { reason: "moved by the operator" }, { "x-admin-token": srv.config.adminToken });
    expect(rq.status, rq.text).toBe(200);
    // The old run's status check sees the job on another attempt: it stops that run, reports nothing
    // for it, and its next poll hands out attempt 2, which runs and settles.
    await waitFor(() => d.output().includes(`job ${jobId} is no longer this provider's`), 15_000, `the old run stopped (${d.output()})`);
    await waitFor(async () => {
      const r = await job(jobId);
      return r.status === "running" && r.attempt === 2 && r.acked_at !== null;
    }, 15_000, `attempt 2 picked up (${d.output()})`);
    gate.open();
    const done = await ended(jobId, 20_000, `job end (${d.output()})`);
    expect(done).toMatchObject({ status: "completed", attempt: 2 });
    const attempts = await db`SELECT a.attempt, a.status, a.end_reason FROM job_attempts a JOIN jobs j ON j.id = a.job_id WHERE j.job_id = ${jobId} ORDER BY a.attempt`;
    expect(attempts.map((a) => [a.attempt, a.status, a.end_reason])).toEqual([[1, "requeued", "admin_requeued"], [2, "completed", "completed"]]);
    expect((await api().get("/api/renters/balance", renter.headers)).body.held_halala).toBe(0);
    expect(await ledgerProblems(db)).toEqual([]);
  });
});
