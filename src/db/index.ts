// Database connection (postgres.js). Values of 64-bit columns come back as
// JS numbers: halala amounts and ids stay far below 2^53.
import postgres from "postgres";

export type Sql = postgres.Sql<{ bigint: number }>;
export type Tx = postgres.TransactionSql<{ bigint: number }>;
/** Either the pool or a transaction: domain functions accept both. */
export type Db = Sql | Tx;

export function connect(url: string, max = 10): Sql {
  return postgres(url, {
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
  }) as unknown as Sql;
}
