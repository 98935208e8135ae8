// An Idempotency-Key is honoured for KEY_KEPT_HOURS after its first request and no longer, whether or not
// the retention sweep has deleted its row yet: a key past its window is taken as one never seen (its old
// row replaced in the request's own transaction), on every path that takes a key, also when requests with
// it race. The sweep is off here, so every old row is still in the table.
import { describe, expect, it } from "vitest";
import { PaymentTopupResponseSchema } from "../../gen/svc/v1/payments_pb.js";
import { claimKey, KEY_KEPT_HOURS } from "../../src/domain/money/idempotency.js";
import { ServiceError } from "../../src/errors.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { useTestServer } from "../helpers/server.js";

const srv = useTestServer({ SVC_RETENTION_SWEEP_SECONDS: "0" });
const api = client(srv);

/** Moves a key's first request `hours` into the past. */
async function age(scope: string, key: string, hours: number) {
  const r = await srv.sql`UPDATE idempotency_keys SET created_at = now() - make_interval(hours => ${hours}) WHERE scope = ${scope} AND key = ${key}`;
  expect(r.count, `${scope} ${key}`).toBe(1);
}
const rowsOf = (scope: string, key: string) =>
  srv.sql<{ request_hash: string; fresh: boolean }[]>`
    SELECT request_hash, created_at > now() - interval '1 hour' AS fresh FROM idempotency_keys WHERE scope = ${scope} AND key = ${key}`;

describe("an Idempotency-Key past its window, not yet swept", () => {
  it("tops up again (same body or another), while a key inside the window still replays and refuses another body", async () => {
    const r = await makeRenter(srv);
    const scope = `renter-topup:${r.id}`;
    const topup = (key: string, amount: number) => api.post("/api/renters/topup", { amount_halala: amount }, { ...r.headers, "idempotency-key": key });
    const balance = async () => Number((await api.get("/api/renters/balance", r.headers)).body.balance_halala);
    for (const key of ["old", "other-body"]) expect((await topup(key, 1000)).status).toBe(200);
    const recent = await topup("recent", 1000);
    expect(recent.status).toBe(200);
    await age(scope, "old", KEY_KEPT_HOURS + 1);
    await age(scope, "other-body", KEY_KEPT_HOURS + 1);
    await age(scope, "recent", KEY_KEPT_HOURS - 1);
    const before = await balance();

    // Inside the window: the first answer again, nothing credited; another body is a 409.
    const replay = await topup("recent", 1000);
    expect(replay.status).toBe(200);
    expect(replay.body).toEqual(recent.body);
    expect((await topup("recent", 2000)).status).toBe(409);
    expect(await balance()).toBe(before);

    // Past it: a new request, as after the sweep.
    const again = await topup("old", 1000);
    expect(again.status).toBe(200);
    expect(Number(again.body.new_balance_halala)).toBe(before + 1000);
    const other = await topup("other-body", 2000);
    expect(other.status, other.text).toBe(200);
    expect(await balance()).toBe(before + 3000);
    // The old rows were replaced: the keys' windows start over, and now replay the new answers.
    for (const key of ["old", "other-body"]) expect((await rowsOf(scope, key)).map((k) => k.fresh)).toEqual([true]);
    expect(Number((await topup("old", 1000)).body.new_balance_halala)).toBe(before + 1000);
    expect((await topup("other-body", 1000)).status).toBe(409);
    expect(await balance()).toBe(before + 3000);
  });

  it("submits a new job", async () => {
    const [r, p] = await Promise.all([makeRenter(srv, 10_000), makeProvider(srv)]);
    const scope = `jobs.submit:renter:${r.id}`;
    const body = { job_type: "benchmark", duration_minutes: 1, provider_id: p.id, params: { suite: "quick", iterations: 1 } };
    const submit = () => api.post("/api/jobs/submit", body, { ...r.headers, "idempotency-key": "job-1" });
    const first = await submit();
    expect(first.status, first.text).toBe(201);
    const replay = await submit();
    expect(replay.body.job.job_id).toBe(first.body.job.job_id);
    await age(scope, "job-1", KEY_KEPT_HOURS + 1);
    const second = await submit();
    expect(second.status, second.text).toBe(201);
    expect(second.body.job.job_id).not.toBe(first.body.job.job_id);
    const jobs = await srv.sql`SELECT job_id FROM jobs WHERE renter_id = ${r.id}`;
    expect(jobs).toHaveLength(2);
  });

  it("takes concurrent requests with the key as one new request: one credit, every answer the same", async () => {
    const r = await makeRenter(srv);
    const scope = `renter-topup:${r.id}`;
    const topup = () => api.post("/api/renters/topup", { amount_halala: 500 }, { ...r.headers, "idempotency-key": "race" });
    expect((await topup()).status).toBe(200);
    await age(scope, "race", KEY_KEPT_HOURS + 3);
    const answers = await Promise.all(Array.from({ length: 8 }, topup));
    for (const a of answers) expect(a.status, a.text).toBe(200);
    expect(new Set(answers.map((a) => String(a.body.new_balance_halala)))).toEqual(new Set(["1000"]));
    expect(Number((await api.get("/api/renters/balance", r.headers)).body.balance_halala)).toBe(1000);
    expect(await rowsOf(scope, "race")).toHaveLength(1);
  });

  it("is claimed anew for a card top-up (claimKey), once among concurrent claims; a claim still in flight past the window is still in progress", async () => {
    const scope = `window-claims-${Date.now()}`;
    const request = { amount_halala: 5000 };
    const answer = { success: true, checkoutUrl: "https://checkout.example.test/old" };
    await srv.sql`
      INSERT INTO idempotency_keys (scope, key, request_hash, response, created_at)
      VALUES (${scope}, 'done', 'h', ${srv.sql.json(answer)}, now() - make_interval(hours => ${KEY_KEPT_HOURS + 1})),
             (${scope}, 'dead', 'h', NULL, now() - make_interval(hours => ${KEY_KEPT_HOURS + 1}))`;
    const claim = (key: string) => claimKey(srv.sql, PaymentTopupResponseSchema, scope, key, request);
    // A claim taken over lately (its first request long ago) whose request is still in flight.
    expect((await claim("in-flight")).replay).toBeUndefined();
    await age(scope, "in-flight", KEY_KEPT_HOURS + 1);

    // Answered long ago, with another body even: not a replay, not a 409, but a claim of its own.
    const results = await Promise.allSettled(Array.from({ length: 6 }, () => claim("done")));
    const claimed = results.filter((x) => x.status === "fulfilled" && x.value.replay === undefined && x.value.claim);
    expect(claimed, JSON.stringify(results)).toHaveLength(1);
    for (const x of results) {
      if (x === claimed[0]) continue;
      // The others see the new claim in flight.
      expect(x.status).toBe("rejected");
      expect((x as PromiseRejectedResult).reason).toBeInstanceOf(ServiceError);
      expect(((x as PromiseRejectedResult).reason as ServiceError).status).toBe(409);
      expect(((x as PromiseRejectedResult).reason as Error).message).toMatch(/still in progress/);
    }
    const [row] = await srv.sql<{ response: unknown; live: boolean; fresh: boolean }[]>`
      SELECT response, claimed_until > now() AS live, created_at > now() - interval '1 hour' AS fresh
      FROM idempotency_keys WHERE scope = ${scope} AND key = 'done'`;
    expect(row).toEqual({ response: null, live: true, fresh: true });

    // A claim whose process died long ago, with another body: claimed anew too.
    const dead = await claim("dead");
    expect(dead.replay).toBeUndefined();
    expect(dead.replay === undefined && dead.claim).toBeTruthy();

    // A request still in flight keeps its key (as the sweep keeps its row) until it has answered.
    await expect(claim("in-flight")).rejects.toThrow(/still in progress/);
  });
});
