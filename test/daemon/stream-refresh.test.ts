// The read a daemon stream makes when a notice may have been missed (src/domain/jobs/stream-refresh.ts):
// reads asked for together share one read of their providers' settings and
// pending jobs, and each gets its own provider's answer.
import { beforeAll, describe, expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { clearMarketplace } from "../jobs/helpers.js";
import { StreamRefresher } from "../../src/domain/jobs/stream-refresh.js";

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000" });
beforeAll(() => clearMarketplace(srv));

describe("stream refresh", () => {
  it("answers beats that arrive together with one read, each with its own provider's settings and pending jobs in order", async () => {
    const api = client(srv.url);
    const busy = await makeProvider(srv);
    const idle = await makeProvider(srv);
    await srv.sql`UPDATE providers SET gpu_count = 2, approved_gpu_count = 2, temp_limit_c = 71 WHERE id = ${busy.id}`;
    await srv.sql`UPDATE providers SET is_paused = true, status = 'paused', gpu_usage_cap_pct = 40 WHERE id = ${idle.id}`;
    const renter = await makeRenter(srv, 1_000);
    const jobs: string[] = [];
    for (let i = 0; i < 2; i++) {
      const r = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 1, params: { suite: "quick" } }, renter.headers);
      expect(r.status, r.text).toBe(201);
      expect(r.body.job.provider_id).toBe(busy.id);
      jobs.push(r.body.job.job_id);
    }

    const refresher = new StreamRefresher(srv.sql);
    const missing = 2 ** 40;
    const [a, a2, b, gone] = await Promise.all([
      refresher.state(busy.id),
      refresher.state(busy.id),
      refresher.state(idle.id),
      refresher.state(missing),
    ]);
    expect(refresher.reads).toBe(1);
    expect(a).toEqual(a2);
    expect(a.pending).toEqual(jobs);
    expect(a.settings).toMatchObject({ id: busy.id, temp_limit_c: 71, is_paused: false, status: "online", approval_status: "approved" });
    expect(b.pending).toEqual([]);
    expect(b.settings).toMatchObject({ id: idle.id, is_paused: true, status: "paused", gpu_usage_cap_pct: 40 });
    expect(gone).toEqual({ settings: undefined, pending: [] });

    // A later read sees what changed since.
    await srv.sql`UPDATE providers SET temp_limit_c = 65 WHERE id = ${busy.id}`;
    const later = await refresher.state(busy.id);
    expect(refresher.reads).toBe(2);
    expect(later.settings?.temp_limit_c).toBe(65);
  });
});
