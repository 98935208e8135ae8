// A /v1 request's reservation whose process died between reserving and
// settling (nothing charges or releases it): it stops counting at its
// expires_at, for the spend checks, the renter's usage and, once the job sweep
// has passed, the row itself, released once and never charged.
import { describe, expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import { reserveTokenBudget } from "../../src/domain/money/usage-billing.js";
import { reservedMany } from "../../src/domain/money/promised.js";
import { sweepJobs } from "../../src/workers/job-timeouts.js";

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0" });
const api = client(srv);

describe("a /v1 reservation whose process died before it settled", () => {
  it("stops counting at its expiry for the spend checks and the renter's usage, and the job sweep releases it once", async () => {
    const renter = await makeRenter(srv, 1_000);
    await makeProvider(srv);
    const requestId = `req-died-${renter.id}`;
    // What the route does before it proxies (router.ts), with a TTL of its own in place of
    // SVC_V1_MAX_REQUEST_SECONDS + 60; then nothing settles or releases it.
    const r = await srv.sql.begin((tx) =>
      reserveTokenBudget(tx, {
        requestId,
        renterId: renter.id,
        model: "m",
        stream: false,
        rate: { input: 1_000_000, output: 1_000_000 },
        promptTokens: 100,
        maxTokens: 100,
        choices: 1,
        ttlSeconds: 60,
      }),
    );
    expect(r.reserved).toBeGreaterThan(0);
    const bearer = { authorization: `Bearer ${renter.key}` };
    expect((await api.get("/v1/usage", bearer)).body).toMatchObject({ in_flight: 1, reserved_halala: r.reserved });
    // Its expiry passes (the database's clock decides, as every expiry rule reads now()).
    await srv.sql`UPDATE v1_usage SET expires_at = now() - interval '1 second' WHERE request_id = ${requestId}`;

    expect((await reservedMany(srv.sql, [renter.id])).get(renter.id)).toMatchObject({ v1: 0 });
    // A job may hold the money it had reserved...
    const submit = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 100 }, renter.headers);
    expect(submit.status, submit.text).toBe(201);
    // ...and the renter is not told a request is still in flight with it.
    const usage = await api.get("/v1/usage", bearer);
    expect(usage.status, usage.text).toBe(200);
    expect(usage.body).toMatchObject({ in_flight: 0, reserved_halala: 0 });

    expect((await sweepJobs(srv.sql)).reservationsReleased).toBe(1);
    const [row] = await srv.sql<{ state: string; cost_halala: number | null }[]>`SELECT state, cost_halala FROM v1_usage WHERE request_id = ${requestId}`;
    expect(row.state).toBe("released");
    expect((await sweepJobs(srv.sql)).reservationsReleased).toBe(0);
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });
});
