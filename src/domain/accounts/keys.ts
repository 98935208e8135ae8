// Area accounts (src/domain/accounts): API keys and their rotation, email
// login, renter accounts, and the per-process key and provider caches with
// their cross-process invalidation. It may use shared, notify and money.
//
// API keys: random, prefixed by role, stored only as SHA-256 hashes.
import crypto from "node:crypto";
import type { Db } from "../../db/index.js";

export type KeyRole = "provider" | "renter";

export const KEY_PREFIX: Record<KeyRole, string> = {
  provider: "svc-provider-",
  renter: "svc-renter-",
};

export function hashKey(key: string): Buffer {
  return crypto.createHash("sha256").update(key).digest();
}

export function newKey(role: KeyRole): string {
  return KEY_PREFIX[role] + crypto.randomBytes(24).toString("base64url");
}

export function roleOfKey(key: string): KeyRole | undefined {
  if (key.startsWith(KEY_PREFIX.provider)) return "provider";
  if (key.startsWith(KEY_PREFIX.renter)) return "renter";
  return undefined;
}

/** Issues a new key for an account and returns it (the only time it is visible). */
export async function issueKey(db: Db, role: KeyRole, accountId: number): Promise<string> {
  const key = newKey(role);
  await db`
    INSERT INTO api_keys (key_hash, role, provider_id, renter_id)
    VALUES (${hashKey(key)}, ${role}, ${role === "provider" ? accountId : null}, ${role === "renter" ? accountId : null})`;
  return key;
}

export interface KeyOwner {
  role: KeyRole;
  accountId: number;
  /** A renter whose account is suspended: the key is valid but refused. Always false for providers. */
  suspended: boolean;
}

/** The live account a key belongs to, if any. */
export async function lookupKey(db: Db, key: string): Promise<KeyOwner | undefined> {
  if (!roleOfKey(key) || key.length > 200) return undefined;
  // The renter's status comes along (one round trip); a status change forgets cached owners (admin.ts).
  const [row] = await db<{ role: KeyRole; provider_id: number | null; renter_id: number | null; suspended: boolean | null }[]>`
    SELECT k.role, k.provider_id, k.renter_id, r.status = 'suspended' AS suspended
    FROM api_keys k LEFT JOIN renters r ON r.id = k.renter_id
    WHERE k.key_hash = ${hashKey(key)} AND k.revoked_at IS NULL`;
  if (!row) return undefined;
  return { role: row.role, accountId: (row.role === "provider" ? row.provider_id : row.renter_id)!, suspended: row.suspended === true };
}

/**
 * Whether one of these keys was issued and has since been revoked (a rotation): a key that worked once,
 * which callers are told is invalid, unlike a key no account was ever given.
 */
export async function anyKeyRevoked(db: Db, keys: readonly string[]): Promise<boolean> {
  const hashes = keys.filter((k) => roleOfKey(k) && k.length <= 200).map((k) => hashKey(k).toString("hex"));
  if (hashes.length === 0) return false;
  const [row] = await db`
    SELECT 1 FROM api_keys
    WHERE key_hash IN (SELECT decode(h, 'hex') FROM unnest(${hashes}::text[]) h) AND revoked_at IS NOT NULL
    LIMIT 1`;
  return row !== undefined;
}

export function constantTimeEqual(a: string, b: string): boolean {
  const ha = crypto.createHash("sha256").update(a).digest();
  const hb = crypto.createHash("sha256").update(b).digest();
  return crypto.timingSafeEqual(ha, hb);
}
