// Delivers renter webhooks from the outbox: signed, retried with exponential
// backoff, never on a request's path. Woken by NOTIFY when a transaction
// queues one, and polling for retries that fall due; several processes can
// run it at once (claims use FOR UPDATE SKIP LOCKED).
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
  batch?: number;
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
 * `signal` (the worker stopping) ends it at once.
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
  const batch = opts.batch ?? 20;
  let timer: NodeJS.Timeout | undefined;
  let unlisten: (() => Promise<void>) | undefined;
  let running: Promise<void> | undefined;
  let again = false;
  let stopped = false;
  // Aborted by stop(): deliveries in flight end at once (their rows are retried later, as after a failure).
  let stopping = new AbortController();

  async function deliver(row: OutboxRow) {
    const out = await post(row, opts.production, timeoutMs, stopping.signal);
    if (out.ok) {
      await markDelivered(opts.sql, row.id, out.status!);
      return;
    }
    // A stop is not the receiver's failure: the row goes back as it was, for the next process.
    if (out.stopped) return releaseClaim(opts.sql, row.id);
    const delay = out.permanent ? null : retryDelayMs(row.attempts, base, max, maxAttempts);
    opts.log.warn({ outboxId: row.id, renterId: row.renter_id, attempts: row.attempts, error: out.error, giveUp: delay === null }, "webhook delivery failed");
    await markFailed(opts.sql, row.id, out.status, out.error, delay);
    opts.onFailure?.(delay === null);
  }

  async function drain() {
    await releaseOrphanedClaims(opts.sql);
    do {
      again = false;
      const rows = await claimDue(opts.sql, batch);
      await Promise.all(rows.map((r) => deliver(r).catch((err) => opts.log[failureLevel(err)]({ err, outboxId: r.id }, "webhook delivery bookkeeping failed"))));
      if (rows.length === batch) again = true;
    } while (again && !stopped);
  }

  function tick(): Promise<void> {
    if (stopped) return Promise.resolve();
    if (running) {
      again = true;
      return running;
    }
    running = drain()
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
      stopping = new AbortController();
      const sub = await opts.sql.listen(WEBHOOK_NOTIFY_CHANNEL, () => void tick());
      unlisten = sub.unlisten;
      timer = setInterval(() => void tick(), pollMs);
      timer.unref();
      void tick();
    },
    async stop() {
      stopped = true;
      stopping.abort();
      if (timer) clearInterval(timer);
      await unlisten?.().catch(() => {});
      await running;
    },
  };
}
