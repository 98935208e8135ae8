// The stream's task signature beside the HMAC (DESIGN §3 allows a stronger
// scheme): an Ed25519 key derived from SVC_HMAC_SECRET signs
// "<job_id>\n<canonical task_spec>". Daemons hold only the public key, so
// the secret never leaves the server for them, and a key pinned on first
// contact detects a server impostor too.
import crypto from "node:crypto";
import { canonicalJson } from "../domain/task-signing.js";

// PKCS#8 wrapping of a raw Ed25519 seed (RFC 8410).
const PKCS8_PREFIX = Buffer.from("302e020100300506032b657004220420", "hex");
const SPKI_PREFIX = Buffer.from("302a300506032b6570032100", "hex");

export interface TaskSigner {
  /** Raw 32-byte public key, base64. */
  publicKey: string;
  sign(jobId: string, taskSpec: unknown): string;
}

export function taskSigner(hmacSecret: string): TaskSigner {
  const seed = crypto.createHmac("sha256", hmacSecret).update("svc stream task signing ed25519 v1").digest();
  const key = crypto.createPrivateKey({ key: Buffer.concat([PKCS8_PREFIX, seed]), format: "der", type: "pkcs8" });
  const spki = crypto.createPublicKey(key).export({ format: "der", type: "spki" });
  return {
    publicKey: spki.subarray(SPKI_PREFIX.length).toString("base64"),
    sign: (jobId, taskSpec) => crypto.sign(null, signedBytes(jobId, taskSpec), key).toString("base64"),
  };
}

function signedBytes(jobId: string, taskSpec: unknown): Buffer {
  return Buffer.from(`${jobId}\n${canonicalJson(taskSpec)}`, "utf8");
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
