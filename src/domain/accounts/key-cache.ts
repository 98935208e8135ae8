// A short-lived in-process cache of API key -> account, so a heartbeat does
// not pay a key lookup per request. Only keys found valid are cached (an
// unknown key always reaches the database).
//
// Revocation (rotate-key): rotateKeys() forgets the account's cached keys at
// once in this process and refuses to cache that account again for
// KEY_CACHE_TTL_MS, which covers the rotation's transaction until it commits.
// Other processes hear of it through NOTIFY at commit (src/domain/accounts/invalidation.ts)
// and forget the account then; if that channel is down, a revoked key stays
// usable there for at most KEY_CACHE_TTL_MS.
import crypto from "node:crypto";
import { lookupKey, type KeyOwner, type KeyRole } from "./keys.js";
import type { Db } from "../../db/index.js";

export const KEY_CACHE_TTL_MS = 120_000;
const MAX_ENTRIES = 500_000;

interface Entry {
  owner: KeyOwner;
  expires: number;
}

const byHash = new Map<string, Entry>();
const hashesOfAccount = new Map<string, Set<string>>();
const blockedUntil = new Map<string, number>();

const accountKey = (role: KeyRole, id: number) => `${role}:${id}`;

/**
 * What the cache (and the open streams, open-streams.ts) knows a key by: its SHA-256 in base64
 * (one-shot crypto.hash), never the key itself. The same digest as api_keys.key_hash.
 */
export const keyHashOf = (key: string): string => crypto.hash("sha256", key, "base64");

/** The live account a key belongs to (cached when valid). `hash`: keyHashOf(key), when the caller has it already. */
export async function cachedLookupKey(db: Db, key: string, hash = keyHashOf(key)): Promise<KeyOwner | undefined> {
  const now = Date.now();
  const hit = byHash.get(hash);
  if (hit && hit.expires > now) return hit.owner;
  if (hit) byHash.delete(hash);
  const owner = await lookupKey(db, key);
  if (!owner) return undefined;
  const acct = accountKey(owner.role, owner.accountId);
  const blocked = blockedUntil.get(acct);
  if (blocked !== undefined) {
    if (blocked > Date.now()) return owner;
    blockedUntil.delete(acct);
  }
  if (byHash.size >= MAX_ENTRIES) {
    // Drop the oldest tenth (Map keeps insertion order).
    let n = MAX_ENTRIES / 10;
    for (const h of byHash.keys()) {
      byHash.delete(h);
      if (--n <= 0) break;
    }
  }
  byHash.set(hash, { owner, expires: Date.now() + KEY_CACHE_TTL_MS });
  let set = hashesOfAccount.get(acct);
  if (!set) hashesOfAccount.set(acct, (set = new Set()));
  set.add(hash);
  return owner;
}

/** Forgets every cached key of the account and keeps it uncached for one TTL. */
export function forgetAccountKeys(role: KeyRole, accountId: number): void {
  const acct = accountKey(role, accountId);
  blockedUntil.set(acct, Date.now() + KEY_CACHE_TTL_MS);
  for (const h of hashesOfAccount.get(acct) ?? []) byHash.delete(h);
  hashesOfAccount.delete(acct);
}

/** Forgets everything (e.g. after the invalidation channel reconnects and may have missed messages). */
export function forgetAllKeys(): void {
  byHash.clear();
  hashesOfAccount.clear();
}
