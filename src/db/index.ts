// Database connection (postgres.js). Values of 64-bit columns come back as
// JS numbers: halala amounts and ids stay far below 2^53.
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
  (sql as unknown as { begin: (...args: unknown[]) => Promise<unknown> }).begin = async (...args: unknown[]) => {
    for (let attempt = 1; ; attempt++) {
      try {
        return await begin(...args);
      } catch (err) {
        const code = (err as { code?: string } | null)?.code;
        if (attempt >= TRANSACTION_ATTEMPTS || !code || !RETRYABLE_CODES.has(code)) throw err;
        await new Promise((r) => setTimeout(r, 5 + Math.random() * 20 * attempt));
      }
    }
  };
  return sql;
}

export function connect(url: string, max = 10): Sql {
  return retryTransactions(postgres(url, {
    max,
    onnotice: () => {},
    types: {
      bigint: {
        to: 20,
        from: [20],
        serialize: (x: number) => String(x),
        parse: (x: string) => Number(x),
      },
    },
    connection: { application_name: "svc" },
  }) as unknown as Sql);
}

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
