// Reliability's per-day counts of ended attempts (migration 034): they must
// agree with the attempts they summarise however those are written, and the
// score must read the last 30 UTC days of them, not the attempts.
import { describe, expect, it } from "vitest";
import { freshDatabase, useTestServer } from "../helpers/server.js";
import { connect } from "../../src/db/index.js";
import { migrate } from "../../src/db/migrate.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { refreshReputation, reliabilityScore, SUCCESS_WINDOW_DAYS } from "../../src/domain/providers/reputation.js";

const srv = useTestServer();

let seq = 0;
/** A job row for attempts written by hand: already ended, so the server's queue sweep never assigns it. */
async function newJob(renterId: number): Promise<number> {
  const [j] = await srv.sql<{ id: number }[]>`
    INSERT INTO jobs (job_id, renter_id, job_type, status, duration_minutes, max_duration_seconds, rate_halala_per_minute, cost_halala)
    VALUES (${`job-days-${process.pid}-${++seq}`}, ${renterId}, 'training', 'completed', 1, 600, 25, 25) RETURNING id`;
  return j.id;
}

/** The per-day rows of a provider, as the trigger kept them. */
const fromCounter = (providerId: number, db = srv.sql) =>
  db<{ day: string; carried: number; faults: number }[]>`
    SELECT to_char(day, 'YYYY-MM-DD') AS day, carried, faults FROM provider_attempt_days
    WHERE provider_id = ${providerId} AND (carried > 0 OR faults > 0) ORDER BY day`;

/** The same figures counted from the attempts (carried: charged a minute or more, by a renter of another email, migration 048). */
const fromAttempts = (providerId: number, db = srv.sql) =>
  db<{ day: string; carried: number; faults: number }[]>`
    WITH a AS (
      SELECT (a.ended_at AT TIME ZONE 'UTC')::date AS day, a.fault = 'provider' AS fault,
             (a.fault = 'none' OR (a.fault = 'renter' AND a.started_at IS NOT NULL))
               AND a.cost_halala >= j.rate_halala_per_minute AND lower(r.email) <> lower(p.email) AS carried
      FROM job_attempts a JOIN jobs j ON j.id = a.job_id JOIN renters r ON r.id = j.renter_id JOIN providers p ON p.id = a.provider_id
      WHERE a.provider_id = ${providerId} AND a.fault IS NOT NULL AND a.ended_at IS NOT NULL)
    SELECT to_char(day, 'YYYY-MM-DD') AS day, count(*) FILTER (WHERE carried)::int AS carried, count(*) FILTER (WHERE fault)::int AS faults
    FROM a GROUP BY 1 HAVING count(*) FILTER (WHERE carried OR fault) > 0 ORDER BY 1`;

describe("provider attempt days", () => {
  it("follow every way an attempt ends, moves between days, changes its fault or is deleted", async () => {
    const r = await makeRenter(srv);
    const p = await makeProvider(srv);
    const jobs = await Promise.all(Array.from({ length: 6 }, () => newJob(r.id)));
    const attempt = (i: number, fault: string | null, endedDaysAgo: number | null, started = true) => srv.sql`
      INSERT INTO job_attempts (job_id, attempt, provider_id, status, assigned_at, started_at, ended_at, fault, cost_halala)
      VALUES (${jobs[i]}, 1, ${p.id}, ${fault ? "completed" : "running"}, now(), ${started ? srv.sql`now()` : null},
              ${endedDaysAgo === null ? null : srv.sql`now() - make_interval(days => ${endedDaysAgo})`}, ${fault}, 25)`;
    await attempt(0, "none", 0); // written ended: carried today
    await attempt(1, "provider", 3); // a fault three days ago
    await attempt(2, "renter", 1); // the renter's fault after it ran: carried
    await attempt(3, "renter", 1, false); // the renter's fault before it ran: neither
    await attempt(4, "platform", 0); // the platform's fault: neither
    await attempt(5, null, null); // still running
    expect(await fromCounter(p.id)).toEqual(await fromAttempts(p.id));
    expect((await fromCounter(p.id)).map((d) => [d.carried, d.faults])).toEqual([[0, 1], [1, 0], [1, 0]]);

    // The running one ends as the settlement writes it, then is re-dated, re-attributed, started late, deleted.
    await srv.sql`UPDATE job_attempts SET status = 'failed', ended_at = now(), fault = 'provider' WHERE job_id = ${jobs[5]}`;
    expect(await fromCounter(p.id)).toEqual(await fromAttempts(p.id));
    await srv.sql`UPDATE job_attempts SET ended_at = now() - interval '2 days' WHERE job_id = ${jobs[0]}`;
    await srv.sql`UPDATE job_attempts SET fault = 'none' WHERE job_id = ${jobs[1]}`;
    await srv.sql`UPDATE job_attempts SET started_at = now() WHERE job_id = ${jobs[3]}`;
    await srv.sql`UPDATE job_attempts SET fault = 'platform' WHERE job_id = ${jobs[2]}`;
    expect(await fromCounter(p.id)).toEqual(await fromAttempts(p.id));
    // Its charge corrected below a minute of its rate, then back.
    await srv.sql`UPDATE job_attempts SET cost_halala = 1 WHERE job_id = ${jobs[1]}`;
    expect((await fromCounter(p.id)).map((d) => [d.carried, d.faults])).toEqual([[1, 0], [1, 0], [0, 1]]);
    expect(await fromCounter(p.id)).toEqual(await fromAttempts(p.id));
    await srv.sql`UPDATE job_attempts SET cost_halala = 25 WHERE job_id = ${jobs[1]}`;
    expect(await fromCounter(p.id)).toEqual(await fromAttempts(p.id));
    const other = await makeProvider(srv);
    await srv.sql`UPDATE job_attempts SET provider_id = ${other.id} WHERE job_id = ${jobs[4]} OR job_id = ${jobs[5]}`;
    await srv.sql`DELETE FROM job_attempts WHERE job_id = ${jobs[0]}`;
    expect(await fromCounter(p.id)).toEqual(await fromAttempts(p.id));
    expect(await fromCounter(other.id)).toEqual(await fromAttempts(other.id));
    expect((await fromCounter(other.id)).map((d) => [d.carried, d.faults])).toEqual([[0, 1]]);
  });

  it("count every end when many attempts of one provider end at once", async () => {
    const r = await makeRenter(srv);
    const p = await makeProvider(srv);
    const jobs = await Promise.all(Array.from({ length: 24 }, () => newJob(r.id)));
    for (const id of jobs) {
      await srv.sql`INSERT INTO job_attempts (job_id, attempt, provider_id, status, assigned_at, started_at) VALUES (${id}, 1, ${p.id}, 'running', now(), now())`;
    }
    // Each end in its own transaction, as settlement and re-queue write them, all at once on one day's row.
    const pool = connect(srv.databaseUrl, 12);
    try {
      await Promise.all(
        jobs.map((id, i) =>
          pool.begin(async (tx) => {
            await tx`SELECT pg_sleep(0.01)`;
            await tx`UPDATE job_attempts SET status = 'completed', ended_at = now(), fault = ${i % 3 === 0 ? "provider" : "none"}, cost_halala = 25 WHERE job_id = ${id}`;
          }),
        ),
      );
    } finally {
      await pool.end();
    }
    expect(await fromCounter(p.id)).toEqual(await fromAttempts(p.id));
    expect((await fromCounter(p.id)).reduce((n, d) => [n[0] + d.carried, n[1] + d.faults], [0, 0])).toEqual([16, 8]);
  });

  it("the score counts the last 30 UTC days of them", async () => {
    const r = await makeRenter(srv);
    const p = await makeProvider(srv);
    await srv.sql`UPDATE providers SET first_heartbeat_at = now() - interval '60 days', last_heartbeat = now() WHERE id = ${p.id}`;
    const ended = async (fault: string, at: string) => {
      const id = await newJob(r.id);
      await srv.sql`
        INSERT INTO job_attempts (job_id, attempt, provider_id, status, assigned_at, started_at, ended_at, fault, cost_halala)
        VALUES (${id}, 1, ${p.id}, 'failed', ${at}::timestamptz - interval '1 hour', ${at}::timestamptz - interval '1 hour', ${at}::timestamptz, ${fault}, 25)`;
    };
    const [{ today }] = await srv.sql<{ today: string }[]>`SELECT to_char((now() AT TIME ZONE 'UTC')::date, 'YYYY-MM-DD') AS today`;
    const dayStart = (daysAgo: number) => `${new Date(Date.parse(today + "T00:00:00Z") - daysAgo * 86_400_000).toISOString()}`;
    await ended("none", dayStart(0));
    await ended("none", dayStart(SUCCESS_WINDOW_DAYS - 1)); // the window's first day: counts
    await ended("provider", dayStart(SUCCESS_WINDOW_DAYS - 1));
    await ended("provider", new Date(Date.parse(dayStart(SUCCESS_WINDOW_DAYS - 1)) - 1000).toISOString()); // a second before it: does not
    await ended("provider", dayStart(SUCCESS_WINDOW_DAYS + 10));
    await refreshReputation(srv.sql, [p.id]);
    const [row] = await srv.sql<{ reliability_score: number; uptime_percent: number }[]>`
      SELECT reliability_score, uptime_percent FROM providers WHERE id = ${p.id}`;
    expect(Number(row.reliability_score)).toBe(
      reliabilityScore({ completedJobs: 2, failedJobs: 1, uptimePercent: Number(row.uptime_percent), ageDays: 60 }),
    );
  });

  it("count the attempts that ended before the migration", async () => {
    const db = await freshDatabase();
    const pool = connect(db.url, 2);
    try {
      await migrate(pool, { through: 33 });
      const [{ id: renter }] = await pool<{ id: number }[]>`INSERT INTO renters (name, email) VALUES ('Old', 'old@example.com') RETURNING id`;
      const [{ id: provider }] = await pool<{ id: number }[]>`
        INSERT INTO providers (name, email, gpu_model, os) VALUES ('Old rig', 'rig@example.com', 'RTX 4090', 'linux') RETURNING id`;
      for (const [i, fault, daysAgo] of [[1, "none", 0], [2, "none", 0], [3, "provider", 0], [4, "none", 45], [5, null, null]] as const) {
        const [{ id }] = await pool<{ id: number }[]>`
          INSERT INTO jobs (job_id, renter_id, job_type, status, duration_minutes, max_duration_seconds, rate_halala_per_minute, cost_halala)
          VALUES (${`job-old-${i}`}, ${renter}, 'training', 'completed', 1, 600, 25, 25) RETURNING id`;
        await pool`
          INSERT INTO job_attempts (job_id, attempt, provider_id, status, assigned_at, started_at, ended_at, fault, cost_halala)
          VALUES (${id}, 1, ${provider}, 'completed', now(), now(),
                  ${daysAgo === null ? null : pool`now() - make_interval(days => ${daysAgo})`}, ${fault}, 25)`;
      }
      expect(await migrate(pool)).toEqual(expect.arrayContaining([34]));
      expect(await fromCounter(provider, pool)).toEqual(await fromAttempts(provider, pool));
      expect((await fromCounter(provider, pool)).map((d) => [d.carried, d.faults])).toEqual([[1, 0], [2, 1]]);
    } finally {
      await pool.end();
      await db.drop();
    }
  });
});
