// A server process whose PostgreSQL goes away under it (a restart, a failover,
// a cut connection), its database reached through a TCP proxy that resets
// connections the way a restarting PostgreSQL does:
// - the process lives on: postgres.js dropped the promise of the array-types
//   query each new connection sends first, so a reconnect reset during that
//   query ended the process with an unhandled `read ECONNRESET` (the crash
//   npm run chaos found; bin/patch-postgres.mjs);
// - while the database cannot be reached, requests answer 503 with
//   {"error"} and Retry-After on REST, Connect, gRPC and /v1 (the routes whose
//   failure the spec documents as 500 keep it, with Retry-After), never a bare 500;
// - the pool connects again within seconds once it is back (its reconnect
//   delay is capped at 2 s, postgres.js's default grows to 20 s).
import { spawn, type ChildProcess } from "node:child_process";
import net from "node:net";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { RenterService } from "../../gen/svc/v1/renters_pb.js";
import { ADMIN_TOKEN, HMAC_SECRET, freshDatabase } from "../helpers/server.js";
import { connect } from "../../src/db/index.js";
import { client, uniqueEmail } from "../helpers/http.js";
import { DbProxy } from "../helpers/db-proxy.js";
import { reconnectDelaySeconds } from "../../src/db/index.js";

let db: Awaited<ReturnType<typeof freshDatabase>>;
let proxy: DbProxy;
let child: ChildProcess;
let output = "";
let base = "";
let renterKey = "";

async function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const s = net.createServer().listen(0, "127.0.0.1", () => {
      const p = (s.address() as net.AddressInfo).port;
      s.close(() => resolve(p));
    });
  });
}

const alive = () => child.exitCode === null && child.signalCode === null;
/** The server's log lines at error level or above (JSON lines; LOG_LEVEL=warn). */
const errorLines = () =>
  output
    .split("\n")
    .filter((l) => l.startsWith("{"))
    .map((l) => JSON.parse(l) as { level: number; msg: string })
    .filter((l) => l.level >= 50);
const balance = () => fetch(`${base}/api/renters/balance`, { headers: { "x-renter-key": renterKey } });

/**
 * The last LISTEN the server's listening connection sent, once it has listened on every channel (the
 * same text in five reads in a row), read straight from the database, not through the proxy. Every
 * (re)connect of that connection empties the server's key cache (anything notified meanwhile is lost).
 */
async function lastListen(expected?: string): Promise<string> {
  const direct = connect(db.url, 1);
  try {
    let seen = "";
    for (let i = 0, same = 0; i < 200 && same < 5; i++) {
      const [row] = await direct<{ query: string }[]>`
        SELECT query FROM pg_stat_activity WHERE datname = current_database() AND state = 'idle' AND query ILIKE 'listen%'`;
      const q = row?.query ?? "";
      same = q !== "" && q === seen && (expected === undefined || q === expected) ? same + 1 : 0;
      seen = q;
      await new Promise((r) => setTimeout(r, 100));
    }
    return seen;
  } finally {
    await direct.end();
  }
}
let listening = "";

/** Waits (bounded) until the database answers through the server again. */
async function recovered(): Promise<number> {
  let status = 0;
  for (let i = 0; i < 100 && status !== 200 && alive(); i++) {
    status = await balance().then((r) => r.status, () => 0);
    if (status !== 200) await new Promise((r) => setTimeout(r, 200));
  }
  return status;
}

beforeAll(async () => {
  db = await freshDatabase();
  const front = await DbProxy.inFrontOf(db.url);
  proxy = front.proxy;
  const port = await freePort();
  base = `http://127.0.0.1:${port}`;
  const env = {
    ...process.env,
    NODE_ENV: "development",
    DATABASE_URL: front.url,
    PORT: String(port),
    HOST: "127.0.0.1",
    SVC_ADMIN_TOKEN: ADMIN_TOKEN,
    SVC_HMAC_SECRET: HMAC_SECRET,
    SVC_RATE_LIMITS: "off",
    LOG_LEVEL: "warn",
  } as NodeJS.ProcessEnv;
  delete env.VITEST;
  child = spawn(process.execPath, ["--import", "tsx", "src/main.ts"], { env, stdio: ["ignore", "pipe", "pipe"] });
  child.stdout!.on("data", (d) => (output += d));
  child.stderr!.on("data", (d) => (output += d));
  let ready = false;
  for (let i = 0; i < 300 && !ready && alive(); i++) {
    ready = await fetch(`${base}/readyz`).then((r) => r.status === 200, () => false);
    if (!ready) await new Promise((r) => setTimeout(r, 200));
  }
  if (!ready) throw new Error(`the server did not start:\n${output}`);
  listening = await lastListen();
  const api = client(base);
  renterKey = (await api.post("/api/renters/register", { name: "Renter", email: uniqueEmail("restart") })).body.api_key;
}, 120_000);

afterAll(async () => {
  if (child && alive()) {
    child.kill("SIGKILL");
    await new Promise((r) => child.once("exit", r));
  }
  await proxy?.close();
  await db?.drop();
});

describe("the database goes away under a running server process", () => {
  it("the pool's reconnect delay stays at most 2 s however many connects failed in a row", () => {
    const delays = Array.from({ length: 40 }, (_, failures) => reconnectDelaySeconds(failures));
    expect(Math.max(...delays)).toBeLessThanOrEqual(2);
    expect(delays[0]).toBeLessThanOrEqual(0.05);
  });

  it("a connection reset while a new connection fetches its types fails that request, and the process lives on", async () => {
    proxy.resetOnTypesQuery = true;
    proxy.cut();
    // Each request makes the pool open a connection; each new connection's first statement is reset.
    const statuses: number[] = [];
    for (let i = 0; i < 40 && proxy.typesQueriesReset < 3 && alive(); i++) {
      statuses.push(await balance().then((r) => r.status, () => 0));
      await new Promise((r) => setTimeout(r, 100));
    }
    await new Promise((r) => setTimeout(r, 500)); // an unhandled rejection ends the process within a tick
    proxy.resetOnTypesQuery = false;
    expect(alive(), output).toBe(true);
    expect(proxy.typesQueriesReset, `statuses ${statuses.join(",")}`).toBeGreaterThanOrEqual(3);
    expect(output).not.toMatch(/triggerUncaughtException|Unhandled/);
    expect(await recovered()).toBe(200);
    expect(alive(), output).toBe(true);
  });

  it("while it cannot be reached: 503 with {error} and Retry-After on REST, Connect and gRPC; documented 500s keep their text", async () => {
    // The renter's key is looked up (and cached) while the database answers: renters/me then reaches its handler.
    // Once the listening connection, cut by the test before, is back: its reconnect empties the cache.
    expect(await lastListen(listening)).toBe(listening);
    const me = () => fetch(`${base}/api/renters/me`, { headers: { "x-renter-key": renterKey } });
    expect((await me()).status).toBe(200);
    proxy.refusing = true;
    proxy.cut();
    try {
      const rest = await balance();
      expect(rest.status).toBe(503);
      expect(rest.headers.get("retry-after")).toMatch(/^\d+$/);
      expect(await rest.json()).toEqual({ error: expect.stringMatching(/temporarily unavailable/) });

      const submit = await fetch(`${base}/api/jobs/submit`, {
        method: "POST",
        headers: { "x-renter-key": renterKey, "content-type": "application/json", "idempotency-key": "restart-1" },
        body: JSON.stringify({ job_type: "benchmark", duration_minutes: 1 }),
      });
      expect(submit.status).toBe(503);
      expect(submit.headers.get("retry-after")).toMatch(/^\d+$/);

      // Connect (HTTP/1.1 JSON): the code is unavailable, the HTTP status 503, Retry-After a header.
      const connect = await fetch(`${base}/svc.v1.RenterService/GetBalance`, {
        method: "POST",
        headers: { "content-type": "application/json", "x-renter-key": renterKey },
        body: "{}",
      });
      expect(connect.status).toBe(503);
      expect(connect.headers.get("retry-after")).toMatch(/^\d+$/);
      expect(await connect.json()).toMatchObject({ code: "unavailable" });

      // gRPC: UNAVAILABLE with retry-after in the metadata.
      const grpc = createClient(RenterService, createGrpcTransport({ baseUrl: base }));
      const err = await grpc.getBalance({}, { headers: { "x-renter-key": renterKey } }).then(
        () => undefined,
        (e: unknown) => ConnectError.from(e),
      );
      expect(err?.code).toBe(Code.Unavailable);
      expect(err?.metadata.get("retry-after")).toMatch(/^\d+$/);

      // /v1: the envelope says the service is away (retryable, with its retry-after), as the other wires do.
      const chat = await fetch(`${base}/v1/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${renterKey}`, "content-type": "application/json" },
        body: JSON.stringify({ model: "any-model", messages: [{ role: "user", content: "hi" }] }),
      });
      expect(chat.status).toBe(503);
      expect(chat.headers.get("retry-after")).toMatch(/^\d+$/);
      expect(await chat.json()).toMatchObject({
        error: { message: expect.stringMatching(/temporarily unavailable/), status: 503, retryable: true, retry_after_seconds: expect.any(Number) },
      });

      // The spec documents the failure of renters/me as 500 "failed to fetch renter data": kept, with Retry-After.
      const mine = await me();
      expect(mine.status).toBe(500);
      expect(mine.headers.get("retry-after")).toMatch(/^\d+$/);
      expect(await mine.json()).toEqual({ error: "failed to fetch renter data" });
    } finally {
      proxy.refusing = false;
    }
    expect(await recovered()).toBe(200);
    expect(alive(), output).toBe(true);
    // An outage is logged as warnings (requests answered 503, workers that retry by themselves), not as errors.
    expect(errorLines()).toEqual([]);
  });
});
