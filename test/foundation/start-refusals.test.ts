// A start that fails for a setting says so in one line on stderr, naming the variable, and exits 1:
// never a stack trace. Settings checked by loadConfig fail before anything runs (no migration);
// a port taken, a database that cannot be reached or refuses, and (as root) an embedded database
// whose data folder the postgres user cannot reach are said plainly too. The build (bin/build.mjs)
// as a real process, as `npm start` runs it. And the local secrets file holds only what was generated.
import { execFileSync, spawn } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { connect } from "../../src/db/index.js";
import { closedFolderOnTheWay } from "../../src/db/embedded.js";
import { SERVER_NODE_FLAGS } from "../../bin/node-flags.mjs";
import { ADMIN_TOKEN, HMAC_SECRET, freshDatabase } from "../helpers/server.js";

/** The build in a folder of its own (inside the project, so that its packages resolve). */
const BUILD_DIR = path.join(".data", `build-start-refusals-${process.pid}`);
const STACK_FRAME = /^\s+at .+/m;

let db: { url: string; drop(): Promise<void> };
/** The data folder of the starts that name none (each with DATABASE_URL: only their secrets go there). */
let dataDir: string;
beforeAll(async () => {
  execFileSync(process.execPath, ["bin/build.mjs", "--out", BUILD_DIR], { stdio: "pipe" });
  db = await freshDatabase();
  dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "svc-start-"));
}, 60_000);
afterAll(async () => {
  fs.rmSync(BUILD_DIR, { recursive: true, force: true });
  fs.rmSync(dataDir, { recursive: true, force: true });
  await db?.drop();
});

interface Ended {
  code: number | null;
  stdout: string;
  stderr: string;
}

/**
 * Starts the built server with `env` over a working default (a variable given as "" is left out);
 * resolves to how it ended. `whileUp` runs once it is ready (its port), then it is stopped.
 */
function start(env: Record<string, string>, whileUp?: (port: number) => Promise<void>): Promise<Ended> {
  const full: Record<string, string | undefined> = {
    PATH: process.env.PATH,
    SVC_ADMIN_TOKEN: ADMIN_TOKEN,
    SVC_HMAC_SECRET: HMAC_SECRET,
    SVC_DATA_DIR: dataDir,
    DATABASE_URL: db.url,
    PORT: "0",
    HOST: "127.0.0.1",
    LOG_LEVEL: "info",
    ...env,
  };
  for (const k of Object.keys(full)) if (full[k] === "") delete full[k];
  const child = spawn(process.execPath, [...SERVER_NODE_FLAGS, path.join(BUILD_DIR, "src", "main.js")], { env: full, stdio: ["ignore", "pipe", "pipe"] });
  let stdout = "";
  let stderr = "";
  let ran = false;
  child.stdout.on("data", (d) => {
    stdout += d;
    const ready = /"url":"http:\/\/127\.0\.0\.1:(\d+)","msg":"svc marketplace ready"/.exec(stdout);
    if (ready && whileUp && !ran) {
      ran = true;
      void whileUp(Number(ready[1])).finally(() => child.kill("SIGTERM"));
    }
  });
  child.stderr.on("data", (d) => (stderr += d));
  return new Promise((resolve) => {
    const timer = setTimeout(() => child.kill("SIGKILL"), 60_000);
    child.on("exit", (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

/** Exit 1 with one line on stderr, and no stack trace anywhere. */
function refusedWithOneLine(r: Ended): string {
  expect(r.code, r.stderr).toBe(1);
  expect(r.stderr.trim().split("\n"), r.stderr).toHaveLength(1);
  expect(r.stdout + r.stderr).not.toMatch(STACK_FRAME);
  return r.stderr.trim();
}

describe("a start refused for a setting", { timeout: 90_000 }, () => {
  it("SVC_RATE_LIMIT_OVERRIDES naming a row the table does not have, or CORS_ORIGINS holding no origin: a configuration error before anything runs", async () => {
    const overrides = refusedWithOneLine(await start({ SVC_RATE_LIMIT_OVERRIDES: "heartbeats=1000/60" }));
    expect(overrides).toMatch(/^configuration error: SVC_RATE_LIMIT_OVERRIDES names "heartbeats"; rows are provider_register, heartbeat, /);
    const cors = refusedWithOneLine(await start({ CORS_ORIGINS: "app.example.com" }));
    expect(cors).toBe('configuration error: CORS_ORIGINS entries must be origins like https://app.example.com (got "app.example.com")');
    // Neither reached the database: no migration ran.
    const sql = connect(db.url, 1);
    try {
      expect((await sql`SELECT count(*)::int AS n FROM pg_tables WHERE schemaname = 'public'`)[0].n).toBe(0);
    } finally {
      await sql.end();
    }
  });

  it("a PORT another process holds names HOST and PORT", async () => {
    const taken = net.createServer();
    await new Promise<void>((r) => taken.listen(0, "127.0.0.1", () => r()));
    const port = (taken.address() as net.AddressInfo).port;
    const pgDir = fs.mkdtempSync(path.join(os.tmpdir(), "svc-start-pg-"));
    fs.chmodSync(pgDir, 0o755);
    try {
      const line = refusedWithOneLine(await start({ PORT: String(port) }));
      expect(line).toBe(`cannot listen on 127.0.0.1:${port} (HOST and PORT): address already in use (EADDRINUSE)`);
      // On the embedded database (`npm start`'s), the refused start takes its PostgreSQL with it, and the next start works.
      const embedded = refusedWithOneLine(await start({ PORT: String(port), DATABASE_URL: "", SVC_DATA_DIR: pgDir }));
      expect(embedded).toBe(line);
      let status = 0;
      const again = await start({ DATABASE_URL: "", SVC_DATA_DIR: pgDir }, async (free) => {
        status = (await fetch(`http://127.0.0.1:${free}/readyz`)).status;
      });
      expect(status, again.stdout + again.stderr).toBe(200);
      expect(again.code).toBe(0);
    } finally {
      taken.close();
      fs.rmSync(pgDir, { recursive: true, force: true });
    }
  }, 180_000);

  it("a DATABASE_URL that cannot be reached, or names a database that is not there, names DATABASE_URL and never its password", async () => {
    const refused = refusedWithOneLine(await start({ DATABASE_URL: "postgres://svc:s3cret-pw@127.0.0.1:1/svc" }));
    expect(refused).toBe("cannot reach the database of DATABASE_URL (127.0.0.1:1/svc): connection refused (ECONNREFUSED)");
    // The test database's own URL (its password kept: the embedded PostgreSQL checks it), another database.
    const missing = new URL(db.url);
    missing.pathname = "/svc_no_such_database";
    const absent = refusedWithOneLine(await start({ DATABASE_URL: missing.toString() }));
    expect(absent).toBe(`the database of DATABASE_URL (${missing.host}/svc_no_such_database) refused: database "svc_no_such_database" does not exist`);
    if (missing.password) expect(absent).not.toContain(decodeURIComponent(missing.password));
    const malformed = refusedWithOneLine(await start({ DATABASE_URL: "postgres://svc:s3cret-pw@db.example.com:port/svc" }));
    expect(malformed).toMatch(/^configuration error: DATABASE_URL must be a URL such as postgres:\/\//);
    expect(refused + malformed).not.toContain("s3cret");
  });
});

describe("the embedded PostgreSQL's data folder", { timeout: 90_000 }, () => {
  it("is checked folder by folder for the user PostgreSQL runs as: its owner's, group's or others' x bit", () => {
    const top = fs.mkdtempSync(path.join(os.tmpdir(), "svc-closed-"));
    try {
      const inside = path.join(top, "home", ".data");
      fs.mkdirSync(inside, { recursive: true });
      fs.chmodSync(top, 0o755);
      const someoneElse = { uid: 65_001, gids: [65_001] };
      const owner = { uid: fs.statSync(top).uid, gids: [65_001] };
      const group = { uid: 65_001, gids: [fs.statSync(top).gid] };
      expect(closedFolderOnTheWay(inside, someoneElse)).toBeUndefined();
      fs.chmodSync(path.join(top, "home"), 0o700); // as /root is
      expect(closedFolderOnTheWay(inside, someoneElse)).toEqual({ folder: path.join(top, "home"), mode: 0o700 });
      expect(closedFolderOnTheWay(inside, undefined)).toEqual({ folder: path.join(top, "home"), mode: 0o700 });
      expect(closedFolderOnTheWay(inside, owner)).toBeUndefined();
      expect(closedFolderOnTheWay(inside, group)).toEqual({ folder: path.join(top, "home"), mode: 0o700 });
      fs.chmodSync(path.join(top, "home"), 0o710);
      expect(closedFolderOnTheWay(inside, group)).toBeUndefined();
      expect(closedFolderOnTheWay(inside, someoneElse)).toEqual({ folder: path.join(top, "home"), mode: 0o710 });
    } finally {
      fs.rmSync(top, { recursive: true, force: true });
    }
  });

  it.skipIf(process.getuid?.() !== 0)("under a folder the postgres user cannot enter: npm start as root says so and names the way out", async () => {
    const closed = fs.mkdtempSync(path.join(os.tmpdir(), "svc-closed-"));
    fs.chmodSync(closed, 0o700);
    try {
      const closedData = path.join(closed, ".data");
      const line = refusedWithOneLine(await start({ DATABASE_URL: "", SVC_DATA_DIR: closedData }));
      expect(line).toBe(
        `configuration error: SVC_DATA_DIR ${closedData}: as root the embedded PostgreSQL runs as the postgres user, which cannot enter ${closed} ` +
          "(mode 0700); set SVC_DATA_DIR to a folder it can reach (e.g. /var/lib/svc), or DATABASE_URL to a PostgreSQL of your own",
      );
      expect(fs.existsSync(path.join(closedData, "pg", "PG_VERSION"))).toBe(false);
    } finally {
      fs.rmSync(closed, { recursive: true, force: true });
    }
  });
});

describe("the local secrets file", { timeout: 90_000 }, () => {
  it("with SVC_ADMIN_TOKEN set, holds (and the start log names) only the generated HMAC secret", async () => {
    const secretsDir = fs.mkdtempSync(path.join(os.tmpdir(), "svc-secrets-"));
    const adminToken = "operator-chosen-admin-token-0123";
    let saved: Record<string, string> = {};
    let status = 0;
    try {
      const r = await start({ SVC_HMAC_SECRET: "", SVC_ADMIN_TOKEN: adminToken, SVC_DATA_DIR: secretsDir }, async (port) => {
        saved = JSON.parse(fs.readFileSync(path.join(secretsDir, "secrets.json"), "utf8"));
        status = (await fetch(`http://127.0.0.1:${port}/api/admin/dashboard`, { headers: { "x-admin-token": adminToken } })).status;
      });
      expect(r.code, r.stderr).toBe(0);
      expect(Object.keys(saved)).toEqual(["hmacSecret"]);
      expect(status).toBe(200);
      const logged = r.stdout.split("\n").find((l) => l.includes("secrets are kept in this file"));
      expect(JSON.parse(logged!)).toMatchObject({ file: path.join(secretsDir, "secrets.json"), secrets: ["hmacSecret"] });
    } finally {
      fs.rmSync(secretsDir, { recursive: true, force: true });
    }
  });
});
