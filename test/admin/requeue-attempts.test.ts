// An admin's re-queue spends none of the job's attempts (SVC_JOB_MAX_ATTEMPTS): it is the platform's
// decision, not the job failing on a provider, so the job still gets every attempt at being run,
// and the re-queued attempt stays in its history.
import { beforeEach, describe, expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { refusedToTheLimit } from "../helpers/attempt-limit.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { clearMarketplace } from "../helpers/isolation.js";
import { ADMIN } from "./helpers.js";

const srv = useTestServer({ SVC_JOB_MAX_ATTEMPTS: "3", SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0" });
const api = client(srv);
beforeEach(() => clearMarketplace(srv));

const jobRow = async (jobId: string) =>
  (await srv.sql<{ status: string; provider_id: number | null; attempt: number }[]>`
    SELECT status, provider_id, attempt FROM jobs WHERE job_id = ${jobId}`)[0];

describe("an admin's re-queue and the job's attempts", () => {
  it("a job re-queued by an admin is failed only by the last of SVC_JOB_MAX_ATTEMPTS provider refusals after it", async () => {
    const renter = await makeRenter(srv, 10_000);
    const first = await makeProvider(srv);
    const r = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 10 }, renter.headers);
    const jobId: string = r.body.job?.job_id;
    expect(await jobRow(jobId), r.text).toMatchObject({ status: "pending", provider_id: first.id, attempt: 1 });

    const rq = await api.post(`/api/admin/jobs/${jobId}/requeue`, { reason: "provider stuck" }, ADMIN);
    expect(rq.status, rq.text).toBe(200);
    // Not offered back to the provider it was taken off: it waits for another.
    expect(await jobRow(jobId)).toEqual({ status: "queued", provider_id: null, attempt: 2 });

    await refusedToTheLimit(srv, jobId, 2);

    // Every attempt is in the job's history, the admin's re-queue included.
    const history = await api.get(`/api/jobs/${jobId}/history`, renter.headers);
    expect(history.status, history.text).toBe(200);
    expect(history.body.attempts.map((a: { attempt: number; end_reason: string; fault: string }) => [a.attempt, a.end_reason, a.fault])).toEqual([
      [1, "admin_requeued", "platform"],
      [2, "provider_refused", "provider"],
      [3, "provider_refused", "provider"],
      [4, "provider_refused", "provider"],
    ]);
    const balance = (await api.get("/api/renters/balance", renter.headers)).body;
    expect(balance).toMatchObject({ balance_halala: 10_000, held_halala: 0, total_spent_halala: 0 });
  });
});
