// Money in and back out the way renters' payments move: a sandbox top-up paid, and the gateway's
// signed refund event for it (what refund debt is made of).
import crypto from "node:crypto";
import { expect } from "vitest";
import type { client } from "./http.js";

type Api = ReturnType<typeof client>;

/** A sandbox top-up of `amount` halala, paid (the same path as a card's paid event); its payment id. */
export async function paidTopup(api: Api, headers: Record<string, string>, amount: number): Promise<string> {
  const t = await api.post("/api/payments/topup", { amount_halala: amount, source_type: "sandbox" }, headers);
  expect(t.status, t.text).toBe(201);
  const id = t.body.payment.payment_id as string;
  expect((await api.post(`/api/payments/${id}/sandbox-confirm`, {}, headers)).status).toBe(200);
  return id;
}

/** The gateway's refund event for `amount` halala of a payment, signed with the webhook secret; its answer. */
export async function gatewayRefund(api: Api, secret: string, paymentId: string, amount: number) {
  const raw = JSON.stringify({ id: `evt-${crypto.randomUUID()}`, type: "payment_refunded", data: { amount, refunded: amount, metadata: { payment_id: paymentId } } });
  const sig = crypto.createHmac("sha256", secret).update(raw).digest("hex");
  const r = await api.call("POST", "/api/payments/webhook", raw, { "content-type": "application/json", "x-gateway-signature": sig });
  expect(r.status, r.text).toBe(200);
  return r.body;
}
