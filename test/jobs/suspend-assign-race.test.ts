// An administrator's suspension racing an assignment to the same provider.
// Assignments lock the provider's provider_load row; the suspension closes that
// row (migration 056) before its re-queue looks for the provider's jobs. Either
// order ends with no job on the suspended provider: an assignment that held the
// row first commits before the re-queue, which then takes its job back; one
// that locks the row after the suspension sees it closed, although its
// statement read the provider's status before the suspension committed.
import { beforeEach, describe, expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import { dispatchForProvider } from "../../src/domain/dispatch/dispatch.js";
import { admin, clearMarketplace } from "./helpers.js";
import { loadRowHolder, waitingOn as waitingOnLock } from "../helpers/lock-races.js";

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0" });
const api = client(srv);
beforeEach(() => clearMarketplace(srv));
const holdLoadRow = loadRowHolder(() => srv.sql);

const waitingOn = (pattern: string, n = 1) => waitingOnLock(srv.sql, pattern, n);

/** A queued job waiting for `provider`, then the provider available again, and its load row held by another transaction. */
async function setUp() {
  const renter = await makeRenter(srv, 10_000);
  const provider = await makeProvider(srv);
  await srv.sql`UPDATE providers SET is_paused = true, status = 'paused' WHERE id = ${provider.id}`;
  const r = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 10 }, renter.headers);
  expect(r.body.job?.status, r.text).toBe("queued");
  await srv.sql`UPDATE providers SET is_paused = false, status = 'online', last_heartbeat = now() WHERE id = ${provider.id}`;
  return { provider, jobId: r.body.job.job_id as string, release: await holdLoadRow(provider.id) };
}

const suspend = (id: number) => api.post(`/api/admin/providers/${id}/suspend`, { reason: "fraud" }, admin(srv));

describe("a suspension racing an assignment", () => {
  it("the assignment first: the suspension waits for it and takes its job back", async () => {
    const { provider, jobId, release } = await setUp();
    const assigning = dispatchForProvider(srv.sql, provider.id);
    await waitingOn("%FOR UPDATE OF l%");
    const suspending = suspend(provider.id);
    await waitingOn("%UPDATE provider_load SET closed%");
    await release();
    expect((await assigning).map((a) => a.jobId)).toEqual([jobId]);
    expect((await suspending).status).toBe(200);
    expect((await srv.sql`SELECT status, provider_id FROM jobs WHERE job_id = ${jobId}`)[0]).toEqual({ status: "queued", provider_id: null });
    const polled = await api.get(`/api/providers/${provider.key}/jobs`);
    expect(polled.body.job ?? null).toBeNull();
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("the suspension first: an assignment that read the provider before it committed assigns nothing", async () => {
    const { provider, jobId, release } = await setUp();
    const suspending = suspend(provider.id);
    await waitingOn("%UPDATE provider_load SET closed%");
    // Its statement starts (and reads the provider as available) before the suspension commits.
    const assigning = dispatchForProvider(srv.sql, provider.id);
    await waitingOn("%FOR UPDATE OF l%");
    await release();
    expect((await suspending).status).toBe(200);
    expect(await assigning).toEqual([]);
    expect((await srv.sql`SELECT status, provider_id FROM jobs WHERE job_id = ${jobId}`)[0]).toEqual({ status: "queued", provider_id: null });
    // Unsuspended, it takes work again.
    expect((await api.post(`/api/admin/providers/${provider.id}/unsuspend`, {}, admin(srv))).status).toBe(200);
    await srv.sql`UPDATE providers SET status = 'online', last_heartbeat = now() WHERE id = ${provider.id}`;
    expect((await dispatchForProvider(srv.sql, provider.id)).map((a) => a.jobId)).toEqual([jobId]);
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });
});
