// A database whose TimeZone is not UTC (Asia/Kolkata, UTC+05:30: its hours start at :30 UTC)
// under a server process in America/Los_Angeles. Real server and PostgreSQL; the zone is set with
// ALTER DATABASE before the server connects, as on a host whose postgresql.conf names a local zone.
// The server's sessions run in UTC (src/db/index.ts), so what the database renders or truncates by
// the session's zone means UTC, and the rules that name UTC say so themselves as well.
// Put back once the file is done: the worker runs other files after it in this process.
const hostZone = process.env.TZ;
process.env.TZ = "America/Los_Angeles";
import postgres from "postgres";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { freshDatabase, startTestServer, type TestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeRenter } from "../helpers/fixtures.js";
import { connect, type Sql } from "../../src/db/index.js";
import { ADMIN, flushHeartbeats, heartbeat, newProvider } from "../providers/helpers.js";
import { msUntilNextUtcMonth } from "../../src/domain/money/quota.js";
import { daemonEventMessage, listDaemonEvents } from "../../src/domain/providers/daemon-events.js";
import { withinRunWindow } from "../../src/shared/run-window.js";

const ZONE = "Asia/Kolkata";
let srv: TestServer;
let drop: () => Promise<void>;
let url: string;
beforeAll(async () => {
  const db = await freshDatabase();
  drop = db.drop;
  url = db.url;
  const admin = connect(db.url, 1);
  await admin.unsafe(`ALTER DATABASE ${new URL(db.url).pathname.slice(1)} SET timezone TO '${ZONE}'`);
  await admin.end();
  srv = await startTestServer({ SVC_LIVENESS_SWEEP_SECONDS: "0" }, db.url);
});
afterAll(async () => {
  await srv?.close();
  await drop?.();
  if (hostZone === undefined) delete process.env.TZ;
  else process.env.TZ = hostZone;
});
const api = () => client(srv.url);
const hhmm = (d: Date) => d.toISOString().slice(11, 16);
/** A session as a plain client opens it: in the database's own zone. */
async function plainSession<T>(body: (sql: Sql) => Promise<T>): Promise<T> {
  const sql = postgres(url, { max: 1, onnotice: () => {} }) as unknown as Sql;
  try {
    return await body(sql);
  } finally {
    await sql.end();
  }
}

describe(`database TimeZone ${ZONE}, process TZ America/Los_Angeles`, () => {
  it("preconditions: a plain session runs in the database's zone, this process in Los Angeles", async () => {
    const tz = await plainSession(async (sql) => (await sql<{ tz: string }[]>`SELECT current_setting('TimeZone') AS tz`)[0].tz);
    expect(tz).toBe(ZONE);
    expect(new Date(2024, 0, 1).getTimezoneOffset()).toBe(480);
  });

  it("the server's sessions run in UTC, whatever the database's zone", async () => {
    for (const sql of [srv.app.deps.sql, srv.sql]) {
      const [{ tz }] = await sql<{ tz: string }[]>`SELECT current_setting('TimeZone') AS tz`;
      expect(tz).toBe("UTC");
    }
  });

  it("uptime coverage accumulates per UTC hour, not per Kolkata hour starting at :30 UTC", async () => {
    const p = await newProvider(srv);
    expect((await heartbeat(srv, p.key)).status).toBe(200);
    await flushHeartbeats(srv);
    const [row] = await srv.sql<{ uptime_hour: Date; last_heartbeat: Date }[]>`SELECT uptime_hour, last_heartbeat FROM providers WHERE id = ${p.id}`;
    const utcHour = new Date(Math.floor(row.last_heartbeat.getTime() / 3_600_000) * 3_600_000);
    expect(row.uptime_hour.toISOString()).toBe(utcHour.toISOString());
  });

  it("daemon events stored before timestamps were checked (year 1, 1850) read back as stored, in any session zone", async () => {
    const p = await newProvider(srv);
    const stored = ["0001-01-01T00:00:00.000Z", "1850-01-01T00:00:00.000Z", "2024-06-01T10:00:00.000Z"];
    for (const at of stored) {
      await srv.sql`INSERT INTO daemon_events (provider_id, event_type, severity, reported_at) VALUES (${p.id}, 'legacy', 'info', ${at}::timestamptz)`;
    }
    const list = await api().get(`/api/admin/providers/${p.id}/events`, ADMIN);
    expect(list.status, list.text).toBe(200);
    expect(list.body.events.map((e: { reported_at: string }) => e.reported_at)).toEqual([...stored].reverse());
    // Kolkata's zone before 1854 is local mean time (+05:53:28): read in such a session too.
    const read = await plainSession(async (sql) => (await listDaemonEvents(sql, p.id, { limit: 10, offset: 0 })).rows.map(daemonEventMessage));
    expect(read.map((e) => e.reportedAt)).toEqual([...stored].reverse());
  });

  it("sound: a scheduled window is read in UTC, one that wraps midnight included", async () => {
    const [{ now }] = await srv.sql<{ now: Date }[]>`SELECT now()`;
    const inside = await newProvider(srv);
    const outside = await newProvider(srv);
    for (const p of [inside, outside]) expect((await heartbeat(srv, p.key)).status).toBe(200);
    await flushHeartbeats(srv);
    // inside: [now - 1 h, now + 1 h) UTC (wraps midnight when now is near it); outside: [now + 2 h, now + 3 h).
    const at = (h: number) => hhmm(new Date(now.getTime() + h * 3_600_000));
    const set = (key: string, s: string, e: string) =>
      api().post("/api/providers/preferences", { key, run_mode: "scheduled", scheduled_start: s, scheduled_end: e });
    expect((await set(inside.key, at(-1), at(1))).status).toBe(200);
    expect((await set(outside.key, at(2), at(3))).status).toBe(200);
    expect(withinRunWindow("scheduled", at(-1), at(1), now)).toBe(true);
    const renter = await makeRenter(srv, 10_000);
    const inJob = await api().post("/api/jobs/submit", { job_type: "benchmark", provider_id: inside.id }, renter.headers);
    expect(inJob.body.job, inJob.text).toMatchObject({ status: "pending", provider_id: inside.id });
    const outJob = await api().post("/api/jobs/submit", { job_type: "benchmark", provider_id: outside.id }, renter.headers);
    expect(outJob.body.job?.status === "pending" && outJob.body.job?.provider_id === outside.id).toBe(false);
    // 22:00-06:00 wraps midnight; equal ends are refused (never a 24 h or empty window by accident).
    expect(withinRunWindow("scheduled", "22:00", "06:00", new Date("2024-02-29T23:59:59.999Z"))).toBe(true);
    expect(withinRunWindow("scheduled", "22:00", "06:00", new Date("2024-03-01T05:59:59Z"))).toBe(true);
    expect(withinRunWindow("scheduled", "22:00", "06:00", new Date("2024-03-01T06:00:00Z"))).toBe(false);
    const sqlWrap = await plainSession(
      async (sql) => (await sql<{ w: boolean }[]>`SELECT svc_within_run_window('scheduled', '22:00', '06:00', '2024-03-01T05:59:59Z'::timestamptz) AS w`)[0].w,
    );
    expect(sqlWrap).toBe(true);
    expect((await set(outside.key, "08:00", "08:00")).status).toBe(400);
  });

  it("sound: today's job count is kept and read by UTC day", async () => {
    const renter = await makeRenter(srv, 100_000);
    await srv.sql`UPDATE renter_quota SET daily_jobs_limit = 2 WHERE renter_id = ${renter.id}`;
    // A full yesterday (UTC) does not count today.
    await srv.sql`INSERT INTO renter_daily_jobs (renter_id, day, jobs) VALUES (${renter.id}, (now() AT TIME ZONE 'UTC')::date - 1, 99)`;
    for (let i = 0; i < 2; i++) expect((await api().post("/api/jobs/submit", { job_type: "benchmark" }, renter.headers)).status).toBeLessThan(300);
    const third = await api().post("/api/jobs/submit", { job_type: "benchmark" }, renter.headers);
    expect(third.status).toBe(429);
    const [{ day, utc }] = await srv.sql<{ day: string; utc: string }[]>`
      SELECT to_char(max(day), 'YYYY-MM-DD') AS day, to_char((now() AT TIME ZONE 'UTC')::date, 'YYYY-MM-DD') AS utc FROM renter_daily_jobs WHERE renter_id = ${renter.id}`;
    expect(day).toBe(utc);
  });

  it("sound: this month's spend is read by UTC month (last month's spend does not count)", async () => {
    const renter = await makeRenter(srv, 100_000);
    await srv.sql`UPDATE renter_quota SET monthly_spend_limit_halala = 1000 WHERE renter_id = ${renter.id}`;
    await srv.sql`INSERT INTO renter_monthly_spend (renter_id, month, spent_halala)
                  VALUES (${renter.id}, (date_trunc('month', now() AT TIME ZONE 'UTC') - interval '1 month')::date, 1000)`;
    expect((await api().post("/api/jobs/submit", { job_type: "benchmark" }, renter.headers)).status).toBeLessThan(300);
    await srv.sql`INSERT INTO renter_monthly_spend (renter_id, month, spent_halala)
                  VALUES (${renter.id}, date_trunc('month', now() AT TIME ZONE 'UTC')::date, 1000)`;
    expect((await api().post("/api/jobs/submit", { job_type: "benchmark" }, renter.headers)).status).toBe(429);
  });

  it("sound: API timestamps stay UTC ISO 8601 and timeout_at keeps its documented form", async () => {
    const renter = await makeRenter(srv, 20_000);
    const p = await newProvider(srv);
    expect((await heartbeat(srv, p.key)).status).toBe(200);
    await flushHeartbeats(srv);
    const r = await api().post("/api/jobs/submit", { job_type: "benchmark", provider_id: p.id, max_duration_seconds: 86_400, duration_minutes: 1440 }, renter.headers);
    expect(r.status, r.text).toBeLessThan(300);
    const job = r.body.job;
    expect(job.submitted_at).toMatch(/^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/);
    if (job.timeout_at !== null && job.timeout_at !== undefined) {
      expect(job.timeout_at).toMatch(/^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\.\d{3}$/);
      const [{ t }] = await srv.sql<{ t: Date }[]>`SELECT timeout_at AS t FROM jobs WHERE job_id = ${job.job_id}`;
      expect(job.timeout_at).toBe(t.toISOString().replace("T", " ").slice(0, 23));
      // max_duration_seconds 86400 runs a whole day past the assignment, across midnight.
      expect(t.getTime() - new Date(job.submitted_at).getTime()).toBeGreaterThanOrEqual(86_400_000 - 1000);
    }
    const st = await api().get(`/api/providers/status/${p.key}`);
    expect(st.body.last_heartbeat).toMatch(/Z$/);
  });

  it("sound: the month's end for Retry-After across a year change and a leap day", () => {
    expect(msUntilNextUtcMonth(new Date("2024-12-31T23:59:59.900Z"))).toBe(100);
    expect(msUntilNextUtcMonth(new Date("2024-02-29T23:59:59Z"))).toBe(1000);
    expect(msUntilNextUtcMonth(new Date("2024-02-28T23:59:59Z"))).toBe(86_401_000);
  });
});
