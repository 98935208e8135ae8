// Isolation for job tests that share one server: before each test every
// earlier provider goes offline and every unfinished job is cancelled through
// the API (so the books stay balanced), leaving an empty marketplace.
import type { TestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { takeProvidersOffline } from "../helpers/isolation.js";

export async function clearMarketplace(srv: TestServer): Promise<void> {
  await takeProvidersOffline(srv);
  const api = client(srv.url);
  const active = await srv.sql<{ job_id: string }[]>`SELECT job_id FROM jobs WHERE status IN ('queued', 'pending', 'running')`;
  for (const j of active) {
    const r = await api.post(`/api/jobs/${j.job_id}/cancel`, { reason: "test isolation" }, { "x-admin-token": srv.config.adminToken });
    if (r.status !== 200 && r.status !== 409) throw new Error(`cancel ${j.job_id}: ${r.status} ${r.text}`);
  }
}

export const admin = (srv: TestServer) => ({ "x-admin-token": srv.config.adminToken });
