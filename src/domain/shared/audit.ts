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

/** One action on many targets (a suspension's stopped jobs), one entry each, in one statement. */
export async function recordAuditMany(
  db: Db,
  actor: string,
  action: string,
  targetType: string,
  entries: { targetId: string | number; details: Record<string, unknown> }[],
): Promise<void> {
  if (entries.length === 0) return;
  await db`
    INSERT INTO audit_log (actor, action, target_type, target_id, details)
    SELECT ${actor}, ${action}, ${targetType}, t.id, t.details::jsonb
    FROM unnest(${entries.map((e) => String(e.targetId))}::text[], ${entries.map((e) => JSON.stringify(e.details))}::text[]) WITH ORDINALITY AS t(id, details, ord)
    ORDER BY t.ord`;
}
