// Two embedded clusters starting at once on the same preferred port (two `npm start`s, or test
// workers, each on a fresh data folder): both find the port free before either postmaster binds it
// (initdb runs in between). The one that loses the bind starts on another port instead of failing
// with nothing to say; and a postmaster that exits as it starts for another reason is named.
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import postgres from "postgres";
import { afterAll, describe, expect, it } from "vitest";
import { startEmbedded, type EmbeddedServer } from "../../src/db/embedded.js";
import { createLogger } from "../../src/log.js";

const dirs: string[] = [];
const started: EmbeddedServer[] = [];
afterAll(async () => {
  await Promise.allSettled(started.map((s) => s.stop()));
  for (const d of dirs) fs.rmSync(d, { recursive: true, force: true });
});

function dataDir(): string {
  const d = fs.mkdtempSync(path.join(os.tmpdir(), "svc-embedded-race-"));
  fs.chmodSync(d, 0o755);
  dirs.push(d);
  return d;
}

/** A port free a moment ago. */
async function freePort(): Promise<number> {
  const srv = net.createServer();
  await new Promise<void>((r) => srv.listen(0, "127.0.0.1", () => r()));
  const port = (srv.address() as net.AddressInfo).port;
  await new Promise<void>((r) => srv.close(() => r()));
  return port;
}

async function answers(s: EmbeddedServer): Promise<number> {
  const sql = postgres(s.url, { max: 1, onnotice: () => {} });
  try {
    return (await sql`SELECT 1 AS one`)[0].one;
  } finally {
    await sql.end();
  }
}

describe("embedded PostgreSQL start", { timeout: 120_000 }, () => {
  it("two clusters starting at once on one preferred port both start, on different ports", async () => {
    const preferred = await freePort();
    const log = createLogger("silent");
    // The second looks at the port once the first has looked (and let it go) and is in its initdb.
    const a = startEmbedded(dataDir(), log, preferred);
    await new Promise((r) => setTimeout(r, 300));
    const results = await Promise.allSettled([a, startEmbedded(dataDir(), log, preferred)]);
    for (const r of results) if (r.status === "fulfilled") started.push(r.value);
    expect(results.map((r) => (r.status === "rejected" ? `rejected: ${String(r.reason)}` : "started"))).toEqual(["started", "started"]);
    const ports = started.map((s) => new URL(s.url).port);
    expect(new Set(ports).size).toBe(2);
    expect(ports).toContain(String(preferred));
    for (const s of started) expect(await answers(s)).toBe(1);
  });

  it("a postmaster that exits as it starts is named with PostgreSQL's reason", async () => {
    const dir = dataDir();
    const first = await startEmbedded(dir, createLogger("silent"), await freePort());
    await first.stop();
    // A setting the postmaster refuses at start.
    fs.appendFileSync(path.join(dir, "pg", "postgresql.conf"), "\nshared_buffers = 'plenty'\n");
    const err = await startEmbedded(dir, createLogger("silent"), await freePort()).then(
      (s) => {
        started.push(s);
        return undefined;
      },
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(Error);
    expect((err as Error).name).toBe("EmbeddedStartError");
    expect((err as Error).message).toContain(`the embedded PostgreSQL in ${path.join(dir, "pg")} exited while starting: `);
    expect((err as Error).message).toMatch(/shared_buffers/);
  });
});
