// Card payments over real HTTP: the gateway client against a local server
// that plays the gateway, the signed webhook (signature, replay, unknown ids,
// failed, refunded, voided), Idempotency-Key claims across the gateway call,
// history, and the sandbox source.
import crypto from "node:crypto";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { ledgerProblems, hold } from "../../src/domain/money/ledger.js";
import { startTestServer, useTestServer, type TestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeRenter } from "../helpers/fixtures.js";
import { releaseTokenBudget, reserveTokenBudget } from "../../src/domain/money/usage-billing.js";

const GATEWAY_KEY = "sk_test_gateway_0123456789";
const WEBHOOK_SECRET = "whsec_gateway_test_0123456789";
const FRONTEND = "https://app.example.test";

interface Seen {
  method: string;
  path: string;
  auth: string | undefined;
  body: any;
}

/** Plays the gateway: answers POST /v1/invoices according to `mode`. */
function fakeGateway() {
  const seen: Seen[] = [];
  let mode: "ok" | "unauthorized" | "error" | "garbage" | "wrong-amount" = "ok";
  let n = 0;
  let delayMs = 0;
  const server = http.createServer((req, res) => {
    let raw = "";
    req.on("data", (c) => (raw += c));
    req.on("end", async () => {
      if (delayMs) await new Promise((r) => setTimeout(r, delayMs));
      const body = raw ? JSON.parse(raw) : undefined;
      seen.push({ method: req.method!, path: req.url!, auth: req.headers.authorization, body });
      if (req.method !== "POST" || req.url !== "/v1/invoices") {
        res.writeHead(404).end();
        return;
      }
      if (mode === "unauthorized") {
        res.writeHead(401, { "content-type": "application/json" }).end(JSON.stringify({ type: "authentication_error", message: "Invalid authorization credentials" }));
        return;
      }
      if (mode === "error") {
        res.writeHead(422, { "content-type": "application/json" }).end(JSON.stringify({ type: "invalid_request_error", message: "Amount is invalid" }));
        return;
      }
      if (mode === "garbage") {
        res.writeHead(200, { "content-type": "text/html" }).end("<html>oops</html>");
        return;
      }
      const id = `inv_${++n}_${crypto.randomBytes(4).toString("hex")}`;
      res.writeHead(201, { "content-type": "application/json" }).end(
        JSON.stringify({
          id,
          status: "initiated",
          amount: mode === "wrong-amount" ? body.amount + 1 : body.amount,
          currency: body.currency,
          description: body.description,
          url: `https://checkout.gateway.test/invoices/${id}`,
          callback_url: body.callback_url,
          metadata: body.metadata,
        }),
      );
    });
  });
  return {
    seen,
    setMode: (m: typeof mode) => (mode = m),
    setDelay: (ms: number) => (delayMs = ms),
    async listen() {
      await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
      return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    },
    close: () => new Promise<void>((r) => server.close(() => r())),
  };
}

const sign = (raw: string, secret = WEBHOOK_SECRET) => crypto.createHmac("sha256", secret).update(raw).digest("hex");

let gw: ReturnType<typeof fakeGateway>;
let srv: TestServer;
let api: ReturnType<typeof client>;

beforeAll(async () => {
  gw = fakeGateway();
  const url = await gw.listen();
  srv = await startTestServer({
    PAYMENT_GATEWAY_SECRET_KEY: GATEWAY_KEY,
    PAYMENT_GATEWAY_WEBHOOK_SECRET: WEBHOOK_SECRET,
    PAYMENT_GATEWAY_URL: url,
    FRONTEND_URL: FRONTEND,
  });
  api = client(srv.url);
});
afterAll(async () => {
  await srv?.close();
  await gw?.close();
});
beforeEach(() => {
  gw.setMode("ok");
});

async function webhook(event: unknown, opts: { raw?: string; signature?: string | null } = {}) {
  const raw = opts.raw ?? JSON.stringify(event);
  const headers: Record<string, string> = { "content-type": "application/json" };
  if (opts.signature !== null) headers["x-gateway-signature"] = opts.signature ?? sign(raw);
  return api.call("POST", "/api/payments/webhook", raw, headers);
}

const paidEvent = (paymentId: string, amount: number, extra: Record<string, unknown> = {}) => ({
  id: `evt_${crypto.randomUUID()}`,
  type: "payment_paid",
  created_at: new Date().toISOString(),
  data: { id: `gwpay_${crypto.randomUUID()}`, status: "paid", amount, currency: "SAR", metadata: { payment_id: paymentId }, ...extra },
});

/** Invoices the gateway has made (POST /v1/invoices answered 201). */
const invoicesMade = () => gw.seen.filter((c) => c.method === "POST" && c.path === "/v1/invoices").length;

async function balance(headers: Record<string, string>) {
  return (await api.get("/api/renters/balance", headers)).body;
}

async function cardTopup(headers: Record<string, string>, amount_halala = 5000, source_type = "creditcard") {
  const r = await api.post("/api/payments/topup", { amount_halala, source_type }, headers);
  expect(r.status, r.text).toBe(201);
  return r.body;
}

describe("POST /api/payments/topup with the gateway", () => {
  it("creates an initiated payment and answers the gateway's checkout URL", async () => {
    const r = await makeRenter(srv);
    const before = gw.seen.length;
    const res = await api.post("/api/payments/topup", { amount_sar: 50, source_type: "mada", description: "Credits" }, r.headers);
    expect(res.status).toBe(201);
    expect(res.body.success).toBe(true);
    const p = res.body.payment;
    expect(p).toMatchObject({ amount_sar: 50, amount_halala: 5000, status: "initiated", source_type: "mada", description: "Credits", confirmed_at: null, renter_id: r.id });
    expect(p.payment_id).toMatch(/^pay_[0-9a-f]{24}$/);
    expect(new Date(p.created_at).toISOString()).toBe(p.created_at);
    expect(res.body.checkout_url).toMatch(/^https:\/\/checkout\.gateway\.test\/invoices\/inv_/);

    expect(gw.seen.length).toBe(before + 1);
    const call = gw.seen.at(-1)!;
    expect(call.method).toBe("POST");
    expect(call.path).toBe("/v1/invoices");
    expect(call.auth).toBe("Basic " + Buffer.from(`${GATEWAY_KEY}:`).toString("base64"));
    expect(call.body).toMatchObject({ amount: 5000, currency: "SAR", description: "Credits", metadata: { payment_id: p.payment_id, renter_id: String(r.id), source_type: "mada" } });
    expect(call.body.callback_url).toBe(`${FRONTEND}/payments/callback?payment_id=${p.payment_id}`);
    expect(call.body.back_url.startsWith(FRONTEND)).toBe(true);

    const got = await api.get(`/api/payments/${p.payment_id}`, r.headers);
    expect(got.status).toBe(200);
    expect(got.body).toMatchObject({ payment_id: p.payment_id, status: "initiated", checkout_url: res.body.checkout_url });
    expect((await balance(r.headers)).balance_halala).toBe(0);
  });

  it("gateway trouble is a 502 naming it, and leaves no payment behind", async () => {
    const r = await makeRenter(srv);
    for (const [mode, msg] of [
      ["unauthorized", /rejected our credentials/],
      ["error", /refused the invoice: Amount is invalid/],
      ["garbage", /without an invoice id/],
      ["wrong-amount", /invoice for 5001, not 5000/],
    ] as const) {
      gw.setMode(mode);
      const res = await api.post("/api/payments/topup", { amount_halala: 5000, source_type: "creditcard" }, r.headers);
      expect(res.status, mode).toBe(502);
      expect(res.body.error).toMatch(msg);
      expect(res.body.error).not.toContain(GATEWAY_KEY);
    }
    expect((await api.get("/api/payments/history", r.headers)).body.total).toBe(0);
  });

  it("400 for missing or unknown source_type, bad amounts, and card amounts under 1 SAR; 400/401 without or with a bad key", async () => {
    const r = await makeRenter(srv);
    const cases: [unknown, RegExp][] = [
      [{ amount_halala: 5000 }, /missing required fields: source_type/],
      [{ amount_halala: 5000, source_type: "bitcoin" }, /source_type must be one of creditcard, mada, applepay, sandbox/],
      [{ source_type: "creditcard" }, /exactly one of amount_halala or amount_sar/],
      [{ amount_halala: 100, amount_sar: 1, source_type: "creditcard" }, /exactly one/],
      [{ amount_halala: 99, source_type: "applepay" }, /amount_halala must be an integer between 100 and/],
      [{ amount_sar: 10.001, source_type: "creditcard" }, /at most two decimals/],
    ];
    for (const [body, msg] of cases) {
      const res = await api.post("/api/payments/topup", body, r.headers);
      expect(res.status, JSON.stringify(body)).toBe(400);
      expect(res.body.error).toMatch(msg);
    }
    expect((await api.post("/api/payments/topup", { amount_halala: 5000, source_type: "creditcard" })).status).toBe(400);
    expect((await api.post("/api/payments/topup", { amount_halala: 5000, source_type: "creditcard" }, { "x-renter-key": "svc-renter-bogus" })).status).toBe(401);
  });

  it("no database transaction stays open while the gateway makes its invoice", async () => {
    const r = await makeRenter(srv);
    gw.setDelay(800);
    try {
      const pending = api.post("/api/payments/topup", { amount_halala: 3000, source_type: "mada" }, r.headers);
      await new Promise((res) => setTimeout(res, 250)); // the gateway is still answering
      const [{ db }] = await srv.sql`SELECT current_database() AS db`;
      // A transaction idle across three looks 100 ms apart is one waiting on something outside the
      // database (background workers' transactions are idle only for an instant between statements).
      const idle = async () =>
        new Set(
          (await srv.sql<{ k: string }[]>`
            SELECT pid || '@' || xact_start AS k FROM pg_stat_activity
            WHERE datname = ${db} AND state LIKE 'idle in transaction%' AND pid <> pg_backend_pid()`).map((r) => r.k),
        );
      let held = await idle();
      for (let i = 0; i < 2; i++) {
        await new Promise((res) => setTimeout(res, 100));
        const now = await idle();
        held = new Set([...held].filter((k) => now.has(k)));
      }
      expect([...held]).toEqual([]);
      expect((await pending).status).toBe(201);
    } finally {
      gw.setDelay(0);
    }
  });

  it("Idempotency-Key: a retry gets the same payment and makes no second invoice; another body is 409", async () => {
    const r = await makeRenter(srv);
    const h = { ...r.headers, "idempotency-key": "checkout-1" };
    const first = await api.post("/api/payments/topup", { amount_halala: 2500, source_type: "creditcard" }, h);
    const calls = gw.seen.length;
    const again = await api.post("/api/payments/topup", { amount_halala: 2500, source_type: "creditcard" }, h);
    expect(again.status).toBe(201);
    expect(again.body).toEqual(first.body);
    expect(gw.seen.length).toBe(calls);
    const other = await api.post("/api/payments/topup", { amount_halala: 2600, source_type: "creditcard" }, h);
    expect(other.status).toBe(409);
    expect((await api.get("/api/payments/history", r.headers)).body.total).toBe(1);
  });

  it("Idempotency-Key: concurrent duplicates make one invoice; the other is a 409 'in progress; retry', and its retry replays", async () => {
    const r = await makeRenter(srv);
    const h = { ...r.headers, "idempotency-key": "checkout-concurrent" };
    const before = invoicesMade();
    gw.setDelay(600);
    try {
      const both = await Promise.all([
        api.post("/api/payments/topup", { amount_halala: 2500, source_type: "creditcard" }, h),
        api.post("/api/payments/topup", { amount_halala: 2500, source_type: "creditcard" }, h),
      ]);
      const won = both.find((x) => x.status === 201)!;
      const refused = both.find((x) => x.status !== 201)!;
      expect(both.map((x) => x.status).sort(), both.map((x) => x.text).join("\n")).toEqual([201, 409]);
      expect(refused.body.error).toMatch(/Idempotency-Key is still in progress; retry/);
      expect(refused.headers.get("retry-after")).toBe("1");
      // Each extra invoice would be a live checkout at the gateway for a payment id this server never stored.
      expect(invoicesMade() - before).toBe(1);
      const retried = await api.post("/api/payments/topup", { amount_halala: 2500, source_type: "creditcard" }, h);
      expect(retried.status).toBe(201);
      expect(retried.body).toEqual(won.body);
      expect(invoicesMade() - before).toBe(1);
      expect((await api.get("/api/payments/history", r.headers)).body.total).toBe(1);
    } finally {
      gw.setDelay(0);
    }
  });

  it("Idempotency-Key: a gateway failure releases the key, so a retry with it asks the gateway again", async () => {
    const r = await makeRenter(srv);
    const h = { ...r.headers, "idempotency-key": "checkout-gateway-down" };
    gw.setMode("error");
    const failed = await api.post("/api/payments/topup", { amount_halala: 2500, source_type: "creditcard" }, h);
    expect(failed.status).toBe(502);
    expect(await srv.sql`SELECT 1 FROM idempotency_keys WHERE scope = ${`payment-topup:${r.id}`} AND key = 'checkout-gateway-down'`).toHaveLength(0);
    gw.setMode("ok");
    const before = invoicesMade();
    const retried = await api.post("/api/payments/topup", { amount_halala: 2500, source_type: "creditcard" }, h);
    expect(retried.status, retried.text).toBe(201);
    expect(invoicesMade() - before).toBe(1);
    expect((await api.post("/api/payments/topup", { amount_halala: 2500, source_type: "creditcard" }, h)).body).toEqual(retried.body);
    expect((await api.get("/api/payments/history", r.headers)).body.total).toBe(1);
  });

  it("Idempotency-Key: the claim of a request that never answered expires, and a retry then takes the key over", async () => {
    const r = await makeRenter(srv);
    const h = { ...r.headers, "idempotency-key": "checkout-stuck" };
    const scope = `payment-topup:${r.id}`;
    const body = { amount_halala: 4000, source_type: "creditcard" };
    gw.setDelay(1500);
    try {
      // The first request is at the gateway: its claim is committed, with no answer yet.
      const first = api.post("/api/payments/topup", body, h);
      let claim: any;
      for (let i = 0; i < 50 && !claim; i++) {
        [claim] = await srv.sql`SELECT response, claimed_until > now() AS live FROM idempotency_keys WHERE scope = ${scope} AND key = 'checkout-stuck'`;
        if (!claim) await new Promise((res) => setTimeout(res, 20));
      }
      expect(claim).toEqual({ response: null, live: true });
      const dup = await api.post("/api/payments/topup", body, h);
      expect(dup.status).toBe(409);
      expect(dup.body.error).toMatch(/in progress; retry/);
      // As if the first request's process had died long ago: its claim has run out.
      await srv.sql`UPDATE idempotency_keys SET claimed_until = now() - interval '1 second' WHERE scope = ${scope} AND key = 'checkout-stuck'`;
      const takeover = await api.post("/api/payments/topup", body, h);
      expect(takeover.status, takeover.text).toBe(201);
      // The first request still finishes: its invoice is real, so its payment is recorded too (a paid event credits it).
      const late = await first;
      expect(late.status).toBe(201);
      expect(late.body.payment.payment_id).not.toBe(takeover.body.payment.payment_id);
      const replay = await api.post("/api/payments/topup", body, h);
      expect(replay.body).toEqual(takeover.body);
      expect((await api.get("/api/payments/history", r.headers)).body.total).toBe(2);
    } finally {
      gw.setDelay(0);
    }
  });
});

describe("POST /api/payments/webhook", () => {
  it("credits once per payment: replays and concurrent duplicates are no-ops", async () => {
    const r = await makeRenter(srv);
    const { payment } = await cardTopup(r.headers, 5000);
    const ev = paidEvent(payment.payment_id, 5000);
    const first = await webhook(ev);
    expect(first.status).toBe(200);
    expect(first.body).toEqual({ success: true, outcome: "credited", payment_id: payment.payment_id });
    const replay = await webhook(ev);
    expect(replay.body.outcome).toBe("duplicate");
    // A different event id for the same payment is still the same payment.
    const dupes = await Promise.all(Array.from({ length: 6 }, () => webhook(paidEvent(payment.payment_id, 5000))));
    for (const d of dupes) expect(d.body).toMatchObject({ success: true, outcome: "duplicate" });
    expect((await balance(r.headers)).balance_halala).toBe(5000);
    const got = (await api.get(`/api/payments/${payment.payment_id}`, r.headers)).body;
    expect(got.status).toBe("paid");
    expect(got.confirmed_at).toEqual(expect.any(String));
    expect(got).not.toHaveProperty("checkout_url");
  });

  it("concurrent first deliveries credit exactly once", async () => {
    const r = await makeRenter(srv);
    const { payment } = await cardTopup(r.headers, 3000);
    const all = await Promise.all(Array.from({ length: 8 }, () => webhook(paidEvent(payment.payment_id, 3000))));
    expect(all.map((a) => a.status)).toEqual(Array(8).fill(200));
    expect(all.filter((a) => a.body.outcome === "credited")).toHaveLength(1);
    expect((await balance(r.headers)).balance_halala).toBe(3000);
  });

  it("finds the payment by the gateway's invoice id too", async () => {
    const r = await makeRenter(srv);
    const res = await cardTopup(r.headers, 1200);
    const invoiceId = res.checkout_url.split("/").pop();
    const ev = { id: "evt_x", type: "payment_paid", data: { id: "gwpay_1", invoice_id: invoiceId, status: "paid", amount: 1200, currency: "SAR" } };
    expect((await webhook(ev)).body.outcome).toBe("credited");
    expect((await balance(r.headers)).balance_halala).toBe(1200);
  });

  it("401 for a missing, wrong or re-serialized signature; the HMAC covers the raw bytes", async () => {
    const r = await makeRenter(srv);
    const { payment } = await cardTopup(r.headers, 4000);
    const ev = paidEvent(payment.payment_id, 4000);
    const raw = JSON.stringify(ev, null, 3) + "\n"; // unusual formatting: the signature is over these bytes
    const missing = await webhook(ev, { raw, signature: null });
    expect(missing.status).toBe(401);
    expect(missing.body.error).toMatch(/missing x-gateway-signature/);
    const wrongSecret = await webhook(ev, { raw, signature: sign(raw, "another-secret") });
    expect(wrongSecret.status).toBe(401);
    expect(wrongSecret.body.error).toMatch(/invalid webhook signature/);
    expect((await webhook(ev, { raw, signature: sign(JSON.stringify(ev)) })).status).toBe(401);
    expect((await webhook(ev, { raw, signature: sign(raw).toUpperCase() })).status).toBe(401);
    expect((await webhook(ev, { raw, signature: "zz" })).status).toBe(401);
    const tampered = raw.replace('"amount": 4000', '"amount": 4001');
    expect((await webhook(ev, { raw: tampered, signature: sign(raw) })).status).toBe(401);
    expect((await balance(r.headers)).balance_halala).toBe(0);
    const ok = await webhook(ev, { raw, signature: sign(raw) });
    expect(ok.status).toBe(200);
    expect(ok.body.outcome).toBe("credited");
  });

  it("unknown payments and unhandled event types answer 200 and change nothing", async () => {
    const before = await srv.sql`SELECT count(*)::int AS n FROM ledger_transfers`;
    const unknown = await webhook(paidEvent("pay_000000000000000000000000", 5000));
    expect(unknown.status).toBe(200);
    expect(unknown.body).toEqual({ success: true, outcome: "ignored" });
    const noRefs = await webhook({ type: "payment_paid", data: {} });
    expect(noRefs.body.outcome).toBe("ignored");
    const r = await makeRenter(srv);
    const { payment } = await cardTopup(r.headers, 1000);
    const other = await webhook({ id: "e", type: "payment_authorized", data: { metadata: { payment_id: payment.payment_id } } });
    expect(other.body).toMatchObject({ outcome: "ignored", payment_id: payment.payment_id });
    const after = await srv.sql`SELECT count(*)::int AS n FROM ledger_transfers`;
    expect(after[0].n).toBe(before[0].n);
    expect((await api.get(`/api/payments/${payment.payment_id}`, r.headers)).body.status).toBe("initiated");
  });

  it("ignores a paid event whose amount or currency differs from the payment", async () => {
    const r = await makeRenter(srv);
    const { payment } = await cardTopup(r.headers, 5000);
    expect((await webhook(paidEvent(payment.payment_id, 500))).body.outcome).toBe("ignored");
    expect((await webhook(paidEvent(payment.payment_id, 5000, { currency: "USD" }))).body.outcome).toBe("ignored");
    expect((await balance(r.headers)).balance_halala).toBe(0);
    const [audit] = await srv.sql`SELECT details FROM audit_log WHERE action = 'payment.amount_mismatch' AND target_id = ${payment.payment_id}`;
    expect(audit.details).toEqual({ expected: 5000, reported: 500 });
  });

  it("failed marks the payment failed; a later paid still credits once", async () => {
    const r = await makeRenter(srv);
    const { payment } = await cardTopup(r.headers, 2000);
    const failed = await webhook({ id: "e1", type: "payment_failed", data: { status: "failed", amount: 2000, message: "Insufficient funds", metadata: { payment_id: payment.payment_id } } });
    expect(failed.body.outcome).toBe("failed");
    expect((await api.get(`/api/payments/${payment.payment_id}`, r.headers)).body.status).toBe("failed");
    expect((await webhook({ id: "e1", type: "payment_failed", data: { metadata: { payment_id: payment.payment_id } } })).body.outcome).toBe("duplicate");
    expect((await webhook(paidEvent(payment.payment_id, 2000))).body.outcome).toBe("credited");
    expect((await webhook({ id: "e2", type: "payment_failed", data: { metadata: { payment_id: payment.payment_id } } })).body.outcome).toBe("ignored");
    expect((await api.get(`/api/payments/${payment.payment_id}`, r.headers)).body.status).toBe("paid");
    expect((await balance(r.headers)).balance_halala).toBe(2000);
  });

  it("refunded debits through the ledger once; a refund of money already spent or held records the shortfall", async () => {
    const r = await makeRenter(srv);
    const { payment } = await cardTopup(r.headers, 5000);
    const refundEv = { id: "rf", type: "payment_refunded", data: { status: "refunded", amount: 5000, refunded: 5000, metadata: { payment_id: payment.payment_id } } };
    await webhook(paidEvent(payment.payment_id, 5000));
    expect((await webhook(refundEv)).body.outcome).toBe("refunded");
    expect((await webhook(refundEv)).body.outcome).toBe("duplicate");
    expect((await balance(r.headers)).balance_halala).toBe(0);
    expect((await api.get(`/api/payments/${payment.payment_id}`, r.headers)).body.status).toBe("refunded");

    // Spent (held by a job) before the refund arrives: only the available part comes back.
    const r2 = await makeRenter(srv);
    const p2 = (await cardTopup(r2.headers, 5000)).payment;
    await webhook(paidEvent(p2.payment_id, 5000));
    const [job] = await srv.sql`
      INSERT INTO jobs (job_id, renter_id, job_type, status, duration_minutes, max_duration_seconds, rate_halala_per_minute, cost_halala)
      VALUES (${"job-refund-" + r2.id}, ${r2.id}, 'training', 'queued', 120, 7200, 25, 3000) RETURNING id`;
    await srv.sql.begin((tx) => hold(tx, r2.id, job.id, 3000));
    const res = await webhook({ id: "rf2", type: "payment_refunded", data: { refunded: 5000, metadata: { payment_id: p2.payment_id } } });
    expect(res.body.outcome).toBe("refunded");
    expect(await balance(r2.headers)).toMatchObject({ balance_halala: 3000, held_halala: 3000, available_halala: 0 });
    const [row] = await srv.sql`SELECT status, refunded_halala, refund_shortfall_halala FROM payments WHERE payment_id = ${p2.payment_id}`;
    expect(row).toEqual({ status: "refunded", refunded_halala: 2000, refund_shortfall_halala: 3000 });
    const [audit] = await srv.sql`SELECT details FROM audit_log WHERE action = 'payment.refund_shortfall' AND target_id = ${String(r2.id)}`;
    expect(audit.details).toMatchObject({ payment_id: p2.payment_id, shortfall_halala: 3000, debited_halala: 2000 });
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("a refund that comes before the paid event credits and takes back the payment; the paid event is then a duplicate", async () => {
    const r = await makeRenter(srv);
    const { payment } = await cardTopup(r.headers, 5000);
    // The paid delivery failed and will come again later; meanwhile the payment is refunded at the gateway.
    const refundEv = { id: "rf-early", type: "payment_refunded", data: { status: "refunded", amount: 5000, refunded: 5000, metadata: { payment_id: payment.payment_id } } };
    expect((await webhook(refundEv)).body.outcome).toBe("refunded");
    expect((await webhook(paidEvent(payment.payment_id, 5000))).body.outcome).toBe("duplicate");
    expect((await balance(r.headers)).balance_halala).toBe(0);
    const [row] = await srv.sql`SELECT status, refunded_halala, refund_shortfall_halala FROM payments WHERE payment_id = ${payment.payment_id}`;
    expect(row).toEqual({ status: "refunded", refunded_halala: 5000, refund_shortfall_halala: 0 });
    const moved = await srv.sql`SELECT kind, amount FROM ledger_transfers WHERE payment_id = ${payment.payment_id} ORDER BY id`;
    expect(moved.map((t) => [t.kind, t.amount])).toEqual([["payment", 5000], ["refund", 5000]]);
    // A refund whose amount is not the payment's moves nothing, as a paid event would not.
    const other = (await cardTopup(r.headers, 3000)).payment;
    const odd = await webhook({ id: "rf-odd", type: "payment_refunded", data: { amount: 2999, refunded: 2999, metadata: { payment_id: other.payment_id } } });
    expect(odd.body.outcome).toBe("ignored");
    expect((await api.get(`/api/payments/${other.payment_id}`, r.headers)).body.status).toBe("initiated");
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("a refund leaves what the renter's /v1 requests in flight reserved, recording it as shortfall", async () => {
    const r = await makeRenter(srv);
    const p = (await cardTopup(r.headers, 5000)).payment;
    await webhook(paidEvent(p.payment_id, 5000));
    // 10 prompt + 1,990 completion tokens at 1 halala each: 2,000 reserved by a request in flight.
    const requestId = `test-refund-${r.id}`;
    await srv.sql.begin((tx) =>
      reserveTokenBudget(tx, { requestId, renterId: r.id, model: "m", stream: false, rate: { input: 1_000_000, output: 1_000_000 }, promptTokens: 10, maxTokens: 1990, choices: 1, ttlSeconds: 60 }),
    );
    const res = await webhook({ id: "rf-v1", type: "payment_refunded", data: { refunded: 5000, metadata: { payment_id: p.payment_id } } });
    expect(res.body.outcome).toBe("refunded");
    expect(await balance(r.headers)).toMatchObject({ balance_halala: 2000, available_halala: 2000 });
    const [row] = await srv.sql`SELECT refunded_halala, refund_shortfall_halala FROM payments WHERE payment_id = ${p.payment_id}`;
    expect(row).toEqual({ refunded_halala: 3000, refund_shortfall_halala: 2000 });
    // The shortfall is owed (refund-debt.ts): while the request is in flight its 2,000 are not the
    // renter's to reserve again, and the answer says why.
    expect(await balance(r.headers)).toMatchObject({ available_halala: 2000, refund_owed_halala: 2000 });
    const again = srv.sql.begin((tx) =>
      reserveTokenBudget(tx, { requestId: `${requestId}-2`, renterId: r.id, model: "m", stream: false, rate: { input: 1_000_000, output: 1_000_000 }, promptTokens: 10, maxTokens: 10, choices: 1, ttlSeconds: 60 }),
    );
    await expect(again).rejects.toMatchObject({ status: 402, message: expect.stringContaining("2000 owed for refunded payments") });
    // Once it ends without a charge, its 2,000 go back to the gateway.
    expect(await releaseTokenBudget(srv.sql, requestId)).toBe(true);
    expect(await balance(r.headers)).toMatchObject({ balance_halala: 0, available_halala: 0 });
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("partial refunds: the gateway's running total takes only the difference each time; replays move nothing", async () => {
    const r = await makeRenter(srv);
    const { payment } = await cardTopup(r.headers, 5000);
    await webhook(paidEvent(payment.payment_id, 5000));
    const refund = (id: string, refunded: number) =>
      webhook({ id, type: "payment_refunded", data: { status: "refunded", amount: 5000, refunded, metadata: { payment_id: payment.payment_id } } });
    expect((await refund("pr1", 1000)).body.outcome).toBe("refunded");
    expect((await balance(r.headers)).balance_halala).toBe(4000);
    expect((await refund("pr1", 1000)).body.outcome).toBe("duplicate");
    expect((await refund("pr2", 3500)).body.outcome).toBe("refunded");
    expect((await balance(r.headers)).balance_halala).toBe(1500);
    expect((await refund("pr2", 3500)).body.outcome).toBe("duplicate");
    expect((await refund("pr0", 500)).body.outcome).toBe("duplicate"); // an older, smaller total arriving late
    expect((await refund("pr3", 9999)).body.outcome).toBe("refunded"); // capped at the payment's amount
    expect((await balance(r.headers)).balance_halala).toBe(0);
    const [row] = await srv.sql`SELECT status, refunded_halala, refund_shortfall_halala FROM payments WHERE payment_id = ${payment.payment_id}`;
    expect(row).toEqual({ status: "refunded", refunded_halala: 5000, refund_shortfall_halala: 0 });
    const moves = await srv.sql`SELECT amount FROM ledger_transfers WHERE payment_id = ${payment.payment_id} AND kind = 'refund' ORDER BY id`;
    expect(moves.map((m) => Number(m.amount))).toEqual([1000, 2500, 1500]);
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("voided after the credit takes the whole payment back through the ledger, once; replays move nothing", async () => {
    const r = await makeRenter(srv);
    const { payment } = await cardTopup(r.headers, 5000);
    const data = { id: `gwpay_${crypto.randomUUID()}`, amount: 5000, currency: "SAR", metadata: { payment_id: payment.payment_id } };
    expect((await webhook({ id: "e-paid", type: "payment_paid", data: { ...data, status: "paid" } })).body.outcome).toBe("credited");
    expect((await balance(r.headers)).balance_halala).toBe(5000);
    // The operator voids the payment before settlement: the card holder gets the 50 SAR back.
    const voidEv = { id: "e-void", type: "payment_voided", data: { ...data, status: "voided", refunded: 0 } };
    const voided = await webhook(voidEv);
    expect(voided.status).toBe(200);
    expect(voided.body).toEqual({ success: true, outcome: "refunded", payment_id: payment.payment_id });
    expect((await balance(r.headers)).balance_halala).toBe(0);
    expect((await api.get(`/api/payments/${payment.payment_id}`, r.headers)).body.status).toBe("refunded");
    // Replays, and the same void named by data.status alone, move nothing; nor does a paid event after it.
    expect((await webhook(voidEv)).body.outcome).toBe("duplicate");
    expect((await webhook({ id: "e-void-2", data: { ...data, status: "voided" } })).body.outcome).toBe("duplicate");
    expect((await webhook({ id: "e-paid", type: "payment_paid", data: { ...data, status: "paid" } })).body.outcome).toBe("duplicate");
    const moved = await srv.sql`SELECT kind, amount FROM ledger_transfers WHERE payment_id = ${payment.payment_id} ORDER BY id`;
    expect(moved.map((t) => [t.kind, Number(t.amount)])).toEqual([["payment", 5000], ["refund", 5000]]);
    const [row] = await srv.sql`SELECT status, refunded_halala, refund_shortfall_halala FROM payments WHERE payment_id = ${payment.payment_id}`;
    expect(row).toEqual({ status: "refunded", refunded_halala: 5000, refund_shortfall_halala: 0 });
    const events = await srv.sql`SELECT event_type, outcome FROM payment_events WHERE payment_id = ${payment.payment_id} ORDER BY id`;
    expect(events.map((e) => e.event_type)).toEqual(["payment_paid", "payment_voided", "payment_voided", "voided", "payment_paid"]);
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("a void after a partial refund takes the rest; what is held then is owed, as for a refund", async () => {
    const r = await makeRenter(srv);
    const { payment } = await cardTopup(r.headers, 5000);
    await webhook(paidEvent(payment.payment_id, 5000));
    const refunded = await webhook({ id: "pv-1", type: "payment_refunded", data: { amount: 5000, refunded: 1000, metadata: { payment_id: payment.payment_id } } });
    expect(refunded.body.outcome).toBe("refunded");
    const [job] = await srv.sql`
      INSERT INTO jobs (job_id, renter_id, job_type, status, duration_minutes, max_duration_seconds, rate_halala_per_minute, cost_halala)
      VALUES (${"job-void-" + r.id}, ${r.id}, 'training', 'queued', 120, 7200, 25, 3000) RETURNING id`;
    await srv.sql.begin((tx) => hold(tx, r.id, job.id, 3000));
    // The gateway's `refunded` on a void is not what is taken back: the whole payment is.
    const voided = await webhook({ id: "pv-2", type: "payment_voided", data: { status: "voided", amount: 5000, refunded: 1000, metadata: { payment_id: payment.payment_id } } });
    expect(voided.body.outcome).toBe("refunded");
    expect(await balance(r.headers)).toMatchObject({ balance_halala: 3000, held_halala: 3000, available_halala: 0, refund_owed_halala: 3000 });
    const [row] = await srv.sql`SELECT status, refunded_halala, refund_shortfall_halala FROM payments WHERE payment_id = ${payment.payment_id}`;
    expect(row).toEqual({ status: "refunded", refunded_halala: 2000, refund_shortfall_halala: 3000 });
    const [audit] = await srv.sql`SELECT details FROM audit_log WHERE action = 'payment.refund_shortfall' AND target_id = ${String(r.id)}`;
    expect(audit.details).toMatchObject({ payment_id: payment.payment_id, refunded_halala: 4000, debited_halala: 1000, shortfall_halala: 3000 });
    expect((await webhook({ id: "pv-2", type: "payment_voided", data: { metadata: { payment_id: payment.payment_id } } })).body.outcome).toBe("duplicate");
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("a void of a payment never credited marks it failed and moves nothing; a paid event arriving late then credits nothing", async () => {
    const r = await makeRenter(srv);
    const { payment } = await cardTopup(r.headers, 3000);
    const voidEv = { id: "nv-1", type: "payment_voided", data: { status: "voided", amount: 3000, metadata: { payment_id: payment.payment_id } } };
    const voided = await webhook(voidEv);
    expect(voided.body).toEqual({ success: true, outcome: "failed", payment_id: payment.payment_id });
    expect((await api.get(`/api/payments/${payment.payment_id}`, r.headers)).body.status).toBe("failed");
    expect((await webhook(voidEv)).body.outcome).toBe("duplicate");
    const late = await webhook(paidEvent(payment.payment_id, 3000));
    expect(late.body.outcome).toBe("ignored");
    expect((await balance(r.headers)).balance_halala).toBe(0);
    expect(await srv.sql`SELECT 1 FROM ledger_transfers WHERE payment_id = ${payment.payment_id}`).toHaveLength(0);
    const [row] = await srv.sql`SELECT status, failure_reason, voided_at IS NOT NULL AS voided FROM payments WHERE payment_id = ${payment.payment_id}`;
    expect(row).toEqual({ status: "failed", failure_reason: "voided at the gateway", voided: true });
    const [audit] = await srv.sql`SELECT details FROM audit_log WHERE action = 'payment.paid_after_void' AND target_id = ${payment.payment_id}`;
    expect(audit.details).toMatchObject({ amount: 3000 });
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("a refund event arriving after a void of a payment never credited credits nothing (the void gave the whole payment back)", async () => {
    const r = await makeRenter(srv);
    const { payment } = await cardTopup(r.headers, 5000);
    // The gateway's paid, partial refund and void, delivered in reverse: the void first, then the refund.
    const base = { amount: 5000, currency: "SAR", metadata: { payment_id: payment.payment_id } };
    expect((await webhook({ id: "vr-void", type: "payment_voided", data: { ...base, status: "voided", refunded: 1000 } })).body.outcome).toBe("failed");
    const refund = await webhook({ id: "vr-refund", type: "payment_refunded", data: { ...base, status: "refunded", refunded: 1000 } });
    expect(refund.status).toBe(200);
    expect(refund.body.outcome).toBe("ignored");
    expect((await webhook(paidEvent(payment.payment_id, 5000))).body.outcome).toBe("ignored");
    expect((await balance(r.headers)).balance_halala).toBe(0);
    expect(await srv.sql`SELECT 1 FROM ledger_transfers WHERE payment_id = ${payment.payment_id}`).toHaveLength(0);
    const [row] = await srv.sql`SELECT status, refunded_halala, voided_at IS NOT NULL AS voided FROM payments WHERE payment_id = ${payment.payment_id}`;
    expect(row).toEqual({ status: "failed", refunded_halala: 0, voided: true });
    const audits = await srv.sql`SELECT action FROM audit_log WHERE target_id = ${payment.payment_id} ORDER BY id`;
    expect(audits.map((a) => a.action)).toEqual(["payment.refund_after_void", "payment.paid_after_void"]);
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("reads an amount or a refunded total written as a string of digits; one it cannot read as whole halala moves nothing", async () => {
    const r = await makeRenter(srv);
    const { payment } = await cardTopup(r.headers, 5000);
    const id = payment.payment_id;
    // "4000" is not the payment's 5,000: refused as a number 4000 would be, not credited as 5,000.
    expect((await webhook(paidEvent(id, "4000" as never))).body.outcome).toBe("ignored");
    expect((await balance(r.headers)).balance_halala).toBe(0);
    expect((await webhook(paidEvent(id, "5000" as never))).body.outcome).toBe("credited");
    expect((await balance(r.headers)).balance_halala).toBe(5000);
    // A partial refund of 10 SAR takes 10 SAR, not the whole payment.
    const refund = (refunded: unknown) => webhook({ id: `evt_${crypto.randomUUID()}`, type: "payment_refunded", data: { amount: 5000, refunded, metadata: { payment_id: id } } });
    expect((await refund("1000")).body.outcome).toBe("refunded");
    expect((await balance(r.headers)).balance_halala).toBe(4000);
    // A running total of 0 takes nothing either (the whole payment is meant only when it is left out).
    expect((await refund(0)).body.outcome).toBe("ignored");
    expect((await balance(r.headers)).balance_halala).toBe(4000);
    // Totals that are no whole number of halala: nothing taken (no whole refund assumed), audited.
    for (const bad of [1500.5, -1000, "15.00", "abc", true, { value: 1500 }]) {
      const res = await webhook({ id: `evt_${crypto.randomUUID()}`, type: "payment_refunded", data: { amount: 5000, refunded: bad, metadata: { payment_id: id } } });
      expect(res.body.outcome, JSON.stringify(bad)).toBe("ignored");
      expect((await balance(r.headers)).balance_halala, JSON.stringify(bad)).toBe(4000);
    }
    const [row] = await srv.sql`SELECT status, refunded_halala FROM payments WHERE payment_id = ${id}`;
    expect(row).toEqual({ status: "refunded", refunded_halala: 1000 });
    const audits = await srv.sql`SELECT details FROM audit_log WHERE action = 'payment.unreadable_amount' AND target_id = ${id} ORDER BY id`;
    expect(audits).toHaveLength(6);
    expect(audits[0].details.problem).toMatch(/refunded 1500\.5 is not a whole number of halala/);
    // A paid event whose amount is a fraction credits nothing either (its amount cannot be checked).
    const other = (await cardTopup(r.headers, 3000)).payment;
    expect((await webhook(paidEvent(other.payment_id, 3000.5))).body.outcome).toBe("ignored");
    expect((await api.get(`/api/payments/${other.payment_id}`, r.headers)).body.status).toBe("initiated");
    expect((await balance(r.headers)).balance_halala).toBe(4000);
    const [recorded] = await srv.sql`SELECT outcome FROM payment_events WHERE payment_id = ${other.payment_id}`;
    expect(recorded.outcome).toMatch(/^ignored: amount 3000\.5 is not a whole number of halala$/);
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("records every verified event", async () => {
    const r = await makeRenter(srv);
    const { payment } = await cardTopup(r.headers, 700);
    await webhook(paidEvent(payment.payment_id, 700));
    await webhook(paidEvent(payment.payment_id, 700));
    const events = await srv.sql`SELECT event_type, outcome FROM payment_events WHERE payment_id = ${payment.payment_id} ORDER BY id`;
    expect(events).toEqual([
      { event_type: "payment_paid", outcome: "credited" },
      { event_type: "payment_paid", outcome: "duplicate" },
    ]);
  });
});

describe("gateway text PostgreSQL cannot store as it came", () => {
  it("a lone surrogate escaped in a signed event: credited and recorded (as U+FFFD), not a 500", async () => {
    const r = await makeRenter(srv);
    const { payment } = await cardTopup(r.headers, 900);
    // JSON.stringify writes a lone surrogate as the escape \ud83d, as a gateway's JSON may.
    const ev = paidEvent(payment.payment_id, 900, { message: "APPROVED \ud83d" });
    const raw = JSON.stringify(ev);
    expect(raw).toContain("\\ud83d");
    const res = await webhook(ev);
    expect(res.status, res.text).toBe(200);
    expect(res.body.outcome).toBe("credited");
    expect((await balance(r.headers)).balance_halala).toBe(900);
    const [stored] = await srv.sql`SELECT payload FROM payment_events WHERE payment_id = ${payment.payment_id}`;
    expect(stored.payload.data).toMatchObject({ message: "APPROVED \uFFFD" });
    const odd = await webhook({ id: "evt-odd", type: "payment_\udc00paid", data: { metadata: { payment_id: payment.payment_id } } });
    expect(odd.status, odd.text).toBe(200);
  });
});

describe("history and reads", () => {
  it("pages newest first with total, limit and offset; 400 for bad paging", async () => {
    const r = await makeRenter(srv);
    const ids: string[] = [];
    for (let i = 1; i <= 5; i++) ids.push((await cardTopup(r.headers, 1000 * i)).payment.payment_id);
    const all = await api.get("/api/payments/history", r.headers);
    expect(all.status).toBe(200);
    expect(all.body.total).toBe(5);
    expect(all.body.payments.map((p: any) => p.payment_id)).toEqual([...ids].reverse());
    const pageTwo = await api.get("/api/payments/history?limit=2&offset=2", r.headers);
    expect(pageTwo.body).toMatchObject({ total: 5, limit: 2, offset: 2 });
    expect(pageTwo.body.payments.map((p: any) => p.payment_id)).toEqual([ids[2], ids[1]]);
    for (const q of ["limit=0", "limit=101", "offset=-1", "limit=abc"]) {
      const bad = await api.get(`/api/payments/history?${q}`, r.headers);
      expect(bad.status, q).toBe(400);
    }
    const other = await makeRenter(srv);
    expect((await api.get("/api/payments/history", other.headers)).body).toEqual({ payments: [], total: 0, limit: 50, offset: 0 });
    expect((await api.get(`/api/payments/${ids[0]}`, other.headers)).status).toBe(403);
    expect((await api.get("/api/payments/pay_nope", r.headers)).status).toBe(404);
    expect((await api.get(`/api/payments/${ids[0]}`, { "x-admin-token": "test-admin-token-0123456789" })).status).toBe(200);
    expect((await api.get("/api/payments/history")).status).toBe(400);
  });
});

describe("without a gateway (local)", () => {
  const local = useTestServer();
  const lapi = client(local);

  it("the sandbox source runs the whole flow: topup -> checkout (sandbox-confirm) -> paid, credited once", async () => {
    const r = await makeRenter(local);
    const t = await lapi.post("/api/payments/topup", { amount_sar: 25, source_type: "sandbox" }, r.headers);
    expect(t.status).toBe(201);
    const id = t.body.payment.payment_id;
    expect(t.body.checkout_url).toBe(`/api/payments/${id}/sandbox-confirm`);
    const other = await makeRenter(local);
    expect((await lapi.post(t.body.checkout_url, {}, other.headers)).status).toBe(403);
    const c = await lapi.post(t.body.checkout_url, {}, r.headers);
    expect(c.status).toBe(200);
    expect(c.body).toMatchObject({ payment_id: id, status: "paid", amount_halala: 2500, source_type: "sandbox" });
    expect(c.body.confirmed_at).toEqual(expect.any(String));
    expect((await lapi.post(t.body.checkout_url, {}, r.headers)).body.status).toBe("paid");
    expect((await lapi.get("/api/renters/balance", r.headers)).body.balance_halala).toBe(2500);

    const declined = (await lapi.post("/api/payments/topup", { amount_halala: 100, source_type: "sandbox" }, r.headers)).body;
    const d = await lapi.post(declined.checkout_url, { outcome: "failed" }, r.headers);
    expect(d.body.status).toBe("failed");
    expect((await lapi.post(declined.checkout_url, { outcome: "maybe" }, r.headers)).status).toBe(400);
    expect((await lapi.post("/api/payments/pay_unknown/sandbox-confirm", {}, r.headers)).status).toBe(404);
    expect((await lapi.get("/api/renters/balance", r.headers)).body.balance_halala).toBe(2500);
    expect(await ledgerProblems(local.sql)).toEqual([]);
  });

  it("card sources answer 501 naming PAYMENT_GATEWAY_SECRET_KEY, definitive (no Retry-After: a 5xx that asks for no retry); the webhook is 503 without a secret", async () => {
    const r = await makeRenter(local);
    for (const source_type of ["creditcard", "mada", "applepay"]) {
      const res = await lapi.post("/api/payments/topup", { amount_halala: 1000, source_type }, r.headers);
      expect(res.status).toBe(501);
      expect(res.headers.get("retry-after")).toBeNull();
      expect(res.body.error).toMatch(/card payments are not configured on this server.*PAYMENT_GATEWAY_SECRET_KEY/);
    }
    const wh = await lapi.call("POST", "/api/payments/webhook", "{}", { "content-type": "application/json", "x-gateway-signature": "00" });
    expect(wh.status).toBe(503);
  });

  it("a card payment cannot be confirmed through the sandbox route", async () => {
    const r = await makeRenter(srv);
    const { payment } = await cardTopup(r.headers, 1000);
    const res = await api.post(`/api/payments/${payment.payment_id}/sandbox-confirm`, {}, r.headers);
    expect(res.status).toBe(400);
    expect(res.body.error).toMatch(/only sandbox payments/);
  });
});

describe("production", () => {
  it("refuses the sandbox source and its confirm route; the webhook secret defaults to the gateway key", async () => {
    const gw2 = fakeGateway();
    const url = await gw2.listen();
    const prod = await startTestServer({ NODE_ENV: "production", PAYMENT_GATEWAY_SECRET_KEY: GATEWAY_KEY, PAYMENT_GATEWAY_URL: url });
    try {
      const papi = client(prod.url);
      const r = await makeRenter(prod);
      const sb = await papi.post("/api/payments/topup", { amount_halala: 1000, source_type: "sandbox" }, r.headers);
      expect(sb.status).toBe(400);
      expect(sb.body.error).toMatch(/sandbox is not available in production/);
      expect((await papi.post("/api/payments/pay_x/sandbox-confirm", {}, r.headers)).status).toBe(403);
      const card = await papi.post("/api/payments/topup", { amount_halala: 1000, source_type: "creditcard" }, r.headers);
      expect(card.status).toBe(201);
      const raw = JSON.stringify(paidEvent(card.body.payment.payment_id, 1000));
      const res = await papi.call("POST", "/api/payments/webhook", raw, { "content-type": "application/json", "x-gateway-signature": sign(raw, GATEWAY_KEY) });
      expect(res.body.outcome).toBe("credited");
    } finally {
      await prod.close();
      await gw2.close();
    }
  });
});
