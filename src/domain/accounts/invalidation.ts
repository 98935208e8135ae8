// Cross-process cache invalidation over PostgreSQL LISTEN/NOTIFY. A change is
// announced inside the transaction that makes it, so other processes hear of
// it exactly when it commits (and never when it rolls back). The local
// process forgets at once as well.
import type { Db, Sql } from "../../db/index.js";
import { forgetAccountKeys, forgetAllKeys } from "./key-cache.js";
import { endStreamsOf, recheckOpenStreams } from "./open-streams.js";
import type { KeyRole } from "./keys.js";
import { providerCacheOf } from "./provider-cache.js";

export const INVALIDATION_CHANNEL = "svc_cache_invalidate";
/** NOTIFY payloads are limited to 8000 bytes; ids are sent in chunks. */
const IDS_PER_MESSAGE = 500;

/** Provider state changed (approval, status, pause, preload): forget it everywhere. */
export async function providersChanged(sql: Sql, db: Db, ids: number[]): Promise<void> {
  if (ids.length === 0) return;
  providerCacheOf(sql).forget(ids);
  for (let i = 0; i < ids.length; i += IDS_PER_MESSAGE) {
    await db`SELECT pg_notify(${INVALIDATION_CHANNEL}, ${"provider:" + ids.slice(i, i + IDS_PER_MESSAGE).join(",")})`;
  }
}

/**
 * An account's keys were revoked, or what a cached key owner carries changed
 * (a renter suspended or reinstated): forget its keys everywhere.
 */
export async function accountKeysChanged(db: Db, role: KeyRole, accountId: number): Promise<void> {
  forgetAccountKeys(role, accountId);
  await db`SELECT pg_notify(${INVALIDATION_CHANNEL}, ${`key:${role}:${accountId}`})`;
}

/** Applies one notification to this process's caches. */
export function applyInvalidation(sql: Sql, payload: string): void {
  const [kind, ...rest] = payload.split(":");
  if (kind === "provider") {
    providerCacheOf(sql).forget(rest.join(":").split(",").map(Number).filter(Number.isFinite));
  } else if (kind === "key" && (rest[0] === "provider" || rest[0] === "renter")) {
    forgetAccountKeys(rest[0], Number(rest[1]));
    // After the commit (a notice is delivered then), so a stream reopened meanwhile is refused.
    endStreamsOf(sql, rest[0], Number(rest[1]));
  }
}

/**
 * After (re)connecting the listener, messages may have been missed: start cold,
 * and check the keys of the streams open meanwhile, which no cache clearing
 * reaches (a failed check is made up for by the periodic one, open-streams.ts).
 */
export function forgetEverything(sql: Sql): void {
  providerCacheOf(sql).clear();
  forgetAllKeys();
  recheckOpenStreams(sql).catch(() => {});
}
