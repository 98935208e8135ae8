// The same implementation over every wire on one port: a standard
// @grpc/grpc-js client (unary and the bidi stream's handshake), a generated
// Connect client over gRPC and over the Connect protocol, and REST.
import * as grpc from "@grpc/grpc-js";
import { create, fromBinary, toBinary, type DescMessage, type DescMethod, type MessageShape } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import { describe, expect, it } from "vitest";
import { DaemonMessageSchema, DaemonService, ServerMessageSchema } from "../../gen/svc/v1/daemon_pb.js";
import { ProviderService } from "../../gen/svc/v1/providers_pb.js";
import { RenterService } from "../../gen/svc/v1/renters_pb.js";
import { useTestServer } from "../helpers/server.js";
import { client, uniqueEmail } from "../helpers/http.js";

const srv = useTestServer();

/** A grpc-js method definition serialised with protobuf-es. */
function grpcMethod<I extends DescMessage, O extends DescMessage>(service: { typeName: string }, method: DescMethod, input: I, output: O) {
  return {
    path: `/${service.typeName}/${method.name}`,
    requestStream: method.methodKind === "client_streaming" || method.methodKind === "bidi_streaming",
    responseStream: method.methodKind === "server_streaming" || method.methodKind === "bidi_streaming",
    requestSerialize: (m: MessageShape<I>) => Buffer.from(toBinary(input, m)),
    requestDeserialize: (b: Buffer) => fromBinary(input, b),
    responseSerialize: (m: MessageShape<O>) => Buffer.from(toBinary(output, m)),
    responseDeserialize: (b: Buffer) => fromBinary(output, b),
  };
}

describe("gRPC with @grpc/grpc-js on the shared port", () => {
  it("calls a unary RPC and maps errors to gRPC status codes", async () => {
    const register = ProviderService.method.register;
    const Client = grpc.makeGenericClientConstructor(
      { register: grpcMethod(ProviderService, register, register.input, register.output) },
      "ProviderService",
    );
    const c = new Client(`127.0.0.1:${srv.port}`, grpc.credentials.createInsecure()) as any;
    const call = (req: unknown) =>
      new Promise<any>((resolve, reject) => c.register(create(register.input, req as never), (err: unknown, res: unknown) => (err ? reject(err) : resolve(res))));
    const email = uniqueEmail("grpc");
    const res = await call({ name: "gRPC rig", email, gpuModel: "A100", os: "linux" });
    expect(res.success).toBe(true);
    expect(res.apiKey).toMatch(/^svc-provider-/);
    expect(typeof res.providerId).toBe("bigint");

    const dup = await call({ name: "gRPC rig", email, gpuModel: "A100", os: "linux" }).catch((e) => e);
    expect(dup.code).toBe(grpc.status.ALREADY_EXISTS);
    expect(dup.details).toMatch(/already registered/);
    const bad = await call({ name: "x" }).catch((e) => e);
    expect(bad.code).toBe(grpc.status.INVALID_ARGUMENT);

    // The caller's request id comes back in the response metadata (and in the call's log line).
    const md = new grpc.Metadata();
    md.set("x-request-id", "trace-grpc-1");
    const echoed = await new Promise<grpc.Metadata>((resolve, reject) => {
      const unary = c.register(create(register.input, { name: "x" } as never), md, (err: unknown) => err ?? reject(new Error("expected an error")));
      unary.on("status", (st: grpc.StatusObject) => resolve(st.metadata));
    });
    expect(echoed.get("x-request-id")).toEqual(["trace-grpc-1"]);

    // The same account is visible over REST: one implementation, two wires.
    const login = await client(srv.url).post("/api/providers/login-email", { email });
    expect(login.status).toBe(200);
    expect(login.body.provider.id).toBe(Number(res.providerId));
    c.close();
  });

  it("opens the daemon bidi stream: hello -> welcome, authenticated by metadata", async () => {
    const reg = await client(srv.url).post("/api/providers/register", { name: "Streamer", email: uniqueEmail("s"), gpu_model: "L4", os: "linux" });
    const connect = DaemonService.method.connect;
    const Client = grpc.makeGenericClientConstructor(
      { connect: grpcMethod(DaemonService, connect, DaemonMessageSchema, ServerMessageSchema) },
      "DaemonService",
    );
    const c = new Client(`127.0.0.1:${srv.port}`, grpc.credentials.createInsecure()) as any;

    const md = new grpc.Metadata();
    md.set("x-provider-key", reg.body.api_key);
    const stream = c.connect(md);
    const first = new Promise<any>((resolve, reject) => {
      stream.once("data", resolve);
      stream.once("error", reject);
    });
    stream.write(create(DaemonMessageSchema, { kind: { case: "hello", value: { daemonVersion: "5.0.0" } } }));
    const welcome = await first;
    expect(welcome.kind.case).toBe("welcome");
    expect(Number(welcome.kind.value.providerId)).toBe(reg.body.provider_id);
    expect(welcome.kind.value.heartbeatIntervalSeconds).toBe(30);
    expect(welcome.kind.value.approvalStatus).toBe("pending");
    stream.end();
    await new Promise<void>((resolve) => {
      stream.on("end", resolve);
      stream.on("error", () => resolve());
      stream.resume();
    });

    // Without a key the stream is refused with UNAUTHENTICATED/INVALID_ARGUMENT, never opened.
    const anon = c.connect(new grpc.Metadata());
    const err = await new Promise<any>((resolve) => {
      anon.on("error", resolve);
      anon.on("data", () => {});
      anon.write(create(DaemonMessageSchema, { kind: { case: "hello", value: { daemonVersion: "5.0.0" } } }));
    });
    expect([grpc.status.INVALID_ARGUMENT, grpc.status.UNAUTHENTICATED]).toContain(err.code);
    c.close();
  });
});

describe("generated Connect clients", () => {
  it("register and read me over gRPC and Connect transports", async () => {
    for (const transport of [
      createGrpcTransport({ baseUrl: srv.url }),
      createConnectTransport({ baseUrl: srv.url, httpVersion: "1.1" }),
    ]) {
      const renters = createClient(RenterService, transport);
      const email = uniqueEmail("connect");
      const reg = await renters.register({ name: "Connect user", email });
      expect(reg.apiKey).toMatch(/^svc-renter-/);
      const me = await renters.getMe({}, { headers: { "x-renter-key": reg.apiKey } });
      expect(me.renter?.email).toBe(email);
      expect(me.renter?.balanceHalala).toBe(0n);
      await expect(renters.getMe({}, { headers: { "x-renter-key": "svc-renter-wrong" } })).rejects.toThrow(/renter not found/);
    }
  });
});

describe("one port", () => {
  it("tells HTTP/1.1 from h2c even when the first bytes arrive one at a time", async () => {
    const { default: net } = await import("node:net");
    const answer = await new Promise<string>((resolve, reject) => {
      const sock = net.connect(srv.port, "127.0.0.1", async () => {
        sock.write("P"); // also the first byte of the HTTP/2 preface
        await new Promise((r) => setTimeout(r, 50));
        sock.write("OST /api/renters/register HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}");
      });
      let data = "";
      sock.on("data", (c) => (data += c));
      sock.on("end", () => resolve(data));
      sock.on("error", reject);
    });
    expect(answer).toMatch(/^HTTP\/1\.1 400 /);
    expect(answer).toContain("missing required fields");
  });
});

