// AdminService, the provider part: listing, approval decisions, preload
// requests and the daemon event log. The rest of AdminService is admin.ts.
import type { HandlerContext, ServiceImpl } from "@connectrpc/connect";
import { AdminRejectProviderRequestSchema, SetPreloadModelRequestSchema, type AdminService } from "../../gen/svc/v1/admin_pb.js";
import { decideProvider, requestPreload, type AdminActor, type ApprovalAction } from "../domain/providers/approval.js";
import { daemonEventMessage, listDaemonEvents } from "../domain/providers/daemon-events.js";
import { afterJobsTakenOff, lockJobsOfProvider, takeJobsOffProvider } from "../domain/dispatch/dispatch.js";
import { failureLevel } from "../errors.js";
import { listProviders, providerById, providerMessage } from "../domain/providers/providers.js";
import { checkId } from "../domain/admin/admin.js";
import { page, requireMembers } from "../domain/shared/validate.js";
import { auditActor, type Deps } from "./deps.js";
import { recordAuditMany } from "../domain/shared/audit.js";

const REQUEUE_REASON: Partial<Record<ApprovalAction, string>> = {
  suspend: "provider suspended by an administrator",
  reject: "provider rejected by an administrator",
};

function actorOf(ctx: HandlerContext): AdminActor {
  const { actor, ip } = auditActor(ctx);
  return { actor, ip: ip || undefined };
}

export function adminProviderService(deps: Deps): Partial<ServiceImpl<typeof AdminService>> {
  const { sql, log } = deps;

  async function decide(id: bigint, action: ApprovalAction, reason: string | undefined, ctx: HandlerContext) {
    // The provider's jobs leave it in the transaction that suspends or rejects it: no report of its own
    // is taken in between (a result would be refused: the job is no longer its).
    const providerId = checkId(id, "id");
    const { outcome, removed } = await sql.begin(async (tx) => {
      // Its jobs first, then its row (in decideProvider): the order a settling result takes them in.
      // A rejected provider never takes work again: the queued jobs pinned to it end too.
      const pinnedQueued = action === "reject";
      const held = REQUEUE_REASON[action] ? await lockJobsOfProvider(tx, providerId, pinnedQueued) : [];
      const who = actorOf(ctx);
      const outcome = await decideProvider(sql, tx, providerId, action, who, reason);
      const removed = outcome.requeue ? await takeJobsOffProvider(tx, outcome.provider.id, "admin", REQUEUE_REASON[action]!, pinnedQueued) : undefined;
      if (removed) {
        // Each job taken off gets the entry an admin's re-queue of it writes: a job's own trail says who moved it.
        const why = `${REQUEUE_REASON[action]}${reason ? `: ${reason}` : ""}`;
        const ended = new Map<string, string>([...removed.requeued.map((j) => [j, "requeued"] as const), ...removed.failed.map((j) => [j, "failed"] as const)]);
        await recordAuditMany(
          tx,
          who.actor,
          "job.requeue",
          "job",
          held.filter((j) => ended.has(j.job_id)).map((j) => ({
            targetId: j.job_id,
            details: { from_provider: j.provider_id, attempt: j.attempt, outcome: ended.get(j.job_id), reason: why, ip: who.ip ?? null },
          })),
        );
      }
      return { outcome, removed };
    });
    if (removed) {
      await afterJobsTakenOff(sql, outcome.provider.id, removed).catch((err) =>
        log[failureLevel(err)]({ err, providerId: outcome.provider.id }, "placing a suspended provider's jobs failed"),
      );
    }
    if (outcome.changed) log.info({ providerId: outcome.provider.id, action }, "provider decision");
    return { success: true, provider: providerMessage(outcome.provider) };
  }

  return {
    async listProviders(req) {
      const { limit, offset } = page(req.limit, req.offset, 200, "narrow the list by status, approval_status, gpu_model or q");
      const { rows, total } = await listProviders(sql, {
        status: req.status,
        approvalStatus: req.approvalStatus,
        gpuModel: req.gpuModel,
        q: req.q,
        limit,
        offset,
      });
      return { providers: rows.map(providerMessage), total: BigInt(total), limit, offset };
    },

    async getProvider(req) {
      return providerMessage(await providerById(sql, checkId(req.id, "id")));
    },

    approveProvider: (req, ctx) => decide(req.id, "approve", req.reason, ctx),
    rejectProvider: (req, ctx) => {
      requireMembers(AdminRejectProviderRequestSchema, req);
      return decide(req.id, "reject", req.reason, ctx);
    },
    suspendProvider: (req, ctx) => decide(req.id, "suspend", req.reason, ctx),
    unsuspendProvider: (req, ctx) => decide(req.id, "unsuspend", req.reason, ctx),

    async setPreloadModel(req, ctx) {
      const id = checkId(req.id, "id");
      // Absent is not a clear: a misspelt field would otherwise drop the request already made.
      if (req.modelName === undefined) requireMembers(SetPreloadModelRequestSchema, req);
      const row = await sql.begin((tx) => requestPreload(sql, tx, id, req.modelName!, actorOf(ctx)));
      return { success: true, provider: providerMessage(row) };
    },

    async listProviderEvents(req) {
      const { limit, offset } = page(req.limit, req.offset, 200, "narrow the list by severity or event_type");
      const id = checkId(req.id, "id");
      await providerById(sql, id);
      const { rows, total } = await listDaemonEvents(sql, id, { severity: req.severity, eventType: req.eventType, limit, offset });
      return { events: rows.map(daemonEventMessage), total: BigInt(total) };
    },
  };
}
