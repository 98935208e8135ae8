// Area providers (src/domain/providers): registration, approval, heartbeats,
// preferences, readiness, versions, daemon events, reputation and the
// marketplace listing. It may use shared, notify, money and accounts; it
// reaches dispatch only through the offerWork callback its caller passes.
//
// Provider accounts: registration, lookup and the Provider resource shape.
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { ProviderSchema } from "../../../gen/svc/v1/models_pb.js";
import type { Db, Sql, Tx } from "../../db/index.js";
import { conflict, forbidden, isUniqueViolation, notFound } from "../../errors.js";
import { providersChanged } from "../accounts/invalidation.js";
import { issueKey } from "../accounts/keys.js";
import { LIVE_WINDOW_SECONDS } from "../shared/liveness.js";
import { checkEnum, countedFor, iso } from "../shared/validate.js";
import { preferenceFields } from "./preferences.js";
import { belowMinimum } from "./versions.js";

export const PROVIDER_OS = ["windows", "linux", "mac", "darwin"] as const;
export type ProviderOs = (typeof PROVIDER_OS)[number];

export interface ProviderRow {
  id: number;
  name: string;
  email: string;
  gpu_model: string;
  os: string;
  status: string;
  approval_status: string;
  rejection_reason: string | null;
  is_paused: boolean;
  run_mode: string;
  scheduled_start: string | null;
  scheduled_end: string | null;
  gpu_usage_cap_pct: number;
  vram_reserve_gb: number;
  temp_limit_c: number;
  last_heartbeat: Date | null;
  daemon_version: string | null;
  gpu_vram_mib: number | null;
  gpu_count: number;
  /** What an admin approved (migration 047): placement counts no more; null: no cap. */
  approved_gpu_count: number | null;
  approved_vram_mib: number | null;
  gpu_compute_capability: string | null;
  gpu_cuda_version: string | null;
  gpu_driver_version: string | null;
  gpu_telemetry: Record<string, unknown> | null;
  cached_models: string[];
  location: string | null;
  readiness_status: string | null;
  reliability_score: number | null;
  uptime_percent: number;
  total_earnings_halala: number;
  total_jobs: number;
  preload_model: string | null;
  created_at: Date;
  first_heartbeat_at: Date | null;
  status_since: Date;
  suspended_reason: string | null;
  /** Why its daemon cannot verify this server's tasks (task-key.ts); no dispatch while set. */
  task_key_mismatch: string | null;
  /** The job types its daemon declared it runs (migration 049); null: declared none, offered every type. */
  supported_job_types: string[] | null;
}

export const PROVIDER_STATUSES = ["registered", "connected", "online", "offline", "paused", "suspended"] as const;
export const APPROVAL_STATUSES = ["pending", "approved", "rejected"] as const;

export async function registerProvider(
  tx: Tx,
  input: { name: string; email: string; gpuModel: string; os: ProviderOs; phone?: string; resourceSpec?: object },
): Promise<{ id: number; apiKey: string }> {
  try {
    const [row] = await tx<{ id: number }[]>`
      INSERT INTO providers (name, email, gpu_model, os, phone, resource_spec)
      VALUES (${input.name}, ${input.email}, ${input.gpuModel}, ${input.os}, ${input.phone ?? null},
              ${input.resourceSpec ? tx.json(input.resourceSpec as never) : null})
      RETURNING id`;
    return { id: row.id, apiKey: await issueKey(tx, "provider", row.id) };
  } catch (err) {
    if (isUniqueViolation(err, "providers_email_key")) throw conflict("a provider with this email is already registered");
    throw err;
  }
}

export async function providerById(db: Db, id: number): Promise<ProviderRow> {
  const [row] = await db<ProviderRow[]>`SELECT * FROM providers WHERE id = ${id}`;
  if (!row) throw notFound("provider not found");
  return row;
}

/** What a daemon stream tells its daemon about its provider (DaemonSettings). */
export type DaemonSettingsRow = Pick<
  ProviderRow,
  "id" | "is_paused" | "status" | "run_mode" | "scheduled_start" | "scheduled_end" | "gpu_usage_cap_pct" | "vram_reserve_gb" | "temp_limit_c" | "approval_status"
>;

/** The daemon settings of each of these providers, by id (missing: no such provider). */
export async function daemonSettingsOf(db: Db, ids: number[]): Promise<Map<number, DaemonSettingsRow>> {
  const rows = await db<DaemonSettingsRow[]>`
    SELECT id, is_paused, status, run_mode, scheduled_start, scheduled_end, gpu_usage_cap_pct, vram_reserve_gb, temp_limit_c, approval_status
    FROM providers WHERE id = ANY(${ids}::bigint[])`;
  return new Map(rows.map((r) => [r.id, r]));
}

export async function providerByEmail(db: Db, email: string): Promise<ProviderRow | undefined> {
  const [row] = await db<ProviderRow[]>`SELECT * FROM providers WHERE lower(email) = ${email.toLowerCase()}`;
  return row;
}

/** Whether a provider reports more GPUs, or more memory, than it was approved with. */
export function reportsUnapprovedHardware(p: Pick<ProviderRow, "gpu_count" | "gpu_vram_mib" | "approved_gpu_count" | "approved_vram_mib">): boolean {
  return (
    (p.approved_gpu_count != null && p.gpu_count > p.approved_gpu_count) ||
    (p.approved_vram_mib != null && Number(p.gpu_vram_mib ?? 0) > Number(p.approved_vram_mib))
  );
}

/** The Provider resource of the interface. */
export function providerMessage(p: ProviderRow): MessageInitShape<typeof ProviderSchema> {
  return {
    id: BigInt(p.id),
    name: p.name,
    email: p.email,
    gpuModel: p.gpu_model,
    status: p.status,
    lastHeartbeat: iso(p.last_heartbeat),
    daemonVersion: p.daemon_version ?? undefined,
    daemonNeedsUpdate: belowMinimum(p.daemon_version),
    uptimePercent: p.uptime_percent,
    totalEarningsHalala: BigInt(p.total_earnings_halala),
    totalJobs: BigInt(p.total_jobs),
    gpuVramMib: p.gpu_vram_mib === null ? undefined : BigInt(p.gpu_vram_mib),
    gpuCountReported: BigInt(p.gpu_count),
    gpuComputeCapability: p.gpu_compute_capability ?? undefined,
    gpuCudaVersion: p.gpu_cuda_version ?? undefined,
    isPaused: p.is_paused,
    ...preferenceFields(p),
    approvalStatus: p.approval_status,
    reliabilityScore: p.reliability_score ?? undefined,
    createdAt: iso(p.created_at)!,
    readinessStatus: p.readiness_status ?? undefined,
    rejectionReason: p.rejection_reason ?? undefined,
    taskKeyMismatch: p.task_key_mismatch ?? undefined,
    gpuCountApproved: p.approved_gpu_count == null ? undefined : BigInt(p.approved_gpu_count),
    gpuVramMibApproved: p.approved_vram_mib == null ? undefined : BigInt(p.approved_vram_mib),
    hardwareNeedsApproval: reportsUnapprovedHardware(p),
    supportedJobTypes: p.supported_job_types ?? [],
  };
}

/**
 * Pause: the provider keeps heartbeating but gets no new jobs (running ones
 * finish). 403 for a suspended provider: only an operator changes that state.
 * The update marks the provider's load row away (a trigger, migration 060),
 * waiting for an assignment to it in flight: the pause is answered after that
 * job landed (a daemon that refuses it as paused hands it back at no cost to
 * anyone: dispatch's loseJobLocked), and no job is assigned after it.
 */
export async function pauseProvider(sql: Sql, id: number): Promise<string> {
  return sql.begin(async (tx) => {
    const [row] = await tx<{ status: string }[]>`SELECT status FROM providers WHERE id = ${id} FOR NO KEY UPDATE`;
    if (!row) throw notFound("provider not found");
    if (row.status === "suspended") throw forbidden("provider is suspended; contact support");
    await tx`
      UPDATE providers SET is_paused = true, status = 'paused',
        status_since = CASE WHEN status = 'paused' THEN status_since ELSE now() END, updated_at = now()
      WHERE id = ${id}`;
    await providersChanged(sql, tx, [id]);
    return "paused";
  });
}

/**
 * Resume: online when the provider is approved and its daemon was heard from
 * within the live window, otherwise connected (waiting for its next accepted
 * heartbeat; the sweep moves it offline if none comes within the window): a
 * rejected provider, whose heartbeats are refused, is never brought back online
 * by its owner. Its load row is no longer away (migration 060) once this commits.
 */
export async function resumeProvider(sql: Sql, id: number): Promise<{ status: string; becameOnline: boolean }> {
  return sql.begin(async (tx) => {
    const [row] = await tx<{ status: string }[]>`SELECT status FROM providers WHERE id = ${id} FOR NO KEY UPDATE`;
    if (!row) throw notFound("provider not found");
    if (row.status === "suspended") throw forbidden("provider is suspended; contact support");
    const [after] = await tx<{ status: string }[]>`
      UPDATE providers SET is_paused = false,
        status = CASE WHEN approval_status = 'approved' AND last_heartbeat >= now() - make_interval(secs => ${LIVE_WINDOW_SECONDS})
                      THEN 'online' ELSE 'connected' END,
        updated_at = now()
      WHERE id = ${id} RETURNING status`;
    if (after.status !== row.status) await tx`UPDATE providers SET status_since = now() WHERE id = ${id}`;
    await providersChanged(sql, tx, [id]);
    return { status: after.status, becameOnline: after.status === "online" && row.status !== "online" };
  });
}

export interface ProviderFilter {
  status?: string;
  approvalStatus?: string;
  gpuModel?: string;
  q?: string;
  limit: number;
  offset: number;
}

/** Admin listing: newest first, filtered by status, approval, GPU model (substring) and name/email (substring); the total counted up to LIST_COUNTED, or one past the page. */
export async function listProviders(db: Db, f: ProviderFilter): Promise<{ rows: ProviderRow[]; total: number }> {
  const status = f.status ? checkEnum(f.status, PROVIDER_STATUSES, "status") : null;
  const approval = f.approvalStatus ? checkEnum(f.approvalStatus, APPROVAL_STATUSES, "approval_status") : null;
  const like = (v: string | undefined) => (v?.trim() ? `%${v.trim().replace(/[\\%_]/g, (c) => "\\" + c)}%` : null);
  const gpu = like(f.gpuModel);
  const q = like(f.q);
  const where = db`(${status}::text IS NULL OR status = ${status})
    AND (${approval}::text IS NULL OR approval_status = ${approval})
    AND (${gpu}::text IS NULL OR gpu_model ILIKE ${gpu})
    AND (${q}::text IS NULL OR name ILIKE ${q} OR email ILIKE ${q})`;
  const [rows, [{ total }]] = await Promise.all([
    db<ProviderRow[]>`SELECT * FROM providers WHERE ${where} ORDER BY id DESC LIMIT ${f.limit} OFFSET ${f.offset}`,
    db<{ total: number }[]>`SELECT count(*)::bigint AS total FROM (SELECT 1 FROM providers WHERE ${where} LIMIT ${countedFor(f)}) c`,
  ]);
  return { rows, total };
}
