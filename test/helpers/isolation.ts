// Test isolation for files whose tests share one server: takes every earlier
// provider out of the marketplace so the next test's job cannot go to a
// provider whose daemon is gone.
//
// Order matters. A heartbeat the server received just before a daemon was
// killed may still sit in the telemetry batch (src/domain/providers/heartbeat.ts); its
// write would bring the provider back online with a fresh last_heartbeat
// (correctly: it was heard from then). So: wait until no daemon stream is
// still being handled here, write the batch, and only then go offline.
import { providersChanged } from "../../src/domain/accounts/invalidation.js";
import { heartbeatPipeline } from "../../src/domain/providers/heartbeat.js";
import { jobSignalHub } from "../../src/workers/job-signals.js";
import { client } from "./http.js";
import type { TestServer } from "./server.js";

export async function takeProvidersOffline(srv: TestServer): Promise<void> {
  const { deps } = srv.app;
  const hub = jobSignalHub(deps.sql, deps.log);
  const until = Date.now() + 5_000;
  while (hub.subscribers > 0 && Date.now() < until) await new Promise((r) => setTimeout(r, 20));
  // A beat a killed daemon sent just before it died can still be on its way in (an HTTP request
  // being read, a stream message not yet handled) and bring its provider back online after the
  // update: go offline again until a pause passes with every provider still offline.
  for (let round = 0; round < 20; round++) {
    await heartbeatPipeline(deps).flush();
    const changed = await srv.sql.begin(async (tx) => {
      const rows = await tx<{ id: number }[]>`
        UPDATE providers SET status = 'offline', last_heartbeat = NULL WHERE status <> 'offline' OR last_heartbeat IS NOT NULL RETURNING id`;
      await providersChanged(deps.sql, tx, rows.map((r) => r.id));
      return rows.length;
    });
    if (changed === 0 && round > 0) return;
    await new Promise((r) => setTimeout(r, 150));
  }
  throw new Error("providers kept coming back online after their daemons were stopped");
}

/**
 * An empty marketplace: every earlier provider offline and every unfinished job
 * cancelled through the API (so the books stay balanced), so a job left queued
 * by one test cannot land on the next test's provider.
 */
export async function clearMarketplace(srv: TestServer): Promise<void> {
  await takeProvidersOffline(srv);
  await cancelUnfinishedJobs(srv);
}

/** Every unfinished job cancelled through the API (so the books stay balanced); the providers are left as they are. */
export async function cancelUnfinishedJobs(srv: TestServer): Promise<void> {
  const api = client(srv.url);
  const active = await srv.sql<{ job_id: string }[]>`SELECT job_id FROM jobs WHERE status IN ('queued', 'pending', 'running')`;
  for (const j of active) {
    const r = await api.post(`/api/jobs/${j.job_id}/cancel`, { reason: "test isolation" }, { "x-admin-token": srv.config.adminToken });
    if (r.status !== 200 && r.status !== 409) throw new Error(`cancel ${j.job_id}: ${r.status} ${r.text}`);
  }
}

