// Request ids and call logs: REST echoes a sane x-request-id (or makes one);
// a gRPC/Connect call that fails with something other than a ConnectError is
// logged with its cause and answered "internal error", never with the cause;
// a client that goes away mid-stream is logged at info, not as an error; a
// database that cannot be reached is answered 503 (Unavailable) with
// Retry-After on every wire, the errors of PostgreSQL's statements stay 500.
import net from "node:net";
import { Writable } from "node:stream";
import { pino } from "pino";
import { Code, ConnectError, createContextValues } from "@connectrpc/connect";
import { afterAll, describe, expect, it } from "vitest";
import { ProviderService } from "../../gen/svc/v1/providers_pb.js";
import { callLogInterceptor } from "../../src/http/call-log.js";
import { credentialsKey } from "../../src/http/credentials.js";
import { toConnectError, toHttpError } from "../../src/http/errors.js";
import { loadConfig } from "../../src/config.js";
import { startApp, type App } from "../../src/server.js";
import { ADMIN_TOKEN, HMAC_SECRET, freshDatabase, useTestServer } from "../helpers/server.js";
import { client, uniqueEmail } from "../helpers/http.js";
import { openStream } from "../daemon/grpc-stream.js";

const srv = useTestServer();

function capture() {
  const lines: Record<string, unknown>[] = [];
  const stream = new Writable({
    write(chunk, _enc, done) {
      lines.push(JSON.parse(String(chunk)));
      done();
    },
  });
  return { log: pino({ level: "info" }, stream), lines };
}

function fakeRequest(requestId: string) {
  return {
    service: ProviderService,
    method: ProviderService.method.getMe,
    stream: false,
    contextValues: createContextValues().set(credentialsKey, { keys: [], adminTokens: [], clientIp: "", requestId }),
  } as never;
}

describe("request ids", () => {
  it("REST echoes the caller's x-request-id, and replaces one that is not a sane token", async () => {
    const given = await fetch(`${srv.url}/api/renters/me`, { headers: { "x-request-id": "trace-rest-1" } });
    expect(given.headers.get("x-request-id")).toBe("trace-rest-1");
    const plain = await fetch(`${srv.url}/healthz`);
    expect(plain.headers.get("x-request-id")).toBeNull(); // plain routes are not transcoded calls
    const injected = await fetch(`${srv.url}/api/renters/me`, { headers: { "x-request-id": "a b\tc" } });
    expect(injected.headers.get("x-request-id")).toMatch(/^[0-9a-f-]{36}$/);
  });

  it("a call failing with a plain Error answers 'internal error' and logs the cause with the request id", async () => {
    const { log, lines } = capture();
    const call = callLogInterceptor(log)(async () => {
      throw new Error('relation "secret_table" does not exist');
    });
    const err = await call(fakeRequest("rid-1")).catch((e) => e);
    expect(err).toBeInstanceOf(ConnectError);
    expect(err.code).toBe(Code.Internal);
    expect(err.rawMessage).toBe("internal error");
    expect(err.metadata.get("x-request-id")).toBe("rid-1");
    // The documented status, as every answered error carries it: a client tells the server's 500 from no answer.
    expect(err.metadata.get("x-svc-http-status")).toBe("500");
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatchObject({ level: 50, requestId: "rid-1", procedure: "svc.v1.ProviderService/GetMe" });
    expect(JSON.stringify(lines[0])).toContain("secret_table");
  });

  it("a documented error passes through with its code and the request id", async () => {
    const { log, lines } = capture();
    const call = callLogInterceptor(log)(async () => {
      throw new ConnectError("provider not found", Code.NotFound);
    });
    const err = await call(fakeRequest("rid-2")).catch((e) => e);
    expect(err.code).toBe(Code.NotFound);
    expect(err.metadata.get("x-request-id")).toBe("rid-2");
    expect(lines[0]).toMatchObject({ level: 30, requestId: "rid-2", code: "NotFound" });
  });
});

describe("a client gone mid-stream", () => {
  let app: App | undefined;
  let db: Awaited<ReturnType<typeof freshDatabase>> | undefined;
  const { log, lines } = capture();
  afterAll(async () => {
    await app?.close();
    await db?.drop();
  });

  it("a daemon stream cut or reset by the network is logged at info, not as an error", async () => {
    db = await freshDatabase();
    app = await startApp(
      loadConfig({ SVC_ADMIN_TOKEN: ADMIN_TOKEN, SVC_HMAC_SECRET: HMAC_SECRET, DATABASE_URL: db.url, PORT: "0", HOST: "127.0.0.1", SVC_RATE_LIMITS: "off" }),
      { log },
    );
    const api = client(app.url);
    const reg = await api.post("/api/providers/register", { name: "Rig", email: uniqueEmail("cut"), gpu_model: "NVIDIA GeForce RTX 4090", os: "linux" });
    expect((await api.post(`/api/admin/providers/${reg.body.provider_id}/approve`, {}, { "x-admin-token": ADMIN_TOKEN })).status).toBe(200);
    // The network between daemon and server: a TCP proxy whose connections are dropped (FIN) or reset (RST).
    const sockets = new Set<net.Socket>();
    const proxy = net.createServer((c) => {
      const u = net.connect(app!.port, "127.0.0.1");
      for (const s of [c, u]) {
        sockets.add(s);
        s.on("error", () => {});
        s.on("close", () => sockets.delete(s));
      }
      c.pipe(u).pipe(c);
    });
    await new Promise<void>((r) => proxy.listen(0, "127.0.0.1", r));
    const port = (proxy.address() as net.AddressInfo).port;
    try {
      for (const cut of [(s: net.Socket) => s.destroy(), (s: net.Socket) => s.resetAndDestroy()]) {
        const before = lines.length;
        const stream = openStream(port, reg.body.api_key);
        stream.send({ case: "hello", value: { daemonVersion: "5.0.0", runningJobIds: [], gpus: [{ name: "NVIDIA GeForce RTX 4090", vram_mib: 24564 }] } });
        await stream.next("welcome");
        for (const s of [...sockets]) cut(s);
        stream.cancel();
        await expect.poll(() => lines.slice(before).some((l) => l.msg === "call ended: the client went away"), { timeout: 10_000 }).toBe(true);
        expect(lines.slice(before).filter((l) => (l.level as number) >= 50)).toEqual([]);
        expect(lines.slice(before).find((l) => l.msg === "call ended: the client went away")).toMatchObject({ level: 30, procedure: "svc.v1.DaemonService/Connect" });
      }
    } finally {
      await new Promise((r) => proxy.close(r));
    }
  });
});

describe("a database that cannot be reached", () => {
  const outage = (code: string) => Object.assign(new Error(`database: ${code}`), { code });

  it("is 503 with Retry-After on REST and Unavailable on gRPC/Connect, for postgres.js, socket and PostgreSQL codes", () => {
    for (const code of ["ECONNREFUSED", "ECONNRESET", "CONNECTION_CLOSED", "CONNECTION_ENDED", "CONNECT_TIMEOUT", "57P01", "57P03", "08006", "53300"]) {
      const rest = toHttpError(outage(code));
      expect(rest, code).toMatchObject({ status: 503, headers: { "retry-after": expect.stringMatching(/^\d+$/) } });
      expect(rest.message).not.toContain(code); // no internals in the answer
      const rpc = toConnectError(outage(code)) as ConnectError;
      expect(rpc.code, code).toBe(Code.Unavailable);
      expect(rpc.metadata.get("retry-after")).toBe(rest.headers["retry-after"]);
    }
  });

  it("leaves a statement's own errors (a constraint, a missing relation, a protocol violation) and plain errors at 500", () => {
    for (const code of ["23505", "42P01", "08P01", undefined]) {
      expect(toHttpError(Object.assign(new Error("boom"), { code })), String(code)).toEqual({ status: 500, message: "internal error", headers: {} });
      expect(toConnectError(Object.assign(new Error("boom"), { code }))).not.toBeInstanceOf(ConnectError);
    }
  });

  it("is logged as a warning by the call log, with its cause, and answered Unavailable", async () => {
    const { log, lines } = capture();
    const call = callLogInterceptor(log)(async () => {
      throw outage("57P01");
    });
    const err = await call(fakeRequest("rid-db")).catch((e) => e);
    expect(err.code).toBe(Code.Unavailable);
    expect(err.metadata.get("x-request-id")).toBe("rid-db");
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatchObject({ level: 40, requestId: "rid-db", msg: "call failed: database unreachable" });
  });
});
