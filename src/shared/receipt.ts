// Signed job receipts and provider attestations, shared by the server (which
// issues receipts), the stream daemon (which attests its results) and the CLI
// (which verifies receipts offline). Nothing here reaches a database or the
// network: verification needs only the receipt, the public keys and, to check
// the output too, the output itself.
//
// The checks themselves are in receipt-check.ts (no Node module, so that the
// web console runs the same rules with WebCrypto); this module gives them
// node:crypto (verifyReceipt) and holds what needs Node: signing, hashing.
//
// Key ids are derived from the public key (a prefix and the first 16 hex
// digits of the SHA-256 of the raw 32-byte key): a keys file cannot carry a
// key under another key's id.
import crypto from "node:crypto";
import { canonicalJson } from "./canonical-json.js";
import {
  ATTESTATION_TYPE,
  keyIdFromDigest,
  runChecksSync,
  signatureHolds,
  verifyReceiptSync,
  type PublishedKeys,
  type ReceiptCrypto,
  type Verification,
} from "./receipt-check.js";

export {
  ATTESTATION_TYPE,
  RECEIPT_TYPE,
  RECEIPT_VERSION,
  SIGNATURE_ALGORITHM,
  repeatedMemberName,
  receiptKeyIds,
  type PublishedKeys,
  type ReceiptFile,
  type SignatureVerdict,
  type Verification,
} from "./receipt-check.js";

// PKCS#8 and SPKI wrappings of raw Ed25519 keys (RFC 8410).
const PKCS8_PREFIX = Buffer.from("302e020100300506032b657004220420", "hex");
const SPKI_PREFIX = Buffer.from("302a300506032b6570032100", "hex");

export const sha256Hex = (data: string | Uint8Array) => crypto.createHash("sha256").update(data).digest("hex");

/** The checks' cryptography from node:crypto: every answer at once. */
export const nodeReceiptCrypto: ReceiptCrypto = {
  fromBase64: (text) => Buffer.from(text, "base64"),
  sha256Hex,
  ed25519Verify: (publicKey, message, signature) =>
    crypto.verify(null, message, crypto.createPublicKey({ key: Buffer.concat([SPKI_PREFIX, publicKey]), format: "der", type: "spki" }), signature),
};

/**
 * The output hash of a receipt: SHA-256 of the canonical JSON of the job's
 * stored result (the object or string the daemon reported), null when the job
 * stored none. GET /api/jobs/{id}/output/result answers exactly those
 * canonical JSON bytes (a completed job's, and a failed one's that stored a
 * result), so their SHA-256 is the hash.
 */
export function outputSha256(result: unknown): string | null {
  return result === null || result === undefined ? null : sha256Hex(canonicalJson(result));
}

/** `srv-…` for server keys, `prv-…` for provider keys. */
export function keyIdOf(prefix: "srv" | "prv", publicKeyBase64: string): string {
  return keyIdFromDigest(prefix, sha256Hex(Buffer.from(publicKeyBase64, "base64")));
}

export interface Ed25519Signer {
  /** Raw 32-byte public key, base64. */
  publicKey: string;
  /** Base64 signature of the canonical JSON of value. */
  signCanonical(value: unknown): string;
}

export function ed25519Signer(seed: Buffer): Ed25519Signer {
  if (seed.length !== 32) throw new Error("an Ed25519 seed is 32 bytes");
  const key = crypto.createPrivateKey({ key: Buffer.concat([PKCS8_PREFIX, seed]), format: "der", type: "pkcs8" });
  const spki = crypto.createPublicKey(key).export({ format: "der", type: "spki" });
  return {
    publicKey: spki.subarray(SPKI_PREFIX.length).toString("base64"),
    signCanonical: (value) => crypto.sign(null, Buffer.from(canonicalJson(value), "utf8"), key).toString("base64"),
  };
}

/** Whether `signature` is the Ed25519 signature of canonicalJson(value) by the raw public key. */
export function verifyCanonical(publicKeyBase64: string, value: unknown, signature: string): boolean {
  return runChecksSync(signatureHolds(nodeReceiptCrypto, publicKeyBase64, value, signature));
}

/**
 * Checks a receipt file offline with node:crypto (receipt-check.ts holds the
 * rules): the server's signature over the body with the published key it
 * names (a revoked key's signature refused), the provider attestation when the
 * receipt carries one, and, when `output` is given, that the output hashes to
 * the receipt's output_sha256.
 */
export function verifyReceipt(file: unknown, keys: PublishedKeys, output?: { value: unknown }): Verification {
  return verifyReceiptSync(nodeReceiptCrypto, file, keys, output);
}

/** The GPU facts of a receipt's attempt and of an attestation (null members: not reported). */
export interface GpuFacts {
  model: string | null;
  count: number | null;
  vram_mib: number | null;
  driver_version: string | null;
  /** GPU UUIDs as nvidia-smi reports them, where reported. */
  uuids: string[];
}

/** What a provider daemon signs about a result. */
export interface AttestationStatement {
  type: typeof ATTESTATION_TYPE;
  version: 1;
  job_id: string;
  /** outputSha256 of the result it reports. */
  output_sha256: string | null;
  gpu: GpuFacts;
}

export function attestationStatement(jobId: string, result: unknown, gpu: GpuFacts): AttestationStatement {
  return { type: ATTESTATION_TYPE, version: 1, job_id: jobId, output_sha256: outputSha256(result), gpu };
}
