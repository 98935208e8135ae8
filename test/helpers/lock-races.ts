// Races made deterministic with row locks: a provider's provider_load row held from a second
// connection while the operation under test runs, and a wait until a statement is seen waiting for
// a lock (test/jobs/suspend-assign-race.test.ts, test/providers/*-assign-race.test.ts).
import { afterEach, expect } from "vitest";
import type { Sql } from "../../src/db/index.js";

/** Resolves once `n` sessions of this database wait on a lock running a statement like `pattern`. */
export async function waitingOn(sql: Sql, pattern: string, n = 1): Promise<void> {
  await expect
    .poll(
      async () =>
        (await sql<{ n: number }[]>`
          SELECT count(*)::int AS n FROM pg_stat_activity
          WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE ${pattern}`)[0].n,
      { timeout: 10_000, interval: 10 },
    )
    .toBeGreaterThanOrEqual(n);
}

/**
 * Holding a provider's provider_load row FOR UPDATE in a transaction of its own (on `db()`, read when
 * a row is held: a test server's pool starts in beforeAll): `hold` resolves once
 * the row is held, with the function that lets it go (and waits for that transaction to end). Every
 * row still held is let go after each test, whatever it asserted.
 */
export function loadRowHolder(db: () => Sql): (providerId: number) => Promise<() => Promise<void>> {
  const held: (() => Promise<void>)[] = [];
  afterEach(async () => {
    while (held.length > 0) await held.pop()!();
  });
  return async (providerId) => {
    let release!: () => void;
    const gate = new Promise<void>((res) => (release = res));
    let locked!: () => void;
    const isLocked = new Promise<void>((res) => (locked = res));
    const holder = db().begin(async (tx) => {
      await tx`SELECT 1 FROM provider_load WHERE provider_id = ${providerId} FOR UPDATE`;
      locked();
      await gate;
    });
    await isLocked;
    const letGo = async () => {
      release();
      await holder;
    };
    held.push(letGo);
    return letGo;
  };
}
