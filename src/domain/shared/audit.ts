// The audit log: every admin action, written in the action's transaction.
import type { Db } from "../../db/index.js";

export async function recordAudit(
  db: Db,
  actor: string,
  action: string,
  targetType: string,
  targetId: string | number,
  details: Record<string, unknown> = {},
): Promise<void> {
  await db`
    INSERT INTO audit_log (actor, action, target_type, target_id, details)
    VALUES (${actor}, ${action}, ${targetType}, ${String(targetId)}, ${db.json(details as never)})`;
}
