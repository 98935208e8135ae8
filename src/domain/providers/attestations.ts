// Provider attestation: a stream daemon holds an Ed25519 key of its own,
// registers the public key when it connects (Hello.provider_key), and signs
// the output hash and GPU facts of each result it reports. The signature is
// checked here against a key this provider registered before the result is
// taken; a result whose attestation is malformed or does not verify is
// refused whole (400 naming the field; the job keeps running). The verified
// attestation is kept for the attempt the result ends, in the transaction
// that takes the result (job-reports.ts reportResult), and the job's receipt
// carries it when it is about the output the job stored
// (src/domain/money/receipts.ts).
import type { JsonObject, JsonValue } from "@bufbuild/protobuf";
import type { Struct, Value } from "@bufbuild/protobuf/wkt";
import { structJson, valueJson } from "../../shared/value-json.js";
import type { Db, Sql, Tx } from "../../db/index.js";
import { apiError, badRequest, conflict } from "../../errors.js";
import { unstorableIn } from "../../shared/nul-text.js";
import { ATTESTATION_TYPE, keyIdOf, outputSha256, verifyCanonical, type AttestationStatement } from "../../shared/receipt.js";

const BASE64_KEY = /^[A-Za-z0-9+/]{43}=$/;

/**
 * New keys one provider may register per day, and keys it may hold in all. A
 * daemon makes its key once (a new one when its state directory is lost), and
 * every key stays published for the receipts it attested: without a cap each
 * connect could add a row to the public keys listing.
 */
export const PROVIDER_KEYS_PER_DAY = 5;
export const PROVIDER_KEYS_MAX = 20;
/** Advisory-lock namespace: one provider's keys are counted and added one at a time. */
const KEY_LOCK_NS = 0x7635;

/**
 * Registers a daemon's public key for a provider (first connect) or notes it
 * was seen again; returns its key id. A key registered to another provider is
 * refused (409): the id names one provider's key. A new key past the
 * provider's caps is refused (412); its keys already registered stay.
 */
export async function registerProviderKey(sql: Sql, providerId: number, publicKey: string): Promise<string> {
  if (!BASE64_KEY.test(publicKey) || Buffer.from(publicKey, "base64").length !== 32) {
    throw badRequest("provider_key must be a raw 32-byte Ed25519 public key in base64");
  }
  const keyId = keyIdOf("prv", publicKey);
  const [seen] = await sql<{ provider_id: number }[]>`
    UPDATE provider_keys SET last_seen_at = now() WHERE key_id = ${keyId} RETURNING provider_id`;
  const owner = seen?.provider_id ?? (await addProviderKey(sql, providerId, keyId, publicKey));
  if (owner !== providerId) throw conflict("provider_key is registered to another provider");
  return keyId;
}

/** Adds a key not yet registered, within the provider's caps; returns the provider that holds it. */
async function addProviderKey(sql: Sql, providerId: number, keyId: string, publicKey: string): Promise<number> {
  return sql.begin(async (tx) => {
    // Concurrent connects of one provider are counted one after the other: they cannot pass a cap together.
    await tx`SELECT pg_advisory_xact_lock(${KEY_LOCK_NS}, ${providerId % 2147483647}::int)`;
    const [held] = await tx<{ total: number; today: number }[]>`
      SELECT count(*)::int AS total, count(*) FILTER (WHERE registered_at > now() - interval '24 hours')::int AS today
      FROM provider_keys WHERE provider_id = ${providerId}`;
    if (held.total >= PROVIDER_KEYS_MAX) {
      throw apiError(412, `provider_key not registered: a provider may register at most ${PROVIDER_KEYS_MAX} attestation keys in all; results are taken unattested`);
    }
    if (held.today >= PROVIDER_KEYS_PER_DAY) {
      throw apiError(412, `provider_key not registered: a provider may register at most ${PROVIDER_KEYS_PER_DAY} new attestation keys per 24 h; results are taken unattested`);
    }
    const [row] = await tx<{ provider_id: number }[]>`
      INSERT INTO provider_keys (key_id, provider_id, public_key) VALUES (${keyId}, ${providerId}, ${publicKey})
      ON CONFLICT (key_id) DO UPDATE SET last_seen_at = now()
      RETURNING provider_id`;
    return row.provider_id;
  });
}

export interface AttestationInput {
  keyId: string;
  statement?: Struct | JsonObject;
  signature: string;
}

/** An attestation that verified against the reporting provider's registered key: what keepAttestation stores. */
export interface VerifiedAttestation {
  providerId: number;
  keyId: string;
  statement: AttestationStatement;
  signature: string;
}

const jsonOf = (v: Value | JsonValue | undefined): JsonValue | undefined =>
  v !== undefined && v !== null && typeof v === "object" && "$typeName" in v ? valueJson(v as Value) : (v as JsonValue | undefined);

const isObject = (v: unknown): v is Record<string, unknown> => v !== null && typeof v === "object" && !Array.isArray(v);

/** The members of a statement, and of its `gpu`, exactly (docs/receipts.md "Provider attestation"). */
const STATEMENT_MEMBERS = ["type", "version", "job_id", "output_sha256", "gpu"] as const;
const GPU_MEMBERS = ["model", "count", "vram_mib", "driver_version", "uuids"] as const;
/** Bounds of the GPU facts: far above what nvidia-smi reports, low enough that a statement stays a few KiB. */
export const GPU_FACT_BOUNDS = { textChars: 256, count: 1024, vramMib: 16 * 1024 * 1024, uuids: 64 } as const;

/** C0 and C1 control characters: no GPU name, driver version or UUID holds one. */
const CONTROL = /[\u0000-\u001f\u007f-\u009f]/;

/** The member names of `v` that are not `allowed`, cut short for a message (the caller chose them). */
function extraMembers(v: Record<string, unknown>, allowed: readonly string[]): string | undefined {
  const extra = Object.keys(v).filter((k) => !allowed.includes(k)).sort();
  if (extra.length === 0) return undefined;
  const named = extra.slice(0, 5).map((k) => JSON.stringify(k.length > 40 ? `${k.slice(0, 40)}…` : k));
  return `${named.join(", ")}${extra.length > 5 ? ` and ${extra.length - 5} more` : ""}`;
}

function checkMembers(v: Record<string, unknown>, allowed: readonly string[], field: string): void {
  const extra = extraMembers(v, allowed);
  if (extra) throw badRequest(`${field} has members it does not hold: ${extra} (it holds exactly ${allowed.join(", ")})`);
  const missing = allowed.find((k) => !(k in v));
  if (missing) throw badRequest(`${field}.${missing} is required`);
}

function checkText(v: unknown, field: string, nullable: boolean): void {
  if (v === null && nullable) return;
  const bound = GPU_FACT_BOUNDS.textChars;
  if (typeof v !== "string" || v.length > bound || CONTROL.test(v) || unstorableIn(v) !== undefined) {
    throw badRequest(`${field} must be ${nullable ? "null or " : ""}well-formed text of at most ${bound} characters without control characters`);
  }
}

function checkInteger(v: unknown, max: number, field: string): void {
  if (v === null) return;
  if (typeof v !== "number" || !Number.isInteger(v) || v < 0 || v > max) throw badRequest(`${field} must be null or an integer between 0 and ${max}`);
}

/**
 * A statement is what docs/receipts.md says it is, and what the daemon's statement builder
 * (attestationStatement, with the GPU facts of the job's GPU) makes: exactly its five members, and
 * `gpu` exactly the GPU facts, each of its type and within GPU_FACT_BOUNDS. Anything else is
 * refused (400 naming the field): the receipt signs the statement into itself under the server's
 * key, so a member of the daemon's own choosing would read as the server's word.
 */
export function checkStatement(s: unknown): asserts s is AttestationStatement {
  if (!isObject(s)) throw badRequest("attestation.statement must be an object");
  checkMembers(s, STATEMENT_MEMBERS, "attestation.statement");
  if (s.type !== ATTESTATION_TYPE || s.version !== 1) throw badRequest(`attestation.statement.type must be ${ATTESTATION_TYPE} version 1`);
  if (typeof s.job_id !== "string") throw badRequest("attestation.statement.job_id must be a string");
  if (s.output_sha256 !== null && (typeof s.output_sha256 !== "string" || !/^[0-9a-f]{64}$/.test(s.output_sha256))) {
    throw badRequest("attestation.statement.output_sha256 must be null or 64 lowercase hex digits");
  }
  const g = s.gpu;
  if (!isObject(g)) throw badRequest(`attestation.statement.gpu must be an object of the GPU facts: ${GPU_MEMBERS.join(", ")}`);
  checkMembers(g, GPU_MEMBERS, "attestation.statement.gpu");
  checkText(g.model, "attestation.statement.gpu.model", true);
  checkInteger(g.count, GPU_FACT_BOUNDS.count, "attestation.statement.gpu.count");
  checkInteger(g.vram_mib, GPU_FACT_BOUNDS.vramMib, "attestation.statement.gpu.vram_mib");
  checkText(g.driver_version, "attestation.statement.gpu.driver_version", true);
  if (!Array.isArray(g.uuids) || g.uuids.length > GPU_FACT_BOUNDS.uuids) {
    throw badRequest(`attestation.statement.gpu.uuids must be a list of at most ${GPU_FACT_BOUNDS.uuids} strings`);
  }
  g.uuids.forEach((u, i) => checkText(u, `attestation.statement.gpu.uuids[${i}]`, false));
}

/**
 * Checks a result's attestation: a statement of the documented form (checkStatement), signed by a
 * key this provider registered, about this job and the reported result. Writes nothing: the result's
 * report keeps it (keepAttestation) in the transaction that takes the result, and only then. Called
 * before the report, so that a bad attestation is refused (400 naming the field) before any work.
 * `result`: the result as reported.
 */
export async function verifyAttestation(
  db: Db,
  providerId: number,
  jobId: string,
  result: Value | JsonValue | undefined,
  a: AttestationInput,
): Promise<VerifiedAttestation> {
  const statement = (a.statement && "$typeName" in a.statement ? structJson(a.statement as Struct) : a.statement) as JsonObject | undefined;
  if (!a.keyId) throw badRequest("attestation.key_id is required");
  if (!statement) throw badRequest("attestation.statement is required");
  if (!a.signature) throw badRequest("attestation.signature is required");
  checkStatement(statement);
  const [key] = await db<{ provider_id: number; public_key: string }[]>`SELECT provider_id, public_key FROM provider_keys WHERE key_id = ${a.keyId}`;
  if (!key || key.provider_id !== providerId) throw badRequest(`attestation.key_id ${a.keyId} is not a key this provider registered`);
  if (!verifyCanonical(key.public_key, statement, a.signature)) {
    throw badRequest(`attestation.signature does not verify with the provider's registered key ${a.keyId}`);
  }
  if (statement.job_id !== jobId) throw badRequest("attestation.statement.job_id is not this result's job");
  const value = jsonOf(result);
  if (statement.output_sha256 !== outputSha256(value ?? null)) throw badRequest("attestation.statement.output_sha256 does not match the reported result");
  return { providerId, keyId: a.keyId, statement, signature: a.signature };
}

/**
 * Keeps a verified attestation for the attempt its result ended (`job`: the locked job row, on the
 * attempt the report named), in the transaction that takes the result and before it settles, so that
 * the receipt issued there reads it. A report refused anywhere on the way keeps nothing.
 */
export async function keepAttestation(tx: Tx, job: { id: number; attempt: number }, a: VerifiedAttestation): Promise<void> {
  await tx`
    INSERT INTO job_attestations (job_id, attempt, provider_id, key_id, statement, signature)
    VALUES (${job.id}, ${job.attempt}, ${a.providerId}, ${a.keyId}, ${tx.json(a.statement as never)}, ${a.signature})
    ON CONFLICT (job_id, attempt) DO UPDATE SET provider_id = EXCLUDED.provider_id, key_id = EXCLUDED.key_id,
      statement = EXCLUDED.statement, signature = EXCLUDED.signature, received_at = now()`;
}
