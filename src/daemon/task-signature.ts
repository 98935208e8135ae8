// The stream's task signature beside the HMAC (DESIGN §3 allows a stronger
// scheme): an Ed25519 key signs "<job_id>\n<canonical task_spec>". Daemons
// hold only the public key, and a key pinned on first contact detects a server
// impostor too. The private key is a random seed the server generates once and
// keeps in the database (server_keys, migration 012), shared by every process;
// it must not be derivable from SVC_HMAC_SECRET, which legacy daemons carry.
import crypto from "node:crypto";
import type { Db } from "../db/index.js";
import { canonicalJson } from "../domain/task-signing.js";

const SIGNING_KEY_NAME = "task-signing-ed25519";

/** The server's signer: its seed is created on first use (any process may win the race; all read the same row). */
export async function loadTaskSigner(db: Db): Promise<TaskSigner> {
  await db`INSERT INTO server_keys (name, secret) VALUES (${SIGNING_KEY_NAME}, ${crypto.randomBytes(32)}) ON CONFLICT (name) DO NOTHING`;
  const [row] = await db<{ secret: Buffer }[]>`SELECT secret FROM server_keys WHERE name = ${SIGNING_KEY_NAME}`;
  return taskSigner(row.secret);
}

// PKCS#8 wrapping of a raw Ed25519 seed (RFC 8410).
const PKCS8_PREFIX = Buffer.from("302e020100300506032b657004220420", "hex");
const SPKI_PREFIX = Buffer.from("302a300506032b6570032100", "hex");

export interface TaskSigner {
  /** Raw 32-byte public key, base64. */
  publicKey: string;
  /** `canonical`: canonicalJson(taskSpec) when the caller already has it. */
  sign(jobId: string, taskSpec: unknown, canonical?: string): string;
}

/** A signer for a raw 32-byte Ed25519 seed. */
export function taskSigner(seed: Buffer): TaskSigner {
  if (seed.length !== 32) throw new Error("an Ed25519 seed is 32 bytes");
  const key = crypto.createPrivateKey({ key: Buffer.concat([PKCS8_PREFIX, seed]), format: "der", type: "pkcs8" });
  const spki = crypto.createPublicKey(key).export({ format: "der", type: "spki" });
  return {
    publicKey: spki.subarray(SPKI_PREFIX.length).toString("base64"),
    sign: (jobId, taskSpec, canonical) => crypto.sign(null, signedBytes(jobId, taskSpec, canonical), key).toString("base64"),
  };
}

function signedBytes(jobId: string, taskSpec: unknown, canonical = canonicalJson(taskSpec)): Buffer {
  return Buffer.from(`${jobId}\n${canonical}`, "utf8");
}

export function verifyTaskSignature(publicKeyBase64: string, jobId: string, taskSpec: unknown, signature: string): boolean {
  try {
    const raw = Buffer.from(publicKeyBase64, "base64");
    if (raw.length !== 32 || !signature) return false;
    const key = crypto.createPublicKey({ key: Buffer.concat([SPKI_PREFIX, raw]), format: "der", type: "spki" });
    return crypto.verify(null, signedBytes(jobId, taskSpec), key, Buffer.from(signature, "base64"));
  } catch {
    return false;
  }
}
