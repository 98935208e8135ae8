// A renter's suspension over real HTTP and PostgreSQL: while suspended, none of
// its queued jobs is given to a provider by any path (a freed slot, a provider
// coming online, the job sweep, a re-queue after a provider's fault), they wait
// with their holds and say why, other renters' queue positions do not count
// them, and the unsuspension offers them at once;
// stop_jobs cancels every active job in the suspension's transaction (the time
// a running job used charged and paid, the holds released); a submit or an
// assignment racing the suspension leaves no job dispatched after it. The CLI
// takes --stop-jobs (the console's checkbox: test/console/operator-actions.test.ts).
import { beforeEach, describe, expect, it } from "vitest";
import { ADMIN_TOKEN, useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { waitingOn as waitingOnLock } from "../helpers/lock-races.js";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import { dispatchForProvider, dispatchQueued } from "../../src/domain/dispatch/dispatch.js";
import { clearMarketplace, pickUp } from "../jobs/helpers.js";
import { gpuStatus, newProvider } from "../providers/helpers.js";
import { runSvc } from "../cli/run-svc.js";
import { ADMIN } from "./helpers.js";

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0" });
const api = client(srv);
beforeEach(() => clearMarketplace(srv));

const waitingOn = (pattern: string, n = 1) => waitingOnLock(srv.sql, pattern, n);

/** A rendering job: 20 halala a minute, 10 minutes held (200). */
const submit = (headers: Record<string, string>) =>
  api.post("/api/jobs/submit", { job_type: "rendering", params: { scene_url: "https://example.com/a.blend" } }, headers);
const suspend = (id: number, body: Record<string, unknown> = {}) => api.post(`/api/admin/renters/${id}/suspend`, body, ADMIN);
const unsuspend = (id: number, body: Record<string, unknown> = {}) => api.post(`/api/admin/renters/${id}/unsuspend`, body, ADMIN);

async function submitted(headers: Record<string, string>): Promise<string> {
  const r = await submit(headers);
  expect(r.status, r.text).toBe(201);
  return r.body.job.job_id;
}

async function jobRow(jobId: string) {
  const [j] = await srv.sql<{ status: string; provider_id: number | null; attempt: number }[]>`
    SELECT status, provider_id, attempt FROM jobs WHERE job_id = ${jobId}`;
  return j;
}

const renterOf = async (id: number) => (await api.get(`/api/admin/renters/${id}`, ADMIN)).body.renter;
const renterAudit = async (id: number) =>
  (await api.get(`/api/admin/audit?target_type=renter&target_id=${id}`, ADMIN)).body.entries as { action: string; details: Record<string, unknown> }[];

async function booksClean() {
  expect(await ledgerProblems(srv.sql)).toEqual([]);
  const r = await api.get("/api/admin/ledger/audit?full=true", ADMIN);
  expect(r.status, r.text).toBe(200);
  expect(r.body.ok).toBe(true);
}

describe("a suspended renter's queued jobs", () => {
  it("are given to no provider: a freed slot, a provider coming online, the sweep; they wait saying why, and are placed as soon as it is unsuspended", async () => {
    const renter = await makeRenter(srv, 10_000);
    const other = await makeRenter(srv, 10_000);
    const busy = await makeProvider(srv);
    const first = await submitted(other.headers);
    expect((await pickUp(api, busy.key))?.job_id).toBe(first);
    const waiting = await submitted(renter.headers);
    expect((await jobRow(waiting)).status).toBe("queued");

    const s = await suspend(renter.id, { reason: "chargeback" });
    expect(s.status, s.text).toBe(200);
    expect(s.body).toMatchObject({ success: true, jobs_stopped: 0, renter: { status: "suspended", held_halala: 200 } });

    // Its answer says why it waits (an admin reads it: the renter's key is refused while suspended).
    const read = await api.get(`/api/jobs/${waiting}`, ADMIN);
    expect(read.body).toMatchObject({ status: "queued", queue_reason_code: "renter_suspended" });
    expect(read.body.queue_reason).toMatch(/suspended/);

    // A slot frees: the provider is refilled, but not with it.
    const done = await api.post("/api/providers/job-result", { api_key: busy.key, job_id: first, success: true, result: {} });
    expect(done.status, done.text).toBe(200);
    expect(await jobRow(waiting)).toMatchObject({ status: "queued", provider_id: null });
    // A provider with room comes online.
    const fresh = await newProvider(srv);
    const beat = await api.post("/api/providers/heartbeat", { api_key: fresh.key, gpu_status: gpuStatus() });
    expect(beat.status, beat.text).toBe(200);
    expect(await dispatchForProvider(srv.sql, fresh.id)).toEqual([]);
    expect(await dispatchForProvider(srv.sql, busy.id)).toEqual([]);
    // The sweep.
    expect(await dispatchQueued(srv.sql)).toBe(0);
    expect(await jobRow(waiting)).toMatchObject({ status: "queued", provider_id: null });

    // Another renter's job submitted later goes past it.
    const later = await submitted(other.headers);
    expect((await jobRow(later)).status).toBe("pending");
    // Nothing moved: its hold is whole.
    expect(await renterOf(renter.id)).toMatchObject({ balance_halala: 10_000, held_halala: 200 });

    // Unsuspended, it is placed at once (no sweep runs in this test).
    const u = await unsuspend(renter.id);
    expect(u.status, u.text).toBe(200);
    expect((await jobRow(waiting)).status).toBe("pending");
    expect((await api.get(`/api/jobs/${waiting}`, renter.headers)).body.status).toBe("pending");
    await booksClean();
  });

  it("are not placed by a re-queue after a provider's fault; its running job runs on without stop_jobs", async () => {
    const renter = await makeRenter(srv, 10_000);
    const a = await makeProvider(srv);
    const b = await makeProvider(srv);
    const jobId = await submitted(renter.headers);
    const first = (await jobRow(jobId)).provider_id!;
    const [on, spare] = first === a.id ? [a, b] : [b, a];
    expect((await pickUp(api, on.key))?.job_id).toBe(jobId);

    const s = await suspend(renter.id);
    expect(s.status, s.text).toBe(200);
    expect(s.body.jobs_stopped).toBe(0);
    expect((await jobRow(jobId)).status).toBe("running");

    // The provider fails it: back in the queue as a new attempt, but not given to the free provider.
    const failed = await api.post("/api/providers/job-result", { api_key: on.key, job_id: jobId, success: false, error: "GPU fell off the bus", fault: "provider" });
    expect(failed.status, failed.text).toBe(200);
    expect(await jobRow(jobId)).toMatchObject({ status: "queued", provider_id: null, attempt: 2 });
    expect(await dispatchForProvider(srv.sql, spare.id)).toEqual([]);

    expect((await unsuspend(renter.id)).status).toBe(200);
    expect(await jobRow(jobId)).toMatchObject({ status: "pending", provider_id: spare.id });
    await booksClean();
  });
});

describe("stop_jobs", () => {
  it("cancels the renter's queued, pending and running jobs in the suspension's transaction: the time used charged and paid, the holds released", async () => {
    const renter = await makeRenter(srv, 10_000);
    const other = await makeRenter(srv, 10_000);
    const provider = await makeProvider(srv);
    await srv.sql`UPDATE providers SET gpu_count = 2, approved_gpu_count = 2 WHERE id = ${provider.id}`;
    const running = await submitted(renter.headers);
    expect((await pickUp(api, provider.key))?.job_id).toBe(running);
    const pending = await submitted(renter.headers);
    const queued = await submitted(renter.headers);
    const theirs = await submitted(other.headers);
    expect([await jobRow(running), await jobRow(pending), await jobRow(queued), await jobRow(theirs)].map((j) => j.status)).toEqual([
      "running",
      "pending",
      "queued",
      "queued",
    ]);
    expect(await renterOf(renter.id)).toMatchObject({ held_halala: 600 });

    // Suspended first without it: every job stays as it was.
    const plain = await suspend(renter.id, { stop_jobs: false });
    expect(plain.status, plain.text).toBe(200);
    expect(plain.body.jobs_stopped).toBe(0);
    expect((await jobRow(running)).status).toBe("running");

    await new Promise((r) => setTimeout(r, 50));
    const s = await suspend(renter.id, { stop_jobs: true, reason: "abuse report 42" });
    expect(s.status, s.text).toBe(200);
    expect(s.body.jobs_stopped).toBe(3);
    // The running job paid its one billable minute (20 halala, 15 to the provider); the others nothing.
    expect(s.body.renter).toMatchObject({ status: "suspended", balance_halala: 9_980, held_halala: 0, total_spent_halala: 20 });

    const read = async (jobId: string) => (await api.get(`/api/jobs/${jobId}`, ADMIN)).body;
    expect(await read(running)).toMatchObject({
      status: "cancelled", end_reason: "renter_suspended", fault: "renter", actual_cost_halala: 20, provider_earned_halala: 15, platform_fee_halala: 5,
    });
    for (const jobId of [pending, queued]) {
      expect(await read(jobId)).toMatchObject({ status: "cancelled", end_reason: "renter_suspended", fault: "renter", actual_cost_halala: 0 });
    }
    expect((await read(running)).error).toMatch(/suspended/);
    const me = await api.get(`/api/providers/me?key=${provider.key}`);
    expect(me.body.provider.total_earnings_halala).toBe(15);
    // The provider is told to stop, and its freed GPUs refilled from the queue.
    expect((await jobRow(theirs)).status).toBe("pending");

    const [entry] = await renterAudit(renter.id);
    expect(entry).toMatchObject({ action: "renter.suspend", details: { reason: "abuse report 42", changed: false, stop_jobs: true, jobs_stopped: 3 } });
    // Each job stopped has its own entry, as an admin's cancel of it would: a job's audit trail says who ended it.
    for (const [jobId, status] of [[running, "running"], [pending, "pending"], [queued, "queued"]]) {
      const trail = (await api.get(`/api/admin/audit?target_type=job&target_id=${jobId}`, ADMIN)).body.entries;
      expect(trail, jobId).toMatchObject([
        { action: "job.cancel", details: { status, reason: "the renter's account was suspended (stop_jobs): abuse report 42", renter_id: renter.id } },
      ]);
    }
    expect((await api.get(`/api/admin/audit?target_type=job&target_id=${theirs}`, ADMIN)).body.entries).toEqual([]);
    // Nothing left to stop.
    expect((await suspend(renter.id, { stop_jobs: true })).body.jobs_stopped).toBe(0);
    await booksClean();
  });

  it("is refused unless a boolean, and on an unsuspension, suspending nothing", async () => {
    const renter = await makeRenter(srv, 1_000);
    for (const v of ["yes", 1, { on: true }]) {
      const r = await suspend(renter.id, { stop_jobs: v });
      expect(r.status, r.text).toBe(400);
      expect(r.body.error).toMatch(/stop_jobs/);
    }
    expect((await renterOf(renter.id)).status).toBe("active");
    expect(await renterAudit(renter.id)).toEqual([]);
    const u = await unsuspend(renter.id, { stop_jobs: true });
    expect(u.status, u.text).toBe(400);
    expect(u.body.error).toMatch(/stop_jobs/);
  });
});

describe("queue positions", () => {
  it("leave out a suspended renter's queued jobs ahead, and count them again once it is unsuspended", async () => {
    const renter = await makeRenter(srv, 10_000);
    const other = await makeRenter(srv, 10_000);
    const busy = await makeProvider(srv);
    const running = await submitted(other.headers);
    expect((await pickUp(api, busy.key))?.job_id).toBe(running);
    const first = await submit(renter.headers);
    expect(first.body.job, first.text).toMatchObject({ status: "queued", queue_position: 1 });
    expect((await suspend(renter.id)).status).toBe(200);

    // Another renter's job behind it: the suspended renter's job, given to no provider, is not ahead of it.
    const behind = await submit(other.headers);
    expect(behind.body.job, behind.text).toMatchObject({ status: "queued", queue_position: 1 });
    const waiting = (await api.get(`/api/jobs/${behind.body.job.job_id}`, other.headers)).body;
    expect(waiting.queue_reason_code).toBe("providers_busy");
    expect(waiting.queue_reason).not.toMatch(/ahead/);
    // The suspended renter's job still says why it waits.
    expect((await api.get(`/api/jobs/${first.body.job.job_id}`, ADMIN)).body.queue_reason_code).toBe("renter_suspended");

    // Unsuspended (the only provider still busy), its job is in line again, ahead of the other renter's.
    expect((await unsuspend(renter.id)).status).toBe(200);
    expect((await jobRow(first.body.job.job_id)).status).toBe("queued");
    const later = await submit(other.headers);
    expect(later.body.job, later.text).toMatchObject({ status: "queued", queue_position: 3 });
    expect((await api.get(`/api/jobs/${behind.body.job.job_id}`, other.headers)).body.queue_reason).toMatch(/1 job ahead in the queue/);
    await booksClean();
  });
});

describe("races", () => {
  it("a submit that authenticated before the suspension committed is refused after it, leaving nothing dispatched", async () => {
    const renter = await makeRenter(srv, 10_000);
    await makeProvider(srv);
    // The renter's row held elsewhere: the suspension waits for it before it commits.
    let release!: () => void;
    const gate = new Promise<void>((res) => (release = res));
    let held!: () => void;
    const isHeld = new Promise<void>((res) => (held = res));
    const holder = srv.sql.begin(async (tx) => {
      await tx`SELECT 1 FROM renters WHERE id = ${renter.id} FOR NO KEY UPDATE`;
      held();
      await gate;
    });
    await isHeld;
    const suspending = suspend(renter.id);
    await waitingOn("%", 1);
    // Its key still works: the submit is let in, and then waits for the suspension.
    const submitting = submit(renter.headers);
    await waitingOn("%", 2);
    release();
    await holder;
    expect((await suspending).status).toBe(200);
    const r = await submitting;
    expect(r.status, r.text).toBe(403);
    expect(r.body.error).toMatch(/suspended/);
    const jobs = await srv.sql`SELECT status FROM jobs WHERE renter_id = ${renter.id}`;
    expect(jobs).toEqual([]);
    expect(await renterOf(renter.id)).toMatchObject({ status: "suspended", held_halala: 0, total_jobs: 0 });
    await booksClean();
  });

  it("a suspension waits for an assignment of the renter's job already under way: once it answers, none follows", async () => {
    const renter = await makeRenter(srv, 10_000);
    const provider = await makeProvider(srv);
    await srv.sql`UPDATE providers SET is_paused = true, status = 'paused' WHERE id = ${provider.id}`;
    const jobId = await submitted(renter.headers);
    const [{ id }] = await srv.sql<{ id: number }[]>`SELECT id FROM jobs WHERE job_id = ${jobId}`;
    await srv.sql`UPDATE providers SET is_paused = false, status = 'online', last_heartbeat = now() WHERE id = ${provider.id}`;
    // The assignment stops inside its statement (the attempt row's insert) until the gate opens.
    const key = 7_000_000 + id;
    await srv.sql.unsafe(`
      CREATE FUNCTION test_gate_${id}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_advisory_xact_lock_shared(${key}); RETURN NEW; END $$;
      CREATE TRIGGER test_gate_${id} BEFORE INSERT ON job_attempts FOR EACH ROW WHEN (NEW.job_id = ${id}) EXECUTE FUNCTION test_gate_${id}();`);
    let release!: () => void;
    const gate = new Promise<void>((res) => (release = res));
    let closed!: () => void;
    const isClosed = new Promise<void>((res) => (closed = res));
    const holder = srv.sql.begin(async (tx) => {
      await tx`SELECT pg_advisory_xact_lock(${key})`;
      closed();
      await gate;
    });
    try {
      await isClosed;
      const assigning = dispatchForProvider(srv.sql, provider.id);
      await waitingOn("%WITH target AS MATERIALIZED%");
      const suspending = suspend(renter.id);
      const first = await Promise.race([suspending.then(() => "answered"), waitingOn("%FROM renters WHERE id%FOR UPDATE%").then(() => "waiting")]);
      expect(first).toBe("waiting");
      release();
      await holder;
      expect((await assigning).map((a) => a.jobId)).toEqual([jobId]);
      expect((await suspending).status).toBe(200);
      expect((await jobRow(jobId)).status).toBe("pending");
    } finally {
      release();
      await holder;
      await srv.sql.unsafe(`DROP TRIGGER test_gate_${id} ON job_attempts; DROP FUNCTION test_gate_${id}();`);
    }
    await booksClean();
  });
});

describe("svc admin suspend-renter", () => {
  it("suspends with --stop-jobs, saying how many jobs it stopped, and unsuspends", async () => {
    const renter = await makeRenter(srv, 10_000);
    await makeProvider(srv);
    const jobId = await submitted(renter.headers);
    const env = { SVC_URL: srv.url, SVC_ADMIN_TOKEN: ADMIN_TOKEN };
    const r = await runSvc(["admin", "suspend-renter", String(renter.id), "--stop-jobs", "--reason", "abuse report"], { env });
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout.trim()).toBe(`renter ${renter.id}: suspended; 1 job stopped`);
    expect((await jobRow(jobId)).status).toBe("cancelled");
    expect((await renterAudit(renter.id))[0].details).toMatchObject({ reason: "abuse report", stop_jobs: true, jobs_stopped: 1 });
    const again = await runSvc(["--json", "admin", "suspend-renter", String(renter.id)], { env });
    expect(again.code, again.stderr).toBe(0);
    expect(JSON.parse(again.stdout)).toMatchObject({ jobs_stopped: 0, renter: { status: "suspended" } });
    const u = await runSvc(["admin", "unsuspend-renter", String(renter.id)], { env });
    expect(u.code, u.stderr).toBe(0);
    expect(u.stdout.trim()).toBe(`renter ${renter.id}: unsuspended`);
    expect((await renterOf(renter.id)).status).toBe("active");
    await booksClean();
  });
});
