// Renter webhooks: the URL rules, the signature, and the transactional outbox.
// A notification is written in the same transaction as the state change that
// causes it (so it exists exactly when the change committed) and delivered
// later by src/workers/webhook-outbox.ts; no request ever waits on a renter's
// server.
import crypto from "node:crypto";
import type { Db, Tx } from "../../db/index.js";
import { badRequest } from "../../errors.js";
import { isPrivateHost } from "../shared/address.js";
import { deleteInBatches } from "../shared/batched-delete.js";

export const WEBHOOK_NOTIFY_CHANNEL = "svc_webhook_outbox";
export const SIGNATURE_HEADER = "x-svc-signature";
export const TIMESTAMP_HEADER = "x-svc-timestamp";
export const EVENT_HEADER = "x-svc-event";
export const DELIVERY_HEADER = "x-svc-delivery";
/** Receivers should refuse a timestamp further than this from their clock (replay window). */
export const SIGNATURE_TOLERANCE_SECONDS = 300;

export type RenterWebhookEvent = "job.completed" | "job.failed" | "job.cancelled" | (string & {});

/**
 * Validates a renter webhook URL: absolute http(s), no credentials, https only
 * in production, and in production no private host (shared/address.ts: a
 * non-public IP literal or a local name; other names are resolved and their
 * addresses checked at every delivery).
 */
export function checkWebhookUrl(raw: string, production: boolean, field = "webhook_url"): string {
  const text = raw.trim();
  if (text.length > 2000) throw badRequest(`${field} must be at most 2000 characters`);
  let u: URL;
  try {
    u = new URL(text);
  } catch {
    throw badRequest(`${field} must be an absolute URL`);
  }
  if (u.protocol !== "https:" && !(u.protocol === "http:" && !production)) {
    throw badRequest(production ? `${field} must use https` : `${field} must use https or http`);
  }
  if (u.username || u.password) throw badRequest(`${field} must not contain credentials`);
  if (production) {
    if (isPrivateHost(u.hostname)) {
      throw badRequest(`${field} must not point at a private or loopback address`);
    }
  }
  u.hash = "";
  return u.toString();
}

export function newWebhookSecret(): string {
  return "whsec_" + crypto.randomBytes(24).toString("base64url");
}

/** Lowercase hex HMAC-SHA256 over `${timestamp}.${body}`. */
export function webhookSignature(secret: string, timestamp: number, body: string): string {
  return crypto.createHmac("sha256", secret).update(`${timestamp}.`).update(body).digest("hex");
}

/**
 * Queues a notification for the renter's webhook_url in the caller's
 * transaction. Does nothing (returns undefined) when the renter has no
 * webhook. The body is fixed now, so every retry signs the same bytes.
 */
export async function enqueueRenterWebhook(
  tx: Tx,
  renterId: number,
  event: RenterWebhookEvent,
  payload: Record<string, unknown>,
): Promise<string | undefined> {
  const [r] = await tx<{ webhook_url: string | null }[]>`SELECT webhook_url FROM renters WHERE id = ${renterId}`;
  if (!r?.webhook_url) return undefined;
  const eventId = "evt_" + crypto.randomBytes(12).toString("hex");
  const body = JSON.stringify({ id: eventId, event, created_at: new Date().toISOString(), renter_id: renterId, data: payload });
  await tx`
    INSERT INTO webhook_outbox (event_id, renter_id, event, url, body)
    VALUES (${eventId}, ${renterId}, ${event}, ${r.webhook_url}, ${body})`;
  await tx`SELECT pg_notify(${WEBHOOK_NOTIFY_CHANNEL}, '')`;
  return eventId;
}

export interface OutboxRow {
  id: number;
  event_id: string;
  renter_id: number;
  event: string;
  url: string;
  body: string;
  attempts: number;
  secret: string | null;
}

/** How long a claimed delivery is reserved for the process that claimed it. */
const CLAIM_SECONDS = 60;

/** Why a queued delivery was dropped: the renter has no webhook any more. */
export const WEBHOOK_REMOVED = "the renter removed its webhook";

/**
 * Claims up to `limit` due deliveries, oldest first, leaving out a renter's
 * once `perRenter` of its deliveries are claimed (in flight, in any process):
 * a renter whose receiver is slow or never answers holds only its own share.
 * Each is pushed out of reach of other processes for CLAIM_SECONDS, marked
 * with the claiming process's connection name (releaseOrphanedClaims frees it
 * sooner when that process is gone). Each goes to the renter's webhook as it
 * is now, URL and secret together (a retry follows a change of URL, and an
 * address the renter dropped, or that was dropped for it, gets nothing more);
 * one whose renter has none is dead. The row locked is checked to be due
 * still (another process may have claimed it since it was ranked). Two
 * processes claiming at the same moment do not see each other's claims: a
 * renter may then have up to `perRenter` in flight in each.
 */
export async function claimDue(db: Db, limit: number, perRenter: number): Promise<OutboxRow[]> {
  const rows = await db<(OutboxRow & { status: string })[]>`
    WITH claimed AS (
      SELECT renter_id, count(*) AS n FROM webhook_outbox
      WHERE status = 'pending' AND claimed_by IS NOT NULL AND next_attempt_at > now()
      GROUP BY renter_id
    ), ranked AS (
      SELECT o.id, o.next_attempt_at,
             coalesce(c.n, 0) + row_number() OVER (PARTITION BY o.renter_id ORDER BY o.next_attempt_at, o.id) AS place
      FROM webhook_outbox o LEFT JOIN claimed c ON c.renter_id = o.renter_id
      WHERE o.status = 'pending' AND o.next_attempt_at <= now()
    ), due AS (
      SELECT id FROM webhook_outbox
      WHERE id IN (SELECT id FROM ranked WHERE place <= ${perRenter} ORDER BY next_attempt_at, id LIMIT ${limit})
        AND status = 'pending' AND next_attempt_at <= now()
      FOR UPDATE SKIP LOCKED
    )
    UPDATE webhook_outbox o
    SET attempts = o.attempts + CASE WHEN r.webhook_url IS NULL THEN 0 ELSE 1 END, next_attempt_at = now() + make_interval(secs => ${CLAIM_SECONDS}),
        claimed_by = CASE WHEN r.webhook_url IS NULL THEN NULL ELSE current_setting('application_name') END,
        url = coalesce(r.webhook_url, o.url),
        status = CASE WHEN r.webhook_url IS NULL THEN 'dead' ELSE o.status END,
        last_error = CASE WHEN r.webhook_url IS NULL THEN ${WEBHOOK_REMOVED} ELSE o.last_error END
    FROM due, renters r
    WHERE o.id = due.id AND r.id = o.renter_id
    RETURNING o.id, o.event_id, o.renter_id, o.event, o.url, o.body, o.attempts, r.webhook_secret AS secret, o.status`;
  return rows.filter((r) => r.status === "pending").map(({ status: _, ...row }) => row);
}

/**
 * Makes due again the claimed deliveries whose claiming process has no connection to the
 * database left (killed, or its machine gone): its claim would otherwise hold them for up to
 * CLAIM_SECONDS. Such a delivery may have been sent before the process died; receivers tell a
 * repeat by its event id, as for any retry.
 */
export async function releaseOrphanedClaims(db: Db): Promise<number> {
  const released = await db`
    UPDATE webhook_outbox SET next_attempt_at = now(), claimed_by = NULL
    WHERE status = 'pending' AND claimed_by IS NOT NULL AND next_attempt_at > now()
      AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.application_name = webhook_outbox.claimed_by)`;
  return released.count;
}

/**
 * A claim as the claiming process holds it: the row still pending, claimed by this process (its
 * connections' application_name), at the attempt it claimed. Every claim counts an attempt and only
 * the holder hands one back (releaseClaim), so a claim released meanwhile (its process taken for
 * gone while it reconnected, or its 60 s run out) and taken again, by another process or this one,
 * is no longer held: what the first holder learns afterwards changes nothing but a success.
 */
type Claim = Pick<OutboxRow, "id" | "attempts">;

/**
 * Hands a claimed row back untried (its worker stopped before the receiver answered): the claim's
 * attempt is not counted, and the row is due at once for whichever process delivers next.
 */
export async function releaseClaim(db: Db, claim: Claim): Promise<void> {
  await db`
    UPDATE webhook_outbox SET attempts = greatest(attempts - 1, 0), next_attempt_at = now(), claimed_by = NULL
    WHERE id = ${claim.id} AND status = 'pending' AND claimed_by = current_setting('application_name') AND attempts = ${claim.attempts}`;
}

/**
 * Records a delivery the receiver accepted, whoever holds the row now: the event has arrived (another
 * process's try of it still in flight changes nothing once it ends), and a row given up meanwhile was
 * delivered after all. Delivery is at least once; a delivered row is never marked dead.
 */
export async function markDelivered(db: Db, id: number, status: number): Promise<void> {
  await db`UPDATE webhook_outbox SET status = 'delivered', delivered_at = now(), last_status = ${status}, last_error = NULL, claimed_by = NULL WHERE id = ${id}`;
}

/**
 * Schedules the next try after `delayMs`, or gives up (dead) after the last attempt; only while the
 * claim is still held (Claim). False when it was not: the row is left as it is.
 */
export async function markFailed(db: Db, claim: Claim, status: number | null, error: string, delayMs: number | null): Promise<boolean> {
  const held = db`id = ${claim.id} AND status = 'pending' AND claimed_by = current_setting('application_name') AND attempts = ${claim.attempts}`;
  const settled = delayMs === null
    ? await db`UPDATE webhook_outbox SET status = 'dead', last_status = ${status}, last_error = ${error.slice(0, 500)}, claimed_by = NULL WHERE ${held}`
    : await db`
      UPDATE webhook_outbox
      SET last_status = ${status}, last_error = ${error.slice(0, 500)}, claimed_by = NULL,
          next_attempt_at = now() + make_interval(secs => ${delayMs / 1000})
      WHERE ${held}`;
  return settled.count > 0;
}

/**
 * Deletes the deliveries that ended (delivered, or given up) and were enqueued more than `days` days
 * ago (0: none), a batch a statement (the retention sweep's). Nothing reads them once they ended; a
 * pending one stays however old it is.
 */
export async function deleteFinishedWebhooks(db: Db, days: number): Promise<number> {
  if (days <= 0) return 0;
  return deleteInBatches(async (limit) => {
    const r = await db`
      DELETE FROM webhook_outbox WHERE id = ANY(ARRAY(
        SELECT id FROM webhook_outbox WHERE status <> 'pending' AND created_at < now() - make_interval(days => ${days})
        LIMIT ${limit} FOR UPDATE SKIP LOCKED))`;
    return r.count;
  });
}
