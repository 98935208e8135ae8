// Transactions that PostgreSQL aborts as deadlock victims run again (src/db/index.ts)
// instead of failing the request; other errors reach the caller at once. A
// transaction's pipelined steps go out in their order.
import { afterAll, beforeAll, expect, it } from "vitest";
import { allInTransaction, connect, inOrder, type Sql, type Tx } from "../../src/db/index.js";
import { freshDatabase } from "../helpers/server.js";

let db: Awaited<ReturnType<typeof freshDatabase>>;
let sql: Sql;

beforeAll(async () => {
  db = await freshDatabase();
  sql = connect(db.url, 4);
  await sql`CREATE TABLE counters (id int PRIMARY KEY, v int NOT NULL)`;
});
afterAll(async () => {
  await sql?.end();
  await db?.drop();
});

it("re-runs the deadlock victim, so both transactions land", async () => {
  await sql`INSERT INTO counters VALUES (1, 0), (2, 0)`;
  let runs = 0;
  let firstLocks = 0;
  let release!: () => void;
  const bothLocked = new Promise<void>((r) => (release = r));
  // Each takes one row, waits until the other has taken its row, then wants the other's: a deadlock.
  const crossing = (first: number, second: number) =>
    sql.begin(async (tx) => {
      runs++;
      await tx`UPDATE counters SET v = v + 1 WHERE id = ${first}`;
      if (++firstLocks === 2) release();
      await bothLocked;
      await tx`UPDATE counters SET v = v + 1 WHERE id = ${second}`;
    });
  await Promise.all([crossing(1, 2), crossing(2, 1)]);
  expect(runs).toBe(3); // one of them was the victim and ran again
  expect(await sql`SELECT id, v FROM counters ORDER BY id`).toEqual([{ id: 1, v: 2 }, { id: 2, v: 2 }]);
});

it("does not re-run a transaction that failed for any other reason", async () => {
  let runs = 0;
  const err = await sql
    .begin(async (tx) => {
      runs++;
      await tx`INSERT INTO counters VALUES (1, 0)`; // duplicate key
    })
    .catch((e) => e);
  expect(err.code).toBe("23505");
  expect(runs).toBe(1);
});

it("sends a list's steps in its order when a statement of its own goes through inOrder", async () => {
  await sql`CREATE SEQUENCE wire_order`;
  // What each statement drew from the sequence is the order it reached PostgreSQL in.
  const step = async (tx: Tx) => (await tx<{ n: number }[]>`SELECT nextval('wire_order')::int AS n`)[0].n;
  const drawn = (q: PromiseLike<{ n: number }[]>) => Promise.resolve(q).then((rows) => rows[0].n);
  const inList = await sql.begin((tx) => allInTransaction([step(tx), drawn(inOrder(tx`SELECT nextval('wire_order')::int AS n`)), step(tx)]));
  expect(inList).toEqual([1, 2, 3]);
  // A direct execute() goes out ahead of the steps listed before it.
  const direct = await sql.begin((tx) => allInTransaction([step(tx), drawn(tx<{ n: number }[]>`SELECT nextval('wire_order')::int AS n`.execute()), step(tx)]));
  expect(direct).toEqual([5, 4, 6]);
});
