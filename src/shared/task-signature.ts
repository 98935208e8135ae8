// Task signatures, shared by the server and the reference daemons (the only
// server module the daemons import).
//
// HMAC (DESIGN §3): task_spec_hmac = lowercase hex HMAC-SHA256(secret,
// canonical JSON of task_spec), canonical per RFC 8785: object keys sorted by
// UTF-16 code units, no whitespace, strings as JSON.stringify writes them,
// numbers in their shortest round-trip form.
//
// Ed25519 (the stream's signature beside the HMAC): a server key signs
// "<job_id>\n<canonical task_spec>". Daemons hold only the public key, and a
// key pinned on first contact detects a server impostor too. The server keeps
// the seed in the database (src/domain/jobs/task-signer.ts).
import crypto from "node:crypto";
import { canonicalJson } from "./canonical-json.js";

export { canonicalJson };

export function signTask(secret: string, taskSpec: unknown): string {
  return hmacOfCanonical(secret, canonicalJson(taskSpec));
}

/** signTask when the caller already has canonicalJson(taskSpec). */
export function hmacOfCanonical(secret: string, canonical: string): string {
  return crypto.createHmac("sha256", secret).update(canonical, "utf8").digest("hex");
}

/** `canonical`: canonicalJson(taskSpec) when the caller already has it (it also signs it). */
export function verifyTask(secret: string, taskSpec: unknown, hmac: string, canonical = canonicalJson(taskSpec)): boolean {
  if (!/^[0-9a-f]{64}$/.test(hmac)) return false;
  return crypto.timingSafeEqual(Buffer.from(hmacOfCanonical(secret, canonical), "hex"), Buffer.from(hmac, "hex"));
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
