// What the heartbeat fast path needs to know about a provider, cached in
// process. An entry is only trusted while fresh and only to decide that a
// heartbeat changes no state; every change of these fields (admin actions,
// pause/resume, the sweep, a heartbeat's own transition) forgets the entry
// here and, through NOTIFY at commit, in every other process
// (src/domain/accounts/invalidation.ts). PROVIDER_CACHE_TTL_MS bounds a missed
// notification. A forgotten provider is remembered as changed for as long:
// its next beat goes straight to the state-changing write, which reads the
// row under its lock anyway (after the sweep took a whole fleet offline, no
// read per provider first).
import type { Sql } from "../../db/index.js";

export const PROVIDER_CACHE_TTL_MS = 120_000;
const MAX_ENTRIES = 1_000_000;

export interface ProviderState {
  approvalStatus: string;
  status: string;
  isPaused: boolean;
  preloadModel: string | null;
  daemonVersion: string | null;
  /** The declared job types as jobTypesKey() writes them; null: none declared (every type). */
  jobTypes: string | null;
  /** When the entry was read from (or written to) the database. */
  checkedAt: number;
}

export class ProviderStateCache {
  /** A state, or when the provider was announced changed. */
  private readonly map = new Map<number, ProviderState | number>();

  /** The cached state, undefined when not cached (or only known to have changed). */
  get(id: number, now = Date.now()): ProviderState | undefined {
    const e = this.fresh(id, now);
    return typeof e === "number" ? undefined : e;
  }

  /** Whether the provider's state was announced changed since it was last cached. */
  changed(id: number, now = Date.now()): boolean {
    return typeof this.fresh(id, now) === "number";
  }

  private fresh(id: number, now: number): ProviderState | number | undefined {
    const e = this.map.get(id);
    if (e === undefined) return undefined;
    if (now - (typeof e === "number" ? e : e.checkedAt) > PROVIDER_CACHE_TTL_MS) {
      this.map.delete(id);
      return undefined;
    }
    return e;
  }

  set(id: number, state: ProviderState): void {
    if (this.map.size >= MAX_ENTRIES && !this.map.has(id)) this.map.clear();
    this.map.set(id, state);
  }

  /** Forgets the providers' states, remembering that they changed. */
  forget(ids: Iterable<number>): void {
    const now = Date.now();
    for (const id of ids) {
      if (this.map.size >= MAX_ENTRIES && !this.map.has(id)) this.map.clear();
      this.map.set(id, now);
    }
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
