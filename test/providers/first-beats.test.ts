// Heartbeats that change state (first beat, offline -> online) are written in
// groups (src/domain/providers/state-beats.ts), over real HTTP: many providers
// coming online at once are all online and each is answered only after its
// write committed; an admin suspension racing a first beat is ordered by the
// row lock; one bad beat fails alone; providers that came online together are
// each offered queued work before they are answered; so is a provider still
// marked online whose last beat is older than the live window.
//
// A group is made deterministic by holding the providers table against writes
// (LOCK TABLE ... IN SHARE MODE) while the groups in flight wait (one lone
// beat each) and the next beats queue behind them.
import { describe, expect, it, vi } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeRenter } from "../helpers/fixtures.js";
import { takeProvidersOffline } from "../helpers/isolation.js";
import { heartbeatPipeline } from "../../src/domain/providers/heartbeat.js";
import { MAX_IN_FLIGHT } from "../../src/domain/providers/state-beats.js";
import { sweepOnce } from "../../src/workers/liveness-sweep.js";
import { ADMIN, heardSecondsAgo, heartbeat, newProvider, type TestProvider } from "./helpers.js";

const srv = useTestServer({ SVC_LIVENESS_SWEEP_SECONDS: "0", SVC_JOB_SWEEP_MS: "60000" });
const api = client(srv);

const batcher = () => heartbeatPipeline(srv.app.deps).stateBeats;

/** The state-changing heartbeat write (its prev CTE, early enough for pg_stat_activity's truncated text) and the admin actions' row lock. */
const STATE_WRITE = "%p.rejection_reason%";
const ADMIN_ROW_LOCK = "%FROM providers WHERE id = $1 FOR NO KEY UPDATE%";

/** Statements of this database like any of `patterns` waiting for a lock (the telemetry flush may wait beside them). */
async function waitingForLocks(...patterns: string[]): Promise<number> {
  const [r] = await srv.sql<{ n: number }[]>`
    SELECT count(*)::int AS n FROM pg_stat_activity
    WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE ANY(${patterns}::text[])`;
  return r.n;
}

interface Answer {
  status: number;
  body: Record<string, unknown>;
  /** The provider's status read right after the answer arrived (no flush). */
  statusAfter: string;
}

const settled = { count: 0 };

/** A heartbeat, and the provider's stored status read the moment it is answered. */
async function beatAndRead(p: TestProvider): Promise<Answer> {
  const r = await heartbeat(srv, p.key);
  const [row] = await srv.sql<{ status: string }[]>`SELECT status FROM providers WHERE id = ${p.id}`;
  settled.count++;
  return { status: r.status, body: r.body, statusAfter: row.status };
}

/**
 * The first provider's beat goes alone and waits on the held table, and so
 * does one more lone beat (of a provider made here) for each further group the
 * batcher writes at once (MAX_IN_FLIGHT); the rest arrive meanwhile and queue
 * for one group. Nothing is answered while the table is held. Returns the
 * first beat's answer and the group's, after the table is released, and the
 * providers made for the other lone beats.
 */
async function inOneGroup(first: TestProvider, rest: TestProvider[]): Promise<{ answers: Answer[]; groups: number; extras: TestProvider[] }> {
  const extras = await Promise.all(Array.from({ length: MAX_IN_FLIGHT - 1 }, () => newProvider(srv)));
  const before = batcher().groups;
  settled.count = 0;
  let answers!: Promise<Answer[]>;
  let extraAnswers!: Promise<Answer[]>;
  await srv.sql.begin(async (tx) => {
    await tx`LOCK TABLE providers IN SHARE MODE`;
    const lone: Promise<Answer>[] = [];
    for (const p of [first, ...extras]) {
      lone.push(beatAndRead(p));
      await vi.waitFor(async () => expect(await waitingForLocks(STATE_WRITE)).toBe(lone.length), { timeout: 5000 });
    }
    const grouped = rest.map(beatAndRead);
    await vi.waitFor(() => expect(batcher().queued).toBe(rest.length), { timeout: 5000 });
    expect(settled.count).toBe(0);
    answers = Promise.all([lone[0], ...grouped]);
    extraAnswers = Promise.all(lone.slice(1));
  });
  for (const a of await extraAnswers) expect(a.status).toBe(200);
  return { answers: await answers, groups: batcher().groups - before, extras };
}

describe("state-changing beats in groups", () => {
  it("many providers coming online at once are all online, each answered only after its group committed", async () => {
    const ps = await Promise.all(Array.from({ length: 30 }, () => newProvider(srv)));
    // The second provider beats twice in the group: both beats are merged into its row and both answered.
    const { answers, groups } = await inOneGroup(ps[0], [...ps.slice(1), ps[1]]);
    expect(groups).toBe(MAX_IN_FLIGHT + 1);
    for (const a of answers) {
      expect(a.status).toBe(200);
      expect(a.body.success).toBe(true);
      expect(a.statusAfter).toBe("online");
    }
    const rows = await srv.sql<{ id: number; status: string; first_heartbeat_at: Date | null }[]>`
      SELECT id, status, first_heartbeat_at FROM providers WHERE id IN ${srv.sql(ps.map((p) => p.id))}`;
    expect(rows).toHaveLength(30);
    expect(rows.every((r) => r.status === "online" && r.first_heartbeat_at !== null)).toBe(true);
    // Now cached as online: the next beats change nothing and take the telemetry path.
    const next = batcher().groups;
    for (const p of ps.slice(0, 3)) expect((await heartbeat(srv, p.key)).status).toBe(200);
    expect(batcher().groups).toBe(next);
  });

  it("answers each beat of a group by its own provider's state: a pending or suspended provider in the group gets its 403", async () => {
    const [first, ok, pending, suspended] = await Promise.all([newProvider(srv), newProvider(srv), newProvider(srv, { approve: false }), newProvider(srv)]);
    expect((await api.post(`/api/admin/providers/${suspended.id}/suspend`, { reason: "abuse report" }, ADMIN)).status).toBe(200);
    const { answers } = await inOneGroup(first, [ok, pending, suspended]);
    expect(answers.map((a) => a.status)).toEqual([200, 200, 403, 403]);
    expect(answers[2].body.error).toMatch(/not approved \(approval_status: pending\)/);
    expect(answers[3].body.error).toMatch(/suspended: abuse report/);
    expect(answers.map((a) => a.statusAfter)).toEqual(["online", "online", "registered", "suspended"]);
  });

  it("one bad beat in a group fails alone", async () => {
    const [first, bad, ...good] = await Promise.all(Array.from({ length: 8 }, () => newProvider(srv)));
    await srv.sql.unsafe(`
      CREATE FUNCTION test_refuse_${bad.id}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'disk full'; END $$;
      CREATE TRIGGER test_refuse_${bad.id} BEFORE UPDATE ON providers FOR EACH ROW WHEN (NEW.id = ${bad.id}) EXECUTE FUNCTION test_refuse_${bad.id}();`);
    try {
      const { answers } = await inOneGroup(first, [good[0], good[1], bad, ...good.slice(2)]);
      const byStatus = answers.map((a) => a.status);
      expect(byStatus).toEqual([200, 200, 200, 500, 200, 200, 200, 200]);
      expect(answers[3].body).toEqual({ error: "heartbeat failed" });
      expect(answers[3].statusAfter).toBe("registered");
      for (const a of answers.filter((x) => x.status === 200)) expect(a.statusAfter).toBe("online");
    } finally {
      await srv.sql.unsafe(`DROP TRIGGER test_refuse_${bad.id} ON providers; DROP FUNCTION test_refuse_${bad.id}();`);
    }
    expect((await heartbeat(srv, bad.key)).status).toBe(200);
  });

  it.each([
    ["the first beat, then the suspension", "beat"],
    ["the suspension, then the first beat", "suspend"],
  ])("an admin suspension racing a first beat is ordered by the row lock: %s", async (_name, firstIn) => {
    const p = await newProvider(srv);
    let beat!: Promise<Answer>;
    let suspend!: Promise<{ status: number }>;
    await srv.sql.begin(async (tx) => {
      // Someone holds the row: the group skips it and the beat waits for the lock alone, as the suspension does.
      await tx`SELECT id FROM providers WHERE id = ${p.id} FOR NO KEY UPDATE`;
      const send = (what: string) =>
        what === "beat" ? (beat = beatAndRead(p)) : (suspend = api.post(`/api/admin/providers/${p.id}/suspend`, { reason: "chargeback" }, ADMIN));
      void send(firstIn);
      await vi.waitFor(async () => expect(await waitingForLocks(firstIn === "beat" ? STATE_WRITE : ADMIN_ROW_LOCK)).toBe(1), { timeout: 5000 });
      void send(firstIn === "beat" ? "suspend" : "beat");
      await vi.waitFor(async () => expect(await waitingForLocks(STATE_WRITE, ADMIN_ROW_LOCK)).toBe(2), { timeout: 5000 });
    });
    const [b, s] = await Promise.all([beat, suspend]);
    expect(s.status).toBe(200);
    if (firstIn === "beat") {
      expect(b.status).toBe(200);
    } else {
      expect(b.status).toBe(403);
      expect(b.body.error).toMatch(/suspended: chargeback/);
    }
    const [row] = await srv.sql<{ status: string; suspended_reason: string; last_heartbeat: Date | null }[]>`
      SELECT status, suspended_reason, last_heartbeat FROM providers WHERE id = ${p.id}`;
    expect(row.status).toBe("suspended");
    expect(row.suspended_reason).toBe("chargeback");
    // Heard from only when the beat went first.
    expect(row.last_heartbeat !== null).toBe(firstIn === "beat");
    // Nothing in the cache says it is online: the next beat is refused.
    const next = await heartbeat(srv, p.key);
    expect(next.status).toBe(403);
  });

  it("after the sweep took providers offline, each one's next beat is a state-changing write, answered once it is online", async () => {
    const ps = await Promise.all(Array.from({ length: 5 }, () => newProvider(srv)));
    for (const p of ps) expect((await heartbeat(srv, p.key)).status).toBe(200);
    for (const p of ps) await heardSecondsAgo(srv, p.id, 300);
    const { offline } = await sweepOnce(srv.app.deps);
    expect(offline).toEqual(expect.arrayContaining(ps.map((p) => p.id)));
    const cache = heartbeatPipeline(srv.app.deps).cache;
    // Known to have changed: no read first, straight to the state-changing write.
    for (const p of ps) expect(cache.changed(p.id)).toBe(true);
    const groups = batcher().groups;
    const answers = await Promise.all(ps.map(beatAndRead));
    expect(answers.map((a) => [a.status, a.statusAfter])).toEqual(ps.map(() => [200, "online"]));
    expect(batcher().groups).toBeGreaterThan(groups);
    for (const p of ps) expect(cache.get(p.id)?.status).toBe("online");
  });

  it("providers that came online in one group are each offered queued work before they are answered", async () => {
    await takeProvidersOffline(srv); // the providers of the tests before
    // A paused provider is supply that can come back, so submits queue.
    const paused = await newProvider(srv);
    expect((await heartbeat(srv, paused.key)).status).toBe(200);
    expect((await api.post("/api/providers/pause", { key: paused.key })).status).toBe(200);
    const renter = await makeRenter(srv, 100_000);
    const jobIds: string[] = [];
    for (let i = 0; i < 2; i++) {
      const r = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 1 }, renter.headers);
      expect(r.status).toBe(201);
      expect(r.body.job.status).toBe("queued");
      jobIds.push(r.body.job.job_id);
    }
    const [first, ...rest] = await Promise.all(Array.from({ length: 4 }, () => newProvider(srv)));
    const { answers, extras } = await inOneGroup(first, rest);
    expect(answers.map((a) => a.status)).toEqual([200, 200, 200, 200]);
    const jobs = await srv.sql<{ status: string; provider_id: number }[]>`
      SELECT status, provider_id FROM jobs WHERE job_id IN ${srv.sql(jobIds)}`;
    const fresh = new Set([first, ...rest, ...extras].map((p) => p.id));
    expect(jobs.map((j) => j.status)).toEqual(["pending", "pending"]);
    expect(jobs.every((j) => fresh.has(j.provider_id))).toBe(true);
    expect(new Set(jobs.map((j) => j.provider_id)).size).toBe(2);
  });

  it("a provider still marked online but not heard within the live window: its next beat is written before the answer, and it is offered queued work", async () => {
    await takeProvidersOffline(srv); // the providers of the tests before
    const silent = await newProvider(srv);
    expect((await heartbeat(srv, silent.key)).status).toBe(200);
    // A paused provider is supply that can come back, so the submit below queues.
    const paused = await newProvider(srv);
    expect((await heartbeat(srv, paused.key)).status).toBe(200);
    expect((await api.post("/api/providers/pause", { key: paused.key })).status).toBe(200);
    // Silent for five minutes, the sweep not there yet: still online, but not live.
    await heardSecondsAgo(srv, silent.id, 300);
    expect((await srv.sql`SELECT status FROM providers WHERE id = ${silent.id}`)[0].status).toBe("online");
    const renter = await makeRenter(srv, 100_000);
    const queued = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 1 }, renter.headers);
    expect(queued.status, queued.text).toBe(201);
    expect(queued.body.job.status).toBe("queued");
    // No process holds its state (as after the entry's time to live, or in another process).
    heartbeatPipeline(srv.app.deps).cache.clear();

    const groups = batcher().groups;
    expect((await heartbeat(srv, silent.key)).status).toBe(200);
    // Answered after its write: live for placement at once, and given the queued job.
    const [row] = await srv.sql<{ heard: boolean }[]>`SELECT last_heartbeat > now() - interval '5 seconds' AS heard FROM providers WHERE id = ${silent.id}`;
    expect(row.heard).toBe(true);
    expect(batcher().groups).toBe(groups + 1);
    const [job] = await srv.sql<{ status: string; provider_id: number }[]>`SELECT status, provider_id FROM jobs WHERE job_id = ${queued.body.job.job_id}`;
    expect(job).toEqual({ status: "pending", provider_id: silent.id });
    // Its next beat is an ordinary one again.
    expect((await heartbeat(srv, silent.key)).status).toBe(200);
    expect(batcher().groups).toBe(groups + 1);
  });
});
