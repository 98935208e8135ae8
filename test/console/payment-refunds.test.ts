// The payment lists in a real browser (the renter's payment history and the
// operator's payments list) say how much of each payment the gateway gave
// back: a payment refunded in part is `refunded` with most of it still the
// renter's, so the lists show the refunded amount in SAR beside the status,
// following the gateway's running total up to a void, and nothing for a
// payment nothing was refunded of. Refunds come through the real gateway
// webhook, signed with its secret.
import crypto from "node:crypto";
import type { Page } from "playwright-core";
import { describe, expect, it } from "vitest";
import { makeRenter } from "../helpers/fixtures.js";
import { client } from "../helpers/http.js";
import { paidTopup } from "../helpers/payments.js";
import { ADMIN_TOKEN } from "../helpers/server.js";
import { shot, signedIn, useConsoleHarness } from "./browser.js";

const SECRET = "whsec_console_refunds_0123456789";
const STEP_MS = 30_000;
const poll = <T,>(fn: () => Promise<T> | T) => expect.poll(fn, { timeout: STEP_MS, interval: 100 });
const h = useConsoleHarness({ PAYMENT_GATEWAY_WEBHOOK_SECRET: SECRET });
const api = () => client(h.srv.url);

/** The gateway's signed event of a payment of `amount` whose refunds now total `refunded` (or a void). */
async function gatewayEvent(paymentId: string, type: "payment_refunded" | "payment_voided", amount: number, refunded?: number) {
  const raw = JSON.stringify({
    id: `evt_${crypto.randomUUID()}`,
    type,
    data: { id: `gw_${paymentId}`, amount, currency: "SAR", ...(refunded === undefined ? {} : { refunded }), metadata: { payment_id: paymentId } },
  });
  const sig = crypto.createHmac("sha256", SECRET).update(raw).digest("hex");
  const r = await api().call("POST", "/api/payments/webhook", raw, { "content-type": "application/json", "x-gateway-signature": sig });
  expect(r.status, r.text).toBe(200);
}

/** The payment table's rows as {column head: cell text}, by payment id (its Payment column); none before it is shown. */
const rows = (page: Page) =>
  page.evaluate(() => {
    const out: Record<string, Record<string, string>> = {};
    for (const table of document.querySelectorAll("table")) {
      const heads = [...table.querySelectorAll("thead th")].map((th) => th.textContent ?? "");
      if (!heads.includes("Payment")) continue;
      for (const tr of table.querySelectorAll("tbody tr")) {
        const cells = [...tr.querySelectorAll("td")].map((td) => (td.textContent ?? "").trim());
        const row = Object.fromEntries(heads.map((h, i) => [h, cells[i]]));
        out[row.Payment] = row;
      }
    }
    return out;
  });

describe("refunded amounts in the console's payment lists", () => {
  it("the renter's history and the operator's list show how much of each payment was given back, in SAR", async () => {
    const renter = await makeRenter(h.srv);
    const kept = await paidTopup(api(), renter.headers, 2_000);
    const part = await paidTopup(api(), renter.headers, 5_000);
    const voided = await paidTopup(api(), renter.headers, 3_000);
    await gatewayEvent(part, "payment_refunded", 5_000, 1_000);
    await gatewayEvent(voided, "payment_voided", 3_000);

    const mine = await signedIn(h, "renter", renter.key);
    await mine.page.goto(`${h.srv.url}/#/renter`);
    await poll(async () => Object.keys(await rows(mine.page)).length).toBe(3);
    let r = await rows(mine.page);
    expect(r[part]).toMatchObject({ Amount: "50.00 SAR", Status: "refunded", Refunded: "10.00 SAR" });
    expect(r[voided]).toMatchObject({ Amount: "30.00 SAR", Status: "refunded", Refunded: "30.00 SAR" });
    expect(r[kept]).toMatchObject({ Amount: "20.00 SAR", Status: "paid", Refunded: "—" });
    await shot(mine.page, "renter-payments-refunded");

    // The gateway's running total grows: the history follows it (it is polled).
    await gatewayEvent(part, "payment_refunded", 5_000, 3_000);
    await poll(async () => (await rows(mine.page))[part]?.Refunded).toBe("30.00 SAR");
    expect(mine.problems).toEqual([]);

    const op = await signedIn(h, "admin", ADMIN_TOKEN);
    await op.page.goto(`${h.srv.url}/#/admin/payments`);
    await op.page.getByLabel("Renter id").fill(String(renter.id));
    await op.page.getByLabel("Renter id").press("Enter");
    await poll(async () => Object.keys(await rows(op.page)).sort()).toEqual([kept, part, voided].sort());
    r = await rows(op.page);
    expect(r[part]).toMatchObject({ Renter: `#${renter.id}`, Amount: "50.00 SAR", Status: "refunded", Refunded: "30.00 SAR" });
    expect(r[voided]).toMatchObject({ Status: "refunded", Refunded: "30.00 SAR" });
    expect(r[kept]).toMatchObject({ Status: "paid", Refunded: "—" });

    // Refunded payments only: each says how much of it went back.
    await op.page.getByLabel("Status").selectOption("refunded");
    await poll(async () => Object.keys(await rows(op.page)).sort()).toEqual([part, voided].sort());
    await shot(op.page, "operator-payments-refunded");
    expect(op.problems).toEqual([]);
  }, 120_000);
});
