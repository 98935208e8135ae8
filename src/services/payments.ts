// PaymentService: card top-ups through the gateway, its webhook, history, and
// the sandbox source for trying the whole flow locally.
import type { ServiceImpl } from "@connectrpc/connect";
import { PaymentService, PaymentTopupRequestSchema, PaymentTopupResponseSchema } from "../../gen/svc/v1/payments_pb.js";
import { createInvoice } from "../domain/money/gateway.js";
import { claimKey, finishClaim, idempotent, releaseClaim, type KeyClaim } from "../domain/money/idempotency.js";
import {
  CARD_SOURCES,
  PAYMENT_SOURCES,
  applyGatewayEvent,
  insertPayment,
  listPayments,
  newPaymentId,
  parseGatewayEvent,
  paymentById,
  paymentMessage,
  topupAmount,
  verifySignature,
  type PaymentRow,
  type PaymentSource,
} from "../domain/money/payments.js";
import { halalaToSar } from "../domain/money/pricing.js";
import { checkEnum, optionalText, page, requireMembers } from "../domain/shared/validate.js";
import { badRequest, forbidden, notFound, notImplemented, unauthorized, unavailable } from "../errors.js";
import { callerRenterId, principalOf, type Deps } from "./deps.js";
import { storableJson } from "../shared/nul-text.js";
import type { Tx } from "../db/index.js";

/** Card gateways do not take less than 1 SAR. */
const MIN_CARD_HALALA = 100;

export function paymentService(deps: Deps): Partial<ServiceImpl<typeof PaymentService>> {
  const { sql, config, log } = deps;

  function ownPayment(p: PaymentRow | undefined, renterId: number | undefined): PaymentRow {
    if (!p) throw notFound("payment not found");
    if (renterId !== undefined && p.renter_id !== renterId) throw forbidden("payment belongs to another renter");
    return p;
  }

  /** The claim expired while this request was still in flight and a retry took the key over: both payments stand. */
  function logLostClaim(claim: KeyClaim | undefined, paymentId: string) {
    log.warn({ scope: claim?.scope, paymentId }, "Idempotency-Key claim expired before its top-up answered; another request took the key over");
  }

  return {
    async topup(req, ctx) {
      const renterId = callerRenterId(ctx);
      requireMembers(PaymentTopupRequestSchema, req);
      const source = checkEnum(req.sourceType.trim().toLowerCase(), PAYMENT_SOURCES, "source_type") as PaymentSource;
      const card = CARD_SOURCES.includes(source);
      if (card && !config.paymentGatewaySecretKey) {
        throw notImplemented("card payments are not configured on this server (PAYMENT_GATEWAY_SECRET_KEY is not set)");
      }
      if (!card && config.production) throw badRequest("source_type sandbox is not available in production");
      const amount = topupAmount(req.amountHalala, req.amountSar, card ? MIN_CARD_HALALA : 1);
      const description = optionalText(req.description, 200, "description") ?? `Wallet top-up of ${halalaToSar(amount).toFixed(2)} SAR`;
      const request = {
        amount_halala: req.amountHalala === undefined ? null : Number(req.amountHalala),
        amount_sar: req.amountSar ?? null,
        source_type: source,
        description: req.description ?? null,
      };
      const scope = `payment-topup:${renterId}`;
      const paymentId = newPaymentId();
      const record = (checkoutUrl: string, gatewayId?: string) => async (tx: Tx) => {
        const row = await insertPayment(tx, { paymentId, renterId, amountHalala: amount, source, description, gatewayId, checkoutUrl });
        log.info({ renterId, paymentId, amount, source }, "payment initiated");
        return { success: true, payment: paymentMessage(row), checkoutUrl };
      };
      // Nothing outside the database: the key row goes in with the payment (a duplicate waits, then replays).
      if (!card) return idempotent(sql, PaymentTopupResponseSchema, scope, req.idempotencyKey, request, record(`/api/payments/${paymentId}/sandbox-confirm`));
      // A card top-up asks the gateway for an invoice first. The key is claimed (committed) before that call:
      // a replay answers without a second invoice, and a duplicate sent while this one is in flight is a 409
      // "in progress; retry" rather than another invoice, orphaned at the gateway.
      const claimed = await claimKey(sql, PaymentTopupResponseSchema, scope, req.idempotencyKey, request);
      if (claimed.replay) return claimed.replay;
      const claim = claimed.claim;
      const release = (err: unknown) =>
        releaseClaim(sql, claim).then(
          () => Promise.reject(err),
          (releaseErr) => {
            // Not released: the claim expires (CLAIM_TTL_SECONDS) and a retry then takes the key over.
            log.warn({ renterId, err: (releaseErr as Error).message }, "could not release an Idempotency-Key claim");
            return Promise.reject(err);
          },
        );
      // Before the transaction: no database connection waits on the gateway, a re-run transaction asks for
      // no second invoice, and a refusal leaves no row (and releases the key, so a retry asks again).
      const invoice = await createInvoice(
        { url: config.paymentGatewayUrl, secretKey: config.paymentGatewaySecretKey! },
        {
          amountHalala: amount,
          description,
          callbackUrl: `${config.frontendUrl}/payments/callback?payment_id=${paymentId}`,
          successUrl: `${config.frontendUrl}/payments/callback?payment_id=${paymentId}`,
          backUrl: `${config.frontendUrl}/billing`,
          metadata: { payment_id: paymentId, renter_id: String(renterId), source_type: source },
        },
      ).catch(release);
      const { answer, stored } = await finishClaim(sql, PaymentTopupResponseSchema, claim, record(invoice.url, invoice.id)).catch(release);
      if (!stored) logLostClaim(claim, paymentId);
      return answer;
    },

    async webhook(req) {
      const secret = config.paymentGatewayWebhookSecret;
      if (!secret) throw unavailable("payment webhooks are not configured (PAYMENT_GATEWAY_WEBHOOK_SECRET or PAYMENT_GATEWAY_SECRET_KEY)");
      if (!req.signature) throw unauthorized("missing x-gateway-signature");
      if (!verifySignature(secret, req.rawPayload, req.signature)) throw unauthorized("invalid webhook signature");
      let body: unknown;
      try {
        // Stored as it came (payment_events.payload), once made storable: the gateway's text may escape
        // a NUL or a lone surrogate, which jsonb refuses (the whole event, credit and all, would fail).
        body = storableJson(JSON.parse(Buffer.from(req.rawPayload).toString("utf8")));
      } catch {
        throw badRequest("webhook body must be JSON");
      }
      const event = parseGatewayEvent(body);
      const result = await sql.begin((tx) => applyGatewayEvent(tx, event, body));
      log.info({ paymentId: result.payment?.payment_id, type: event.type, outcome: result.outcome, note: result.note }, "payment webhook");
      return { success: true, outcome: result.outcome, paymentId: result.payment?.payment_id };
    },

    async history(req, ctx) {
      const renterId = callerRenterId(ctx);
      const { limit, offset } = page(req.limit, req.offset, 100, "read a payment by its id (GET /api/payments/{payment_id})");
      const { payments, total } = await listPayments(sql, { renterId, limit, offset });
      return { payments: payments.map(paymentMessage), total: BigInt(total), limit, offset };
    },

    async get(req, ctx) {
      const p = principalOf(ctx);
      const row = ownPayment(await paymentById(sql, req.paymentId), p.role === "renter" ? p.renterId : undefined);
      return paymentMessage(row);
    },

    async confirmSandbox(req, ctx) {
      const renterId = callerRenterId(ctx);
      if (config.production) throw forbidden("sandbox payments are not available in production");
      const outcome = checkEnum(req.outcome?.trim() || "paid", ["paid", "failed"] as const, "outcome");
      const p = ownPayment(await paymentById(sql, req.paymentId), renterId);
      if (p.source_type !== "sandbox") throw badRequest("only sandbox payments can be confirmed here; card payments are confirmed by the gateway");
      const result = await sql.begin((tx) =>
        applyGatewayEvent(
          tx,
          { kind: outcome, type: `sandbox.${outcome}`, paymentId: p.payment_id, gatewayIds: [], reason: outcome === "failed" ? "declined in the sandbox" : undefined },
          { sandbox: true, payment_id: p.payment_id, outcome },
        ),
      );
      return paymentMessage(result.payment!);
    },
  };
}
