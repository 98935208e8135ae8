// The fleet, queue and outbox figures an operator's monitoring reads
// (/metrics, src/metrics): a few aggregate statements, cheap on a large
// fleet and queue, read by each process at most once every few seconds.
// Label values are bounded: provider states and queue reason codes are fixed
// sets, GPU models the most common few (the rest "other"); never an id.
import type { Db } from "../../db/index.js";
import { explainQueue, liveSql } from "../dispatch/dispatch.js";
import type { JobRow } from "../shared/job-row.js";

/** GPU models named in the figures; the rest of the fleet counts as "other". */
export const GPU_MODEL_LABELS = 20;
/** Kinds of queued jobs whose reason is explained (one explainQueue each); the rest count as "other". */
export const QUEUE_GROUPS_EXPLAINED = 20;

export const PROVIDER_STATES = ["online", "offline", "paused", "pending_approval", "suspended", "rejected"] as const;

export interface OperationsFigures {
  providers: { state: string; gpuModel: string; count: number }[];
  queue: { reason: string; count: number }[];
  queueOldestAgeSeconds: number;
  webhookOutboxPending: number;
}

/** A GPU model as a label: trimmed, lower case, 64 characters at most. */
function modelLabel(m: string): string {
  return m.trim().toLowerCase().replace(/\s+/g, " ").slice(0, 64) || "unknown";
}

export async function operationsFigures(db: Db): Promise<OperationsFigures> {
  const [providers, queueGroups, queueAge, outbox] = await Promise.all([
    db<{ state: string; gpu_model: string; n: number }[]>`
      SELECT CASE WHEN p.approval_status = 'pending' THEN 'pending_approval'
                  WHEN p.approval_status = 'rejected' THEN 'rejected'
                  WHEN p.status = 'suspended' THEN 'suspended'
                  WHEN p.is_paused OR p.status = 'paused' THEN 'paused'
                  WHEN ${liveSql(db)} THEN 'online'
                  ELSE 'offline' END AS state,
             lower(btrim(p.gpu_model)) AS gpu_model, count(*)::bigint AS n
      FROM providers p GROUP BY 1, 2`,
    // Jobs with the same requested provider and requirements wait for the same reason:
    // one explanation per kind, the oldest job of each standing for the rest. A suspended
    // renter's jobs wait for that alone (renter_suspended): kinds of their own.
    db<{ rep: number; n: number }[]>`
      SELECT (array_agg(j.id ORDER BY j.priority, j.submitted_at, j.id))[1] AS rep, count(*)::bigint AS n
      FROM jobs j LEFT JOIN renters s ON s.id = j.renter_id AND s.status = 'suspended'
      WHERE j.status = 'queued'
      GROUP BY j.requested_provider_id, j.gpu_requirements::text, s.id IS NULL
      ORDER BY count(*) DESC`,
    db<{ age: number | null }[]>`
      SELECT extract(epoch FROM now() - min(submitted_at))::float8 AS age FROM jobs WHERE status = 'queued'`,
    // Read through the partial index of pending rows (delivered ones stay in the table).
    db<{ pending: number }[]>`SELECT count(*)::bigint AS pending FROM webhook_outbox WHERE status = 'pending'`,
  ]);

  // The most common GPU models by name; the others are folded into "other".
  const perModel = new Map<string, number>();
  for (const r of providers) perModel.set(modelLabel(r.gpu_model ?? ""), (perModel.get(modelLabel(r.gpu_model ?? "")) ?? 0) + Number(r.n));
  const named = new Set([...perModel.entries()].sort((a, b) => b[1] - a[1]).slice(0, GPU_MODEL_LABELS).map(([m]) => m));
  const fleet = new Map<string, { state: string; gpuModel: string; count: number }>();
  for (const r of providers) {
    const m = modelLabel(r.gpu_model ?? "");
    const gpuModel = named.has(m) ? m : "other";
    const key = `${r.state}\u0000${gpuModel}`;
    const f = fleet.get(key) ?? { state: r.state, gpuModel, count: 0 };
    f.count += Number(r.n);
    fleet.set(key, f);
  }

  const reasons = new Map<string, number>();
  const explained = queueGroups.slice(0, QUEUE_GROUPS_EXPLAINED);
  if (explained.length > 0) {
    const reps = await db<JobRow[]>`SELECT * FROM jobs WHERE id = ANY(${explained.map((g) => g.rep)}::bigint[])`;
    const byId = new Map(reps.map((j) => [j.id, j]));
    for (const g of explained) {
      const job = byId.get(g.rep);
      // Left the queue since the group was read: counted under the reason it no longer has would mislead.
      const code = job && job.status === "queued" ? (await explainQueue(db, job)).code : "waiting_for_dispatch";
      reasons.set(code, (reasons.get(code) ?? 0) + Number(g.n));
    }
  }
  const rest = queueGroups.slice(QUEUE_GROUPS_EXPLAINED).reduce((n, g) => n + Number(g.n), 0);
  if (rest > 0) reasons.set("other", rest);

  return {
    providers: [...fleet.values()],
    queue: [...reasons.entries()].map(([reason, count]) => ({ reason, count })),
    queueOldestAgeSeconds: Math.max(0, Number(queueAge[0]?.age ?? 0)),
    webhookOutboxPending: Number(outbox[0]?.pending ?? 0),
  };
}
