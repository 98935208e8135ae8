// The server's Ed25519 task signer. The private key is a random seed the
// server generates once and keeps in the database (server_keys, migration
// 012), shared by every process; it must not be derivable from
// SVC_HMAC_SECRET, which legacy daemons carry.
import crypto from "node:crypto";
import type { Db } from "../../db/index.js";
import { taskSigner, type TaskSigner } from "../../shared/task-signature.js";

const SIGNING_KEY_NAME = "task-signing-ed25519";

/** The server's signer: its seed is created on first use (any process may win the race; all read the same row). */
export async function loadTaskSigner(db: Db): Promise<TaskSigner> {
  await db`INSERT INTO server_keys (name, secret) VALUES (${SIGNING_KEY_NAME}, ${crypto.randomBytes(32)}) ON CONFLICT (name) DO NOTHING`;
  const [row] = await db<{ secret: Buffer }[]>`SELECT secret FROM server_keys WHERE name = ${SIGNING_KEY_NAME}`;
  return taskSigner(row.secret);
}
