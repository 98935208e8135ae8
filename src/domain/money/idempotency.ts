// Optional Idempotency-Key handling (topup, job submit): the same key with
// the same body replays the first response; with another body it is a 409.
// The key row is inserted in the same transaction as the work, so a
// concurrent duplicate waits on it and then replays the committed answer.
import crypto from "node:crypto";
import { create, fromJson, toJson, type DescMessage, type MessageInitShape, type MessageShape } from "@bufbuild/protobuf";
import type { Sql, Tx } from "../../db/index.js";
import { badRequest, conflict } from "../../errors.js";
import { canonicalJson } from "../../shared/task-signature.js";

function hashOf(key: string, request: unknown): string {
  if (key.length > 255) throw badRequest("Idempotency-Key must be at most 255 characters");
  return crypto.createHash("sha256").update(canonicalJson(request)).digest("hex");
}

/**
 * The answer already stored for this key and request (a replay), without
 * waiting on a request still in flight; 409 when the key was used with
 * another request. For work with an outside effect that should not be
 * repeated for a replay (a gateway invoice); idempotent() still decides.
 */
export async function priorAnswer<D extends DescMessage>(sql: Sql, schema: D, scope: string, key: string | undefined, request: unknown): Promise<MessageShape<D> | undefined> {
  if (!key) return undefined;
  const requestHash = hashOf(key, request);
  const [prior] = await sql<{ request_hash: string; response: unknown }[]>`
    SELECT request_hash, response FROM idempotency_keys WHERE scope = ${scope} AND key = ${key}`;
  if (!prior) return undefined;
  if (prior.request_hash !== requestHash) throw conflict("Idempotency-Key was already used with a different request");
  return prior.response === null ? undefined : fromJson(schema, prior.response as never);
}

export async function idempotent<D extends DescMessage>(
  sql: Sql,
  schema: D,
  scope: string,
  key: string | undefined,
  request: unknown,
  run: (tx: Tx) => Promise<MessageInitShape<D>>,
): Promise<MessageShape<D>> {
  if (!key) return create(schema, (await sql.begin(run)) as MessageInitShape<D>);
  const requestHash = hashOf(key, request);
  return (await sql.begin(async (tx) => {
    const inserted = await tx`
      INSERT INTO idempotency_keys (scope, key, request_hash) VALUES (${scope}, ${key}, ${requestHash})
      ON CONFLICT DO NOTHING RETURNING key`;
    if (inserted.length === 0) {
      const [prior] = await tx<{ request_hash: string; response: unknown }[]>`
        SELECT request_hash, response FROM idempotency_keys WHERE scope = ${scope} AND key = ${key} FOR UPDATE`;
      if (prior.request_hash !== requestHash) throw conflict("Idempotency-Key was already used with a different request");
      return fromJson(schema, prior.response as never);
    }
    const result = create(schema, await run(tx));
    await tx`UPDATE idempotency_keys SET response = ${tx.json(toJson(schema, result) as never)} WHERE scope = ${scope} AND key = ${key}`;
    return result;
  })) as MessageShape<D>;
}

/**
 * Replaces the stored answer of a key whose request changed what it answers
 * after its transaction (a submit placed once contended providers were
 * refilled), so that a replay repeats what the first caller was told.
 */
export async function restoreAnswer<D extends DescMessage>(sql: Sql, schema: D, scope: string, key: string | undefined, answer: MessageShape<D>): Promise<void> {
  if (!key) return;
  await sql`UPDATE idempotency_keys SET response = ${sql.json(toJson(schema, answer) as never)} WHERE scope = ${scope} AND key = ${key}`;
}
