// Two ends of one job at the same moment, in a chosen order: the test holds
// the job row locked, starts the first call, waits until it queues on that
// lock, starts the second, waits until it queues too, then lets go, so the
// first takes the row first (PostgreSQL grants a row's waiters in turn). Each
// end locks the job row and re-checks its status under the lock: whichever
// comes first ends the attempt, the other moves no money.
import { afterAll, beforeEach, describe, expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { client, type Reply } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import { openStream, type TestStream } from "../daemon/grpc-stream.js";
import { admin, clearMarketplace, pickUp } from "./helpers.js";

const streams: TestStream[] = [];

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0" });
const api = client(srv);
afterAll(() => {
  for (const s of streams) s.cancel();
});
beforeEach(() => clearMarketplace(srv));

const balance = async (key: string) => (await api.get("/api/renters/balance", { "x-renter-key": key })).body;

/** Calls queued on a job row's lock: lockJob's statement (settlement.ts), the one every end of a job by its id starts with. */
async function waitingOnJobRow(): Promise<number> {
  const [r] = await srv.sql<{ n: number }[]>`
    SELECT count(*)::int AS n FROM pg_stat_activity
    WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%FROM jobs WHERE job_id = $1 FOR UPDATE%'`;
  return r.n;
}

async function untilWaiting(n: number): Promise<void> {
  const until = Date.now() + 10_000;
  while ((await waitingOnJobRow()) < n) {
    if (Date.now() > until) throw new Error(`fewer than ${n} calls queued on the job row`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

/** Runs `first` and `second` so that `first` takes the job row's lock first. */
async function inTurn<A, B>(jobId: string, first: () => Promise<A>, second: () => Promise<B>): Promise<[A, B]> {
  let release!: () => void;
  const gate = new Promise<void>((r) => (release = r));
  let locked!: () => void;
  const held = new Promise<void>((r) => (locked = r));
  const holder = srv.sql.begin(async (tx) => {
    await tx`SELECT 1 FROM jobs WHERE job_id = ${jobId} FOR UPDATE`;
    locked();
    await gate;
  });
  await held;
  const a = first();
  await untilWaiting(1);
  const b = second();
  await untilWaiting(2);
  release();
  await holder;
  return Promise.all([a, b]);
}

/** Transfers of the job's settlement, by kind. */
async function charges(jobId: string): Promise<Record<string, number>> {
  const rows = await srv.sql<{ kind: string; n: number }[]>`
    SELECT t.kind, count(*)::int AS n FROM ledger_transfers t JOIN jobs j ON j.id = t.job_id
    WHERE j.job_id = ${jobId} AND t.kind IN ('charge_provider', 'charge_platform') GROUP BY t.kind`;
  return Object.fromEntries(rows.map((r) => [r.kind, r.n]));
}

const report = (key: string, jobId: string) => api.post("/api/providers/job-result", { api_key: key, job_id: jobId, success: true, result: { ok: 1 } });

describe("an admin re-queue and the provider's result at the same moment", () => {
  async function runningJob() {
    const renter = await makeRenter(srv, 10_000);
    const provider = await makeProvider(srv);
    const r = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 10 }, renter.headers);
    expect(r.status, r.text).toBe(201);
    const jobId = r.body.job.job_id as string;
    expect((await pickUp(api, provider.key))?.job_id).toBe(jobId);
    return { renter, provider, jobId };
  }
  const requeue = (jobId: string) => api.post(`/api/admin/jobs/${jobId}/requeue`, { reason: "race" }, admin(srv));

  it("re-queue first: the attempt ends the platform's fault, nothing is charged and the late result is refused", async () => {
    const { renter, provider, jobId } = await runningJob();
    const [rq, rs] = await inTurn(jobId, () => requeue(jobId), () => report(provider.key, jobId));
    expect(rq.status, rq.text).toBe(200);
    expect(rs.status, rs.text).toBe(403);
    const [attempt] = await srv.sql`
      SELECT a.status, a.end_reason, a.fault, a.cost_halala FROM job_attempts a JOIN jobs j ON j.id = a.job_id
      WHERE j.job_id = ${jobId} AND a.attempt = 1`;
    expect(attempt).toMatchObject({ status: "requeued", end_reason: "admin_requeued", fault: "platform", cost_halala: 0 });
    const [job] = await srv.sql`SELECT status, attempt, actual_cost_halala FROM jobs WHERE job_id = ${jobId}`;
    expect(job).toMatchObject({ attempt: 2, actual_cost_halala: null });
    expect(["queued", "pending"]).toContain(job.status);
    expect(await charges(jobId)).toEqual({});
    // The hold stays whole for the next attempt.
    expect(await balance(renter.key)).toMatchObject({ balance_halala: 10_000, held_halala: 100, total_spent_halala: 0 });
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("result first: the job is settled once for the minute it ran and the re-queue is refused", async () => {
    const { renter, provider, jobId } = await runningJob();
    const [rs, rq] = await inTurn(jobId, () => report(provider.key, jobId), () => requeue(jobId));
    expect(rs.status, rs.text).toBe(200);
    expect(rs.body).toMatchObject({ status: "completed", cost_halala: 10, provider_earned_halala: 7, platform_fee_halala: 3 });
    expect(rq.status, rq.text).toBe(409);
    const [job] = await srv.sql`SELECT status, attempt, actual_cost_halala FROM jobs WHERE job_id = ${jobId}`;
    expect(job).toMatchObject({ status: "completed", attempt: 1, actual_cost_halala: 10 });
    expect(await charges(jobId)).toEqual({ charge_provider: 1, charge_platform: 1 });
    expect(await balance(renter.key)).toMatchObject({ balance_halala: 9_990, held_halala: 0, total_spent_halala: 10 });
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });
});

describe("the same result over the JSON route and the daemon stream at once", () => {
  for (const first of ["stream", "json"] as const) {
    it(`settles once and answers both with the same figures (${first} first)`, async () => {
      const renter = await makeRenter(srv, 10_000);
      // A webhook URL nobody listens on: the outbox keeps what each end queued.
      expect((await api.patch("/api/renters/me", { webhook_url: "http://127.0.0.1:9/hook" }, renter.headers)).status).toBe(200);
      const provider = await makeProvider(srv);
      const s = openStream(srv.port, provider.key);
      streams.push(s);
      s.send({ case: "hello", value: { daemonVersion: "5.0.0", runningJobIds: [], gpus: [{ name: "NVIDIA GeForce RTX 4090", vram_mib: 24564 }] } });
      await s.next("welcome");
      expect((await api.post("/api/jobs/submit", { job_type: "benchmark" }, renter.headers)).status).toBe(201);
      const job = await s.next("job", 5_000);
      s.send({ case: "jobAccepted", value: { jobId: job.jobId } });
      const until = Date.now() + 5_000;
      while ((await srv.sql`SELECT 1 FROM jobs WHERE job_id = ${job.jobId} AND status = 'running'`).length === 0) {
        if (Date.now() > until) throw new Error("the job was not accepted");
        await new Promise((r) => setTimeout(r, 10));
      }

      const overStream = async () => {
        s.send({ case: "result", value: { jobId: job.jobId, success: true } });
        const ack = await s.next("resultAck", 10_000);
        return { status: ack.status, cost: Number(ack.costHalala), earned: Number(ack.providerEarnedHalala), fee: Number(ack.platformFeeHalala) };
      };
      const overJson = async () => {
        const r: Reply = await report(provider.key, job.jobId);
        expect(r.status, r.text).toBe(200);
        return { status: r.body.status, cost: r.body.cost_halala, earned: r.body.provider_earned_halala, fee: r.body.platform_fee_halala };
      };
      const [a, b] = first === "stream" ? await inTurn(job.jobId, overStream, overJson) : await inTurn(job.jobId, overJson, overStream);
      expect(a).toEqual({ status: "completed", cost: 10, earned: 7, fee: 3 });
      expect(b).toEqual(a);
      expect(await charges(job.jobId)).toEqual({ charge_provider: 1, charge_platform: 1 });
      const [hooks] = await srv.sql<{ n: number }[]>`SELECT count(*)::int AS n FROM webhook_outbox WHERE renter_id = ${renter.id} AND event = 'job.completed'`;
      expect(hooks.n).toBe(1);
      const [p] = await srv.sql`SELECT total_jobs, total_earnings_halala FROM providers WHERE id = ${provider.id}`;
      expect(p).toMatchObject({ total_jobs: 1, total_earnings_halala: 7 });
      expect(await balance(renter.key)).toMatchObject({ balance_halala: 9_990, held_halala: 0, total_spent_halala: 10 });
      expect(await ledgerProblems(srv.sql)).toEqual([]);
      s.end();
    });
  }
});
