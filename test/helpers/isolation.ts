// Test isolation for files whose tests share one server: takes every earlier
// provider out of the marketplace so the next test's job cannot go to a
// provider whose daemon is gone.
//
// Order matters. A heartbeat the server received just before a daemon was
// killed may still sit in the telemetry batch (src/domain/heartbeat.ts); its
// write would bring the provider back online with a fresh last_heartbeat
// (correctly: it was heard from then). So: wait until no daemon stream is
// still being handled here, write the batch, and only then go offline.
import { providersChanged } from "../../src/domain/invalidation.js";
import { heartbeatPipeline } from "../../src/domain/heartbeat.js";
import { jobSignalHub } from "../../src/workers/job-signals.js";
import type { TestServer } from "./server.js";

export async function takeProvidersOffline(srv: TestServer): Promise<void> {
  const { deps } = srv.app;
  const hub = jobSignalHub(deps.sql, deps.log);
  const until = Date.now() + 5_000;
  while (hub.subscribers > 0 && Date.now() < until) await new Promise((r) => setTimeout(r, 20));
  await heartbeatPipeline(deps).flush();
  await srv.sql.begin(async (tx) => {
    const rows = await tx<{ id: number }[]>`
      UPDATE providers SET status = 'offline', last_heartbeat = NULL WHERE status <> 'offline' OR last_heartbeat IS NOT NULL RETURNING id`;
    await providersChanged(deps.sql, tx, rows.map((r) => r.id));
  });
}
