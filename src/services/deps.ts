// What every service implementation is built from, and the caller's principal.
import type { DescMethod } from "@bufbuild/protobuf";
import { createContextKey, type HandlerContext } from "@connectrpc/connect";
import type { Config } from "../config.js";
import type { Sql } from "../db/index.js";
import type { Logger } from "../log.js";
import type { Metrics } from "../metrics/metrics.js";
import { credentialsKey } from "../http/credentials.js";
import { forbidden } from "../errors.js";

/**
 * Counts a call on a rate-limit row kept per renter key, once its
 * authentication is decided, on both wires (src/http/rate-limits.ts).
 * `renterKey` is the renter key that authenticated the call, undefined when
 * none did (the row then counts against `clientIp`). Throws the 429.
 */
export type KeyRowCounter = (clientIp: string, renterKey: string | undefined) => Promise<void>;

export interface Deps {
  config: Config;
  sql: Sql;
  log: Logger;
  /** Set when rate limits are on: the counter of a method on a per-renter-key row, or undefined for other methods. */
  keyRowCounter?: (method: DescMethod) => KeyRowCounter | undefined;
  /**
   * Set when rate limits are on: heartbeats a daemon stream may send per window, the
   * heartbeat row's (as on the JSON route, but counted per stream, in its process).
   */
  streamBeatLimit?: { points: number; durationSec: number };
  /**
   * Set when rate limits are on: the default row, as it applies to each daemon stream's reports
   * that have no budget of their own (readiness, job reports, results), and to the refusals it answers.
   */
  streamWriteLimit?: { points: number; durationSec: number };
  /** Offers queued work to providers that became available (dispatch; never throws). */
  offerWork(providerIds: number[]): Promise<void>;
  /** The process's Prometheus metrics (absent in tools that build services without a server). */
  metrics?: Metrics;
}

export type Principal =
  | { role: "public" }
  /** `name`: whose token it was (SVC_OPERATOR_TOKENS), "admin" for SVC_ADMIN_TOKEN's: what the audit log records. */
  | { role: "admin"; name: string }
  | { role: "provider"; providerId: number }
  | { role: "renter"; renterId: number };

export const principalKey = createContextKey<Principal>({ role: "public" });

export function principalOf(ctx: HandlerContext): Principal {
  return ctx.values.get(principalKey);
}

/** The calling provider's id; the route's roles guarantee one is there. */
export function callerProviderId(ctx: HandlerContext): number {
  const p = principalOf(ctx);
  if (p.role !== "provider") throw forbidden("this endpoint needs a provider key");
  return p.providerId;
}

export function callerRenterId(ctx: HandlerContext): number {
  const p = principalOf(ctx);
  if (p.role !== "renter") throw forbidden("this endpoint needs a renter key");
  return p.renterId;
}

/** The API keys the caller presented (one of them authenticated it). */
export function callerKeys(ctx: HandlerContext): readonly string[] {
  return ctx.values.get(credentialsKey).keys;
}

/** Who an admin call's audit record names (the operator whose token it was), and from where. */
export function auditActor(ctx: HandlerContext): { actor: string; ip: string } {
  const p = principalOf(ctx);
  return { actor: p.role === "admin" ? p.name : p.role, ip: ctx.values.get(credentialsKey).clientIp };
}

/** A job ended by the platform's fault is logged as an error (the operator must look at it). */
export function logPlatformFault(deps: Pick<Deps, "log">, jobId: string, ack: { fault?: string; endReason?: string; status?: string }): void {
  if (ack.fault === "platform") deps.log.error({ jobId, endReason: ack.endReason, fault: "platform" }, "job ended by the platform's fault");
}
