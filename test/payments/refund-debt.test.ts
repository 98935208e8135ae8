// A gateway refund (or chargeback) of a payment whose money the renter had
// already put into a job's hold takes back what is free at once; the rest is
// owed (renters.refund_owed_halala): no spend check counts it as the
// renter's, and it goes back to the gateway as the money comes free (a hold
// released or settled, a new payment credited). Without it, cancelling the
// job gave the renter the refunded money to spend a second time.
import crypto from "node:crypto";
import { describe, expect, it } from "vitest";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import { chargeTokenUsage, releaseTokenBudget, reserveTokenBudget } from "../../src/domain/money/usage-billing.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { client } from "../helpers/http.js";
import { gatewayRefund, paidTopup } from "../helpers/payments.js";
import { ADMIN_TOKEN, useTestServer } from "../helpers/server.js";

const SECRET = "whsec_refund_debt_0123456789";
const srv = useTestServer({ PAYMENT_GATEWAY_WEBHOOK_SECRET: SECRET, SVC_JOB_SWEEP_MS: "60000" });
const api = client(srv);
const ADMIN = { "x-admin-token": ADMIN_TOKEN };

type Renter = Awaited<ReturnType<typeof makeRenter>>;
const paid = (r: Renter, amount: number) => paidTopup(api, r.headers, amount);
const refunded = (paymentId: string, amount: number) => gatewayRefund(api, SECRET, paymentId, amount);
const owed = async (r: Renter) => Number((await srv.sql`SELECT refund_owed_halala FROM renters WHERE id = ${r.id}`)[0].refund_owed_halala);
const balance = async (r: Renter) => (await api.get("/api/renters/balance", r.headers)).body;
/** Benchmark jobs hold 10 halala a minute. */
const submit = (r: Renter, minutes: number) => api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: minutes, max_duration_seconds: minutes * 60 }, r.headers);

describe("a refund of money held for a job", () => {
  it("is owed, and taken back when the hold is released: cancelling the job gives the renter nothing to spend", async () => {
    await makeProvider(srv);
    const r = await makeRenter(srv);
    const pay = await paid(r, 5_000);
    const job = await submit(r, 500);
    expect(job.status, job.text).toBe(201);
    const ev = await refunded(pay, 5_000);
    expect(ev).toMatchObject({ outcome: "refunded" });
    expect(await owed(r)).toBe(5_000);
    expect(await balance(r)).toMatchObject({ held_halala: 5_000, available_halala: 0, refund_owed_halala: 5_000 });

    const c = await api.post(`/api/jobs/${job.body.job.job_id}/cancel`, {}, r.headers);
    expect(c.status, c.text).toBe(200);
    expect(await balance(r)).toMatchObject({ balance_halala: 0, held_halala: 0, available_halala: 0 });
    expect(await owed(r)).toBe(0);
    expect(await balance(r)).not.toHaveProperty("refund_owed_halala");
    // The payment's 5,000 went back to the gateway: the credit, and refunds of 5,000 in all.
    const moved = await srv.sql`SELECT kind, sum(amount)::int AS amount FROM ledger_transfers WHERE kind IN ('payment', 'refund') AND (payment_id = ${pay} OR idempotency_key LIKE ${`refund-debt:renter:${r.id}:%`}) GROUP BY kind ORDER BY kind`;
    expect(moved).toEqual([{ kind: "payment", amount: 5_000 }, { kind: "refund", amount: 5_000 }]);
    expect((await submit(r, 1)).status).toBe(402);
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("is paid first from the next payment, and what is still owed no submit can hold", async () => {
    await makeProvider(srv);
    const r = await makeRenter(srv);
    const first = await paid(r, 5_000);
    expect((await submit(r, 300)).status).toBe(201); // 3,000 held
    await refunded(first, 5_000); // 2,000 taken at once, 3,000 owed
    expect(await owed(r)).toBe(3_000);
    await paid(r, 2_000); // all of it pays the debt
    expect(await owed(r)).toBe(1_000);
    expect(await balance(r)).toMatchObject({ held_halala: 3_000, available_halala: 0 });

    // Free money beside a debt (as a /v1 request's unused reservation leaves it): the debt is not the renter's to hold.
    await srv.sql`UPDATE renters SET refund_owed_halala = 1500 WHERE id = ${r.id}`;
    await paid(r, 2_500); // 1,500 collected of it
    expect(await owed(r)).toBe(0);
    await srv.sql`UPDATE renters SET refund_owed_halala = 600 WHERE id = ${r.id}`;
    const refused = await submit(r, 50);
    expect(refused.status, refused.text).toBe(402);
    expect(refused.body.error).toMatch(/1000 halala is available, of which 600 is owed for refunded payments/);
    expect((await submit(r, 40)).status).toBe(201);
    await srv.sql`UPDATE renters SET refund_owed_halala = 0 WHERE id = ${r.id}`;
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });
});

describe("a refund of money a /v1 request reserved", () => {
  /** A request in flight reserving `cap` halala (1 halala a token). */
  const reserve = (r: Renter, requestId: string, cap: number) =>
    srv.sql.begin((tx) =>
      reserveTokenBudget(tx, { requestId, renterId: r.id, model: "m", stream: false, rate: { input: 1_000_000, output: 1_000_000 }, promptTokens: 10, maxTokens: cap - 10, choices: 1, ttlSeconds: 60 }),
    );
  /** What went back to the gateway for the renter's debt. */
  const collected = async (r: Renter) =>
    Number((await srv.sql`SELECT coalesce(sum(amount), 0)::int AS n FROM ledger_transfers WHERE idempotency_key LIKE ${`refund-debt:renter:${r.id}:%`}`)[0].n);

  it("is taken back when the request ends without a charge", async () => {
    const r = await makeRenter(srv);
    const pay = await paid(r, 5_000);
    const requestId = `rd-release-${r.id}`;
    await reserve(r, requestId, 2_000);
    await refunded(pay, 5_000); // 3,000 taken at once, 2,000 owed
    expect(await owed(r)).toBe(2_000);
    expect(await releaseTokenBudget(srv.sql, requestId)).toBe(true);
    expect(await owed(r)).toBe(0);
    expect(await collected(r)).toBe(2_000);
    expect(await balance(r)).toMatchObject({ balance_halala: 0, available_halala: 0 });
    expect(await balance(r)).not.toHaveProperty("refund_owed_halala");
    // Ended already: nothing moves again.
    expect(await releaseTokenBudget(srv.sql, requestId)).toBe(false);
    expect(await collected(r)).toBe(2_000);
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("is taken back once when two requests end at the same moment", async () => {
    const r = await makeRenter(srv);
    const pay = await paid(r, 5_000);
    await reserve(r, `rd-race-a-${r.id}`, 2_000);
    await reserve(r, `rd-race-b-${r.id}`, 2_000);
    await refunded(pay, 2_000); // 1,000 free taken at once, 1,000 owed
    expect(await owed(r)).toBe(1_000);
    // Another transaction holds the renter's available funds a moment (a settlement, a charge): both
    // releases then collect together.
    let unblock!: () => void;
    const held = new Promise<void>((res) => (unblock = res));
    let locked!: () => void;
    const isLocked = new Promise<void>((res) => (locked = res));
    const blocker = srv.sql.begin(async (tx) => {
      await tx`SELECT balance FROM ledger_accounts WHERE kind = 'renter_available' AND owner_id = ${r.id} FOR UPDATE`;
      locked();
      await held;
    });
    await isLocked;
    const both = Promise.allSettled([releaseTokenBudget(srv.sql, `rd-race-a-${r.id}`), releaseTokenBudget(srv.sql, `rd-race-b-${r.id}`)]);
    await new Promise((res) => setTimeout(res, 300));
    unblock();
    await blocker;
    expect((await both).map((o) => (o.status === "fulfilled" ? o.value : String(o.reason)))).toEqual([true, true]);
    expect(await owed(r)).toBe(0);
    expect(await collected(r)).toBe(1_000);
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("is taken back from what the request reserved and did not cost, once it is charged", async () => {
    const provider = await makeProvider(srv);
    const r = await makeRenter(srv);
    const pay = await paid(r, 5_000);
    const requestId = `rd-charge-${r.id}`;
    await reserve(r, requestId, 2_000);
    await refunded(pay, 5_000);
    const charge = await srv.sql.begin((tx) => chargeTokenUsage(tx, r.id, provider.id, requestId, 500_000_000n)); // 500 halala
    expect(charge).toMatchObject({ charged: 500, moved: true });
    // 1,500 of the 2,000 reserved were not spent: they pay the debt, 500 is still owed.
    expect(await collected(r)).toBe(1_500);
    expect(await owed(r)).toBe(500);
    expect(await balance(r)).toMatchObject({ balance_halala: 0, available_halala: 0, refund_owed_halala: 500 });
    // A repeat of the charge moves nothing, the debt included.
    await srv.sql.begin((tx) => chargeTokenUsage(tx, r.id, provider.id, requestId, 500_000_000n));
    expect(await collected(r)).toBe(1_500);
    await srv.sql`UPDATE renters SET refund_owed_halala = 0 WHERE id = ${r.id}`;
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("is paid first from an operator's credit, as from a top-up", async () => {
    const r = await makeRenter(srv);
    const pay = await paid(r, 5_000);
    const requestId = `rd-admin-${r.id}`;
    await reserve(r, requestId, 2_000);
    await refunded(pay, 5_000);
    // The request's 2,000 stay with it while it is in flight: nothing of the credit's is free of it.
    const credit = await api.post(`/api/admin/renters/${r.id}/adjust-balance`, { amount_halala: 1_200, reason: "goodwill" }, ADMIN);
    expect(credit.status, credit.text).toBe(200);
    expect(await collected(r)).toBe(1_200);
    expect(await owed(r)).toBe(800);
    expect(await balance(r)).toMatchObject({ available_halala: 2_000, refund_owed_halala: 800 });
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });
});

describe("a gateway event with a NUL escaped in it", () => {
  it("is credited and recorded without it, not refused: the gateway's retries would never credit it", async () => {
    const r = await makeRenter(srv);
    const t = await api.post("/api/payments/topup", { amount_halala: 900, source_type: "sandbox" }, r.headers);
    const id = t.body.payment.payment_id as string;
    const raw = JSON.stringify({ id: "evt-nul", type: "payment_paid", data: { amount: 900, currency: "SAR", message: "APPROVED\u0000", metadata: { payment_id: id } } });
    expect(raw).toContain("\\u0000");
    const sig = crypto.createHmac("sha256", SECRET).update(raw).digest("hex");
    const res = await api.call("POST", "/api/payments/webhook", raw, { "content-type": "application/json", "x-gateway-signature": sig });
    expect(res.status, res.text).toBe(200);
    expect(res.body.outcome).toBe("credited");
    expect((await balance(r)).available_halala).toBe(900);
    const [stored] = await srv.sql`SELECT payload FROM payment_events WHERE payment_id = ${id}`;
    expect(stored.payload.data).toMatchObject({ message: "APPROVED" });
  });
});
