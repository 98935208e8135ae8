// Database connection (postgres.js). Values of 64-bit columns come back as
// JS numbers: halala amounts and ids stay far below 2^53.
import crypto from "node:crypto";
import postgres from "postgres";

export type Sql = postgres.Sql<{ bigint: number }>;
export type Tx = postgres.TransactionSql<{ bigint: number }>;
/** Either the pool or a transaction: domain functions accept both. */
export type Db = Sql | Tx;

/** deadlock_detected and serialization_failure: the transaction was rolled back whole and may run again. */
const RETRYABLE_CODES = new Set(["40P01", "40001"]);
/** Runs of one transaction before its error reaches the caller. */
const TRANSACTION_ATTEMPTS = 3;

/**
 * Every `sql.begin` of the pool re-runs its transaction when PostgreSQL
 * aborted it as a deadlock victim or a serialization failure (after a short
 * random pause), instead of answering 500: the transaction was rolled back
 * whole, and the bodies write nothing outside the database but idempotent
 * cache forgets. Lock order is still the first defence (see dispatch.ts and
 * settlement.ts); this covers what slips through.
 */
function retryTransactions(sql: Sql): Sql {
  const begin = sql.begin.bind(sql) as (...args: unknown[]) => Promise<unknown>;
  const retrying = async (...args: unknown[]) => {
    for (let attempt = 1; ; attempt++) {
      // Hooks of this run only: a rolled-back run's hooks are dropped with it.
      let hooks: (() => void)[] = [];
      const body = args[args.length - 1] as (tx: Tx) => unknown;
      const wrapped = (tx: Tx) => {
        commitHooks.set(tx, hooks);
        return body(tx);
      };
      try {
        const result = await begin(...args.slice(0, -1), wrapped);
        for (const h of hooks) runHook(h);
        return result;
      } catch (err) {
        hooks = [];
        const code = (err as { code?: string } | null)?.code;
        if (attempt >= TRANSACTION_ATTEMPTS || !code || !RETRYABLE_CODES.has(code)) throw err;
        await new Promise((r) => setTimeout(r, 5 + Math.random() * 20 * attempt));
      }
    }
  };
  (sql as unknown as { begin: typeof retrying }).begin = retrying;
  return sql;
}

/** A pool's connections now: the figures /metrics shows. */
export interface PoolStats {
  /** Connections the pool may open. */
  max: number;
  /** Connections serving statements (pipelined ones included), held by a transaction, or connecting for a statement. */
  inUse: number;
  /** Connections open and idle. */
  idle: number;
  /** Statements and transactions waiting for a connection: every connection is held by a transaction, or its pipeline is full. */
  waiting: number;
}

/** The queue lengths bin/patch-postgres.mjs exposes (postgres.js keeps them private). */
interface PoolState {
  connecting: number;
  reserved: number;
  busy: number;
  full: number;
  open: number;
  closed: number;
  ended: number;
  waiting: number;
}

const poolMax = new WeakMap<object, number>();

/** The pool's figures, read from postgres.js's queues; undefined for a pool connect() did not open. */
export function poolStats(sql: Sql): PoolStats | undefined {
  const max = poolMax.get(sql);
  const state = (sql as unknown as { svcPoolState?: () => PoolState }).svcPoolState?.();
  if (max === undefined || !state) return undefined;
  return { max, inUse: state.connecting + state.reserved + state.busy + state.full, idle: state.open, waiting: state.waiting };
}

const commitHooks = new WeakMap<object, (() => void)[]>();

function runHook(h: () => void): void {
  try {
    h();
  } catch {
    // A hook only counts (metrics); it must never fail a committed transaction's caller.
  }
}

/**
 * Runs `hook` once `tx` has committed (at once when `db` is the pool, not a
 * transaction of sql.begin). Not run when the transaction rolls back, nor for
 * a run that a deadlock made start again: figures count what was committed.
 */
export function afterCommit(db: Db, hook: () => void): void {
  const hooks = commitHooks.get(db);
  if (hooks) hooks.push(hook);
  else runHook(hook);
}

/**
 * Seconds before a connection that closed with an error connects again:
 * postgres.js's default grows 3^n / 100 with the pool's failed connects in a
 * row, up to 20 s, so a restart of a few seconds under load left the pool
 * waiting up to 20 s after PostgreSQL was back (answering 503 meanwhile).
 * Here it doubles from 50 ms up to 2 s (the Retry-After of those 503s), with jitter.
 */
export const reconnectDelaySeconds = (failures: number): number => Math.min(0.05 * 2 ** failures, 2) * (0.5 + Math.random() / 2);

/**
 * This process's connections' application_name: one per process, so that the database can tell
 * whether a process is still connected (a webhook claim of a process with no connection left is
 * released at once, src/domain/notify/webhooks.ts).
 */
export const PROCESS_TAG = `svc:${process.pid}:${crypto.randomBytes(4).toString("hex")}`;

/**
 * libpq's `host` query parameter, which postgres.js would otherwise send to the
 * server as a setting: a Unix-socket directory
 * (`postgres://user@localhost/db?host=/var/run/postgresql`) becomes the
 * socket's path, a host name the URL's host. A database on the same machine
 * costs less to reach through its socket than through loopback TCP, for this
 * process and for PostgreSQL (docs/operations.md).
 */
export function socketOf(url: string): { url: string; path?: string } {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    return { url };
  }
  const host = parsed.searchParams.get("host");
  if (!host) return { url };
  parsed.searchParams.delete("host");
  if (!host.startsWith("/")) {
    parsed.hostname = host;
    return { url: parsed.toString() };
  }
  return { url: parsed.toString(), path: `${host.replace(/\/+$/, "")}/.s.PGSQL.${parsed.port || 5432}` };
}

export function connect(databaseUrl: string, max = 10): Sql {
  const { url, path } = socketOf(databaseUrl);
  const sql = retryTransactions(postgres(url, {
    ...(path ? { path } : {}),
    max,
    backoff: reconnectDelaySeconds,
    onnotice: () => {},
    types: {
      bigint: {
        to: 20,
        from: [20],
        serialize: (x: number) => String(x),
        parse: (x: string) => Number(x),
      },
    },
    // Every session in UTC, whatever the database's or the server's TimeZone: what the database
    // renders or truncates by the session's zone (a timestamptz as text, date_trunc without a zone)
    // then means UTC, as the API's timestamps and the UTC hours, days and months of the rules do.
    connection: { application_name: PROCESS_TAG, TimeZone: "UTC" },
  }) as unknown as Sql);
  poolMax.set(sql, max);
  return sql;
}

/**
 * A statement as a step of an allInTransaction list, sent in the list's
 * order. postgres.js sends a query a tick after its then() is called, and a
 * step that awaits its statement calls then() a tick later than a direct call
 * would (await on a Promise subclass): a list that mixed both forms went out
 * of order. Through this, a statement of its own goes out as awaited ones do.
 */
export const inOrder = async <T>(query: PromiseLike<T>): Promise<T> => await query;

/**
 * Promise.all for steps pipelined on one transaction: waits until every step
 * has settled, then throws the first failure in order. Promise.all would give
 * up at the first failure while a step of several statements (a placement
 * round, an account opened) is still running, and that step could then issue
 * its next statement after the transaction ended, on a connection back in the pool.
 */
export async function allInTransaction<T extends readonly unknown[] | []>(steps: T): Promise<{ -readonly [P in keyof T]: Awaited<T[P]> }> {
  const results = await Promise.allSettled(steps);
  for (const r of results) if (r.status === "rejected") throw r.reason;
  return results.map((r) => (r as PromiseFulfilledResult<unknown>).value) as { -readonly [P in keyof T]: Awaited<T[P]> };
}
