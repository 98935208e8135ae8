// The rules that check a signed job receipt, in one place for every verifier:
// `svc receipt verify` and the server's tests (node:crypto, receipt.ts
// verifyReceipt) and the web console's job page (WebCrypto). Plain JavaScript
// with no Node module: the console bundles this file. The cryptography is
// given by the caller (ReceiptCrypto), answering at once or with a promise;
// the checks are written once, as a generator that yields each cryptographic
// answer it waits for, and run by verifyReceiptSync or verifyReceiptAsync.
//
// A receipt file is {"receipt": BODY, "signature": {"algorithm": "Ed25519",
// "key_id", "value"}}: `value` is the base64 Ed25519 signature, by the server
// key `key_id`, of the UTF-8 bytes of canonicalJson(BODY) (RFC 8785). BODY
// names the same key in `signer`, so the key id is signed too; a receipt
// signed again after the key it was issued under was revoked keeps naming that
// key there. A provider attestation inside BODY is the provider daemon's own
// Ed25519 signature of canonicalJson(statement), where the statement holds the
// job id, the output hash and the GPU facts (docs/receipts.md).
import { canonicalJson } from "./canonical-json.js";

export const RECEIPT_TYPE = "svc.job-receipt";
export const RECEIPT_VERSION = 1;
export const ATTESTATION_TYPE = "svc.job-result-attestation";
export const SIGNATURE_ALGORITHM = "Ed25519";

/**
 * The cryptography a verifier brings. Each function may answer at once or with a promise
 * (WebCrypto's are promises); verifyReceiptSync takes only one that answers at once.
 */
export interface ReceiptCrypto {
  /** The bytes of base64 text; null when it is not base64. */
  fromBase64(text: string): Uint8Array | null;
  /** Lowercase hex SHA-256 of the bytes. */
  sha256Hex(data: Uint8Array): string | Promise<string>;
  /**
   * Whether `signature` is the Ed25519 signature of `message` by the raw 32-byte public key (called
   * with a 32-byte key and a 64-byte signature only). A key that is no Ed25519 key may answer false
   * or throw: either is "does not verify".
   */
  ed25519Verify(publicKey: Uint8Array, message: Uint8Array, signature: Uint8Array): boolean | Promise<boolean>;
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

/**
 * How a signature checked: `valid`; `invalid` (it does not match what it signs: changed, or made by
 * another key); `revoked` (by a server key since revoked: it proves nothing); `unknown_key` (its key
 * is not among the published keys); `wrong_key` (the published key is not the key its id names, or
 * a provider key is another provider's); `unchecked` (nothing to check: the file is no receipt).
 */
export type SignatureVerdict = "valid" | "invalid" | "revoked" | "unknown_key" | "wrong_key" | "unchecked";

export interface Verification {
  ok: boolean;
  /** What was checked and held. */
  checks: string[];
  /** What failed; empty when ok. */
  problems: string[];
  /** The server's signature: how it checked, and the key it names. */
  server: { verdict: SignatureVerdict; keyId: string | undefined; revokedAt?: string; resignedFor?: string };
  /**
   * The provider attestation: `none` when the receipt carries none (`reason` says why), `missing`
   * when it has no provider_attestation member; otherwise how its signature checked, with
   * `matches` false when its statement is about another job or output than the receipt.
   */
  attestation:
    | { verdict: "none"; reason: string }
    | { verdict: "missing" }
    | { verdict: SignatureVerdict; keyId: string | undefined; providerId: string | undefined; matches: boolean };
}

/** The id of a published key: `srv-` (server) or `prv-` (provider) and the first 16 hex digits of the SHA-256 of its raw 32 bytes. */
export const keyIdFromDigest = (prefix: "srv" | "prv", sha256Hex: string) => `${prefix}-${sha256Hex.slice(0, 16)}`;

/** The form of every key id (keyIdFromDigest): another text names no published key. */
export const KEY_ID_FORM = /^(srv|prv)-[0-9a-f]{16}$/;

const isObject = (v: unknown): v is Record<string, unknown> => v !== null && typeof v === "object" && !Array.isArray(v);

/**
 * The key ids a receipt file names: its signature's, the signer its body names (another key when the
 * receipt was signed again after that one was revoked) and its provider attestation's: the keys to
 * ask GET /api/receipts/keys?key_id= for. Only those of a key id's form: a changed file may name
 * anything, and what no key can be is not published (the checks say so) rather than a value for the
 * server to refuse.
 */
export function receiptKeyIds(doc: unknown): string[] {
  const d = doc as { signature?: { key_id?: unknown }; receipt?: { signer?: { key_id?: unknown }; provider_attestation?: { key_id?: unknown } } } | null;
  const ids = [d?.signature?.key_id, d?.receipt?.signer?.key_id, d?.receipt?.provider_attestation?.key_id];
  return [...new Set(ids.filter((k): k is string => typeof k === "string" && KEY_ID_FORM.test(k)))];
}

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

// ---- the checks ----------------------------------------------------------------------------
// Generators yield what a ReceiptCrypto function answered (a value or a promise) and are resumed
// with the value: one set of rules, run synchronously or asynchronously.
type Checking<T> = Generator<unknown, T, unknown>;

const utf8 = (text: string) => new TextEncoder().encode(text);

/** The published key with this id, from a keys file however malformed (anything but a list of objects holds none). */
function publishedKey<K extends { key_id: string }>(list: unknown, keyId: unknown): K | undefined {
  return Array.isArray(list) ? (list.find((k) => isObject(k) && k.key_id === keyId) as K | undefined) : undefined;
}

/** A published server key marked revoked (any revoked_at but null: a malformed one counts as revoked). */
const isRevoked = (k: { revoked_at?: unknown }) => k.revoked_at !== undefined && k.revoked_at !== null;

/** A published key is the key its id names (ids are derived from the keys: a file cannot pass one key off as another). */
function* keyMatchesId(c: ReceiptCrypto, prefix: "srv" | "prv", k: { key_id: string; public_key: unknown }): Checking<boolean> {
  if (typeof k.public_key !== "string") return false;
  const raw = c.fromBase64(k.public_key);
  if (raw === null) return false;
  return keyIdFromDigest(prefix, (yield c.sha256Hex(raw)) as string) === k.key_id;
}

/** Whether `signature` (base64) is the Ed25519 signature of canonicalJson(value) by the raw public key (base64). */
export function* signatureHolds(c: ReceiptCrypto, publicKeyBase64: string, value: unknown, signature: string): Checking<boolean> {
  try {
    const raw = c.fromBase64(publicKeyBase64);
    const sig = c.fromBase64(signature);
    if (raw === null || sig === null || raw.length !== 32 || sig.length !== 64) return false;
    return (yield c.ed25519Verify(raw, utf8(canonicalJson(value)), sig)) === true;
  } catch {
    return false;
  }
}

/** The output hash of a result: SHA-256 of its canonical JSON, null for none (receipt.ts outputSha256). */
function* outputHash(c: ReceiptCrypto, result: unknown): Checking<string | null> {
  if (result === null || result === undefined) return null;
  return (yield c.sha256Hex(utf8(canonicalJson(result)))) as string;
}

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
function* receiptChecks(c: ReceiptCrypto, file: unknown, keys: PublishedKeys, output?: { value: unknown }): Checking<Verification> {
  const checks: string[] = [];
  const problems: string[] = [];
  let server: Verification["server"] = { verdict: "unchecked", keyId: undefined };
  let attestation: Verification["attestation"] = { verdict: "missing" };
  const done = (): Verification => ({ ok: problems.length === 0, checks, problems, server, attestation });
  if (!isObject(file) || !isObject(file.receipt) || !isObject(file.signature)) {
    problems.push("not a receipt file: expected {receipt, signature}");
    return done();
  }
  const body = file.receipt;
  const sig = file.signature as Record<string, unknown>;
  const sigKeyId = typeof sig.key_id === "string" ? sig.key_id : undefined;
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
  if (!serverKey) {
    problems.push(`server key ${String(sig.key_id)} is not among the published keys`);
    server = { verdict: "unknown_key", keyId: sigKeyId };
  } else if (!(yield* keyMatchesId(c, "srv", serverKey))) {
    problems.push(`published server key ${serverKey.key_id} does not match its id`);
    server = { verdict: "wrong_key", keyId: sigKeyId };
  } else if (isRevoked(serverKey)) {
    problems.push(revokedProblem(serverKey, body.job_id));
    server = { verdict: "revoked", keyId: sigKeyId, revokedAt: typeof serverKey.revoked_at === "string" ? serverKey.revoked_at : undefined };
  } else if (typeof sig.value !== "string" || !(yield* signatureHolds(c, serverKey.public_key, body, sig.value))) {
    problems.push("the server's signature does not match the receipt (changed, or signed by another key)");
    server = { verdict: "invalid", keyId: sigKeyId };
  } else {
    checks.push(`server signature: valid (key ${serverKey.key_id}${resignedFor ? `; re-signed: the receipt was issued under key ${resignedFor}, since revoked` : ""})`);
    server = { verdict: "valid", keyId: serverKey.key_id, ...(resignedFor ? { resignedFor } : {}) };
  }

  const att = body.provider_attestation;
  if (isObject(att) && att.status === "attested") {
    const statement = att.statement;
    const pkey = publishedKey<NonNullable<PublishedKeys["provider_keys"]>[number]>(keys?.provider_keys, att.key_id);
    let verdict: SignatureVerdict;
    if (!pkey) {
      problems.push(`provider key ${String(att.key_id)} is not among the published keys`);
      verdict = "unknown_key";
    } else if (!(yield* keyMatchesId(c, "prv", pkey))) {
      problems.push(`published provider key ${pkey.key_id} does not match its id`);
      verdict = "wrong_key";
    } else if (String(pkey.provider_id) !== String(att.provider_id)) {
      problems.push(`provider key ${pkey.key_id} belongs to provider ${pkey.provider_id}, not ${String(att.provider_id)}`);
      verdict = "wrong_key";
    } else if (typeof att.signature !== "string" || !(yield* signatureHolds(c, pkey.public_key, statement, att.signature))) {
      problems.push("the provider's attestation signature does not match its statement");
      verdict = "invalid";
    } else {
      checks.push(`provider attestation: valid (provider ${pkey.provider_id}, key ${pkey.key_id})`);
      verdict = "valid";
    }
    const matches = isObject(statement) && statement.job_id === body.job_id && statement.output_sha256 === body.output_sha256;
    if (!matches) problems.push("the provider's attestation is about another job or output than the receipt");
    attestation = {
      verdict,
      keyId: typeof att.key_id === "string" ? att.key_id : undefined,
      providerId: att.provider_id === undefined || att.provider_id === null ? undefined : String(att.provider_id),
      matches,
    };
  } else if (isObject(att)) {
    const reason = String(att.reason ?? "not attested");
    checks.push(`provider attestation: none (${reason})`);
    attestation = { verdict: "none", reason };
  } else {
    problems.push("the receipt has no provider_attestation member");
  }

  if (output) {
    const want = body.output_sha256;
    if (want === null) problems.push("the receipt records no output, but an output was given");
    else {
      let matched = false;
      for (const v of outputForms(output.value, body)) {
        if ((yield* outputHash(c, v)) === want) {
          matched = true;
          break;
        }
      }
      if (!matched) problems.push("the output does not match the receipt's output_sha256");
      else checks.push("output: matches output_sha256");
    }
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

const isThenable = (v: unknown): v is PromiseLike<unknown> => (typeof v === "object" || typeof v === "function") && v !== null && typeof (v as { then?: unknown }).then === "function";

/** Runs checks whose crypto answers at once. */
export function runChecksSync<T>(g: Checking<T>): T {
  let r = g.next();
  while (!r.done) {
    if (isThenable(r.value)) throw new TypeError("this ReceiptCrypto answers with promises: use verifyReceiptAsync");
    r = g.next(r.value);
  }
  return r.value;
}

/** Runs checks whose crypto may answer with promises (a rejected one is thrown into the checks, as a throw would be). */
export async function runChecksAsync<T>(g: Checking<T>): Promise<T> {
  let r = g.next();
  while (!r.done) {
    let value: unknown;
    try {
      value = await r.value;
    } catch (err) {
      r = g.throw(err);
      continue;
    }
    r = g.next(value);
  }
  return r.value;
}

/** The checks (receiptChecks) with a crypto that answers at once (node:crypto: receipt.ts verifyReceipt). */
export function verifyReceiptSync(c: ReceiptCrypto, file: unknown, keys: PublishedKeys, output?: { value: unknown }): Verification {
  return runChecksSync(receiptChecks(c, file, keys, output));
}

/** The checks (receiptChecks) with a crypto that may answer with promises (WebCrypto in the console). */
export function verifyReceiptAsync(c: ReceiptCrypto, file: unknown, keys: PublishedKeys, output?: { value: unknown }): Promise<Verification> {
  return runChecksAsync(receiptChecks(c, file, keys, output));
}
