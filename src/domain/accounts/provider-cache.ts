// What the heartbeat fast path needs to know about a provider, cached in
// process. An entry is only trusted while fresh and only to decide that a
// heartbeat changes no state; every change of these fields (admin actions,
// pause/resume, the sweep, a heartbeat's own transition) forgets the entry
// here and, through NOTIFY at commit, in every other process
// (src/domain/accounts/invalidation.ts). PROVIDER_CACHE_TTL_MS bounds a missed
// notification.
import type { Sql } from "../../db/index.js";

export const PROVIDER_CACHE_TTL_MS = 120_000;
const MAX_ENTRIES = 1_000_000;

export interface ProviderState {
  approvalStatus: string;
  status: string;
  isPaused: boolean;
  preloadModel: string | null;
  daemonVersion: string | null;
  /** When the entry was read from (or written to) the database. */
  checkedAt: number;
}

export class ProviderStateCache {
  private readonly map = new Map<number, ProviderState>();

  get(id: number, now = Date.now()): ProviderState | undefined {
    const e = this.map.get(id);
    if (!e) return undefined;
    if (now - e.checkedAt > PROVIDER_CACHE_TTL_MS) {
      this.map.delete(id);
      return undefined;
    }
    return e;
  }

  set(id: number, state: ProviderState): void {
    if (this.map.size >= MAX_ENTRIES && !this.map.has(id)) this.map.clear();
    this.map.set(id, state);
  }

  forget(ids: Iterable<number>): void {
    for (const id of ids) this.map.delete(id);
  }

  clear(): void {
    this.map.clear();
  }

  get size(): number {
    return this.map.size;
  }
}

const caches = new WeakMap<Sql, ProviderStateCache>();

/** The cache of the process's pool (one per database connection pool). */
export function providerCacheOf(sql: Sql): ProviderStateCache {
  let c = caches.get(sql);
  if (!c) caches.set(sql, (c = new ProviderStateCache()));
  return c;
}
