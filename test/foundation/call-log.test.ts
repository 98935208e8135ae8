// Request ids and call logs: REST echoes a sane x-request-id (or makes one);
// a gRPC/Connect call that fails with something other than a ConnectError is
// logged with its cause and answered "internal error", never with the cause.
import { Writable } from "node:stream";
import { pino } from "pino";
import { Code, ConnectError, createContextValues } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ProviderService } from "../../gen/svc/v1/providers_pb.js";
import { callLogInterceptor } from "../../src/http/call-log.js";
import { credentialsKey } from "../../src/http/credentials.js";
import { startTestServer, type TestServer } from "../helpers/server.js";

let srv: TestServer;
beforeAll(async () => {
  srv = await startTestServer();
});
afterAll(() => srv?.close());

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
