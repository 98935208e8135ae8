// Per-key request limit for /v1 (SVC_V1_RATE_LIMIT_PER_MINUTE), counted in the
// shared store of src/http/rate-limits.ts, so that every API process sees the
// same budget, with the same fallback when the store fails.
import { RateLimiterRes } from "rate-limiter-flexible";
import type { Sql } from "../../db/index.js";
import type { Logger } from "../../log.js";
import { keySubject, sharedLimit } from "../rate-limits.js";

export type LimitOutcome = { ok: true; limit: number; remaining: number; resetMs: number } | { ok: false; limit: number; retryAfterMs: number };

export interface V1Limiter {
  /** Counts one request of the renter key that authenticated it. */
  consume(renterKey: string): Promise<LimitOutcome>;
}

export function createV1Limiter(sql: Sql, perMinute: number, log: Logger): V1Limiter | undefined {
  if (perMinute <= 0) return undefined;
  const limit = sharedLimit({ sql }, "v1", perMinute, 60, log);
  return {
    async consume(renterKey) {
      try {
        const r = await limit.consume(keySubject(renterKey));
        return { ok: true, limit: perMinute, remaining: r.remainingPoints, resetMs: r.msBeforeNext };
      } catch (err) {
        if (err instanceof RateLimiterRes) return { ok: false, limit: perMinute, retryAfterMs: err.msBeforeNext };
        throw err;
      }
    },
  };
}
