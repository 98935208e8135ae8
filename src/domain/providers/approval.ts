// Operator decisions on providers: approve, reject, suspend, unsuspend and a
// preload request. Each runs in the caller's transaction with its audit
// entry, and announces the change to every process's heartbeat cache.
import type { Sql, Tx } from "../../db/index.js";
import { badRequest, notFound } from "../../errors.js";
import { recordAudit } from "../shared/audit.js";
import { providersChanged } from "../accounts/invalidation.js";
import { reportsUnapprovedHardware, type ProviderRow } from "./providers.js";

export interface AdminActor {
  actor: string;
  ip?: string;
}

export type ApprovalAction = "approve" | "reject" | "suspend" | "unsuspend";

export interface ActionOutcome {
  provider: ProviderRow;
  /** False when the provider was already in the asked-for state (nothing changed; the call is still audited). */
  changed: boolean;
  /** The provider lost its ability to work: its running jobs must be re-queued after commit. */
  requeue: boolean;
}

async function lockProvider(tx: Tx, id: number): Promise<ProviderRow> {
  const [row] = await tx<ProviderRow[]>`SELECT * FROM providers WHERE id = ${id} FOR NO KEY UPDATE`;
  if (!row) throw notFound("provider not found");
  return row;
}

/**
 * Applies one decision and audits it. Repeating a decision changes nothing
 * and answers the current state (PATCH and retries are safe).
 * - approve: pending/rejected -> approved; the next heartbeat brings it online.
 * - reject (its request requires the reason: AdminRejectProviderRequest): -> rejected;
 *   an online provider goes offline.
 * - suspend: -> status suspended (heartbeats refused, no jobs); approval kept.
 * - unsuspend: suspended -> paused when the owner had paused it, else offline
 *   until its next heartbeat.
 */
export async function decideProvider(
  sql: Sql,
  tx: Tx,
  id: number,
  action: ApprovalAction,
  who: AdminActor,
  reason?: string,
): Promise<ActionOutcome> {
  const why = reason?.trim() || undefined;
  if (why && why.length > 1000) throw badRequest("reason must be at most 1000 characters");
  const before = await lockProvider(tx, id);
  let after: ProviderRow[] = [];
  let requeue = false;
  switch (action) {
    case "approve":
      // Approving approves the hardware its telemetry shows now (none reported yet: its first report,
      // heartbeat-write.ts): placement counts no more GPUs, nor more memory (migration 047). An approved
      // provider reporting more is approved again to use it.
      if (before.approval_status === "approved" && !reportsUnapprovedHardware(before)) break;
      after = await tx<ProviderRow[]>`
        UPDATE providers SET approval_status = 'approved', rejection_reason = NULL, approved_at = now(), updated_at = now(),
          approved_gpu_count = CASE WHEN gpu_vram_mib IS NULL THEN NULL ELSE greatest(gpu_count, 1) END,
          approved_vram_mib = gpu_vram_mib
        WHERE id = ${id} RETURNING *`;
      break;
    case "reject":
      if (before.approval_status === "rejected" && before.rejection_reason === why) break;
      after = await tx<ProviderRow[]>`
        UPDATE providers SET approval_status = 'rejected', rejection_reason = ${why!}, approved_at = NULL,
          status = CASE WHEN status IN ('online', 'connected') THEN 'offline' ELSE status END,
          status_since = CASE WHEN status IN ('online', 'connected') THEN now() ELSE status_since END,
          updated_at = now()
        WHERE id = ${id} RETURNING *`;
      requeue = before.approval_status === "approved";
      break;
    case "suspend":
      if (before.status === "suspended") break;
      after = await tx<ProviderRow[]>`
        UPDATE providers SET status = 'suspended', suspended_reason = ${why ?? null}, status_since = now(), updated_at = now()
        WHERE id = ${id} RETURNING *`;
      requeue = true;
      break;
    case "unsuspend":
      if (before.status !== "suspended") break;
      after = await tx<ProviderRow[]>`
        UPDATE providers SET status = CASE WHEN is_paused THEN 'paused' ELSE 'offline' END, suspended_reason = NULL,
          status_since = now(), updated_at = now()
        WHERE id = ${id} RETURNING *`;
      break;
  }
  const changed = after.length > 0;
  const provider = changed ? after[0] : before;
  if (changed) {
    // Waits for an assignment to it in flight, whose job the caller's re-queue then finds; one that
    // locks the row later sees it closed (migration 056).
    const closed = provider.status === "suspended" || provider.approval_status === "rejected";
    await tx`UPDATE provider_load SET closed = ${closed} WHERE provider_id = ${id} AND closed <> ${closed}`;
  }
  await recordAudit(tx, who.actor, `provider.${action}`, "provider", id, {
    reason: why ?? null,
    changed,
    from: { status: before.status, approval_status: before.approval_status },
    to: { status: provider.status, approval_status: provider.approval_status },
    ip: who.ip ?? null,
  });
  if (changed) await providersChanged(sql, tx, [id]);
  return { provider, changed, requeue };
}

/** Asks the provider's daemon (through heartbeat) to download a model; "" clears the request. */
export async function requestPreload(sql: Sql, tx: Tx, id: number, modelName: string, who: AdminActor): Promise<ProviderRow> {
  const model = modelName.trim();
  if (model.length > 300) throw badRequest("model_name must be at most 300 characters");
  const before = await lockProvider(tx, id);
  const [after] = await tx<ProviderRow[]>`
    UPDATE providers SET preload_model = ${model || null}, preload_requested_at = ${model ? new Date() : null}, updated_at = now()
    WHERE id = ${id} RETURNING *`;
  await recordAudit(tx, who.actor, model ? "provider.preload_model" : "provider.preload_model_cleared", "provider", id, {
    ...(model ? { model_name: model } : {}),
    ...(before.preload_model ? { previous: before.preload_model } : {}),
    ip: who.ip ?? null,
  });
  await providersChanged(sql, tx, [id]);
  return after;
}
