// AdminService (everything but the provider approvals, which live in
// admin-providers.ts): dashboard, renters, jobs, payments, audit. Every
// action writes its audit record in the same transaction as the change.
import crypto from "node:crypto";
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { HandlerContext, ServiceImpl } from "@connectrpc/connect";
import { AdjustBalanceRequestSchema, AdminRenterResponseSchema, type AdminService } from "../../gen/svc/v1/admin_pb.js";
import type { Db } from "../db/index.js";
import { adjustRenterBalance, checkId, listAudit, listJobs, listRenters, offerQueuedJobsOf, RENTER_STATUSES, setQuota, setRenterStatus } from "../domain/admin/admin.js";
import { recordAudit, recordAuditMany } from "../domain/shared/audit.js";
import { dashboard } from "../domain/admin/dashboard.js";
import { auditLedgerNow } from "../domain/money/ledger-audit.js";
import { idempotent } from "../domain/money/idempotency.js";
import { afterCancels, cancelJob, requeueJob } from "../domain/jobs/job-control.js";
import { jobMessage } from "../domain/jobs/jobs.js";
import { listPayments, PAYMENT_STATUSES, paymentMessage } from "../domain/money/payments.js";
import { DEFAULT_QUOTA } from "../domain/money/quota.js";
import { renterById, renterMessage, renterMessages, renterQuota, type RenterRow } from "../domain/accounts/renters.js";
import { checkEnum, optionalText, page, REASON_MAX_CHARS, requireFields, requireMembers } from "../domain/shared/validate.js";
import { badRequest } from "../errors.js";
import { auditActor, type Deps } from "./deps.js";

/** Who did it, for the audit log: the admin token has no identity beyond the caller's address. */

export function adminService(deps: Deps): Partial<ServiceImpl<typeof AdminService>> {
  const { sql } = deps;

  async function renterAnswer(db: Db, row: RenterRow): Promise<MessageInitShape<typeof AdminRenterResponseSchema>> {
    const quota = await renterQuota(db, row.id);
    return {
      success: true,
      renter: await renterMessage(db, row),
      quota: { dailyJobsLimit: BigInt(quota.dailyJobsLimit), monthlySpendLimitHalala: BigInt(quota.monthlySpendLimitHalala) },
    };
  }

  async function changeStatus(req: { id: bigint; reason?: string; stopJobs?: boolean }, status: (typeof RENTER_STATUSES)[number], ctx: HandlerContext) {
    const renterId = checkId(req.id, "id");
    const why = optionalText(req.reason, REASON_MAX_CHARS, "reason");
    const stopJobs = req.stopJobs ?? false;
    const suspending = status === "suspended";
    const { actor, ip } = auditActor(ctx);
    const { answer, changed, stopped } = await sql.begin(async (tx) => {
      const { row, changed, stopped, stoppedJobs } = await setRenterStatus(tx, renterId, status, { stopJobs });
      await recordAudit(tx, actor, suspending ? "renter.suspend" : "renter.unsuspend", "renter", renterId, {
        reason: why ?? null,
        changed,
        ...(suspending ? { stop_jobs: stopJobs, jobs_stopped: stopped.length } : {}),
        ip,
      });
      // Each job stopped gets the entry an admin's cancel of it writes: a job's own trail says who ended it.
      const cause = `the renter's account was suspended (stop_jobs)${why ? `: ${why}` : ""}`;
      await recordAuditMany(
        tx,
        actor,
        "job.cancel",
        "job",
        stoppedJobs.map((j) => ({ targetId: j.jobId, details: { status: j.status, reason: cause, renter_id: renterId, ip: ip ?? null } })),
      );
      const answer = await renterAnswer(tx, row);
      return { answer: suspending ? { ...answer, jobsStopped: BigInt(stopped.length) } : answer, changed, stopped };
    });
    await afterCancels(sql, stopped);
    if (!suspending && changed) await offerQueuedJobsOf(sql, renterId);
    return answer;
  }

  return {
    async getDashboard() {
      return dashboard(sql);
    },

    async auditLedger(req) {
      const r = await auditLedgerNow(sql, { full: req.full ?? false });
      return {
        ok: r.discrepancyCount === 0,
        startedAt: r.startedAt.toISOString(),
        finishedAt: r.finishedAt.toISOString(),
        durationMs: BigInt(r.ms),
        accounts: BigInt(r.accounts),
        entries: BigInt(r.entries),
        holds: BigInt(r.holds),
        openHolds: BigInt(r.openHolds),
        settledJobs: BigInt(r.settledJobs),
        booksSumHalala: BigInt(r.booksSumHalala),
        driftHalala: BigInt(r.driftHalala),
        discrepancyCount: BigInt(r.discrepancyCount),
        discrepancies: r.discrepancies.map((d) => ({ ...d, expectedHalala: BigInt(d.expectedHalala), actualHalala: BigInt(d.actualHalala) })),
        mode: r.mode,
        fromEntryId: BigInt(r.fromEntryId),
        toEntryId: BigInt(r.toEntryId),
        baseAuditId: r.baseAuditId === null ? undefined : BigInt(r.baseAuditId),
        auditId: BigInt(r.auditId ?? 0),
        watermarkEntryId: r.watermark == null ? undefined : BigInt(r.watermark),
      };
    },

    async listRenters(req) {
      const p = page(req.limit, req.offset, 200, "narrow the list by status or q, or read a renter by its id (GET /api/admin/renters/{id})");
      const { rows, total } = await listRenters(sql, { status: req.status, q: req.q, ...p });
      return {
        renters: await renterMessages(sql, rows),
        total: BigInt(total),
        ...p,
      };
    },

    async getRenter(req) {
      return renterAnswer(sql, await renterById(sql, checkId(req.id, "id")));
    },

    suspendRenter: (req, ctx) => changeStatus(req, "suspended", ctx),
    unsuspendRenter: (req, ctx) => changeStatus(req, "active", ctx),

    async adjustBalance(req, ctx) {
      const renterId = checkId(req.id, "id");
      const amount = Number(req.amountHalala);
      if (amount === 0 || !Number.isSafeInteger(amount) || Math.abs(amount) > 1_000_000_000_000) {
        throw badRequest("amount_halala must be a non-zero integer (positive credits, negative debits)");
      }
      requireMembers(AdjustBalanceRequestSchema, req);
      const reason = optionalText(req.reason, REASON_MAX_CHARS, "reason")!;
      const { actor, ip } = auditActor(ctx);
      return idempotent(sql, AdminRenterResponseSchema, `admin-adjust:${renterId}`, req.idempotencyKey, { amount, reason }, async (tx) => {
        const renter = await renterById(tx, renterId);
        const key = `admin-adjust:renter:${renterId}:${crypto.randomUUID()}`;
        const done = await adjustRenterBalance(tx, renterId, amount, key, reason);
        await recordAudit(tx, actor, "renter.adjust_balance", "renter", renterId, {
          amount_halala: amount,
          reason,
          transfer_key: key,
          available_before: done.availableBefore,
          available_after: done.availableAfter,
          ...(done.refundDebtPaid > 0 ? { refund_debt_paid_halala: done.refundDebtPaid } : {}),
          ip,
        });
        return renterAnswer(tx, renter);
      });
    },

    async setQuota(req, ctx) {
      const renterId = checkId(req.id, "id");
      const { actor, ip } = auditActor(ctx);
      return sql.begin(async (tx) => {
        const { before, after } = await setQuota(
          tx,
          renterId,
          {
            dailyJobsLimit: req.dailyJobsLimit === undefined ? undefined : Number(req.dailyJobsLimit),
            monthlySpendLimitHalala: req.monthlySpendLimitHalala === undefined ? undefined : Number(req.monthlySpendLimitHalala),
          },
          DEFAULT_QUOTA,
        );
        await recordAudit(tx, actor, "renter.set_quota", "renter", renterId, {
          before: { daily_jobs_limit: before.dailyJobsLimit, monthly_spend_limit_halala: before.monthlySpendLimitHalala },
          after: { daily_jobs_limit: after.dailyJobsLimit, monthly_spend_limit_halala: after.monthlySpendLimitHalala },
          ip,
        });
        return renterAnswer(tx, await renterById(tx, renterId));
      });
    },

    async listJobs(req) {
      const p = page(req.limit, req.offset, 200, "narrow the list by status, renter_id, provider_id or job_type");
      const { rows, total } = await listJobs(sql, {
        status: req.status,
        renterId: req.renterId === undefined ? undefined : checkId(req.renterId, "renter_id"),
        providerId: req.providerId === undefined ? undefined : checkId(req.providerId, "provider_id"),
        jobType: req.jobType,
        ...p,
      });
      return { jobs: rows.map(jobMessage), total: BigInt(total), ...p };
    },

    async listPayments(req) {
      const p = page(req.limit, req.offset, 200, "narrow the list by status or renter_id");
      const { payments, total } = await listPayments(sql, {
        renterId: req.renterId === undefined ? undefined : checkId(req.renterId, "renter_id"),
        status: req.status === undefined ? undefined : checkEnum(req.status, PAYMENT_STATUSES, "status"),
        ...p,
      });
      return { payments: payments.map(paymentMessage), total: BigInt(total), ...p };
    },

    async cancelJob(req, ctx) {
      requireFields({ job_id: req.jobId });
      const { actor, ip } = auditActor(ctx);
      const { job } = await cancelJob(sql, req.jobId, { role: "admin", actor, ip }, optionalText(req.reason, REASON_MAX_CHARS, "reason"));
      return jobMessage(job);
    },

    async requeueJob(req, ctx) {
      requireFields({ job_id: req.jobId });
      const { actor, ip } = auditActor(ctx);
      return jobMessage(await requeueJob(sql, req.jobId, actor, optionalText(req.reason, REASON_MAX_CHARS, "reason"), ip));
    },

    async listAudit(req) {
      const p = page(req.limit, req.offset, 200, "narrow the list by action, target_type or target_id");
      const { rows, total } = await listAudit(sql, {
        action: optionalText(req.action, 100, "action"),
        targetType: optionalText(req.targetType, 100, "target_type"),
        targetId: optionalText(req.targetId, 100, "target_id"),
        ...p,
      });
      return {
        entries: rows.map((r) => ({
          id: BigInt(r.id),
          actor: r.actor,
          action: r.action,
          targetType: r.target_type,
          targetId: r.target_id,
          details: r.details as never,
          createdAt: r.created_at.toISOString(),
        })),
        total: BigInt(total),
        ...p,
      };
    },
  };
}
