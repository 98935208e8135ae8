// Per-renter request limit for /v1 (SVC_V1_RATE_LIMIT_PER_MINUTE), counted in
// the shared PostgreSQL store of src/http/rate-limits.ts (its table and
// adapter), so that every API process sees the same budget.
import { RateLimiterMemory, RateLimiterPostgres, RateLimiterRes } from "rate-limiter-flexible";
import type { Sql } from "../../db/index.js";
import { pgClientAdapter, RATE_LIMIT_TABLE } from "../rate-limits.js";

export type LimitOutcome = { ok: true; limit: number; remaining: number; resetMs: number } | { ok: false; limit: number; retryAfterMs: number };

export interface V1Limiter {
  consume(subject: string): Promise<LimitOutcome>;
}

export function createV1Limiter(sql: Sql, perMinute: number): V1Limiter | undefined {
  if (perMinute <= 0) return undefined;
  const limiter = new RateLimiterPostgres({
    storeClient: pgClientAdapter(sql),
    storeType: "pool",
    tableName: RATE_LIMIT_TABLE,
    tableCreated: true,
    clearExpiredByTimeout: false,
    keyPrefix: "v1",
    points: perMinute,
    duration: 60,
    // As for /api: over-limit callers are answered from memory until the window ends,
    // and a failing store degrades to a per-process limit instead of failing requests.
    inMemoryBlockOnConsumed: perMinute + 1,
    insuranceLimiter: new RateLimiterMemory({ keyPrefix: "v1", points: perMinute, duration: 60 }),
  });
  return {
    async consume(subject) {
      try {
        const r = await limiter.consume(subject);
        return { ok: true, limit: perMinute, remaining: r.remainingPoints, resetMs: r.msBeforeNext };
      } catch (err) {
        if (err instanceof RateLimiterRes) return { ok: false, limit: perMinute, retryAfterMs: err.msBeforeNext };
        throw err;
      }
    },
  };
}
