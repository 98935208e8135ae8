// RenterService: thin translation between messages and domain calls.
import type { ServiceImpl } from "@connectrpc/connect";
import crypto from "node:crypto";
import { RegisterRenterRequestSchema, RenterLoginEmailRequestSchema, RenterService, TopupResponseSchema } from "../../gen/svc/v1/renters_pb.js";
import { idempotent } from "../domain/money/idempotency.js";
import { rotateKeys } from "../domain/accounts/key-rotation.js";
import { credit, renterFunds } from "../domain/money/ledger.js";
import { loginByEmail } from "../domain/accounts/login.js";
import { recentJobsOfRenter, jobMessageFor } from "../domain/jobs/jobs.js";
import { topupAmount } from "../domain/money/payments.js";
import { halalaToSar } from "../domain/money/pricing.js";
import { collectRefundDebt } from "../domain/money/refund-debt.js";
import { registerRenter, renterByEmail, renterById, renterJobCount, renterMessage, renterQuota, updateRenter, type RenterPatch } from "../domain/accounts/renters.js";
import { checkEmail, checkLength, optionalText, requireMembers } from "../domain/shared/validate.js";
import { checkWebhookUrl } from "../domain/notify/webhooks.js";
import { badRequest, forbidden, notFound, or500 } from "../errors.js";
import { callerKeys, callerRenterId, type Deps } from "./deps.js";

export function renterService(deps: Deps): Partial<ServiceImpl<typeof RenterService>> {
  const { sql, config, log } = deps;
  return {
    async register(req) {
      requireMembers(RegisterRenterRequestSchema, req);
      const input = {
        name: optionalText(req.name, 200, "name")!,
        email: checkEmail(req.email),
        organization: optionalText(req.organization, 200, "organization"),
        useCase: optionalText(req.useCase, 1000, "use_case"),
        phone: optionalText(req.phone, 50, "phone"),
        webhookUrl: req.webhookUrl?.trim() ? checkWebhookUrl(req.webhookUrl, config.production) : undefined,
      };
      const { id, apiKey, webhookSecret } = await sql.begin((tx) => registerRenter(tx, input, config.signupCreditHalala));
      log.info({ renterId: id }, "renter registered");
      return {
        success: true,
        renterId: BigInt(id),
        apiKey,
        message: "Renter registered. Save your API key now: it is shown only once.",
        webhookSecret,
      };
    },

    async loginEmail(req) {
      requireMembers(RenterLoginEmailRequestSchema, req);
      const renter = await renterByEmail(sql, checkEmail(req.email));
      if (!renter) throw notFound("no renter with that email");
      const outcome = await loginByEmail(sql, config, log, "renter", renter.id, renter.email, req.code);
      if (outcome.kind === "code_sent") return { success: true, message: outcome.message, statusCode: 202 };
      return { success: true, apiKey: outcome.apiKey, renter: await renterMessage(sql, renter) };
    },

    async getMe(_req, ctx) {
      const id = callerRenterId(ctx);
      return or500(log, "failed to fetch renter data", { renterId: id }, async () => {
        const renter = await renterById(sql, id);
        const [message, recent, quota] = await Promise.all([renterMessage(sql, renter), recentJobsOfRenter(sql, id), renterQuota(sql, id)]);
        return {
          renter: message,
          recentJobs: recent.map((j) => jobMessageFor(j, { role: "renter", renterId: id })),
          quota: { dailyJobsLimit: BigInt(quota.dailyJobsLimit), monthlySpendLimitHalala: BigInt(quota.monthlySpendLimitHalala) },
        };
      });
    },

    async updateMe(req, ctx) {
      const id = callerRenterId(ctx);
      // "" clears a nullable field; an absent (or null) field keeps its value.
      const nullable = (v: string | undefined, max: number, field: string) =>
        v === undefined ? undefined : (optionalText(v, max, field) ?? null);
      const patch: RenterPatch = {
        organization: nullable(req.organization, 200, "organization"),
        useCase: nullable(req.useCase, 1000, "use_case"),
        phone: nullable(req.phone, 50, "phone"),
        webhookUrl: req.webhookUrl === undefined ? undefined : req.webhookUrl.trim() ? checkWebhookUrl(req.webhookUrl, config.production) : null,
        rotateWebhookSecret: req.rotateWebhookSecret ?? false,
      };
      if (req.name !== undefined) {
        if (!req.name.trim()) throw badRequest("name must not be empty");
        patch.name = checkLength(req.name.trim(), 200, "name");
      }
      const row = await sql.begin((tx) => updateRenter(tx, id, patch));
      return { success: true, renter: await renterMessage(sql, row), webhookSecret: row.webhook_secret ?? undefined };
    },

    async getBalance(_req, ctx) {
      const id = callerRenterId(ctx);
      // One snapshot: a job settling meanwhile is in every figure (balance, held, spent) or in none.
      const [renter, funds, jobs] = await sql.begin("isolation level repeatable read read only", (tx) =>
        Promise.all([renterById(tx, id), renterFunds(tx, id), renterJobCount(tx, id)]),
      );
      return {
        balanceHalala: BigInt(funds.balance),
        balanceSar: halalaToSar(funds.balance),
        heldHalala: BigInt(funds.held),
        heldSar: halalaToSar(funds.held),
        availableHalala: BigInt(funds.available),
        totalSpentHalala: BigInt(renter.total_spent_halala),
        totalSpentSar: halalaToSar(renter.total_spent_halala),
        totalJobs: BigInt(jobs),
        ...(Number(renter.refund_owed_halala) > 0 ? { refundOwedHalala: BigInt(renter.refund_owed_halala) } : {}),
      };
    },

    async topup(req, ctx) {
      const id = callerRenterId(ctx);
      if (!config.allowTopup) {
        const where = config.production ? "in production (set SVC_ALLOW_TOPUP=on to allow it)" : "on this server (SVC_ALLOW_TOPUP=off)";
        throw forbidden(`direct topup is disabled ${where}; use POST /api/payments/topup`);
      }
      const amount = topupAmount(req.amountHalala, req.amountSar);
      // The body as sent: the same amount written the other way is another request.
      const request = { amount_halala: req.amountHalala === undefined ? null : Number(req.amountHalala), amount_sar: req.amountSar ?? null };
      return idempotent(sql, TopupResponseSchema, `renter-topup:${id}`, req.idempotencyKey, request, async (tx) => {
        // Replays are stopped by the idempotency row; the ledger key only has to be unique.
        await credit(tx, id, amount, `topup:renter:${id}:${crypto.randomUUID()}`, "topup");
        // A renter that owes for refunded payments pays that first.
        await collectRefundDebt(tx, id);
        const funds = await renterFunds(tx, id);
        return {
          success: true,
          toppedUpHalala: BigInt(amount),
          toppedUpSar: halalaToSar(amount),
          newBalanceHalala: BigInt(funds.balance),
          newBalanceSar: halalaToSar(funds.balance),
        };
      });
    },

    async rotateKey(_req, ctx) {
      const id = callerRenterId(ctx);
      const { apiKey, webhookSecret } = await sql.begin(async (tx) => {
        const apiKey = await rotateKeys(tx, "renter", id, callerKeys(ctx));
        // A revoked key could read the webhook's secret (PATCH /api/renters/me answers it) and sign
        // notifications to the renter's receiver: it is replaced with the keys.
        const renter = await updateRenter(tx, id, { rotateWebhookSecret: true });
        return { apiKey, webhookSecret: renter.webhook_secret };
      });
      log.info({ renterId: id }, "renter key rotated");
      return {
        success: true,
        message:
          "API key rotated. Every earlier key of this account stopped working; save this one now: it is shown only once." +
          (webhookSecret
            ? " The webhook's signing secret was replaced too (webhook_secret): give it to your receiver, and check webhook_url (GET /api/renters/me), which an earlier key could have changed."
            : ""),
        apiKey,
        renterId: BigInt(id),
        webhookSecret: webhookSecret ?? undefined,
      };
    },
  };
}
