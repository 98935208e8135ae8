// Uptime is a third of the reliability score placement prefers, so it is credited only to a
// provider that takes work (heartbeat-write.ts coverageSet): not to one whose daemon is below
// SVC_DAEMON_MIN_VERSION or pinned another task-signing key, which dispatch gives no jobs
// (versions.ts verifiesTasksSql), however often it beats.
import { describe, expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { flushHeartbeats, gpuStatus, heartbeat, newProvider } from "../providers/helpers.js";

const srv = useTestServer({ SVC_DAEMON_MIN_VERSION: "3.0.0", SVC_DAEMON_LATEST_VERSION: "3.2.0", SVC_LIVENESS_SWEEP_SECONDS: "0" });

const coveredSeconds = async (providerId: number) =>
  (await srv.sql<{ s: number }[]>`
    SELECT p.uptime_hour_seconds + coalesce((SELECT sum(covered_seconds) FROM provider_uptime WHERE provider_id = p.id), 0)::int AS s
    FROM providers p WHERE p.id = ${providerId}`)[0].s;

describe("uptime credit for a provider dispatch gives no work", () => {
  it("a daemon below the minimum version (given no jobs) earns no uptime", async () => {
    const p = await newProvider(srv);
    const old = { gpu_status: gpuStatus(24564, { daemon_version: "2.0.0" }) };
    expect((await heartbeat(srv, p.key, old)).status).toBe(200);
    await flushHeartbeats(srv);
    const before = await coveredSeconds(p.id);
    for (let i = 0; i < 3; i++) {
      await srv.sql`UPDATE providers SET last_heartbeat = now() - interval '30 seconds' WHERE id = ${p.id}`;
      expect((await heartbeat(srv, p.key, old)).status).toBe(200);
      await flushHeartbeats(srv);
    }
    const [row] = await srv.sql`SELECT daemon_version FROM providers WHERE id = ${p.id}`;
    expect(row.daemon_version).toBe("2.0.0");
    expect(await coveredSeconds(p.id)).toBe(before);
  });

  it("a provider kept out of dispatch for a task-key mismatch earns no uptime", async () => {
    const p = await newProvider(srv);
    expect((await heartbeat(srv, p.key)).status).toBe(200);
    await flushHeartbeats(srv);
    await srv.sql`UPDATE providers SET task_key_mismatch = 'daemon pinned another key' WHERE id = ${p.id}`;
    const before = await coveredSeconds(p.id);
    for (let i = 0; i < 3; i++) {
      await srv.sql`UPDATE providers SET last_heartbeat = now() - interval '30 seconds' WHERE id = ${p.id}`;
      expect((await heartbeat(srv, p.key)).status).toBe(200);
      await flushHeartbeats(srv);
    }
    expect(await coveredSeconds(p.id)).toBe(before);
  });
});
