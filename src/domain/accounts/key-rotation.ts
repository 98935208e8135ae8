// Key rotation: revoking an account's keys reaches the key caches of every
// process (src/domain/accounts/invalidation.ts), so it lives apart from the
// key store that the caches read.
import type { Tx } from "../../db/index.js";
import { accountKeysChanged } from "./invalidation.js";
import { unauthorized } from "../../errors.js";
import { hashKey, issueKey, type KeyRole } from "./keys.js";

/** Advisory-lock namespaces: one account's keys are issued and revoked one transaction at a time. */
const KEYS_LOCK_NS: Record<KeyRole, number> = { renter: 0x7636, provider: 0x7637 };

/**
 * Takes the account's key lock until the transaction ends. Without it two rotations (or a rotation
 * and a sign-in) running together each revoke only the keys committed before they started, and
 * the key the other issues outlives the rotation.
 */
export async function lockAccountKeys(tx: Tx, role: KeyRole, accountId: number): Promise<void> {
  await tx`SELECT pg_advisory_xact_lock(${KEYS_LOCK_NS[role]}, ${accountId % 2147483647}::int)`;
}

/**
 * Revokes every key of the account (rotation), then issues a fresh one. The
 * old keys stop at once in this process and, at commit, in every other
 * (src/domain/accounts/key-cache.ts). `presented` are the keys the caller sent
 * (undefined for a sign-in by email, whose authority is not a key): one of them
 * must still be live once the lock is held, so of two rotations with one key
 * the second is refused (401) instead of revoking the key the first handed out.
 */
export async function rotateKeys(db: Tx, role: KeyRole, accountId: number, presented?: readonly string[]): Promise<string> {
  await lockAccountKeys(db, role, accountId);
  const column = role === "provider" ? db`provider_id` : db`renter_id`;
  if (presented) {
    const hashes = presented.map((k) => hashKey(k).toString("hex"));
    const [live] = await db`
      SELECT 1 FROM api_keys
      WHERE key_hash IN (SELECT decode(h, 'hex') FROM unnest(${hashes}::text[]) h) AND role = ${role} AND ${column} = ${accountId} AND revoked_at IS NULL`;
    if (!live) throw unauthorized("invalid API key: another rotation revoked it");
  }
  await db`UPDATE api_keys SET revoked_at = now() WHERE role = ${role} AND ${column} = ${accountId} AND revoked_at IS NULL`;
  // A provider's legacy task-signing secret is derived per key epoch: rotating its keys rotates it.
  if (role === "provider") await db`UPDATE providers SET task_secret_epoch = task_secret_epoch + 1, updated_at = now() WHERE id = ${accountId}`;
  await accountKeysChanged(db, role, accountId);
  return issueKey(db, role, accountId);
}
