// Shared bits of the jobs tests.
import type { TestServer } from "../helpers/server.js";

export { clearMarketplace } from "../helpers/isolation.js";

export const admin = (srv: TestServer) => ({ "x-admin-token": srv.config.adminToken });

/**
 * A legacy daemon takes its next job: the poll, then its first report on the
 * job (progress 0), which confirms it got the poll's answer; a polled job the
 * daemon never reported on bills nothing (pickup.test.ts). The job, or null.
 */
export async function pickUp(api: { get: (p: string) => Promise<{ body: any }>; post: (p: string, b?: unknown) => Promise<unknown> }, providerKey: string) {
  const job = (await api.get(`/api/providers/${providerKey}/jobs`)).body.job as { job_id: string } | null;
  if (job) await api.post(`/api/jobs/${job.job_id}/progress`, { api_key: providerKey, progress_pct: 0, phase: "starting" });
  return job;
}
