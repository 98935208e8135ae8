// Provider attestation: a stream daemon holds an Ed25519 key of its own,
// registers the public key when it connects (Hello.provider_key), and signs
// the output hash and GPU facts of each result it reports. The signature is
// checked here against a key this provider registered before the result is
// taken; a result whose attestation does not verify is refused (400). The
// verified attestation is kept per attempt, and the job's receipt carries it
// when it is about the output the job stored (src/domain/money/receipts.ts).
import { toJson, type JsonObject, type JsonValue } from "@bufbuild/protobuf";
import { StructSchema, ValueSchema, type Struct, type Value } from "@bufbuild/protobuf/wkt";
import type { Db, Sql } from "../../db/index.js";
import { apiError, badRequest, conflict } from "../../errors.js";
import { ATTESTATION_TYPE, keyIdOf, outputSha256, verifyCanonical } from "../../shared/receipt.js";

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

const jsonOf = (v: Value | JsonValue | undefined): JsonValue | undefined =>
  v !== undefined && v !== null && typeof v === "object" && "$typeName" in v ? toJson(ValueSchema, v as Value) : (v as JsonValue | undefined);

/**
 * Checks a result's attestation against the reporting provider's registered
 * key and keeps it for the job's current attempt. Called before the result
 * is reported; a job this provider does not hold is left to the report to
 * refuse. `result`: the result as reported (it is stored as it is).
 */
export async function recordAttestation(db: Db, providerId: number, jobId: string, result: Value | JsonValue | undefined, a: AttestationInput): Promise<void> {
  const statement = (a.statement && "$typeName" in a.statement ? toJson(StructSchema, a.statement as Struct) : a.statement) as JsonObject | undefined;
  if (!a.keyId) throw badRequest("attestation.key_id is required");
  if (!statement) throw badRequest("attestation.statement is required");
  if (!a.signature) throw badRequest("attestation.signature is required");
  const [key] = await db<{ provider_id: number; public_key: string }[]>`SELECT provider_id, public_key FROM provider_keys WHERE key_id = ${a.keyId}`;
  if (!key || key.provider_id !== providerId) throw badRequest(`attestation.key_id ${a.keyId} is not a key this provider registered`);
  if (!verifyCanonical(key.public_key, statement, a.signature)) {
    throw badRequest(`attestation.signature does not verify with the provider's registered key ${a.keyId}`);
  }
  if (statement.type !== ATTESTATION_TYPE || statement.version !== 1) throw badRequest(`attestation.statement.type must be ${ATTESTATION_TYPE} version 1`);
  if (statement.job_id !== jobId) throw badRequest("attestation.statement.job_id is not this result's job");
  const value = jsonOf(result);
  if (statement.output_sha256 !== outputSha256(value ?? null)) throw badRequest("attestation.statement.output_sha256 does not match the reported result");
  // Kept for the provider's current attempt; once the job has its receipt nothing changes.
  await db`
    INSERT INTO job_attestations (job_id, attempt, provider_id, key_id, statement, signature)
    SELECT j.id, j.attempt, ${providerId}, ${a.keyId}, ${db.json(statement as never)}, ${a.signature}
    FROM jobs j WHERE j.job_id = ${jobId} AND j.provider_id = ${providerId}
      AND NOT EXISTS (SELECT 1 FROM job_receipts r WHERE r.job_id = j.id)
    ON CONFLICT (job_id, attempt) DO UPDATE SET key_id = EXCLUDED.key_id, statement = EXCLUDED.statement,
      signature = EXCLUDED.signature, received_at = now()
    WHERE NOT EXISTS (SELECT 1 FROM job_receipts r WHERE r.job_id = job_attestations.job_id)`;
}
