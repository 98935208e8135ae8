// Signed job receipts and provider attestations, shared by the server (which
// issues receipts), the stream daemon (which attests its results) and the CLI
// (which verifies receipts offline). Nothing here reaches a database or the
// network: verification needs only the receipt, the public keys and, to check
// the output too, the output itself.
//
// A receipt file is {"receipt": BODY, "signature": {"algorithm": "Ed25519",
// "key_id", "value"}}: `value` is the base64 Ed25519 signature, by the server
// key `key_id`, of the UTF-8 bytes of canonicalJson(BODY) (RFC 8785, the
// canonicalisation task specs use). BODY names the same key in `signer`, so
// the key id is signed too; a receipt signed again after the key it was
// issued under was revoked keeps naming that key there (verifyReceipt). A provider attestation inside BODY is the
// provider daemon's own Ed25519 signature of canonicalJson(statement), where
// the statement holds the job id, the output hash and the GPU facts.
//
// Key ids are derived from the public key (a prefix and the first 16 hex
// digits of the SHA-256 of the raw 32-byte key): a keys file cannot carry a
// key under another key's id.
import crypto from "node:crypto";
import { canonicalJson } from "./task-signature.js";

export const RECEIPT_TYPE = "svc.job-receipt";
export const RECEIPT_VERSION = 1;
export const ATTESTATION_TYPE = "svc.job-result-attestation";
export const SIGNATURE_ALGORITHM = "Ed25519";

// PKCS#8 and SPKI wrappings of raw Ed25519 keys (RFC 8410).
const PKCS8_PREFIX = Buffer.from("302e020100300506032b657004220420", "hex");
const SPKI_PREFIX = Buffer.from("302a300506032b6570032100", "hex");

export const sha256Hex = (data: string | Buffer) => crypto.createHash("sha256").update(data).digest("hex");

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
  return `${prefix}-${sha256Hex(Buffer.from(publicKeyBase64, "base64")).slice(0, 16)}`;
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
  try {
    const raw = Buffer.from(publicKeyBase64, "base64");
    const sig = Buffer.from(signature, "base64");
    if (raw.length !== 32 || sig.length !== 64) return false;
    const key = crypto.createPublicKey({ key: Buffer.concat([SPKI_PREFIX, raw]), format: "der", type: "spki" });
    return crypto.verify(null, Buffer.from(canonicalJson(value), "utf8"), key, sig);
  } catch {
    return false;
  }
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

/**
 * Public keys a verifier trusts: the answer of GET /api/receipts/keys (or its
 * saved file). A server key with a `revoked_at` is trusted no more.
 */
export interface PublishedKeys {
  server_keys: { key_id: string; public_key: string; algorithm?: string; revoked_at?: string | null; revocation_reason?: string | null }[];
  provider_keys?: { key_id: string; provider_id: number | string; public_key: string; algorithm?: string }[];
}

export interface ReceiptFile {
  receipt: Record<string, unknown>;
  signature: { algorithm: string; key_id: string; value: string };
}

export interface Verification {
  ok: boolean;
  /** What was checked and held. */
  checks: string[];
  /** What failed; empty when ok. */
  problems: string[];
}

const isObject = (v: unknown): v is Record<string, unknown> => v !== null && typeof v === "object" && !Array.isArray(v);

/** The published key with this id, from a keys file however malformed (anything but a list of objects holds none). */
function publishedKey<K extends { key_id: string }>(list: unknown, keyId: unknown): K | undefined {
  return Array.isArray(list) ? (list.find((k) => isObject(k) && k.key_id === keyId) as K | undefined) : undefined;
}

/** A published key is the key its id names (ids are derived from the keys: a file cannot pass one key off as another). */
const keyMatchesId = (prefix: "srv" | "prv", k: { key_id: string; public_key: unknown }) =>
  typeof k.public_key === "string" && keyIdOf(prefix, k.public_key) === k.key_id;

/**
 * The first member name an object in a JSON text repeats, or undefined. JSON.parse keeps a repeated
 * name's last value where another reader may keep its first: a receipt file with one could show a
 * figure its signature does not cover. `text` must be valid JSON (it parsed).
 */
export function repeatedMemberName(text: string): string | undefined {
  const names: (Set<string> | null)[] = []; // per open object its names; null for an open array
  let nameNext = false;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (c === '"') {
      let j = i + 1;
      while (text[j] !== '"') j += text[j] === "\\" ? 2 : 1;
      const seen = names[names.length - 1];
      if (seen && nameNext) {
        const name = JSON.parse(text.slice(i, j + 1)) as string; // escapes decoded: "a" and "\u0061" are one name
        if (seen.has(name)) return name;
        seen.add(name);
        nameNext = false;
      }
      i = j;
    } else if (c === "{") {
      names.push(new Set());
      nameNext = true;
    } else if (c === "[") {
      names.push(null);
      nameNext = false;
    } else if (c === "}" || c === "]") {
      names.pop();
      nameNext = false;
    } else if (c === ",") {
      nameNext = names[names.length - 1] !== null;
    } else if (c === ":") {
      nameNext = false;
    }
  }
  return undefined;
}

/** A published server key marked revoked (any revoked_at but null: a malformed one counts as revoked). */
const isRevoked = (k: { revoked_at?: unknown }) => k.revoked_at !== undefined && k.revoked_at !== null;

/**
 * Checks a receipt file offline: the server's signature over the body with the
 * published key it names, the provider attestation (when the receipt carries
 * one) with the provider's published key, and, when `output` is given, that
 * the output hashes to the receipt's output_sha256. `output` is the job's
 * result as JSON: the answer of GET /api/jobs/{id}/output/result, which is the
 * stored result as hashed. The answer of GET /api/jobs/{id}/output is accepted
 * too where it can be undone (its added job_id and status left out when they
 * match the receipt, a wrapped string unwrapped); it cannot be for a result
 * with job_id or status members of its own, which that answer replaces.
 *
 * A signature by a revoked key is refused (anyone holding its leaked seed
 * could have made it). A receipt issued under a key since revoked is signed
 * again by the server with its current key: its signature then names that key
 * while its body still names the revoked signer, which is taken only when that
 * signer is published as revoked.
 */
export function verifyReceipt(file: unknown, keys: PublishedKeys, output?: { value: unknown }): Verification {
  const checks: string[] = [];
  const problems: string[] = [];
  const done = (): Verification => ({ ok: problems.length === 0, checks, problems });
  if (!isObject(file) || !isObject(file.receipt) || !isObject(file.signature)) {
    problems.push("not a receipt file: expected {receipt, signature}");
    return done();
  }
  const body = file.receipt;
  const sig = file.signature as Record<string, unknown>;
  if (body.type !== RECEIPT_TYPE || body.version !== RECEIPT_VERSION) problems.push(`unknown receipt type or version: ${String(body.type)} v${String(body.version)}`);
  if (sig.algorithm !== SIGNATURE_ALGORITHM) problems.push(`unsupported signature algorithm: ${String(sig.algorithm)}`);
  const signer = isObject(body.signer) ? body.signer : {};
  let resignedFor: string | undefined;
  if (signer.key_id !== sig.key_id) {
    const issuer = publishedKey<PublishedKeys["server_keys"][number]>(keys?.server_keys, signer.key_id);
    if (issuer && isRevoked(issuer)) resignedFor = issuer.key_id;
    else problems.push(`the signature's key ${String(sig.key_id)} is not the signer the receipt names (${String(signer.key_id)})`);
  }
  const serverKey = publishedKey<PublishedKeys["server_keys"][number]>(keys?.server_keys, sig.key_id);
  if (!serverKey) problems.push(`server key ${String(sig.key_id)} is not among the published keys`);
  else if (!keyMatchesId("srv", serverKey)) problems.push(`published server key ${serverKey.key_id} does not match its id`);
  else if (isRevoked(serverKey)) problems.push(revokedProblem(serverKey, body.job_id));
  else if (typeof sig.value !== "string" || !verifyCanonical(serverKey.public_key, body, sig.value)) problems.push("the server's signature does not match the receipt (changed, or signed by another key)");
  else checks.push(`server signature: valid (key ${serverKey.key_id}${resignedFor ? `; re-signed: the receipt was issued under key ${resignedFor}, since revoked` : ""})`);

  const att = body.provider_attestation;
  if (isObject(att) && att.status === "attested") {
    const statement = att.statement;
    const pkey = publishedKey<NonNullable<PublishedKeys["provider_keys"]>[number]>(keys?.provider_keys, att.key_id);
    if (!pkey) problems.push(`provider key ${String(att.key_id)} is not among the published keys`);
    else if (!keyMatchesId("prv", pkey)) problems.push(`published provider key ${pkey.key_id} does not match its id`);
    else if (String(pkey.provider_id) !== String(att.provider_id)) problems.push(`provider key ${pkey.key_id} belongs to provider ${pkey.provider_id}, not ${String(att.provider_id)}`);
    else if (typeof att.signature !== "string" || !verifyCanonical(pkey.public_key, statement, att.signature)) problems.push("the provider's attestation signature does not match its statement");
    else checks.push(`provider attestation: valid (provider ${pkey.provider_id}, key ${pkey.key_id})`);
    if (!isObject(statement) || statement.job_id !== body.job_id || statement.output_sha256 !== body.output_sha256) {
      problems.push("the provider's attestation is about another job or output than the receipt");
    }
  } else if (isObject(att)) {
    checks.push(`provider attestation: none (${String(att.reason ?? "not attested")})`);
  } else {
    problems.push("the receipt has no provider_attestation member");
  }

  if (output) {
    const want = body.output_sha256;
    if (want === null) problems.push("the receipt records no output, but an output was given");
    else if (!outputForms(output.value, body).some((v) => outputSha256(v) === want)) problems.push("the output does not match the receipt's output_sha256");
    else checks.push("output: matches output_sha256");
  }
  return done();
}

/** Why a signature by a revoked key is refused, and what to do: the server serves the receipt signed again. */
function revokedProblem(k: { key_id: string; revoked_at?: unknown; revocation_reason?: unknown }, jobId: unknown): string {
  const when = typeof k.revoked_at === "string" ? ` at ${k.revoked_at}` : "";
  const why = typeof k.revocation_reason === "string" && k.revocation_reason !== "" ? ` (${k.revocation_reason})` : "";
  const job = typeof jobId === "string" ? jobId : "JOB_ID";
  return (
    `server key ${k.key_id} was revoked${when}${why}: a signature by it proves nothing; ` +
    `fetch the receipt again from the server (svc receipt get ${job}, or GET /api/jobs/${job}/receipt), which serves it signed by a key in force`
  );
}

/**
 * The result a given output file may stand for: itself, or the output route's
 * answer less the job_id and status it adds (a string result is answered as
 * {response}, or {data} for an image job, any other non-object as {result}).
 */
function outputForms(v: unknown, body: Record<string, unknown>): unknown[] {
  if (!isObject(v) || v.job_id !== body.job_id || v.status !== body.status) return [v];
  const { job_id: _j, status: _s, ...rest } = v;
  const keys = Object.keys(rest);
  const forms: unknown[] = [v, rest];
  if (keys.length === 1 && (keys[0] === "response" || keys[0] === "data") && typeof rest[keys[0]] === "string") forms.push(rest[keys[0]]);
  if (keys.length === 1 && keys[0] === "result") forms.push(rest.result);
  return forms;
}
