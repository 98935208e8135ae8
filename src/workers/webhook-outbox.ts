// Delivers renter webhooks from the outbox: signed, retried with exponential
// backoff, never on a request's path. Woken by NOTIFY when a transaction
// queues one, by a delivery ending, and polling for retries that fall due;
// several processes can run it at once (claims use FOR UPDATE SKIP LOCKED).
// Deliveries run side by side in a pool that claims as its slots free, with a
// few at most per renter: a renter's slow receiver delays only its own.
import http from "node:http";
import https from "node:https";
import type { Sql } from "../db/index.js";
import type { Logger } from "../log.js";
import {
  DELIVERY_HEADER,
  EVENT_HEADER,
  SIGNATURE_HEADER,
  TIMESTAMP_HEADER,
  WEBHOOK_NOTIFY_CHANNEL,
  checkWebhookUrl,
  claimDue,
  releaseClaim,
  releaseOrphanedClaims,
  markDelivered,
  markFailed,
  webhookSignature,
  type OutboxRow,
} from "../domain/notify/webhooks.js";
import { publicOnlyLookup } from "../domain/shared/address.js";
import type { Worker } from "./worker.js";
import { failureLevel } from "../errors.js";

export interface WebhookWorkerOptions {
  sql: Sql;
  log: Logger;
  production: boolean;
  pollMs?: number;
  /** First retry delay; doubles per attempt up to maxDelayMs. */
  baseDelayMs?: number;
  maxDelayMs?: number;
  maxAttempts?: number;
  timeoutMs?: number;
  /** Deliveries in flight at once in this process. */
  concurrency?: number;
  /** Deliveries to one renter in flight at once (claimDue). */
  perRenter?: number;
  /** Told of each failed delivery (metrics); `final` when it was given up. */
  onFailure?: (final: boolean) => void;
}

/** Backoff before attempt `attempts + 1`, with ±20% jitter; null once attempts are used up. */
export function retryDelayMs(attempts: number, base: number, max: number, maxAttempts: number): number | null {
  if (attempts >= maxAttempts) return null;
  const raw = Math.min(max, base * 2 ** (attempts - 1));
  return Math.round(raw * (0.8 + Math.random() * 0.4));
}

/** Resolves names and refuses private/loopback answers (production: no SSRF, also via DNS rebinding). */
const lookup = publicOnlyLookup("webhook");

interface Outcome {
  ok: boolean;
  status: number | null;
  error: string;
  permanent: boolean;
  /** The worker stopped before an answer: nothing was judged (the claim is handed back untried). */
  stopped?: boolean;
}

/**
 * One delivery, settled within `timeoutMs` whatever the receiver does: the limit is on the whole
 * exchange up to the status line (a socket's idle timeout alone is reset by every byte, so a
 * receiver trickling its headers held the delivery, and the batch behind it, for ever), and the
 * connection is closed once the status is known (the body is not read: an endless one kept it open).
 * `signal` (the worker stopping) ends it at once; each delivery has its own, so a full pool puts no
 * more than one listener on any signal.
 */
const STOPPED: Outcome = { ok: false, status: null, error: "the worker stopped before an answer", permanent: false, stopped: true };

function post(row: OutboxRow, production: boolean, timeoutMs: number, signal: AbortSignal): Promise<Outcome> {
  if (signal.aborted) return Promise.resolve(STOPPED);
  return new Promise((resolve) => {
    let url: URL;
    try {
      url = new URL(checkWebhookUrl(row.url, production));
    } catch (err) {
      const e = err as Error & { rawMessage?: string };
      return resolve({ ok: false, status: null, error: e.rawMessage ?? e.message, permanent: true });
    }
    const timestamp = Math.floor(Date.now() / 1000);
    const headers: Record<string, string | number> = {
      "content-type": "application/json",
      "content-length": Buffer.byteLength(row.body),
      "user-agent": "svc-webhooks/1",
      [EVENT_HEADER]: row.event,
      [DELIVERY_HEADER]: row.event_id,
      [TIMESTAMP_HEADER]: String(timestamp),
    };
    if (row.secret) headers[SIGNATURE_HEADER] = `v1=${webhookSignature(row.secret, timestamp, row.body)}`;
    const lib = url.protocol === "https:" ? https : http;
    const req = lib.request(url, {
      method: "POST",
      headers,
      signal,
      ...(production ? { lookup } : {}),
    });
    const deadline = setTimeout(() => req.destroy(new Error(`no answer within ${timeoutMs} ms`)), timeoutMs);
    req.on("response", (res) => {
      clearTimeout(deadline);
      const status = res.statusCode ?? 0;
      const ok = status >= 200 && status < 300;
      resolve({ ok, status, error: ok ? "" : `HTTP ${status}`, permanent: status === 410 });
      res.destroy(); // the body is not needed
    });
    req.on("error", (err) => {
      clearTimeout(deadline);
      resolve(signal.aborted ? STOPPED : { ok: false, status: null, error: err.message, permanent: false });
    });
    req.end(row.body);
  });
}

export function webhookOutboxWorker(opts: WebhookWorkerOptions): Worker & { tick(): Promise<void> } {
  const pollMs = opts.pollMs ?? 1000;
  const base = opts.baseDelayMs ?? 15_000;
  const max = opts.maxDelayMs ?? 3_600_000;
  const maxAttempts = opts.maxAttempts ?? 10;
  const timeoutMs = opts.timeoutMs ?? 10_000;
  const concurrency = opts.concurrency ?? 20;
  const perRenter = opts.perRenter ?? 4;
  let timer: NodeJS.Timeout | undefined;
  let unlisten: (() => Promise<void>) | undefined;
  let running: Promise<void> | undefined;
  let again = false;
  let stopped = false;
  let orphansCheckedAt = 0;
  // The deliveries in flight, each with its own abort: stop() aborts them (their rows are handed back untried).
  const inFlight = new Map<Promise<void>, AbortController>();

  async function deliver(row: OutboxRow, signal: AbortSignal) {
    const out = await post(row, opts.production, timeoutMs, signal);
    if (out.ok) {
      await markDelivered(opts.sql, row.id, out.status!);
      return;
    }
    // A stop is not the receiver's failure: the row goes back as it was, for the next process.
    if (out.stopped) return releaseClaim(opts.sql, row);
    const delay = out.permanent ? null : retryDelayMs(row.attempts, base, max, maxAttempts);
    // Settled only while this process still holds the claim (a claim released meanwhile may have been delivered by another).
    const settled = await markFailed(opts.sql, row, out.status, out.error, delay);
    opts.log.warn({ outboxId: row.id, renterId: row.renter_id, attempts: row.attempts, error: out.error, giveUp: settled && delay === null, claimLost: !settled }, "webhook delivery failed");
    opts.onFailure?.(settled && delay === null);
  }

  /** Starts a claimed delivery in a slot; when it ends, the slot is filled again. */
  function launch(row: OutboxRow) {
    const abort = new AbortController();
    if (stopped) abort.abort(); // claimed while stopping: handed back untried
    const done: Promise<void> = deliver(row, abort.signal)
      .catch((err) => opts.log[failureLevel(err)]({ err, outboxId: row.id }, "webhook delivery bookkeeping failed"))
      .finally(() => {
        inFlight.delete(done);
        void tick();
      });
    inFlight.set(done, abort);
  }

  async function fill() {
    // A process gone frees its claims within a poll (not on every delivery's end).
    if (Date.now() - orphansCheckedAt >= pollMs) {
      orphansCheckedAt = Date.now();
      await releaseOrphanedClaims(opts.sql);
    }
    do {
      again = false;
      while (!stopped && inFlight.size < concurrency) {
        const free = concurrency - inFlight.size;
        const rows = await claimDue(opts.sql, free, perRenter);
        for (const row of rows) launch(row);
        if (rows.length < free) break;
      }
    } while (again && !stopped);
  }

  /** Claims due deliveries into the free slots; resolves once they are started, not delivered. */
  function tick(): Promise<void> {
    if (stopped) return Promise.resolve();
    if (running) {
      again = true;
      return running;
    }
    running = fill()
      .catch((err) => opts.log[failureLevel(err)]({ err }, "webhook outbox pass failed"))
      .finally(() => {
        running = undefined;
      });
    return running;
  }

  return {
    tick,
    async start() {
      stopped = false;
      const sub = await opts.sql.listen(WEBHOOK_NOTIFY_CHANNEL, () => void tick());
      unlisten = sub.unlisten;
      timer = setInterval(() => void tick(), pollMs);
      timer.unref();
      void tick();
    },
    async stop() {
      stopped = true;
      for (const abort of inFlight.values()) abort.abort();
      if (timer) clearInterval(timer);
      await unlisten?.().catch(() => {});
      await running;
      await Promise.all(inFlight.keys());
    },
  };
}
