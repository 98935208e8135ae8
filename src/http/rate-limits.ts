// The rate-limit table's enforcement (the table: rate-limit-table.ts) across
// every server process through a shared store: PostgreSQL (the
// `rate_limits` table of migration 006) or Redis when REDIS_URL is set.
//
// Each RPC names its row with the `rate_limit` route option; a route without
// one counts against `default`; a request that nothing answers (an /api path
// no route has or a method it does not take: 404, 405; an unknown gRPC/Connect
// procedure or any other path: 404) counts against the row of its method and
// path (unroutedRow). A request counts against exactly one row.
// The same rows apply to REST and to gRPC/Connect calls. Rows per client IP
// are counted before authentication and before the request's body is read
// (the transcoder's guard; for gRPC/Connect `countAtStart`, when the call's
// context is made, its outcome awaited by the interceptor and, for unary
// calls, before their body is read); rows per renter key after it (secure.ts calls `afterAuth`),
// against the key that authenticated, or against the client IP when none did.
// The plain handlers that take credentials count only their failed checks on
// an IP row (`check` after the failure, `refuseIfOver` before the check):
// /metrics on the admin row, /v1 on the default row.
import crypto from "node:crypto";
import net from "node:net";
import { getOption, type DescMethod } from "@bufbuild/protobuf";
import { createContextKey, type Interceptor } from "@connectrpc/connect";
import { Redis } from "ioredis";
import { RateLimiterMemory, RateLimiterPostgres, RateLimiterRedis, RateLimiterRes, type RateLimiterAbstract } from "rate-limiter-flexible";
import { route as routeOption } from "../../gen/svc/v1/options_pb.js";
import { ConfigError, type Config } from "../config.js";
import type { Sql } from "../db/index.js";
import type { Logger } from "../log.js";
import type { KeyRowCounter } from "../services/deps.js";
import { credentialsKey } from "./credentials.js";
import { apiError } from "../errors.js";
import { toConnectError } from "./errors.js";
import { RATE_LIMITS, unroutedRow, type RateLimitName, type RateLimitRow, type Subject } from "./rate-limit-table.js";
import type { RestRoute, RouteGuard, UnroutedGuard } from "./rest.js";

export { RATE_LIMITS, type RateLimitName, type RateLimitRow, type Subject } from "./rate-limit-table.js";

export const RATE_LIMIT_TABLE = "rate_limits";

/**
 * A gRPC/Connect call's count on its per-IP row, started when its request did (countAtStart): it
 * rejects with the call's resource_exhausted ConnectError when the row refuses it. Set, the
 * interceptor awaits it instead of counting the call again.
 */
export const ipRowCountKey = createContextKey<Promise<void> | undefined>(undefined);

/** Tries of the shared store per request before the process's own count is used. */
const STORE_ATTEMPTS = 2;

/** The row a route counts against. */
export function rowNameOf(rateLimit: string): RateLimitName {
  return (rateLimit || "default") as RateLimitName;
}

/** Fails start-up when an RPC names a row the table does not have. */
export function checkRouteRows(methods: DescMethod[]): void {
  for (const m of methods) {
    const name = getOption(m, routeOption).rateLimit;
    if (name && !(name in RATE_LIMITS)) {
      throw new ConfigError(`${m.parent.typeName}.${m.name} names rate_limit "${name}", which src/http/rate-limit-table.ts does not define`);
    }
  }
}

/** The documented rows with the operator's overrides (benchmarks; their row names checked by loadConfig) applied. */
export function effectiveRows(overrides: Config["rateLimitOverrides"]): Record<RateLimitName, RateLimitRow> {
  const rows = { ...RATE_LIMITS } as Record<RateLimitName, RateLimitRow>;
  for (const [name, o] of Object.entries(overrides) as [RateLimitName, { points: number; durationSec: number }][]) {
    rows[name] = { ...rows[name], points: o.points, durationSec: o.durationSec };
  }
  return rows;
}

/**
 * The counting subject. Keys are hashed: the store never holds a credential.
 * A key row counts against the renter key that authenticated the request;
 * when none did (no key, an unknown key, a key of another role) it counts
 * against the client IP, so rotating invented keys is limited too.
 */
export function subjectOf(row: RateLimitRow, clientIp: string, authenticatedRenterKey?: string): string {
  if (row.per === "renter_key" && authenticatedRenterKey) return keySubject(authenticatedRenterKey);
  return `ip:${clientNetwork(clientIp) || "unknown"}`;
}

const IPV4_WITH_PORT = /^(\d{1,3}(?:\.\d{1,3}){3}):\d{1,5}$/;

/**
 * What a per-IP row counts a client address as. An IPv6 client holds at least
 * a /64 (the smallest assignment; SLAAC and privacy addresses pick any of its
 * 2^64 addresses), so its /64 prefix is the client: counting each address
 * would give it a fresh budget per address. An IPv4-mapped address
 * (::ffff:a.b.c.d, what a dual-stack socket reports for an IPv4 peer) is that
 * IPv4 address. A port that a proxy wrote into X-Forwarded-For (a.b.c.d:port, [v6]:port) is left
 * out: the client picks its source port, and each would be a fresh budget. Anything else (IPv4, a
 * value that is no address) is kept as it is.
 */
export function clientNetwork(ip: string): string {
  if (!ip.includes(":")) return ip; // IPv4 (every request of an IPv4 client): no parsing
  const v4WithPort = IPV4_WITH_PORT.exec(ip);
  if (v4WithPort && net.isIPv4(v4WithPort[1])) return v4WithPort[1];
  let addr = ip.toLowerCase();
  const bracket = addr.startsWith("[") ? addr.indexOf("]") : -1; // [v6] or [v6]:port
  if (bracket > 0) addr = addr.slice(1, bracket);
  const zone = addr.indexOf("%");
  if (zone >= 0) addr = addr.slice(0, zone);
  if (addr.startsWith("::ffff:") && net.isIPv4(addr.slice(7))) return addr.slice(7); // the common mapped form, at once
  if (!net.isIPv6(addr)) return ip;
  const g = ipv6Groups(addr);
  if (g[0] === 0 && g[1] === 0 && g[2] === 0 && g[3] === 0 && g[4] === 0 && g[5] === 0xffff) {
    return `${g[6] >> 8}.${g[6] & 255}.${g[7] >> 8}.${g[7] & 255}`;
  }
  return `${g[0].toString(16)}:${g[1].toString(16)}:${g[2].toString(16)}:${g[3].toString(16)}::/64`;
}

/** The eight 16-bit groups of a valid IPv6 address (net.isIPv6 said so), a dotted IPv4 tail included. */
function ipv6Groups(addr: string): number[] {
  let end = addr.length;
  const tail: number[] = [];
  if (addr.includes(".")) {
    const lastColon = addr.lastIndexOf(":");
    const [a, b, c, d] = addr.slice(lastColon + 1).split(".").map(Number);
    tail.push((a << 8) | b, (c << 8) | d);
    end = lastColon + 1;
  }
  const head: number[] = [];
  let rest: number[] | undefined; // the groups after "::"
  let cur = 0;
  let digits = 0;
  for (let i = 0; i < end; i++) {
    const c = addr.charCodeAt(i);
    if (c === 58 /* : */) {
      if (digits > 0) (rest ?? head).push(cur);
      cur = digits = 0;
      if (addr.charCodeAt(i + 1) === 58) {
        rest = [];
        i++;
      }
    } else {
      cur = cur * 16 + (c <= 57 ? c - 48 : c - 87); // 0-9, a-f (lowercased)
      digits++;
    }
  }
  if (digits > 0) (rest ?? head).push(cur);
  rest ??= [];
  rest.push(...tail);
  while (head.length + rest.length < 8) head.push(0);
  return head.concat(rest);
}

/** The store's name for an API key's counters: a hash, never the credential. */
export function keySubject(key: string): string {
  return `key:${crypto.createHash("sha256").update(key).digest("hex").slice(0, 40)}`;
}

function per(durationSec: number): string {
  if (durationSec === 3600) return "hour";
  if (durationSec === 60) return "minute";
  return `${durationSec} seconds`;
}

/**
 * rate-limiter-flexible's PostgreSQL store speaks to a `pg`-style client
 * (`query({text, values}) -> {rows, rowCount}`). This adapter runs those
 * statements on our postgres.js pool, so the limiter shares the service's one
 * pool, URL and connection limit instead of opening a second driver's pool.
 */
export function pgClientAdapter(sql: Sql) {
  return {
    async query(q: { text: string; values?: unknown[] }) {
      const rows = await sql.unsafe(q.text, (q.values ?? []) as never[], { prepare: true });
      return { rows: [...rows], rowCount: rows.count };
    },
  };
}

export interface RateLimits {
  /** The REST transcoder's guard, before authentication: IP rows only (throws a 429 apiError with Retry-After). */
  guard: RouteGuard;
  /**
   * The same for a request that nothing answers: an /api request no route answers (an unknown path: 404; a method
   * its path does not take: 405), and, in the server's fallback, an unknown procedure or any other path (404).
   */
  unroutedGuard: UnroutedGuard;
  /**
   * The same IP rows for gRPC and Connect calls, counted when the request starts (before its body
   * is read: a body that stalls is counted too): the call's count on its IP row, as a rejected
   * promise (a ConnectError, resource_exhausted, Retry-After) when the row refuses it; undefined for
   * a method whose row is kept per renter key. Put in the call's context under ipRowCountKey.
   */
  countAtStart(method: DescMethod, clientIp: string): Promise<void> | undefined;
  /** Refuses a gRPC/Connect call its IP row refused (ipRowCountKey); counts one without that count. */
  interceptor: Interceptor;
  /**
   * Key rows, after authentication, on both wires (secure.ts, through
   * Deps.keyRowCounter): the counter of a method whose row is kept per renter
   * key, undefined for other methods.
   */
  keyRowCounter(method: DescMethod): KeyRowCounter | undefined;
  /** The heartbeat row as it applies to each daemon stream's heartbeat messages (Deps.streamBeatLimit). */
  streamBeatLimit: { points: number; durationSec: number };
  /** The default row as it applies to each daemon stream's other reports (Deps.streamWriteLimit). */
  streamWriteLimit: { points: number; durationSec: number };
  /** Counts one request of `row` for this caller; throws the 429. */
  check(row: RateLimitName, clientIp: string, authenticatedRenterKey?: string): Promise<void>;
  /**
   * Throws the 429 of `row` when this client IP is already over it, counting nothing (see
   * SharedLimit.overFor). For handlers that count only failed authentication on an IP row
   * (`check` after the failure: /metrics, /v1): a caller over the row is refused before its
   * credential is looked at, so a right guess answers like a wrong one.
   */
  refuseIfOver(row: RateLimitName, clientIp: string): Promise<void>;
  /** Where the counters live, for logs and tests. */
  store: "postgres" | "redis";
  close(): Promise<void>;
}

/** Where shared counters live: the service's PostgreSQL pool, or Redis when configured. */
export type CounterStore = { sql: Sql; redis?: Redis };

/** One limit counted in the shared store (see sharedLimit). */
export interface SharedLimit {
  /** Counts one point for `subject`; throws RateLimiterRes when over the limit. */
  consume(subject: string): Promise<RateLimiterRes>;
  /**
   * Milliseconds `subject` stays over the limit as far as this process knows (the count the store
   * last reported to it, or its own count while the store fails); 0 when it is not known to be over.
   * Counts nothing and reads no store.
   */
  overFor(subject: string): Promise<number>;
}

/**
 * A limit of `points` per `durationSec` shared by every server process. Once a
 * subject is over it, this process answers from memory until the window ends,
 * so abuse does not become store load. A store error (a connection refused or
 * cut: "too many clients", a database restart) is tried once more; if it fails
 * again the request is counted by the process's own fallback counter, which
 * carries the count the store last reported for the subject, so a failure
 * does not start a client's count again from zero (the library's insurance
 * limiter did: under database pressure the 31st marketplace call passed).
 */
export function sharedLimit(store: CounterStore, name: string, points: number, durationSec: number, log: Logger): SharedLimit {
  const common = { keyPrefix: name, points, duration: durationSec, inMemoryBlockOnConsumed: points + 1 };
  const limiter: RateLimiterAbstract = store.redis
    ? new RateLimiterRedis({ ...common, storeClient: store.redis, keyPrefix: `svc:rl:${name}` })
    : new RateLimiterPostgres({
        ...common,
        storeClient: pgClientAdapter(store.sql),
        storeType: "pool",
        tableName: RATE_LIMIT_TABLE,
        tableCreated: true,
        // One sweep (createRateLimits) for the whole table instead of a timer per row.
        clearExpiredByTimeout: false,
      });
  const fallback = new RateLimiterMemory({ keyPrefix: name, points, duration: durationSec });
  let lastStoreWarning = 0;
  return {
    async consume(subject) {
      for (let attempt = 1; ; attempt++) {
        try {
          const res = await limiter.consume(subject);
          if (res.msBeforeNext > 0) void fallback.set(subject, res.consumedPoints, res.msBeforeNext / 1000);
          return res;
        } catch (err) {
          if (err instanceof RateLimiterRes) {
            // The store's count over the limit (an in-memory block answers 0 points: nothing new to keep).
            if (err.consumedPoints > 0 && err.msBeforeNext > 0) void fallback.set(subject, err.consumedPoints, err.msBeforeNext / 1000);
            throw err;
          }
          if (attempt < STORE_ATTEMPTS) {
            await new Promise((r) => setTimeout(r, 25 * attempt));
            continue;
          }
          if (Date.now() - lastStoreWarning > 10_000) {
            lastStoreWarning = Date.now();
            log.warn({ err: (err as Error)?.message ?? String(err), limit: name }, "rate-limit store failed; counting in this process");
          }
          return fallback.consume(subject);
        }
      }
    },
    async overFor(subject) {
      const known = await fallback.get(subject);
      return known && known.consumedPoints > points ? Math.max(1, known.msBeforeNext) : 0;
    },
  };
}

export async function createRateLimits(config: Config, sql: Sql, log: Logger): Promise<RateLimits> {
  const rows = effectiveRows(config.rateLimitOverrides);
  let redis: Redis | undefined;
  if (config.redisUrl) {
    redis = new Redis(config.redisUrl, { enableOfflineQueue: false, maxRetriesPerRequest: 1, lazyConnect: true });
    redis.on("error", (err) => log.warn({ err: err.message }, "rate-limit store (redis) error"));
    await redis.connect();
  }
  const limits = new Map<RateLimitName, SharedLimit>();
  for (const [name, row] of Object.entries(rows) as [RateLimitName, RateLimitRow][]) {
    limits.set(name, sharedLimit({ sql, redis }, name, row.points, row.durationSec, log));
  }

  // Expired counters are only garbage; drop those an hour past their window.
  const sweep = redis
    ? undefined
    : setInterval(() => {
        sql`DELETE FROM rate_limits WHERE expire < ${Date.now() - 3_600_000}`.catch(() => {});
      }, 300_000);
  sweep?.unref();

  function tooMany(row: RateLimitRow, msBeforeNext: number) {
    const retryAfter = Math.max(1, Math.ceil(msBeforeNext / 1000));
    return apiError(429, `rate limit exceeded: ${row.points} requests per ${per(row.durationSec)} (${row.applies}); retry in ${retryAfter} s`, {
      "retry-after": String(retryAfter),
    });
  }

  async function check(name: RateLimitName, clientIp: string, authenticatedRenterKey?: string): Promise<void> {
    const row = rows[name];
    try {
      await limits.get(name)!.consume(subjectOf(row, clientIp, authenticatedRenterKey));
    } catch (err) {
      if (!(err instanceof RateLimiterRes)) throw err;
      throw tooMany(row, err.msBeforeNext);
    }
  }

  async function refuseIfOver(name: RateLimitName, clientIp: string): Promise<void> {
    const ms = await limits.get(name)!.overFor(subjectOf(rows[name], clientIp));
    if (ms > 0) throw tooMany(rows[name], ms);
  }

  return {
    store: redis ? "redis" : "postgres",
    check,
    refuseIfOver,
    guard: async (r: RestRoute, clientIp) => {
      const name = rowNameOf(r.rateLimit);
      if (rows[name].per === "ip") await check(name, clientIp);
    },
    unroutedGuard: (httpMethod, path, clientIp) => check(unroutedRow(httpMethod, path), clientIp),
    countAtStart(method, clientIp) {
      const name = rowNameOf(getOption(method, routeOption).rateLimit);
      if (rows[name].per !== "ip") return undefined;
      const counted = check(name, clientIp).catch((err: unknown) => {
        throw toConnectError(err);
      });
      // Read by the interceptor or the unary body's reader; a call that ends before either leaves it unread.
      counted.catch(() => {});
      return counted;
    },
    interceptor: (next) => async (req) => {
      const counted = req.contextValues.get(ipRowCountKey);
      if (counted) {
        await counted; // counted once, when the request started
      } else {
        const name = rowNameOf(getOption(req.method, routeOption).rateLimit);
        if (rows[name].per === "ip") await check(name, req.contextValues.get(credentialsKey).clientIp);
      }
      return next(req);
    },
    streamBeatLimit: { points: rows.heartbeat.points, durationSec: rows.heartbeat.durationSec },
    streamWriteLimit: { points: rows.default.points, durationSec: rows.default.durationSec },
    keyRowCounter(method) {
      const name = rowNameOf(getOption(method, routeOption).rateLimit);
      if (rows[name]?.per !== "renter_key") return undefined;
      return (clientIp, renterKey) => check(name, clientIp, renterKey);
    },
    async close() {
      if (sweep) clearInterval(sweep);
      if (redis) await redis.quit().catch(() => redis!.disconnect());
    },
  };
}
