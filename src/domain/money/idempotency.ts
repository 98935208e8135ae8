// Optional Idempotency-Key handling (topup, job submit, admin adjust): the
// same key with the same body replays the first response; with another body
// it is a 409.
//
// idempotent(): the key row is inserted in the same transaction as the work,
// so a concurrent duplicate waits on it and then replays the committed answer.
//
// claimKey() / finishClaim() / releaseClaim(): for work that calls outside the
// database before its transaction (a card top-up's gateway invoice), where no
// transaction may wait on that call and a duplicate must not repeat it. The
// key is claimed first, in its own committed statement (a row with no response
// and a claimed_until); a duplicate meanwhile is a 409 "in progress; retry";
// the work's transaction stores the answer and ends the claim; a failure
// releases it (deletes the row) so a retry starts over; a claim whose process
// died expires at claimed_until and the next retry takes the key over.
//
// A key is honoured for KEY_KEPT_HOURS after its first request and no longer
// (pastWindow, the one rule): a request with a key past it replaces the old row
// in the statement that would have inserted its own, as if the key were new,
// whether or not the retention sweep (src/workers/retention.ts) has deleted the
// row yet (deleteExpiredKeys). A key whose request is still in flight (a live
// claim) stays until that request has answered.
import crypto from "node:crypto";
import { create, fromJson, toJson, type DescMessage, type MessageInitShape, type MessageShape } from "@bufbuild/protobuf";
import type { Db, Sql, Tx } from "../../db/index.js";
import { apiError, badRequest, conflict } from "../../errors.js";
import { canonicalJson } from "../../shared/task-signature.js";
import { deleteInBatches } from "../shared/batched-delete.js";

function hashOf(key: string, request: unknown): string {
  if (key.length > 255) throw badRequest("Idempotency-Key must be at most 255 characters");
  return crypto.createHash("sha256").update(canonicalJson(request)).digest("hex");
}

const differentRequest = () => conflict("Idempotency-Key was already used with a different request");

/** Seconds a client waits before retrying a key whose first request is still in flight. */
export const IN_PROGRESS_RETRY_AFTER_SECONDS = 1;

const inProgress = () =>
  apiError(409, "a request with this Idempotency-Key is still in progress; retry after it has answered to get its response", {
    "Retry-After": String(IN_PROGRESS_RETRY_AFTER_SECONDS),
  });

/**
 * How long a claim holds its key while its request is in flight. Well above
 * the gateway call's own timeout (15 s) and a transaction's time, so only a
 * request whose process died (or lost its database) is ever taken over.
 */
export const CLAIM_TTL_SECONDS = 120;

/** A key claimed by this request: `token` tells its claim from a later takeover's. */
export interface KeyClaim {
  scope: string;
  key: string;
  token: string;
}

/**
 * Claims `key` for this request before work with an outside effect, or
 * answers the replay of a request already done with it. Each statement
 * commits on its own: no transaction stays open across the outside call.
 * 409 when the key was used with another request, or when its first request
 * is still in flight (its claim not yet expired). Without a key: no claim.
 */
export async function claimKey<D extends DescMessage>(
  sql: Sql,
  schema: D,
  scope: string,
  key: string | undefined,
  request: unknown,
  ttlSeconds = CLAIM_TTL_SECONDS,
): Promise<{ replay: MessageShape<D> } | { replay?: undefined; claim: KeyClaim | undefined }> {
  if (!key) return { claim: undefined };
  const requestHash = hashOf(key, request);
  const token = crypto.randomUUID();
  // A few rounds: a claim released or taken over between two statements is looked at again.
  for (let round = 0; round < 3; round++) {
    const inserted = await sql`
      INSERT INTO idempotency_keys (scope, key, request_hash, claim_token, claimed_until)
      VALUES (${scope}, ${key}, ${requestHash}, ${token}, now() + make_interval(secs => ${ttlSeconds}))
      ${replacingExpired(sql)} RETURNING key`;
    if (inserted.length > 0) return { claim: { scope, key, token } };
    const [prior] = await sql<{ request_hash: string; response: unknown; live: boolean }[]>`
      SELECT request_hash, response, coalesce(claimed_until > now(), false) AS live
      FROM idempotency_keys WHERE scope = ${scope} AND key = ${key}`;
    if (!prior) continue; // released meanwhile
    if (prior.request_hash !== requestHash) throw differentRequest();
    if (prior.response !== null) return { replay: fromJson(schema, prior.response as never) };
    if (prior.live) throw inProgress();
    // The first request's claim expired (its process died mid-request): this retry takes the key over.
    const taken = await sql`
      UPDATE idempotency_keys SET claim_token = ${token}, claimed_until = now() + make_interval(secs => ${ttlSeconds})
      WHERE scope = ${scope} AND key = ${key} AND request_hash = ${requestHash} AND response IS NULL
        AND (claimed_until IS NULL OR claimed_until <= now())
      RETURNING key`;
    if (taken.length > 0) return { claim: { scope, key, token } };
  }
  throw inProgress();
}

/**
 * Runs the claimed work in one transaction that also stores its answer and
 * ends the claim. `stored` is false when the claim had expired and been taken
 * over meanwhile: the work is still committed (what it recorded happened
 * outside, e.g. an invoice), but the key answers the other request's reply.
 */
export async function finishClaim<D extends DescMessage>(
  sql: Sql,
  schema: D,
  claim: KeyClaim | undefined,
  run: (tx: Tx) => Promise<MessageInitShape<D>>,
): Promise<{ answer: MessageShape<D>; stored: boolean }> {
  return (await sql.begin(async (tx) => {
    const answer = create(schema, await run(tx));
    if (!claim) return { answer, stored: true };
    const done = await tx`
      UPDATE idempotency_keys SET response = ${tx.json(toJson(schema, answer) as never)}, claim_token = NULL, claimed_until = NULL
      WHERE scope = ${claim.scope} AND key = ${claim.key} AND claim_token = ${claim.token} AND response IS NULL
      RETURNING key`;
    return { answer, stored: done.length > 0 };
  })) as { answer: MessageShape<D>; stored: boolean };
}

/** Gives a claim up after its work failed, so that a retry with the key starts over (only this claim, never a takeover's). */
export async function releaseClaim(sql: Sql, claim: KeyClaim | undefined): Promise<void> {
  if (!claim) return;
  await sql`
    DELETE FROM idempotency_keys
    WHERE scope = ${claim.scope} AND key = ${claim.key} AND claim_token = ${claim.token} AND response IS NULL`;
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
    // A key inside its window is left as it is, its row locked by this transaction: a concurrent
    // duplicate waits on it (the new row or the replaced one) and then looks at the committed answer.
    const inserted = await tx`
      INSERT INTO idempotency_keys (scope, key, request_hash) VALUES (${scope}, ${key}, ${requestHash})
      ${replacingExpired(tx)} RETURNING key`;
    if (inserted.length === 0) {
      const [prior] = await tx<{ request_hash: string; response: unknown }[]>`
        SELECT request_hash, response FROM idempotency_keys WHERE scope = ${scope} AND key = ${key} FOR UPDATE`;
      // Gone meanwhile: not expected, as the insert locked the row it left.
      if (!prior) throw inProgress();
      if (prior.request_hash !== requestHash) throw differentRequest();
      // A committed row without an answer is a claimKey() claim still in flight.
      if (prior.response === null) throw inProgress();
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

/** Hours a key replays its first answer (or refuses another request) after its first request. */
export const KEY_KEPT_HOURS = 24;

/**
 * Whether an idempotency_keys row is past its key's window (a condition, as a query fragment): its first
 * request came more than KEY_KEPT_HOURS ago and none with it is in flight (no live claim). Such a row is
 * as if never written: the sweep deletes it (deleteExpiredKeys), and a request with its key replaces it
 * (replacingExpired), whichever comes first.
 */
const pastWindow = (db: Db) => db`
  idempotency_keys.created_at < now() - make_interval(hours => ${KEY_KEPT_HOURS})
  AND (idempotency_keys.claimed_until IS NULL OR idempotency_keys.claimed_until <= now())`;

/**
 * The ON CONFLICT clause of a key's insert: a row past its window (pastWindow) is replaced by the one
 * being inserted (its window starts now), as the insert would have gone in had the sweep deleted it; any
 * other row is left, locked by the statement (by its transaction, when there is one), and nothing is
 * returned. One statement: concurrent requests with the key replace it once, the others then find the
 * new row.
 */
const replacingExpired = (db: Db) => db`
  ON CONFLICT (scope, key) DO UPDATE SET
    request_hash = excluded.request_hash, response = excluded.response, claim_token = excluded.claim_token,
    claimed_until = excluded.claimed_until, created_at = excluded.created_at
  WHERE ${pastWindow(db)}`;

/**
 * Deletes the keys past their window (pastWindow): whose first request came more
 * than KEY_KEPT_HOURS ago, but not one whose request is still in flight (a live
 * claim, or a transaction holding its row), which stays until it has answered.
 * Run by the retention sweep; the index on created_at finds them. A request with
 * such a key does not wait for it: it replaces the row (replacingExpired).
 */
export async function deleteExpiredKeys(db: Db): Promise<number> {
  return deleteInBatches(async (limit) => {
    const r = await db`
      DELETE FROM idempotency_keys WHERE ctid = ANY(ARRAY(
        SELECT ctid FROM idempotency_keys WHERE ${pastWindow(db)}
        LIMIT ${limit} FOR UPDATE SKIP LOCKED))`;
    return r.count;
  });
}
