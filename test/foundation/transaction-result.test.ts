// A finished transaction's result belongs to its caller only. postgres.js
// keeps a handler on the connection for the transaction's lifetime, through
// which the result stayed reachable until the connection's next transaction:
// each connection of a busy pool held its last batch's rows (bin/patch-postgres.mjs).
import v8 from "node:v8";
import vm from "node:vm";
import { afterAll, beforeAll, expect, it } from "vitest";
import { connect, type Sql, type Tx } from "../../src/db/index.js";
import { freshDatabase } from "../helpers/server.js";

let db: Awaited<ReturnType<typeof freshDatabase>>;
let sql: Sql;

beforeAll(async () => {
  db = await freshDatabase();
  sql = connect(db.url, 1);
});
afterAll(async () => {
  await sql?.end();
  await db?.drop();
});

v8.setFlagsFromString("--expose-gc");
const gc = vm.runInNewContext("gc") as () => void;

/** Runs a transaction whose result only a WeakRef keeps. */
async function finishedTransaction(work: (tx: Tx) => Promise<unknown>): Promise<WeakRef<object>> {
  const result = (await sql.begin(async (tx) => ({ rows: await work(tx), padding: new Array(10_000).fill(0) }))) as object;
  return new WeakRef(result);
}

/** Collects from a timer's callback: a WeakRef keeps its target until the task that made or read it is over. */
function collectedLater(ref: WeakRef<object>): Promise<boolean> {
  return new Promise((resolve) =>
    setTimeout(() => {
      gc();
      resolve(ref.deref() === undefined);
    }, 5),
  );
}

it("is not kept by the connection after the commit", async () => {
  const ref = await finishedTransaction((tx) => tx`SELECT generate_series(1, 100) AS n`);
  // The pool's only connection runs on, outside any transaction.
  await sql`SELECT 1`;
  expect(await collectedLater(ref)).toBe(true);
});

it("is not kept after a rollback either", async () => {
  const failed = async (): Promise<WeakRef<object>> => {
    const error = await sql
      .begin(async (tx) => {
        throw Object.assign(new Error("roll back"), { rows: await tx`SELECT generate_series(1, 100) AS n`, padding: new Array(10_000).fill(0) });
      })
      .then(() => undefined, (e: Error) => e);
    expect(error?.message).toBe("roll back");
    return new WeakRef(error!);
  };
  const ref = await failed();
  await sql`SELECT 1`;
  expect(await collectedLater(ref)).toBe(true);
});
