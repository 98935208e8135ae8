// The rate-limit table (spec "Limits"), in one place: counted by src/http/rate-limits.ts, its row
// names checked at start by src/config.ts (SVC_RATE_LIMIT_OVERRIDES). A leaf: it imports nothing.

export type Subject = "ip" | "renter_key";

export interface RateLimitRow {
  /** What the spec's table calls the row. */
  applies: string;
  points: number;
  durationSec: number;
  /** Counted per client IP, or per renter API key (the client IP when no renter key authenticated). */
  per: Subject;
}

/** The spec's table, exactly. Keys are the `rate_limit` route option values. */
export const RATE_LIMITS = {
  provider_register: { applies: "POST /api/providers/register", points: 5, durationSec: 3600, per: "ip" },
  heartbeat: { applies: "POST /api/providers/heartbeat", points: 4, durationSec: 60, per: "ip" },
  renter_register: { applies: "POST /api/renters/register", points: 5, durationSec: 3600, per: "ip" },
  job_submit: { applies: "POST /api/jobs/submit", points: 10, durationSec: 60, per: "renter_key" },
  payment_topup: { applies: "POST /api/payments/topup", points: 10, durationSec: 60, per: "ip" },
  renter_topup: { applies: "POST /api/renters/topup", points: 10, durationSec: 60, per: "renter_key" },
  marketplace: { applies: "GET /api/providers/marketplace", points: 30, durationSec: 60, per: "ip" },
  admin: { applies: "GET /api/admin/*", points: 100, durationSec: 60, per: "ip" },
  default: { applies: "all other /api/*", points: 300, durationSec: 60, per: "ip" },
} as const satisfies Record<string, RateLimitRow>;

export type RateLimitName = keyof typeof RATE_LIMITS;

/**
 * The row of a request that nothing answers (an /api path no route has, or a method its path does not take;
 * an unknown procedure or any other path): the table's rows by method and path, as for a route: a GET (or
 * HEAD) under /api/admin/ is on `GET /api/admin/*`, anything else on `all other /api/*`.
 */
export function unroutedRow(httpMethod: string, path: string): RateLimitName {
  return (httpMethod === "GET" || httpMethod === "HEAD") && path.startsWith("/api/admin/") ? "admin" : "default";
}
