// The README's start path as a real process, as `npm start` runs it: the
// build (bin/build.mjs) compiled to plain JavaScript, no TypeScript loader; no
// DATABASE_URL, so the embedded PostgreSQL starts in the data folder; /readyz
// answers; SIGTERM shuts down cleanly. The build serves every file it needs
// (migrations, the console's sources, the installers, the API document's
// version). Also: secrets never reach the logs.
import { execFileSync, spawn } from "node:child_process";
import fs from "node:fs";
import http from "node:http";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { Writable } from "node:stream";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { loadConfig } from "../../src/config.js";
import { startApp } from "../../src/server.js";
import { connect } from "../../src/db/index.js";
import { ADMIN_TOKEN, HMAC_SECRET, freshDatabase } from "../helpers/server.js";
import { client, uniqueEmail } from "../helpers/http.js";
import { SERVER_NODE_FLAGS } from "../../bin/node-flags.mjs";

async function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const s = net.createServer().listen(0, "127.0.0.1", () => {
      const p = (s.address() as net.AddressInfo).port;
      s.close(() => resolve(p));
    });
  });
}

/** The build in a folder of its own (inside the project, so that its packages resolve). */
const BUILD_DIR = path.join(".data", `build-test-${process.pid}`);
const BUILT_MAIN = path.join(BUILD_DIR, "src", "main.js");

function startBuilt(env: NodeJS.ProcessEnv) {
  const child = spawn(process.execPath, [...SERVER_NODE_FLAGS, BUILT_MAIN], { env, stdio: ["ignore", "pipe", "pipe"] });
  let output = "";
  child.stdout.on("data", (d) => (output += d));
  child.stderr.on("data", (d) => (output += d));
  const exited = new Promise<number | null>((resolve) => child.on("exit", (code) => resolve(code)));
  return { child, exited, output: () => output };
}

async function waitReady(port: number, child: { exitCode: number | null }, ms: number): Promise<boolean> {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline && child.exitCode === null) {
    await new Promise((r) => setTimeout(r, 300));
    if (await fetch(`http://127.0.0.1:${port}/readyz`).then((r) => r.status === 200, () => false)) return true;
  }
  return false;
}

describe("process", () => {
  beforeAll(() => {
    execFileSync(process.execPath, ["bin/build.mjs", "--out", BUILD_DIR], { stdio: "pipe" });
  }, 60_000);
  afterAll(() => fs.rmSync(BUILD_DIR, { recursive: true, force: true }));

  it("the build holds only JavaScript to run and its sources' other files, and refuses a folder outside the project", () => {
    const files = fs.readdirSync(BUILD_DIR, { recursive: true }) as string[];
    // TypeScript only in the console's sources, which the server bundles for the browser.
    expect(files.filter((f) => f.endsWith(".ts") && !f.startsWith(path.join("src", "console") + path.sep))).toEqual([]);
    expect(files).toContain(path.join("src", "main.js"));
    expect(files).toContain(path.join("src", "db", "migrations", "001_core.sql"));
    expect(files).toContain(path.join("gen", "svc", "v1", "jobs_pb.js"));
    expect(files).toContain(path.join("src", "console", "main.tsx"));
    expect(JSON.parse(fs.readFileSync(path.join(BUILD_DIR, "package.json"), "utf8")).type).toBe("module");
    let refused = "";
    try {
      execFileSync(process.execPath, ["bin/build.mjs", "--out", os.tmpdir()], { stdio: "pipe" });
    } catch (err) {
      refused = String((err as { stderr: Buffer }).stderr);
    }
    expect(refused).toContain("--out must be a folder inside");
  });

  it("npm start gives the server the node flags that the benches and the harness start it with", () => {
    const scripts = JSON.parse(fs.readFileSync("package.json", "utf8")).scripts as Record<string, string>;
    expect(scripts.start).toBe(`node ${SERVER_NODE_FLAGS.join(" ")} dist/src/main.js`);
    expect(SERVER_NODE_FLAGS).toContain("--enable-source-maps");
  });

  it("the build serves the console, the API document, the installers and the daemon", async () => {
    const db = await freshDatabase();
    const port = await freePort();
    const env = { ...process.env, PORT: String(port), HOST: "127.0.0.1", DATABASE_URL: db.url, SVC_ADMIN_TOKEN: ADMIN_TOKEN, SVC_HMAC_SECRET: HMAC_SECRET, LOG_LEVEL: "warn" } as NodeJS.ProcessEnv;
    delete env.VITEST;
    delete env.NODE_OPTIONS;
    const run = startBuilt(env);
    try {
      expect(await waitReady(port, run.child, 60_000), run.output()).toBe(true);
      const base = `http://127.0.0.1:${port}`;
      const doc = await (await fetch(`${base}/api/openapi.json`)).json();
      expect(doc.info["x-package-version"]).toBe(JSON.parse(fs.readFileSync("package.json", "utf8")).version);
      const page = await (await fetch(`${base}/`)).text();
      const bundle = page.match(/src="(\/console\/app\.js\?v=[0-9a-f]+)"/);
      expect(bundle, page).not.toBeNull();
      const js = await fetch(`${base}${bundle![1]}`);
      expect(js.status).toBe(200);
      expect((await js.text()).length).toBeGreaterThan(10_000);
      const p = await client(base).post("/api/providers/register", { name: "P", email: uniqueEmail("p"), gpu_model: "A10", os: "linux" });
      expect(p.status).toBe(200);
      const approved = await client(base).post(`/api/admin/providers/${p.body.provider_id}/approve`, {}, { "x-admin-token": ADMIN_TOKEN });
      expect(approved.status, approved.text).toBe(200);
      const headers = { "x-provider-key": p.body.api_key };
      const setup = await fetch(`${base}/api/providers/download/setup`, { headers });
      expect(setup.status).toBe(200);
      expect(await setup.text()).toMatch(/^#!\/.*sh/);
      // (the documented daemon download takes the key in its query)
      const daemon = await fetch(`${base}/api/providers/download/daemon?key=${p.body.api_key}`);
      expect(daemon.status).toBe(200);
      expect(await daemon.text()).toContain(`API_KEY = "${p.body.api_key}"`);
    } finally {
      run.child.kill("SIGTERM");
      expect(await run.exited).toBe(0);
      await db.drop();
    }
  }, 120_000);

  it("starts on the embedded database, serves /readyz, and exits 0 on SIGTERM", async () => {
    const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "svc-proc-"));
    fs.chmodSync(dataDir, 0o755);
    const port = await freePort();
    const env = { ...process.env, PORT: String(port), HOST: "127.0.0.1", SVC_DATA_DIR: dataDir, LOG_LEVEL: "info" } as NodeJS.ProcessEnv;
    delete env.DATABASE_URL;
    delete env.VITEST;
    const { child, exited, output } = startBuilt(env);
    try {
      // First start initialises a PostgreSQL cluster: slow on a loaded 2-core CI machine.
      expect(await waitReady(port, child, 120_000), output()).toBe(true);
      const reg = await client(`http://127.0.0.1:${port}`).post("/api/renters/register", { name: "Local", email: uniqueEmail("local") });
      expect(reg.status).toBe(201);
      expect(output()).toContain(path.join(dataDir, "secrets.json"));
      expect(output()).not.toContain(reg.body.api_key);
      // The service reaches its embedded database through the cluster's Unix socket, in the cluster's folder.
      const pgDir = path.join(dataDir, "pg");
      const pgPort = Number(fs.readFileSync(path.join(pgDir, "postmaster.pid"), "utf8").split("\n")[3]);
      expect(fs.readdirSync(pgDir)).toContain(`.s.PGSQL.${pgPort}`);
      const probe = connect(`postgres://postgres:svc-local@127.0.0.1:${pgPort}/postgres`, 1);
      try {
        const [ways] = await probe<{ socket: number; tcp: number }[]>`
          SELECT count(*) FILTER (WHERE client_addr IS NULL)::int AS socket, count(*) FILTER (WHERE client_addr IS NOT NULL)::int AS tcp
          FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()`;
        expect(ways.tcp).toBe(0);
        expect(ways.socket).toBeGreaterThan(0);
      } finally {
        await probe.end();
      }

      // Graceful: a request in flight when SIGTERM arrives is still answered; new connections are refused.
      let refusedDuring: Promise<string> | undefined;
      const inFlight = new Promise<{ status: number; body: string }>((resolve, reject) => {
        const req = http.request(`http://127.0.0.1:${port}/api/renters/register`, { method: "POST", headers: { "content-type": "application/json" } }, (res) => {
          let body = "";
          res.on("data", (c) => (body += c));
          res.on("end", () => resolve({ status: res.statusCode ?? 0, body }));
        });
        req.on("error", reject);
        req.write('{"name": "Late",');
        req.on("socket", (sock) =>
          sock.on("connect", () =>
            setTimeout(() => {
              child.kill("SIGTERM");
              // New connections are refused while the late request is still open; then it finishes.
              refusedDuring = (async () => {
                let outcome = "";
                // (a pooled keep-alive connection closed by the shutdown may fail differently first)
                for (let i = 0; i < 100 && outcome !== "ECONNREFUSED"; i++) {
                  await new Promise((r) => setTimeout(r, 50));
                  outcome = await fetch(`http://127.0.0.1:${port}/healthz`).then(() => "served", (e) => String(e.cause?.code ?? e));
                }
                return outcome;
              })();
              void refusedDuring.finally(() => req.end(` "email": "${uniqueEmail("late")}"}`));
            }, 100),
          ),
        );
      });
      const answered = await inFlight;
      expect(answered.status, answered.body).toBe(201);
      expect(await refusedDuring).toBe("ECONNREFUSED"); // asked while the late request was still open
    } finally {
      child.kill("SIGTERM");
    }
    expect(await exited).toBe(0);
  }, 180_000);

  it("never logs API keys or the admin token, wherever they were sent", async () => {
    const db = await freshDatabase();
    let logs = "";
    const sink = new Writable({
      write(chunk, _enc, cb) {
        logs += chunk;
        cb();
      },
    });
    const log = pino({ level: "trace" }, sink);
    const config = loadConfig({
      SVC_ADMIN_TOKEN: ADMIN_TOKEN, SVC_HMAC_SECRET: HMAC_SECRET, DATABASE_URL: db.url, PORT: "0", HOST: "127.0.0.1",
      SVC_DATA_DIR: path.join(os.tmpdir(), "svc-test-data"), SVC_RATE_LIMITS: "off",
    });
    const app = await startApp(config, { log });
    try {
      const api = client(app.url);
      const p = await api.post("/api/providers/register", { name: "P", email: uniqueEmail("p"), gpu_model: "A10", os: "linux" });
      const key: string = p.body.api_key;
      await api.get(`/api/providers/me?key=${key}`);
      await api.get("/api/providers/me", { "x-provider-key": key });
      await api.get(`/api/providers/status/${key}`);
      await api.get(`/api/providers/${key}/jobs`);
      await api.post("/api/providers/heartbeat", { api_key: key });
      await api.get("/api/admin/dashboard", { "x-admin-token": ADMIN_TOKEN });
      await api.get("/api/admin/dashboard", { authorization: `Bearer ${ADMIN_TOKEN}` });
      expect(logs.length).toBeGreaterThan(0);
      expect(logs).toContain("/api/providers/status/***"); // the route template, its key parameter masked
      expect(logs).not.toContain(key);
      expect(logs).not.toContain(key.slice("svc-provider-".length));
      expect(logs).not.toContain(ADMIN_TOKEN);
    } finally {
      await app.close();
      await db.drop();
    }
  });

  it("/readyz answers 503 once the database is gone, /healthz still 200", async () => {
    const db = await freshDatabase();
    const config = loadConfig({
      SVC_ADMIN_TOKEN: ADMIN_TOKEN, SVC_HMAC_SECRET: HMAC_SECRET, DATABASE_URL: db.url, PORT: "0", HOST: "127.0.0.1",
      SVC_DATA_DIR: path.join(os.tmpdir(), "svc-test-data"), SVC_RATE_LIMITS: "off", LOG_LEVEL: "silent",
    });
    const app = await startApp(config, { log: pino({ level: "silent" }) });
    try {
      expect((await fetch(`${app.url}/readyz`)).status).toBe(200);
      await db.drop(); // terminates the pool's connections
      const r = await fetch(`${app.url}/readyz`);
      expect(r.status).toBe(503);
      expect(await r.json()).toEqual({ error: "database unreachable" });
      expect((await fetch(`${app.url}/healthz`)).status).toBe(200);
    } finally {
      await app.close();
    }
  });

  it("/readyz answers 503 within seconds when the database stops answering", async () => {
    const db = await freshDatabase();
    // The server reaches PostgreSQL through a proxy that can go silent: connections stay open, nothing passes.
    const target = new URL(db.url);
    let silent = false;
    const sockets = new Set<net.Socket>();
    const proxy = net.createServer((c) => {
      sockets.add(c);
      c.on("error", () => {});
      c.on("close", () => sockets.delete(c));
      if (silent) return;
      const u = net.connect(Number(target.port || 5432), target.hostname);
      sockets.add(u);
      u.on("error", () => c.destroy());
      u.on("close", () => sockets.delete(u));
      c.on("data", (d) => !silent && u.write(d));
      u.on("data", (d) => !silent && c.write(d));
    });
    await new Promise<void>((r) => proxy.listen(0, "127.0.0.1", r));
    const via = new URL(db.url);
    via.hostname = "127.0.0.1";
    via.port = String((proxy.address() as net.AddressInfo).port);
    const config = loadConfig({
      SVC_ADMIN_TOKEN: ADMIN_TOKEN, SVC_HMAC_SECRET: HMAC_SECRET, DATABASE_URL: via.toString(), PORT: "0", HOST: "127.0.0.1",
      SVC_DATA_DIR: path.join(os.tmpdir(), "svc-test-data"), SVC_RATE_LIMITS: "off", LOG_LEVEL: "silent",
    });
    const app = await startApp(config, { log: pino({ level: "silent" }) });
    try {
      expect((await fetch(`${app.url}/readyz`)).status).toBe(200);
      silent = true;
      const started = performance.now();
      const r = await fetch(`${app.url}/readyz`, { signal: AbortSignal.timeout(15_000) });
      expect(r.status).toBe(503);
      expect(await r.json()).toEqual({ error: "database unreachable" });
      expect(performance.now() - started).toBeLessThan(10_000);
      // Shutdown does not wait forever on workers stuck in queries to it.
      const closing = performance.now();
      await app.close();
      expect(performance.now() - closing).toBeLessThan(30_000);
    } finally {
      await app.close();
      const closed = new Promise((r) => proxy.close(r));
      for (const s of sockets) s.destroy();
      await closed;
      await db.drop();
    }
  }, 60_000);
});
