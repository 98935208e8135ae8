// Applies src/db/migrations/NNN_name.sql in order, each in a transaction,
// under an advisory lock so several processes starting at once are safe.
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import type { Sql } from "./index.js";

const MIGRATIONS_DIR = path.join(path.dirname(fileURLToPath(import.meta.url)), "migrations");
const LOCK_ID = 0x5ec_0001;

export function migrationFiles(): { version: number; name: string; file: string }[] {
  return fs
    .readdirSync(MIGRATIONS_DIR)
    .filter((f) => /^\d{3}_[a-z0-9_]+\.sql$/.test(f))
    .sort()
    .map((f) => ({ version: Number(f.slice(0, 3)), name: f, file: path.join(MIGRATIONS_DIR, f) }));
}

/**
 * Applies the migrations not applied yet, in order, in one transaction; returns their versions.
 * `through` stops after that version (a database at an earlier schema: tests of a backfill, benches).
 */
export async function migrate(sql: Sql, opts: { through?: number } = {}): Promise<number[]> {
  // Collected inside the transaction: a deadlock runs it again from the start (db/index.ts).
  return sql.begin(async (tx) => {
    const applied: number[] = [];
    await tx`SELECT pg_advisory_xact_lock(${LOCK_ID})`;
    await tx`CREATE TABLE IF NOT EXISTS schema_migrations (
      version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`;
    const done = new Set((await tx<{ version: number }[]>`SELECT version FROM schema_migrations`).map((r) => r.version));
    for (const m of migrationFiles()) {
      if (done.has(m.version) || (opts.through !== undefined && m.version > opts.through)) continue;
      await tx.unsafe(fs.readFileSync(m.file, "utf8"));
      await tx`INSERT INTO schema_migrations (version, name) VALUES (${m.version}, ${m.name})`;
      applied.push(m.version);
    }
    return applied;
  });
}

/** True when every migration file has been applied (readiness). */
export async function migrationsCurrent(sql: Sql): Promise<boolean> {
  const rows = await sql<{ version: number }[]>`SELECT version FROM schema_migrations`;
  const done = new Set(rows.map((r) => r.version));
  return migrationFiles().every((m) => done.has(m.version));
}
