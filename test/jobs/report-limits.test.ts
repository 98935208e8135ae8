// What one provider can store: at most MAX_LOG_LINES_PER_ATTEMPT log lines and
// MAX_LOG_CHARS_PER_ATTEMPT characters per job attempt (past either, lines are
// dropped, one notice line says so), no logs
// once the attempt ended more than 5 minutes ago (409), and at most 600
// daemon events per provider per hour (429 with Retry-After). Both wires.
import { describe, expect, it } from "vitest";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import postgres from "postgres";
import { appendLogs, LOG_TRUNCATED_NOTICE, MAX_LOG_CHARS_PER_ATTEMPT, MAX_LOG_LINE_CHARS, MAX_LOG_LINES_PER_ATTEMPT } from "../../src/domain/jobs/job-reports.js";
import { MAX_EVENTS_PER_HOUR } from "../../src/domain/providers/daemon-events.js";
import { MAX_LOG_LINES_READ } from "../../src/domain/jobs/jobs.js";
import { openStream, useStreamServer } from "../daemon/grpc-stream.js";

const { srv, streams } = useStreamServer();
const api = client(srv);

/** A job assigned to a fresh provider and picked up by its legacy poll (running). */
async function runningJob() {
  const renter = await makeRenter(srv, 10_000);
  const provider = await makeProvider(srv);
  const sub = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 1, params: { suite: "quick", iterations: 1 } }, renter.headers);
  expect(sub.status, sub.text).toBe(201);
  const jobId: string = sub.body.job.job_id;
  expect((await api.get(`/api/providers/${provider.key}/jobs`)).body.job.job_id).toBe(jobId);
  const [{ id }] = await srv.sql<{ id: number }[]>`SELECT id FROM jobs WHERE job_id = ${jobId}`;
  return { renter, provider, jobId, id };
}

/** Stores `n` log lines for the job's attempt 1 directly (fast setup). */
async function fill(id: number, n: number) {
  await srv.sql`INSERT INTO job_logs (job_id, attempt, level, message) SELECT ${id}, 1, 'info', 'filler ' || g FROM generate_series(1, ${n}) g`;
}

const storedLines = async (id: number) => (await srv.sql<{ n: number }[]>`SELECT count(*)::int AS n FROM job_logs WHERE job_id = ${id} AND attempt = 1`)[0].n;

describe("log lines per job attempt", () => {
  it("uses the read cap as the one limit", () => {
    expect(MAX_LOG_LINES_PER_ATTEMPT).toBe(MAX_LOG_LINES_READ);
    expect(MAX_LOG_LINES_PER_ATTEMPT).toBe(10_000);
  });

  it("keeps lines up to the cap in 1,000-line calls, then drops the rest and stores one notice; a read shows it last", async () => {
    const { renter, provider, jobId, id } = await runningJob();
    const batch = (from: number) => Array.from({ length: 1000 }, (_, i) => `line ${from + i}`);
    for (let b = 0; b < 9; b++) {
      const r = await api.post(`/api/jobs/${jobId}/logs`, { api_key: provider.key, logs: batch(b * 1000) });
      expect(r.status).toBe(200);
      expect(r.body).toMatchObject({ success: true, count: 1000, dropped: 0 });
    }
    // 9,000 stored; 999 more fit (one line is kept for the notice).
    const tenth = await api.post(`/api/jobs/${jobId}/logs`, { api_key: provider.key, logs: batch(9000) });
    expect(tenth.status).toBe(200);
    expect(tenth.body).toMatchObject({ success: true, count: 999, dropped: 1 });
    const eleventh = await api.post(`/api/jobs/${jobId}/logs`, { api_key: provider.key, logs: ["more", "and more"] });
    expect(eleventh.status).toBe(200);
    expect(eleventh.body).toMatchObject({ success: true, count: 0, dropped: 2 });
    expect(await storedLines(id)).toBe(MAX_LOG_LINES_PER_ATTEMPT);
    const notices = await srv.sql`SELECT level FROM job_logs WHERE job_id = ${id} AND message = ${LOG_TRUNCATED_NOTICE}`;
    expect(notices.map((n) => n.level)).toEqual(["warning"]);

    const read = await api.get(`/api/jobs/${jobId}/logs`, renter.headers);
    expect(read.body.logs).toHaveLength(MAX_LOG_LINES_PER_ATTEMPT);
    expect(read.body.logs.at(-2).message).toBe("line 9998");
    expect(read.body.logs.at(-1)).toMatchObject({ level: "warning", message: LOG_TRUNCATED_NOTICE });
    expect(LOG_TRUNCATED_NOTICE).toMatch(/10,000 lines/);
  });

  it("keeps at most MAX_LOG_CHARS_PER_ATTEMPT characters of messages: a read of the log is bounded in bytes, not only in lines", async () => {
    const { renter, provider, jobId } = await runningJob();
    const long = (i: number) => `${String(i).padStart(6, "0")} ${"x".repeat(MAX_LOG_LINE_CHARS - 7)}`;
    const perCall = 50; // 800 KB a call, under the route's 1 MiB body limit
    const fits = Math.floor(MAX_LOG_CHARS_PER_ATTEMPT / MAX_LOG_LINE_CHARS); // 256 lines
    let kept = 0;
    let dropped = 0;
    for (let from = 0; from < 400; from += perCall) {
      const r = await api.post(`/api/jobs/${jobId}/logs`, { api_key: provider.key, logs: Array.from({ length: perCall }, (_, i) => long(from + i)) });
      expect(r.status, r.text).toBe(200);
      kept += r.body.count;
      dropped += r.body.dropped;
    }
    expect(kept).toBe(fits);
    expect(dropped).toBe(400 - fits);
    // Once truncated, a short line is dropped too: the log does not go on after its notice.
    expect((await api.post(`/api/jobs/${jobId}/logs`, { api_key: provider.key, logs: ["short"] })).body).toMatchObject({ count: 0, dropped: 1 });
    const read = await api.get(`/api/jobs/${jobId}/logs`, renter.headers);
    expect(read.body.logs).toHaveLength(fits + 1);
    expect(read.body.logs.at(-1)).toMatchObject({ level: "warning", message: LOG_TRUNCATED_NOTICE });
    expect(read.text.length).toBeLessThan(MAX_LOG_CHARS_PER_ATTEMPT + 100_000);
    expect(LOG_TRUNCATED_NOTICE).toMatch(/4,194,304 characters/);
  });

  it("a call that straddles the cap keeps what fits; the notice is written once", async () => {
    const { provider, jobId, id } = await runningJob();
    await fill(id, MAX_LOG_LINES_PER_ATTEMPT - 10);
    const r = await api.post(`/api/jobs/${jobId}/logs`, { api_key: provider.key, logs: Array.from({ length: 25 }, (_, i) => `x${i}`) });
    expect(r.status).toBe(200);
    expect(r.body.count).toBe(9);
    for (let i = 0; i < 3; i++) expect((await api.post(`/api/jobs/${jobId}/logs`, { api_key: provider.key, logs: ["late"] })).body.count).toBe(0);
    expect(await storedLines(id)).toBe(MAX_LOG_LINES_PER_ATTEMPT);
    const tail = await srv.sql<{ message: string }[]>`SELECT message FROM job_logs WHERE job_id = ${id} ORDER BY id DESC LIMIT 2`;
    expect(tail.map((t) => t.message)).toEqual([LOG_TRUNCATED_NOTICE, "x8"]);
    // An empty call is still fine.
    expect((await api.post(`/api/jobs/${jobId}/logs`, { api_key: provider.key, logs: [] })).body.count).toBe(0);
  });

  it("concurrent calls never store more than the cap", async () => {
    const { provider, jobId, id } = await runningJob();
    await fill(id, MAX_LOG_LINES_PER_ATTEMPT - 500);
    const replies = await Promise.all(
      Array.from({ length: 8 }, (_, c) => api.post(`/api/jobs/${jobId}/logs`, { api_key: provider.key, logs: Array.from({ length: 100 }, (_, i) => `c${c}-${i}`) })),
    );
    expect(replies.map((r) => `${r.status} ${r.status === 200 ? "" : r.text}`.trim())).toEqual(replies.map(() => "200"));
    expect(replies.reduce((a, r) => a + r.body.count, 0)).toBe(499);
    expect(await storedLines(id)).toBe(MAX_LOG_LINES_PER_ATTEMPT);
  });

  it("takes logs up to 5 minutes after the attempt ended (the daemon's last flush), then 409", async () => {
    const { provider, jobId, id } = await runningJob();
    const res = await api.post("/api/providers/job-result", { api_key: provider.key, job_id: jobId, success: true, result: { ok: true } });
    expect(res.status).toBe(200);
    const flush = await api.post(`/api/jobs/${jobId}/logs`, { api_key: provider.key, logs: ["last line after the result"] });
    expect(flush.status).toBe(200);
    expect(flush.body.count).toBe(1);
    await srv.sql`UPDATE job_attempts SET ended_at = now() - interval '4 minutes' WHERE job_id = ${id}`;
    expect((await api.post(`/api/jobs/${jobId}/logs`, { api_key: provider.key, logs: ["still in the grace window"] })).status).toBe(200);
    await srv.sql`UPDATE job_attempts SET ended_at = now() - interval '6 minutes' WHERE job_id = ${id}`;
    const late = await api.post(`/api/jobs/${jobId}/logs`, { api_key: provider.key, logs: ["too late"] });
    expect(late.status).toBe(409);
    expect(late.body.error).toMatch(/ended more than 5 minutes ago/);
    expect(await storedLines(id)).toBe(2);
    // Who asks still matters first: another provider is 403, an unknown job 404.
    const other = await makeProvider(srv, { online: false });
    expect((await api.post(`/api/jobs/${jobId}/logs`, { api_key: other.key, logs: ["x"] })).status).toBe(403);
    expect((await api.post(`/api/jobs/job-nope/logs`, { api_key: provider.key, logs: ["x"] })).status).toBe(404);
  });

  it("the stream: lines past the cap are dropped without an error; logs of a long-ended attempt get a non-fatal error", async () => {
    const { provider, jobId, id } = await runningJob();
    const s = openStream(srv.port, provider.key);
    streams.push(s);
    s.send({ case: "hello", value: { daemonVersion: "5.0.0", runningJobIds: [jobId] } });
    await s.next("welcome");
    await fill(id, MAX_LOG_LINES_PER_ATTEMPT - 2);
    const line = (v: string) => ({ kind: { case: "stringValue", value: v } });
    s.send({ case: "logs", value: { jobId, logs: [line("a"), line("b"), line("c")] as never } });
    s.send({ case: "heartbeat", value: {} });
    await s.next("heartbeatAck");
    expect(await storedLines(id)).toBe(MAX_LOG_LINES_PER_ATTEMPT);
    expect(s.received.some((m) => m.kind.case === "error")).toBe(false);

    await srv.sql`UPDATE jobs SET status = 'failed', updated_at = now() WHERE id = ${id}`;
    await srv.sql`UPDATE job_attempts SET status = 'failed', ended_at = now() - interval '10 minutes' WHERE job_id = ${id}`;
    s.send({ case: "logs", value: { jobId, logs: [line("late")] as never } });
    const err = await s.next("error");
    expect(err).toMatchObject({ code: "already_exists", jobId });
    expect(err.message).toMatch(/ended more than 5 minutes ago/);
    // The stream stays open.
    s.send({ case: "heartbeat", value: {} });
    await s.next("heartbeatAck");
    s.end();
  });
});

describe("an append beside the end of its attempt", () => {
  it("waits for the end instead of deadlocking with it (the job row, then the attempt row, as every ending path locks them)", async () => {
    const { provider, jobId, id } = await runningJob();
    // A first batch confirms the pickup: later appends lock no job row before their lines.
    expect((await api.post(`/api/jobs/${jobId}/logs`, { api_key: provider.key, logs: ["first"] })).status).toBe(200);
    // Plain connections (bigint ids as numbers, as the service reads them): the service's pool retries a
    // deadlock, which would hide it behind a 1 s stall.
    const bigintAsNumber = { to: 20, from: [20], serialize: (x: number) => String(x), parse: (x: string) => Number(x) };
    const raw = postgres(srv.databaseUrl, { max: 3, onnotice: () => {}, types: { bigint: bigintAsNumber } as never });
    const ender = await raw.reserve();
    try {
      await ender`BEGIN`;
      await ender`SELECT id FROM jobs WHERE id = ${id} FOR UPDATE`;
      const append = appendLogs(raw as never, provider.id, { jobId, logs: ["second"] }).then(() => "appended", (e) => `append failed: ${e.code ?? e.message}`);
      await new Promise((r) => setTimeout(r, 300));
      const ended = await ender`UPDATE job_attempts SET ended_at = now() WHERE job_id = ${id} AND attempt = 1`.then(() => "ended", (e) => `end failed: ${e.code ?? e.message}`);
      await ender`ROLLBACK`;
      expect([ended, await append]).toEqual(["ended", "appended"]);
    } finally {
      ender.release();
      await raw.end();
    }
  });
});

describe("daemon events per provider per hour", () => {
  const eventsOf = async (providerId: number) =>
    (await srv.sql<{ n: number }[]>`SELECT count(*)::int AS n FROM daemon_events WHERE provider_id = ${providerId}`)[0].n;
  /** Stores `n` events `minutesAgo` old directly (fast setup). */
  const seed = (providerId: number, n: number, minutesAgo: number) => srv.sql`
    INSERT INTO daemon_events (provider_id, event_type, severity, created_at)
    SELECT ${providerId}, 'seeded', 'info', now() - make_interval(mins => ${minutesAgo}) FROM generate_series(1, ${n})`;

  it("the 601st event of the hour is 429 with Retry-After on the JSON route; older events do not count", async () => {
    const p = await makeProvider(srv);
    await seed(p.id, 1000, 90); // more than an hour old
    await seed(p.id, MAX_EVENTS_PER_HOUR - 1, 20);
    const last = await api.post("/api/providers/daemon-event", { api_key: p.key, event_type: "job_started" });
    expect(last.status).toBe(200);
    const over = await api.post("/api/providers/daemon-event", { api_key: p.key, event_type: "job_started", severity: "critical" });
    expect(over.status).toBe(429);
    expect(over.body.error).toMatch(/at most 600 daemon events per provider per hour/);
    const retry = Number(over.headers.get("retry-after"));
    // The oldest of the hour's 600 is 20 minutes old: room again in about 40 minutes.
    expect(retry).toBeGreaterThan(39 * 60);
    expect(retry).toBeLessThanOrEqual(40 * 60 + 1);
    expect(await eventsOf(p.id)).toBe(1000 + MAX_EVENTS_PER_HOUR);
    // Another provider is not affected.
    const q = await makeProvider(srv);
    expect((await api.post("/api/providers/daemon-event", { api_key: q.key, event_type: "job_started" })).status).toBe(200);
    // Once the hour moves on, events are taken again.
    await srv.sql`UPDATE daemon_events SET created_at = created_at - interval '41 minutes' WHERE provider_id = ${p.id}`;
    expect((await api.post("/api/providers/daemon-event", { api_key: p.key, event_type: "job_started" })).status).toBe(200);
  });

  it("concurrent events never pass the limit", async () => {
    const p = await makeProvider(srv);
    await seed(p.id, MAX_EVENTS_PER_HOUR - 5, 1);
    const replies = await Promise.all(Array.from({ length: 20 }, () => api.post("/api/providers/daemon-event", { api_key: p.key, event_type: "burst" })));
    expect(replies.filter((r) => r.status === 200)).toHaveLength(5);
    expect(replies.filter((r) => r.status === 429)).toHaveLength(15);
    expect(await eventsOf(p.id)).toBe(MAX_EVENTS_PER_HOUR);
  });

  it("the stream: an event past the limit gets a resource_exhausted error and the stream stays open", async () => {
    const p = await makeProvider(srv);
    await seed(p.id, MAX_EVENTS_PER_HOUR, 30);
    const s = openStream(srv.port, p.key);
    streams.push(s);
    s.send({ case: "hello", value: { daemonVersion: "5.0.0" } });
    await s.next("welcome");
    s.send({ case: "event", value: { eventType: "daemon_started" } });
    const err = await s.next("error");
    expect(err.code).toBe("resource_exhausted");
    expect(err.message).toMatch(/at most 600 daemon events .* retry after \d+ s/);
    s.send({ case: "heartbeat", value: {} });
    await s.next("heartbeatAck");
    expect(await eventsOf(p.id)).toBe(MAX_EVENTS_PER_HOUR);
    s.end();
  });
});
