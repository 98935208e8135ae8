// Starts the real service on port 0 against a fresh database of its own.
import crypto from "node:crypto";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, inject } from "vitest";
import { loadConfig, type Config } from "../../src/config.js";
import { connect, type Sql } from "../../src/db/index.js";
import { startApp, type App } from "../../src/server.js";

export const ADMIN_TOKEN = "test-admin-token-0123456789";
export const HMAC_SECRET = "test-hmac-secret-0123456789abcdef";
/** The renter account test servers let run public vllm_serve jobs (SVC_V1_MANAGED_RENTERS). */
export const MANAGED_RENTER_EMAIL = "managed-endpoints@svc.test";

export interface TestServer {
  app: App;
  url: string;
  port: number;
  sql: Sql;
  config: Config;
  databaseUrl: string;
  close(): Promise<void>;
}

/** Creates an empty database and returns its URL plus a function that drops it. */
export async function freshDatabase(): Promise<{ url: string; drop(): Promise<void> }> {
  const base = inject("databaseUrl");
  const name = `svc_t_${crypto.randomBytes(6).toString("hex")}`;
  const admin = connect(base, 1);
  await admin.unsafe(`CREATE DATABASE ${name}`);
  const u = new URL(base);
  u.pathname = `/${name}`;
  return {
    url: u.toString(),
    async drop() {
      await admin.unsafe(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
      await admin.end();
    },
  };
}

export async function startTestServer(env: Record<string, string> = {}, database?: string): Promise<TestServer> {
  const db = database ? { url: database, drop: async () => {} } : await freshDatabase();
  const config = loadConfig({
    SVC_ADMIN_TOKEN: ADMIN_TOKEN,
    SVC_HMAC_SECRET: HMAC_SECRET,
    DATABASE_URL: db.url,
    PORT: "0",
    HOST: "127.0.0.1",
    SVC_DATA_DIR: path.join(os.tmpdir(), "svc-test-data"),
    LOG_LEVEL: process.env.TEST_LOG_LEVEL || "silent", // TEST_LOG_LEVEL=error shows a server's errors while debugging a test
    SVC_RATE_LIMITS: "off",
    SVC_V1_MANAGED_RENTERS: MANAGED_RENTER_EMAIL,
    // Production requires its public origins.
    ...(env.NODE_ENV === "production" ? { BACKEND_URL: "https://api.svc.example.com", FRONTEND_URL: "https://svc.example.com" } : {}),
    ...env,
  });
  const app = await startApp(config);
  const sql = connect(db.url, 4);
  return {
    app,
    url: app.url,
    port: app.port,
    sql,
    config,
    databaseUrl: db.url,
    async close() {
      await sql.end();
      await app.close();
      await db.drop();
    },
  };
}

/**
 * The server of a test file (or of the describe block it is called in): started in
 * beforeAll, closed in afterAll. What it returns stands for that server from module
 * level on, each member read from the running one. Hooks registered after this call
 * find it running: beforeAll hooks run in order, afterAll hooks in reverse (vitest's
 * default sequence.hooks, "stack").
 */
export function useTestServer(env: Record<string, string> = {}): TestServer {
  let started: TestServer | undefined;
  beforeAll(async () => {
    started = await startTestServer(env);
  });
  afterAll(() => started?.close());
  const running = (): TestServer => {
    if (!started) throw new Error("the test server is not running: it starts in beforeAll");
    return started;
  };
  return {
    get app() { return running().app; },
    get url() { return running().url; },
    get port() { return running().port; },
    get sql() { return running().sql; },
    get config() { return running().config; },
    get databaseUrl() { return running().databaseUrl; },
    close: () => running().close(),
  };
}
