// Why a queued job waits counts the live providers that fit it (at most
// 1,001). They are found through the index of providers that could be live
// (migration 037), so a fleet that is mostly offline is not read whole on
// every poll of a queued job: the answer is the same, the plan reads the index.
import { describe, expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { standingCountsSql } from "../../src/domain/dispatch/dispatch.js";
import { genericPlanOf } from "../helpers/plans.js";

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000" });

describe("the live providers behind a queued job's reason", () => {
  it("are counted through providers_live_idx among thousands that are offline", async () => {
    const api = client(srv.url);
    const renter = await makeRenter(srv, 100_000);
    const live = await makeProvider(srv, { gpuModel: "NVIDIA L4 live-index" });
    await srv.sql`
      INSERT INTO providers (name, email, gpu_model, os, status, approval_status, last_heartbeat)
      SELECT 'Offline ' || g, 'offline-' || g || '@example.test', 'NVIDIA L4 live-index', 'linux', 'offline', 'approved', now() - interval '2 days'
      FROM generate_series(1, 5000) g`;
    await srv.sql`ANALYZE providers`;
    const fits = { job_type: "benchmark", gpu_requirements: { gpu_model: "live-index" } };
    expect((await api.post("/api/jobs/submit", fits, renter.headers)).body.job.provider_id).toBe(live.id);
    const waiting = (await api.post("/api/jobs/submit", fits, renter.headers)).body.job;
    expect(waiting).toMatchObject({ status: "queued", queue_reason_code: "providers_busy" });
    expect((await api.get(`/api/jobs/${waiting.job_id}`, renter.headers)).body.queue_reason).toBe("the only matching provider is busy");

    // The statement's generic plan (a prepared statement's, parameters unknown) reads the index.
    const [{ id }] = await srv.sql<{ id: number }[]>`SELECT id FROM jobs WHERE job_id = ${waiting.job_id}`;
    expect(await genericPlanOf(srv.sql, standingCountsSql(srv.sql, id))).toContain("providers_live_idx");
  });
});
