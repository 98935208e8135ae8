// Streaming gRPC calls on the service's own path (src/http/grpc-streams.ts),
// driven frame by frame with node:http2: envelopes split across writes or
// packed into one, answers in order, the method's size limit, a message that
// does not parse, a client that cancels; and the calls this path leaves to
// Connect (compressed messages, the JSON codec) still answered there.
import http2 from "node:http2";
import { afterAll, describe, expect, it } from "vitest";
import * as grpc from "@grpc/grpc-js";
import { create, fromBinary, fromJson, toBinary, toJson, type MessageInitShape } from "@bufbuild/protobuf";
import { DaemonMessageSchema, DaemonService, ServerMessageSchema, type ServerMessage } from "../../gen/svc/v1/daemon_pb.js";
import { bodyLimitBytesOf } from "../../src/http/body.js";
import { useTestServer } from "../helpers/server.js";
import { makeProvider } from "../helpers/fixtures.js";
import { openStream } from "./grpc-stream.js";
import { EnvelopeReader } from "../../src/http/grpc-streams.js";

const PATH = `/${DaemonService.typeName}/${DaemonService.method.connect.name}`;
const hello: MessageInitShape<typeof DaemonMessageSchema> = { kind: { case: "hello", value: { daemonVersion: "5.0.0" } } };
const beat: MessageInitShape<typeof DaemonMessageSchema> = { kind: { case: "heartbeat", value: { daemonVersion: "5.0.0", uptime: 1 } } };

const sessions: http2.ClientHttp2Session[] = [];

const srv = useTestServer();
afterAll(() => {
  for (const s of sessions) s.destroy();
});

function envelope(body: Uint8Array, flags = 0): Buffer {
  const f = Buffer.alloc(5 + body.length);
  f[0] = flags;
  f.writeUInt32BE(body.length, 1);
  f.set(body, 5);
  return f;
}

const encoded = (m: MessageInitShape<typeof DaemonMessageSchema>) => envelope(toBinary(DaemonMessageSchema, create(DaemonMessageSchema, m)));

interface RawCall {
  stream: http2.ClientHttp2Stream;
  headers: Promise<http2.IncomingHttpHeaders>;
  /** Messages as they arrive, decoded with `decode`. */
  messages: ServerMessage[];
  /** Trailers once the call ended. */
  done: Promise<http2.IncomingHttpHeaders>;
  waitFor(n: number): Promise<void>;
}

function rawCall(key: string, contentType = "application/grpc", decode = (b: Buffer) => fromBinary(ServerMessageSchema, b)): RawCall {
  const session = http2.connect(`http://127.0.0.1:${srv.port}`);
  sessions.push(session);
  const stream = session.request({ ":method": "POST", ":path": PATH, "content-type": contentType, te: "trailers", "x-provider-key": key });
  const messages: ServerMessage[] = [];
  const waiters: (() => void)[] = [];
  let buf = Buffer.alloc(0);
  stream.on("data", (chunk: Buffer) => {
    buf = Buffer.concat([buf, chunk]);
    while (buf.length >= 5 && buf.length >= 5 + buf.readUInt32BE(1)) {
      const size = buf.readUInt32BE(1);
      messages.push(decode(buf.subarray(5, 5 + size)));
      buf = buf.subarray(5 + size);
      for (const w of waiters.splice(0)) w();
    }
  });
  const headers = new Promise<http2.IncomingHttpHeaders>((resolve) => stream.once("response", resolve));
  const done = new Promise<http2.IncomingHttpHeaders>((resolve, reject) => {
    let trailers: http2.IncomingHttpHeaders = {};
    stream.once("trailers", (t) => (trailers = t));
    stream.once("close", () => resolve(trailers));
    stream.once("error", reject);
  });
  const waitFor = async (n: number) => {
    const deadline = Date.now() + 10_000;
    while (messages.length < n) {
      if (Date.now() > deadline) throw new Error(`${messages.length} of ${n} messages after 10 s`);
      await new Promise<void>((r) => {
        waiters.push(r);
        setTimeout(r, 200);
      });
    }
  };
  return { stream, headers, messages, done, waitFor };
}

describe("streaming gRPC on the service's own path", () => {
  it("reads envelopes split across writes and packed into one, and answers each in order", async () => {
    const p = await makeProvider(srv, { online: false });
    const call = rawCall(p.key);
    const first = encoded(hello);
    // The hello in three pieces: inside the 5-byte prefix, then inside the message.
    call.stream.write(first.subarray(0, 3));
    call.stream.write(first.subarray(3, 9));
    call.stream.write(first.subarray(9));
    await call.waitFor(1);
    expect(call.messages[0]!.kind.case).toBe("welcome");
    const headers = await call.headers;
    expect(headers[":status"]).toBe(200);
    expect(headers["content-type"]).toBe("application/grpc+proto");
    expect(headers["x-request-id"]).toMatch(/^[\w-]{8,}$/);

    // Forty beats in one write: forty acks, nothing else, nothing lost.
    call.stream.write(Buffer.concat(Array.from({ length: 40 }, () => encoded(beat))));
    await call.waitFor(41);
    const acks = call.messages.slice(1).filter((m) => m.kind.case === "heartbeatAck");
    expect(acks).toHaveLength(40);
    expect(acks.every((m) => m.kind.case === "heartbeatAck" && m.kind.value.success)).toBe(true);
    // The first beat brought the provider online, as on the JSON route.
    const [row] = await srv.sql<{ status: string; last_heartbeat: Date | null }[]>`SELECT status, last_heartbeat FROM providers WHERE id = ${p.id}`;
    expect(row).toMatchObject({ status: "online", last_heartbeat: expect.any(Date) });

    // The client half-closes: the call ends with status 0.
    call.stream.end();
    const trailers = await call.done;
    expect(trailers["grpc-status"]).toBe("0");
  });

  it("ends a call whose message is over the method's limit with RESOURCE_EXHAUSTED, without reading it", async () => {
    const p = await makeProvider(srv);
    const call = rawCall(p.key);
    call.stream.write(encoded(hello));
    await call.waitFor(1);
    const limit = bodyLimitBytesOf(DaemonService.method.connect);
    // Only the prefix is sent: the size alone is refused.
    const prefix = Buffer.alloc(5);
    prefix.writeUInt32BE(limit + 1, 1);
    call.stream.write(prefix);
    const trailers = await call.done;
    expect(trailers["grpc-status"]).toBe(String(grpc.status.RESOURCE_EXHAUSTED));
    expect(decodeURIComponent(String(trailers["grpc-message"]))).toContain(`more than the ${limit} this method accepts`);
  });

  it("ends a call whose message does not parse, or that claims compression it did not declare, with INVALID_ARGUMENT", async () => {
    const p = await makeProvider(srv);
    for (const bad of [envelope(Buffer.from([0x0a, 0xff, 0xff])), envelope(toBinary(DaemonMessageSchema, create(DaemonMessageSchema, beat)), 1)]) {
      const call = rawCall(p.key);
      call.stream.write(encoded(hello));
      await call.waitFor(1);
      call.stream.write(bad);
      const trailers = await call.done;
      expect(trailers["grpc-status"]).toBe(String(grpc.status.INVALID_ARGUMENT));
      expect(String(trailers["grpc-message"])).not.toBe("");
    }
  });

  it("answers a call refused before any message with its status in trailers (grpc-js reads it)", async () => {
    const s = openStream(srv.port, undefined);
    s.send(hello.kind);
    const ended = await s.ended;
    expect(ended.code).toBe(grpc.status.INVALID_ARGUMENT);
    expect(ended.details).toBe("API key required");
  });

  it("runs the stream's own cleanup when the client cancels", async () => {
    const p = await makeProvider(srv);
    const gauge = async () => (await srv.app.deps.metrics!.daemonStreams.get()).values[0]?.value ?? 0;
    const before = await gauge();
    const call = rawCall(p.key);
    call.stream.write(encoded(hello));
    await call.waitFor(1);
    expect(await gauge()).toBe(before + 1);
    call.stream.close(http2.constants.NGHTTP2_CANCEL);
    await expect.poll(gauge, { timeout: 5_000 }).toBe(before);
  });

  it("leaves compressed streams and the JSON codec to Connect, which answers them alike", async () => {
    const p = await makeProvider(srv);
    // grpc-js compressing every message with gzip.
    const gz = openStream(srv.port, p.key, { "grpc.default_compression_algorithm": 2 });
    gz.send(hello.kind);
    expect(Number((await gz.next("welcome")).providerId)).toBe(p.id);
    gz.send(beat.kind);
    expect((await gz.next("heartbeatAck")).success).toBe(true);
    gz.cancel();

    const json = rawCall(p.key, "application/grpc+json", (b) => fromJson(ServerMessageSchema, JSON.parse(b.toString("utf8"))));
    json.stream.write(envelope(Buffer.from(JSON.stringify(toJson(DaemonMessageSchema, create(DaemonMessageSchema, hello))))));
    await json.waitFor(1);
    expect(json.messages[0]!.kind.case).toBe("welcome");
    expect((await json.headers)["content-type"]).toBe("application/grpc+json");
    json.stream.end();
    expect((await json.done)["grpc-status"]).toBe("0");
  });
});

describe("EnvelopeReader", () => {
  const reader = () => new EnvelopeReader(DaemonMessageSchema, 32 * 1024 * 1024);
  const beats = (n: number) => Buffer.concat(Array.from({ length: n }, () => encoded(beat)));

  it("reads messages however the frames cut them: inside the prefix, inside a message, several in one", () => {
    const bytes = Buffer.concat([encoded(hello), beats(5)]);
    for (const cut of [1, 2, 3, 5, 7, 64, bytes.length]) {
      const r = reader();
      const got: string[] = [];
      for (let i = 0; i < bytes.length; i += cut) r.push(bytes.subarray(i, i + cut), (m) => got.push((m as unknown as { kind: { case: string } }).kind.case));
      expect([cut, got]).toEqual([cut, ["hello", "heartbeat", "heartbeat", "heartbeat", "heartbeat", "heartbeat"]]);
      expect(r.pending).toBe(0);
    }
  });

  it("copies a large message's bytes a bounded number of times, however many frames it spans", () => {
    // A 16 MiB message (a beat with an unknown field 99 of zeros) in 16 KiB frames: joining the partial
    // message with every frame would copy ~8 GiB; joining once copies it once.
    const body = toBinary(DaemonMessageSchema, create(DaemonMessageSchema, beat));
    const padding = 16 * 1024 * 1024;
    const tag = Buffer.from([0x9a, 0x06]); // field 99, length-delimited
    const len: number[] = [];
    for (let v = padding; ; v >>>= 7) {
      if (v < 0x80) {
        len.push(v);
        break;
      }
      len.push((v & 0x7f) | 0x80);
    }
    const bytes = envelope(Buffer.concat([Buffer.from(body), tag, Buffer.from(len), Buffer.alloc(padding)]));
    const r = reader();
    let copied = 0;
    const concat = Buffer.concat;
    const copy = Buffer.prototype.copy;
    const from = Buffer.from;
    Buffer.concat = ((list: readonly Uint8Array[], total?: number) => {
      const out = concat(list, total);
      copied += out.length;
      return out;
    }) as typeof Buffer.concat;
    Buffer.prototype.copy = function (this: Buffer, ...args: Parameters<Buffer["copy"]>) {
      const n = copy.apply(this, args);
      copied += n;
      return n;
    };
    Buffer.from = ((...args: Parameters<typeof Buffer.from>) => {
      const out = (from as (...a: unknown[]) => Buffer)(...args);
      if (Buffer.isBuffer(args[0])) copied += out.length;
      return out;
    }) as typeof Buffer.from;
    let got = 0;
    try {
      for (let i = 0; i < bytes.length; i += 16 * 1024) r.push(bytes.subarray(i, i + 16 * 1024), () => got++);
    } finally {
      Buffer.concat = concat;
      Buffer.prototype.copy = copy;
      Buffer.from = from;
    }
    expect(got).toBe(1);
    expect(copied).toBeLessThanOrEqual(2 * bytes.length);
  });
});
