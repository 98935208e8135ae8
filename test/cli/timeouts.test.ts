// svc against a server that took the request and does not answer it (here: a
// table it reads is locked, so the request waits; the server's HTTP/2 pings
// are answered all the while): a call that is not a stream ends at its
// deadline (SVC_TIMEOUT_SECONDS) with "server unreachable" (4) and says so,
// and a job watch whose first event does not come is tried again as a lost
// one, then given up (4); a stream that gets its events runs past that deadline.
import { describe, expect, it } from "vitest";
import type { Sql } from "../../src/db/index.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { client } from "../helpers/http.js";
import { useTestServer } from "../helpers/server.js";
import { tempDir } from "../daemon/helpers.js";
import { runSvc } from "./run-svc.js";

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000" });

/** Runs `during` while `table` is locked (ACCESS EXCLUSIVE: reads wait too), then releases it. */
async function whileLocked<T>(sql: Sql, table: string, during: () => Promise<T>): Promise<T> {
  let release!: () => void;
  const released = new Promise<void>((r) => (release = r));
  let locked!: () => void;
  const isLocked = new Promise<void>((r) => (locked = r));
  const holder = sql.begin(async (tx) => {
    await tx.unsafe(`LOCK TABLE ${table} IN ACCESS EXCLUSIVE MODE`);
    locked();
    await released;
  });
  await isLocked;
  try {
    return await during();
  } finally {
    release();
    await holder;
  }
}

describe("svc and a server that does not answer", { timeout: 120_000 }, () => {
  it("a call ends at SVC_TIMEOUT_SECONDS: exit 4, saying it had no answer in that time", async () => {
    const renter = await makeRenter(srv, 1_000);
    const env = { SVC_URL: srv.url, SVC_KEY: renter.key, SVC_TIMEOUT_SECONDS: "2" };
    const started = Date.now();
    const r = await whileLocked(srv.sql, "ledger_accounts", () => runSvc(["balance"], { home: tempDir("svc-timeout"), env, limitMs: 30_000 }));
    expect(r.killed, "svc still waiting 30 s later").toBeUndefined();
    expect(r.stderr).toMatch(/^svc: server unreachable: no answer within 2 s \(SVC_TIMEOUT_SECONDS\)/m);
    expect(r.code, r.stderr).toBe(4);
    expect(Date.now() - started).toBeLessThan(30_000);
    // Answered, the same call is as before.
    const ok = await runSvc(["balance"], { home: tempDir("svc-timeout"), env });
    expect(ok.code, ok.stderr).toBe(0);
    expect(ok.stdout).toMatch(/balance\s+1000 halala/);
  });

  it("a watch with no first event is tried again, then given up after SVC_RECONNECT_SECONDS: exit 4", async () => {
    const renter = await makeRenter(srv, 10_000);
    const provider = await makeProvider(srv);
    const api = client(srv.url);
    const sub = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 1, provider_id: provider.id }, renter.headers);
    expect(sub.status, sub.text).toBe(201);
    const env = { SVC_URL: srv.url, SVC_KEY: renter.key, SVC_TIMEOUT_SECONDS: "2", SVC_RECONNECT_SECONDS: "3" };
    const r = await whileLocked(srv.sql, "jobs", () => runSvc(["jobs", "watch", sub.body.job.job_id], { home: tempDir("svc-timeout"), env, limitMs: 40_000 }));
    expect(r.killed, "svc still waiting 40 s later").toBeUndefined();
    expect(r.stderr).toMatch(/^svc: connection lost \(no event within 2 s\); reconnecting…$/m);
    expect(r.stderr).toMatch(/^svc: gave up reconnecting after \d+ s$/m);
    expect(r.code, r.stderr).toBe(4);
  });

  it("a watch that gets its events is not cut at the deadline: it follows the job to its end", async () => {
    const renter = await makeRenter(srv, 10_000);
    const provider = await makeProvider(srv);
    const api = client(srv.url);
    const sub = await api.post("/api/jobs/submit", { job_type: "llm-inference", duration_minutes: 1, provider_id: provider.id, params: { prompt: "hi" } }, renter.headers);
    expect(sub.status, sub.text).toBe(201);
    const jobId: string = sub.body.job.job_id;
    const env = { SVC_URL: srv.url, SVC_KEY: renter.key, SVC_TIMEOUT_SECONDS: "1" };
    const watch = runSvc(["jobs", "watch", jobId], { home: tempDir("svc-timeout"), env, limitMs: 60_000 });
    expect((await api.get(`/api/providers/${provider.key}/jobs`)).body.job?.job_id).toBe(jobId);
    await new Promise((r) => setTimeout(r, 4_000));
    const done = await api.post("/api/providers/job-result", { api_key: provider.key, job_id: jobId, success: true, result: { response: "later" } });
    expect(done.status, done.text).toBe(200);
    const r = await watch;
    expect(r.code, r.stdout + r.stderr).toBe(0);
    expect(r.stdout).toMatch(/^later$/m);
    expect(r.stderr).not.toMatch(/connection lost/);
  });
});
