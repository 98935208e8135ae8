// A request's reservation releases the renter's expired ones first (their
// process died before settling them). What they held is free again, and a
// renter that owes for refunded payments pays that debt from it then, in the
// reservation's transaction, as when a request releases its own reservation
// or the job sweep releases an expired one: the debt is not left recorded,
// counted as promised, beside funds that could pay it, until something else
// comes to collect it.
import http from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, expect, it } from "vitest";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import { reserveTokenBudget } from "../../src/domain/money/usage-billing.js";
import { makeRenter } from "../helpers/fixtures.js";
import { client } from "../helpers/http.js";
import { gatewayRefund, paidTopup } from "../helpers/payments.js";
import { useTestServer } from "../helpers/server.js";
import { chunk, usageChunk } from "./evil-upstream.js";
import { serveModel } from "./serving.js";

const MODEL = "TinyLlama/TinyLlama-1.1B-Chat-v1.0";
const SECRET = "whsec_sweep_debt_0123456789";
const srv = useTestServer({
  PAYMENT_GATEWAY_WEBHOOK_SECRET: SECRET,
  SVC_V1_TOKEN_RATES: JSON.stringify({ "*": { input: 1_000_000, output: 2_000_000 } }),
  SVC_JOB_SWEEP_MS: "60000",
  SVC_LIVENESS_SWEEP_SECONDS: "0",
});
const api = client(srv);

// An endpoint that answers each chat completion only once the test lets it: the request is in flight,
// its reservation made and committed, from when it arrives until then.
let arrived: () => void = () => {};
let answer: () => void = () => {};
const nextArrival = () => new Promise<void>((r) => (arrived = r));
const gate = new Promise<void>((r) => (answer = r));
const upstream = http.createServer(async (req, res) => {
  for await (const _ of req);
  if (req.method === "GET") return void res.writeHead(200).end();
  arrived();
  await gate;
  res.writeHead(200, { "content-type": "text/event-stream" });
  for (const e of [chunk(MODEL, { role: "assistant", content: "Hi" }, "stop"), usageChunk(MODEL, 10, 1)]) res.write(`data: ${JSON.stringify(e)}\n\n`);
  res.end("data: [DONE]\n\n");
});
beforeAll(async () => {
  await new Promise<void>((r) => upstream.listen(0, "127.0.0.1", r));
  await serveModel(srv, MODEL, `http://127.0.0.1:${(upstream.address() as AddressInfo).port}/v1`);
});
afterAll(async () => {
  answer();
  upstream.closeAllConnections();
  await new Promise((r) => upstream.close(r));
});

type Renter = Awaited<ReturnType<typeof makeRenter>>;
const paid = (r: Renter, amount: number) => paidTopup(api, r.headers, amount);
const refunded = (paymentId: string, amount: number) => gatewayRefund(api, SECRET, paymentId, amount);
const owed = async (r: Renter) => Number((await srv.sql`SELECT refund_owed_halala FROM renters WHERE id = ${r.id}`)[0].refund_owed_halala);
const debtCollected = async (r: Renter) =>
  Number((await srv.sql`SELECT coalesce(sum(amount), 0)::int AS n FROM ledger_transfers WHERE idempotency_key LIKE ${`refund-debt:renter:${r.id}:%`}`)[0].n);

it("a new request's sweep of the renter's expired reservations collects its refund debt from what they held", async () => {
  const r = await makeRenter(srv);
  const first = await paid(r, 5_000);
  // A request reserves 4,000 (100 prompt + 1,950 completion tokens at 1 and 2 halala), and its process dies.
  const died = `req-died-${r.id}`;
  const reservation = await srv.sql.begin((tx) =>
    reserveTokenBudget(tx, {
      requestId: died,
      renterId: r.id,
      model: MODEL,
      stream: false,
      rate: { input: 1_000_000, output: 2_000_000 },
      promptTokens: 100,
      maxTokens: 1_950,
      choices: 1,
      ttlSeconds: 3600,
    }),
  );
  expect(reservation.reserved).toBe(4_000);
  // The payment is refunded: 1,000 is free and taken, 4,000 owed; a new payment pays 3,000 of it.
  await refunded(first, 5_000);
  await paid(r, 3_000);
  expect(await owed(r)).toBe(1_000);
  const collectedBefore = await debtCollected(r);
  // The dead request's reservation is past its expiry (SVC_V1_MAX_REQUEST_SECONDS + 60 s in the route).
  await srv.sql`UPDATE v1_usage SET expires_at = now() - interval '1 second' WHERE request_id = ${died}`;

  const inFlight = nextArrival();
  const pending = fetch(`${srv.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${r.key}`, "content-type": "application/json" },
    body: JSON.stringify({ model: MODEL, messages: [{ role: "user", content: "hi" }], max_tokens: 16 }),
  });
  await inFlight;
  // The new request's reservation released the dead one and, from what it held, the debt was paid.
  expect((await srv.sql`SELECT state FROM v1_usage WHERE request_id = ${died}`)[0].state).toBe("released");
  expect(await owed(r)).toBe(0);
  expect((await debtCollected(r)) - collectedBefore).toBe(1_000);
  expect(await ledgerProblems(srv.sql)).toEqual([]);

  answer();
  const res = await pending;
  expect(res.status, await res.text()).toBe(200);
  const cost = Number(res.headers.get("x-svc-cost-halala"));
  const balance = (await api.get("/api/renters/balance", r.headers)).body;
  expect(balance).toMatchObject({ available_halala: 4_000 - 1_000 - cost });
  expect(balance).not.toHaveProperty("refund_owed_halala");
  expect(await ledgerProblems(srv.sql)).toEqual([]);
});
