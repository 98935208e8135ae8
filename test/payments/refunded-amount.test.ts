// A payment's refunds are part of what its reads answer: a partial refund leaves the payment
// `refunded` while most of it is still the renter's, so the history, the payment's own read and
// the operator's list say how much the gateway gave back (`refunded_halala`), the figure the
// ledger's refunds and the renter's refund debt add up to.
import crypto from "node:crypto";
import { describe, expect, it } from "vitest";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { client } from "../helpers/http.js";
import { paidTopup } from "../helpers/payments.js";
import { ADMIN_TOKEN, useTestServer } from "../helpers/server.js";

const SECRET = "whsec_refunded_amount_0123456789";
const srv = useTestServer({ PAYMENT_GATEWAY_WEBHOOK_SECRET: SECRET, SVC_JOB_SWEEP_MS: "60000" });
const api = client(srv);
const ADMIN = { "x-admin-token": ADMIN_TOKEN };

/** The gateway's signed event of a payment of `amount` whose refunds now total `refunded` (or a void). */
async function gatewayEvent(paymentId: string, type: "payment_refunded" | "payment_voided", amount: number, refunded?: number) {
  const raw = JSON.stringify({
    id: `evt_${crypto.randomUUID()}`,
    type,
    data: { id: `gw_${paymentId}`, amount, currency: "SAR", ...(refunded === undefined ? {} : { refunded }), metadata: { payment_id: paymentId } },
  });
  const sig = crypto.createHmac("sha256", SECRET).update(raw).digest("hex");
  const r = await api.call("POST", "/api/payments/webhook", raw, { "content-type": "application/json", "x-gateway-signature": sig });
  expect(r.status, r.text).toBe(200);
  return r.body;
}

type Renter = Awaited<ReturnType<typeof makeRenter>>;
const history = async (r: Renter) => {
  const h = await api.get("/api/payments/history", r.headers);
  expect(h.status, h.text).toBe(200);
  return new Map<string, any>(h.body.payments.map((p: any) => [p.payment_id, p]));
};
/** What the ledger took back for a payment (its own refund entries). */
const ledgerRefunds = async (paymentId: string) =>
  Number((await srv.sql`SELECT coalesce(sum(amount), 0)::bigint AS n FROM ledger_transfers WHERE kind = 'refund' AND payment_id = ${paymentId}`)[0].n);

describe("refunded_halala on a payment", () => {
  it("says how much of a partly refunded payment went back, in the history, the payment's read and the operator's list", async () => {
    const r = await makeRenter(srv);
    const kept = await paidTopup(api, r.headers, 2_000);
    const pay = await paidTopup(api, r.headers, 5_000);
    expect(await gatewayEvent(pay, "payment_refunded", 5_000, 1_000)).toMatchObject({ outcome: "refunded" });

    let h = await history(r);
    expect(h.get(pay)).toMatchObject({ status: "refunded", amount_halala: 5_000, refunded_halala: 1_000 });
    // A payment nothing was refunded of answers the documented fields only.
    expect(h.get(kept)).not.toHaveProperty("refunded_halala");
    expect((await api.get(`/api/payments/${pay}`, r.headers)).body).toMatchObject({ status: "refunded", refunded_halala: 1_000 });
    const admin = await api.get(`/api/admin/payments?renter_id=${r.id}`, ADMIN);
    expect(admin.status, admin.text).toBe(200);
    expect(admin.body.payments.find((p: any) => p.payment_id === pay)).toMatchObject({ refunded_halala: 1_000 });

    // The gateway's running total grows: the figure follows it, and what the renter keeps is the rest.
    await gatewayEvent(pay, "payment_refunded", 5_000, 3_000);
    h = await history(r);
    expect(h.get(pay).refunded_halala).toBe(3_000);
    const balance = (await api.get("/api/renters/balance", r.headers)).body;
    const paidIn = [...h.values()].reduce((n, p) => n + p.amount_halala - (p.refunded_halala ?? 0), 0);
    expect(balance.balance_halala).toBe(paidIn);
    expect(await ledgerRefunds(pay)).toBe(3_000);

    // A void gives back the rest.
    await gatewayEvent(pay, "payment_voided", 5_000);
    expect((await history(r)).get(pay).refunded_halala).toBe(5_000);
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("counts a refund of money the renter had held for a job: taken at once in part, the rest owed", async () => {
    await makeProvider(srv);
    const r = await makeRenter(srv);
    const pay = await paidTopup(api, r.headers, 5_000);
    const job = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 300, max_duration_seconds: 18_000 }, r.headers);
    expect(job.status, job.text).toBe(201); // 3,000 held
    await gatewayEvent(pay, "payment_refunded", 5_000, 5_000);
    expect((await history(r)).get(pay)).toMatchObject({ status: "refunded", refunded_halala: 5_000 });
    expect(await ledgerRefunds(pay)).toBe(2_000);
    expect((await api.get("/api/renters/balance", r.headers)).body).toMatchObject({ held_halala: 3_000, available_halala: 0, refund_owed_halala: 3_000 });
  });
});
