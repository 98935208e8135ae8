// What renters see of the supply: the available-providers list and the
// public marketplace summary (GPU models, counts online, VRAM, prices).
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { AvailableProviderSchema, GetMarketplaceResponseSchema } from "../../../gen/svc/v1/providers_pb.js";
import type { Db } from "../../db/index.js";
import { LIVE_WINDOW_SECONDS } from "../shared/liveness.js";
import { RATE_HALALA_PER_MINUTE } from "../money/pricing.js";
import { reusedFor } from "../shared/reuse.js";

/** Discovery is the database only (no DHT): the documented `sqlite` mode and source. */
export const DISCOVERY_MODE = "sqlite";
export const DISCOVERY_SOURCE = "sqlite";
export const DISCOVERY_HEALTH = { mode: DISCOVERY_MODE, enabled: false, announcementEnabled: false, bootstrapConfigured: false };

/** VRAM in whole GB as listed to renters (MiB / 1024, rounded: a 24564 MiB card is 24 GB). */
export const vramGb = (mib: number | null) => Math.round((mib ?? 0) / 1024);

interface AvailableRow {
  id: number;
  name: string;
  gpu_model: string;
  gpu_vram_mib: number | null;
  gpu_count: number;
  gpu_driver_version: string | null;
  gpu_compute_capability: string | null;
  gpu_cuda_version: string | null;
  status: string;
  location: string | null;
  reliability_score: number | null;
  cached_models: string[];
  is_live: boolean;
}

/**
 * Available = status online, approved, not paused (the spec's rule). One not heard within the live
 * window is listed with is_live false until the liveness sweep marks it offline.
 */
const AVAILABLE = (db: Db) => db`status = 'online' AND NOT is_paused AND approval_status = 'approved'`;

/** A page of the available providers in the list's order, read along providers_available_idx (migration 038). */
export const availablePageSql = (db: Db, limit: number, offset: number) => db<AvailableRow[]>`
  SELECT id, name, gpu_model, gpu_vram_mib, gpu_count, gpu_driver_version, gpu_compute_capability, gpu_cuda_version,
         status, location, reliability_score, cached_models,
         coalesce(last_heartbeat >= now() - make_interval(secs => ${LIVE_WINDOW_SECONDS}), false) AS is_live
  FROM providers WHERE ${AVAILABLE(db)}
  ORDER BY gpu_vram_mib DESC NULLS LAST, reliability_score DESC NULLS LAST, id
  LIMIT ${limit} OFFSET ${offset}`;

/** How many providers are available now: it visits each of them (about 30 ms at 100,000 online). */
export async function availableCount(db: Db): Promise<number> {
  const [{ total }] = await db<{ total: number }[]>`SELECT count(*)::bigint AS total FROM providers WHERE ${AVAILABLE(db)}`;
  return total;
}

/**
 * How long one process reuses the count of available providers for pages
 * that do not reach the end of the list. The list needs no credential and
 * may be asked for 300 times a minute per address; counting a fleet of
 * 100,000 on each call would let a few addresses keep a core of the database busy.
 */
export const AVAILABLE_COUNT_REUSE_MS = 5_000;

/**
 * The available providers, largest VRAM first (then most reliable, then
 * oldest), and how many there are. A page shorter than asked ends the list,
 * so the total is exact (offset plus its rows) without counting; a full page
 * takes it from `count` (availableCount, reused a few seconds), never less
 * than the rows up to the end of the page, and an empty page past the end
 * never more than its offset.
 *
 * A page at an offset reads every available provider before it (SQL OFFSET
 * along the index), and the route needs no credential: an offset at or past
 * `count` answers no providers and that count without reading any, so an
 * offset far past the fleet costs no walk of it. (The count may be a few
 * seconds old: providers that came online since are listed once it is read
 * again.)
 */
export async function availableProviders(
  db: Db,
  limit: number,
  offset: number,
  count: () => Promise<number> = () => availableCount(db),
): Promise<{ providers: MessageInitShape<typeof AvailableProviderSchema>[]; total: number }> {
  let counted: number | undefined;
  if (offset > 0) {
    counted = await count();
    if (offset >= counted) return { providers: [], total: counted };
  }
  const counts = async () => counted ?? (await count());
  const rows = await availablePageSql(db, limit, offset);
  let total: number;
  if (rows.length === limit) total = Math.max(await counts(), offset + limit);
  else if (rows.length > 0 || offset === 0) total = offset + rows.length;
  else total = Math.min(await counts(), offset); // past the end: there are at most `offset`
  return {
    total,
    providers: rows.map((r) => ({
      id: BigInt(r.id),
      name: r.name,
      gpuModel: r.gpu_model,
      vramGb: BigInt(vramGb(r.gpu_vram_mib)),
      vramMib: BigInt(r.gpu_vram_mib ?? 0),
      gpuCount: BigInt(r.gpu_count),
      driverVersion: r.gpu_driver_version ?? undefined,
      computeCapability: r.gpu_compute_capability ?? undefined,
      cudaVersion: r.gpu_cuda_version ?? undefined,
      status: r.status,
      isLive: r.is_live,
      location: r.location ?? undefined,
      reliabilityScore: r.reliability_score ?? undefined,
      cachedModels: r.cached_models,
      discoverySource: DISCOVERY_SOURCE,
      discoveredAt: undefined,
      addrs: [],
      stale: false,
    })),
  };
}

/** Seconds a marketplace answer may be cached by clients and proxies. */
export const MARKETPLACE_MAX_AGE_SECONDS = 30;

/**
 * How long one process answers with the same summary. It reads every approved provider (18 ms at
 * 10,000 in EXPLAIN ANALYZE, growing with the fleet), and the endpoint is public: a rate limit per
 * address does not bound it across many addresses. Its answers may be cached MARKETPLACE_MAX_AGE_SECONDS
 * by anyone anyway, and each says when it was made (generated_at).
 */
export const MARKETPLACE_REUSE_MS = 5_000;

type Summary = MessageInitShape<typeof GetMarketplaceResponseSchema>;

/** marketplaceSummary, read at most once per `reuseMs` (of `clock`). */
export const marketplaceSummaries = (db: Db, reuseMs = MARKETPLACE_REUSE_MS, clock: () => number = Date.now): (() => Promise<Summary>) =>
  reusedFor(() => marketplaceSummary(db), reuseMs, clock);

/** Supply per GPU model among approved providers, with the rate table. */
export async function marketplaceSummary(db: Db): Promise<Summary> {
  const rows = await db<{ gpu_model: string; online: number; total: number; vram_mib: number; gpus_online: number }[]>`
    SELECT gpu_model,
           count(*) FILTER (WHERE ${AVAILABLE(db)})::bigint AS online,
           count(*)::bigint AS total,
           coalesce(max(gpu_vram_mib), 0)::bigint AS vram_mib,
           coalesce(sum(greatest(gpu_count, 1)) FILTER (WHERE ${AVAILABLE(db)}), 0)::bigint AS gpus_online
    FROM providers
    WHERE approval_status = 'approved' AND status <> 'suspended'
    GROUP BY gpu_model
    ORDER BY online DESC, vram_mib DESC, gpu_model`;
  return {
    gpus: rows.map((r) => ({
      gpuModel: r.gpu_model,
      providersOnline: BigInt(r.online),
      providersTotal: BigInt(r.total),
      vramMib: BigInt(r.vram_mib),
      vramGb: BigInt(vramGb(r.vram_mib)),
      gpuCountOnline: BigInt(r.gpus_online),
    })),
    providersOnline: BigInt(rows.reduce((n, r) => n + r.online, 0)),
    gpusOnline: BigInt(rows.reduce((n, r) => n + r.gpus_online, 0)),
    rates: Object.entries(RATE_HALALA_PER_MINUTE).map(([jobType, rate]) => ({ jobType, rateHalalaPerMinute: BigInt(rate) })),
    generatedAt: new Date().toISOString(),
  };
}
