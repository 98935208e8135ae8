// Keys in URLs. A provider key in the spec's path form (GET /api/providers/{api_key}/jobs),
// percent-encoded as some HTTP clients encode it, works (the router decodes it) and must be
// masked, in every form, wherever the server writes or answers a path: the request log, a
// 404 or 405 answer and its log. And the served legacy daemon sends its key in the
// x-provider-key header, never in the query of its own requests (self-update, a job's status).
import { Writable } from "node:stream";
import os from "node:os";
import path from "node:path";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { loadConfig } from "../../src/config.js";
import { connect } from "../../src/db/index.js";
import { maskSecrets } from "../../src/log.js";
import { startApp, type App } from "../../src/server.js";
import { ADMIN_TOKEN, HMAC_SECRET, freshDatabase } from "../helpers/server.js";
import { makeProvider } from "../helpers/fixtures.js";

let logs = "";
let app: App;
let db: { url: string; drop(): Promise<void> };
let sql: ReturnType<typeof connect>;

beforeAll(async () => {
  db = await freshDatabase();
  const sink = new Writable({ write(c, _e, cb) { logs += c; cb(); } });
  const config = loadConfig({
    SVC_ADMIN_TOKEN: ADMIN_TOKEN, SVC_HMAC_SECRET: HMAC_SECRET, DATABASE_URL: db.url, PORT: "0", HOST: "127.0.0.1",
    SVC_DATA_DIR: path.join(os.tmpdir(), "svc-test-data"), SVC_RATE_LIMITS: "off", SVC_LIVENESS_SWEEP_SECONDS: "0",
  });
  // A plain pino logger: what the request handlers themselves write, before any serializer of createLogger.
  app = await startApp(config, { log: pino({ level: "trace" }, sink) });
  sql = connect(db.url, 2);
});
afterAll(async () => {
  await sql?.end();
  await app?.close();
  await db?.drop();
});

const PREFIX = "svc-provider-";
const forms: [string, (k: string) => string][] = [
  ["every '-' as %2D", (k) => k.replace(/-/g, "%2D")],
  ["one character after the prefix escaped", (k) => `${PREFIX}%${k.charCodeAt(PREFIX.length).toString(16).toUpperCase()}${k.slice(PREFIX.length + 1)}`],
  ["lower-case escapes", (k) => k.replace(/-/g, "%2d").replace(/v/g, "%76")],
  ["every character escaped", (k) => [...k].map((c) => `%${c.charCodeAt(0).toString(16)}`).join("")],
];

/** Logs written by the request, once they are out. */
async function logsOf(request: () => Promise<Response>): Promise<{ res: Response; body: string; logs: string }> {
  logs = "";
  const res = await request();
  const body = await res.text();
  await new Promise((r) => setTimeout(r, 50));
  return { res, body, logs };
}

describe("a key in a URL path", () => {
  it.each(forms)("GET /api/providers/{api_key}/jobs with the key percent-encoded (%s) works and is logged masked", async (_name, encode) => {
    const p = await makeProvider({ url: app.url, sql } as never);
    const { res, logs: written } = await logsOf(() => fetch(`${app.url}/api/providers/${encode(p.key)}/jobs`));
    expect(res.status).toBe(200); // the server decoded it: the key authenticated
    expect(written).toContain('"path":"/api/providers/***/jobs"');
    expect(written).not.toContain(p.key.slice(-16));
  });

  it.each(forms)("GET /api/providers/status/{api_key} (%s) logs the path without the key", async (_name, encode) => {
    const p = await makeProvider({ url: app.url, sql } as never);
    const { res, logs: written } = await logsOf(() => fetch(`${app.url}/api/providers/status/${encode(p.key)}`));
    expect(res.status).toBe(200);
    expect(written).toContain('"path":"/api/providers/status/***"');
    expect(written).not.toContain(p.key.slice(-16));
  });

  it.each(forms)("a 404 or 405 answer names the path with the key masked (%s), and so does its log", async (_name, encode) => {
    const p = await makeProvider({ url: app.url, sql } as never);
    const notFound = await logsOf(() => fetch(`${app.url}/api/nowhere/${encode(p.key)}/x`));
    expect(notFound.res.status).toBe(404);
    expect(notFound.body).toContain("/api/nowhere/");
    expect(notFound.body).not.toContain(p.key.slice(-16));
    const wrongMethod = await logsOf(() => fetch(`${app.url}/api/providers/${encode(p.key)}/jobs`, { method: "DELETE" }));
    expect(wrongMethod.res.status).toBe(405);
    expect(wrongMethod.body).toContain("not allowed on /api/providers/");
    expect(wrongMethod.body).not.toContain(p.key.slice(-16));
    expect(notFound.logs + wrongMethod.logs).not.toContain(p.key.slice(-16));
  });

  it.each(forms)("a /v1 answer naming the path or model sent (%s) masks a key in it", async (_name, encode) => {
    const p = await makeProvider({ url: app.url, sql } as never);
    const route = await logsOf(() => fetch(`${app.url}/v1/nowhere/${encode(p.key)}`, { headers: { authorization: "Bearer none" } }));
    const model = await logsOf(() => fetch(`${app.url}/v1/models/${encode(p.key)}`, { headers: { authorization: "Bearer none" } }));
    for (const r of [route, model]) {
      expect(r.res.status).toBeGreaterThanOrEqual(400);
      expect(r.body + r.logs).not.toContain(p.key.slice(-16));
    }
  });
});

describe("maskSecrets", () => {
  const key = "svc-renter-Ab3dEf6hIj9kLm2nOp5qRs8tUv1w";
  const tail = key.slice(-16);

  it("masks a key as sent, percent-encoded, escaped twice or with lower-case hex", () => {
    for (const text of [
      `/api/x/${key}/y`,
      `/api/x/${key.replace(/-/g, "%2D")}/y`,
      `/api/x/${key.replace(/-/g, "%252D")}/y`,
      `/api/x/%73vc%2drenter%2d${key.slice("svc-renter-".length)}`,
      `not found: GET /api/x/pre${encodeURIComponent(key).replace(/e/g, "%65")}post`,
    ]) {
      const masked = maskSecrets(text);
      expect(masked, text).not.toContain(tail);
      expect(masked, text).toContain("svc-renter-***");
    }
  });

  it("masks a credential in the query, its name escaped or not", () => {
    expect(maskSecrets("/api/x?key=abc&k%65y=def&API_KEY=ghi&token=jkl&other=1")).toBe("/api/x?key=***&k%65y=***&API_KEY=***&token=***&other=1");
  });

  it("leaves other escapes alone, and a malformed one as written", () => {
    expect(maskSecrets("/api/jobs/job%2F1/logs")).toBe("/api/jobs/job%2F1/logs");
    expect(maskSecrets("/v1/models/TinyLlama%2FTinyLlama-1.1B")).toBe("/v1/models/TinyLlama%2FTinyLlama-1.1B");
    expect(maskSecrets("/api/x/%ZZ%E2%82%AC")).toBe("/api/x/%ZZ%E2%82%AC");
  });

  it("takes time in proportion to its input", () => {
    const long = "/api/" + "a%".repeat(200_000) + "%2D";
    const started = performance.now();
    maskSecrets(long);
    expect(performance.now() - started).toBeLessThan(1000);
  });
});

describe("the served legacy daemon", () => {
  it("asks for its self-update and a job's status with the key in a header, not in the URL's query", async () => {
    const p = await makeProvider({ url: app.url, sql } as never);
    const file = await (await fetch(`${app.url}/api/providers/download/daemon`, { headers: { "x-provider-key": p.key } })).text();
    expect(file).toContain("def self_update");
    const update = file.slice(file.indexOf("def self_update"), file.indexOf("def self_update") + 1500);
    expect(update).toContain('"/api/providers/download/daemon"');
    expect(update).not.toMatch(/download\/daemon",\s*\{\s*"key":/);
    expect(file).toContain('add_unredirected_header("x-provider-key"');
    // No request of the daemon's puts the key in a query.
    expect(file).not.toMatch(/\{\s*"key":\s*self\.api\.key/);
    // Nor does it tell its user to.
    expect(file).not.toContain("?key=");
  });
});
