// Migrations apply once, in order, also when several processes start at once.
import { describe, expect, it } from "vitest";
import { connect } from "../../src/db/index.js";
import { migrate, migrationFiles, migrationsCurrent } from "../../src/db/migrate.js";
import { freshDatabase } from "../helpers/server.js";

describe("migrations", () => {
  it("apply exactly once when four processes' pools race on an empty database", async () => {
    const db = await freshDatabase();
    const pools = Array.from({ length: 4 }, () => connect(db.url, 2));
    try {
      const results = await Promise.all(pools.map((p) => migrate(p)));
      const all = migrationFiles().map((m) => m.version);
      // One runner applied everything; the others found nothing left to do.
      expect(results.filter((r) => r.length > 0)).toEqual([all]);
      expect(results.filter((r) => r.length === 0)).toHaveLength(3);
      const rows = await pools[0]<{ version: number }[]>`SELECT version FROM schema_migrations ORDER BY version`;
      expect(rows.map((r) => r.version)).toEqual(all);
      expect(await migrationsCurrent(pools[0])).toBe(true);
      expect(await migrate(pools[1])).toEqual([]);
    } finally {
      await Promise.all(pools.map((p) => p.end()));
      await db.drop();
    }
  });
});
