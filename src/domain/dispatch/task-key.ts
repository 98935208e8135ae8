// Whether a provider's stream daemon can verify this server's tasks. A daemon
// pins the server's task-signing key per server on first contact and says in
// its hello which key it pinned; one that differs (the server was replaced or
// its database recreated) refuses every task, so the provider is kept out of
// dispatch (providers.task_key_mismatch, checked by liveSql in dispatch.ts) with
// the reason, until a daemon connects with the right key.
import type { Sql } from "../../db/index.js";
import { badRequest } from "../../errors.js";
import { dispatchForProvider, requeueJobsOfProvider } from "./dispatch.js";

/** The flag a daemon's operator passes, after checking the new key, to pin it. */
export const TRUST_NEW_KEY_FLAG = "--trust-new-server-key";

/** The reason recorded when a daemon pinned `pinned` for this server, whose key is `serverKey`; undefined when they agree. */
export function taskKeyMismatch(pinned: string | undefined, serverKey: string): string | undefined {
  if (pinned === undefined || pinned === "") return undefined;
  if (Buffer.from(pinned, "base64").length !== 32 || pinned.length > 64) {
    throw badRequest("hello.task_signing_key must be a base64 Ed25519 public key (32 bytes)");
  }
  if (pinned === serverKey) return undefined;
  return (
    `the provider's daemon pinned another task-signing key for this server (${pinned}) than the server's (${serverKey}) ` +
    `and refuses every task; no job is dispatched to this provider until a daemon connects with the right key ` +
    `(after checking the server's key, restart the daemon with ${TRUST_NEW_KEY_FLAG})`
  );
}

/**
 * Records what a connecting daemon said of the key. A mismatch keeps the
 * provider out of dispatch and sends back the jobs it holds (its daemon would
 * refuse them); agreement lifts an earlier mismatch and fills its free GPUs.
 */
export async function recordTaskKeyCheck(sql: Sql, providerId: number, mismatch: string | undefined): Promise<void> {
  if (mismatch !== undefined) {
    await sql`UPDATE providers SET task_key_mismatch = ${mismatch}, updated_at = now() WHERE id = ${providerId}`;
    await requeueJobsOfProvider(sql, providerId, "task_key", "the provider's daemon cannot verify this server's tasks (task-signing key mismatch)");
    return;
  }
  const cleared = await sql`
    UPDATE providers SET task_key_mismatch = NULL, updated_at = now() WHERE id = ${providerId} AND task_key_mismatch IS NOT NULL RETURNING id`;
  if (cleared.length > 0) await dispatchForProvider(sql, providerId);
}
