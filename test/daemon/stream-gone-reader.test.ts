// A daemon stream whose client leaves with many answers unsent (a hello naming thousands of jobs the
// server does not know, each answered with a cancel, and the client gone without reading them) ends at
// once, on Connect's streaming protocol (either codec) as on gRPC: its implementation stops (the
// provider's notices unsubscribed, the stream no longer counted as connected, its slot freed) and what it
// held for the answers is let go. An answer waiting for room on a connection that closed under it no
// longer waits for ever. A client that reads slowly is still served, every answer in order. Over
// HTTP/1.1 Connect refuses a bidirectional stream outright (505), holding nothing.
import http2 from "node:http2";
import net from "node:net";
import v8 from "node:v8";
import vm from "node:vm";
import { create, fromBinary, fromJsonString, toBinary, toJsonString, type MessageInitShape } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { DaemonMessageSchema, ServerMessageSchema } from "../../gen/svc/v1/daemon_pb.js";
import { openStreamCount } from "../../src/domain/accounts/open-streams.js";
import { HELLO_MAX_JOB_IDS } from "../../src/services/daemon.js";
import { jobSignalHub } from "../../src/workers/job-signals.js";
import { makeProvider } from "../helpers/fixtures.js";
import { useStreamServer } from "./grpc-stream.js";
import { waitFor } from "./helpers.js";

v8.setFlagsFromString("--expose-gc");
const gc = vm.runInNewContext("gc") as () => void;

const { srv } = useStreamServer();
const PATH = "/svc.v1.DaemonService/Connect";
const MB = 1024 * 1024;

type Sent = MessageInitShape<typeof DaemonMessageSchema>;

/** Job ids no server knows, long enough that their cancels are far more than a local connection's buffers hold. */
const unknownIds = (tag: string) => Array.from({ length: HELLO_MAX_JOB_IDS }, (_, k) => `job-${tag}-${String(k).padStart(5, "0")}-${"x".repeat(160)}`);
const helloNaming = (ids: string[]): Sent => ({ kind: { case: "hello", value: { daemonVersion: "5.0.0", runningJobIds: ids } } });

function envelope(payload: Uint8Array): Buffer {
  const head = Buffer.alloc(5);
  head.writeUInt32BE(payload.length, 1);
  return Buffer.concat([head, payload]);
}

/** The messages of an enveloped body read so far: the payloads of its complete envelopes. */
class Envelopes {
  private buf = Buffer.alloc(0);
  readonly payloads: Buffer[] = [];
  push(chunk: Buffer): void {
    this.buf = Buffer.concat([this.buf, chunk]);
    while (this.buf.length >= 5 && this.buf.length >= 5 + this.buf.readUInt32BE(1)) {
      const size = this.buf.readUInt32BE(1);
      this.payloads.push(this.buf.subarray(5, 5 + size));
      this.buf = this.buf.subarray(5 + size);
    }
  }
}

interface Wire {
  name: string;
  type: string;
}

const WIRES: Wire[] = [
  { name: "Connect JSON", type: "application/connect+json" },
  { name: "Connect binary", type: "application/connect+proto" },
  { name: "gRPC", type: "application/grpc" },
];

const encoded = (type: string, m: Sent) => {
  const message = create(DaemonMessageSchema, m);
  return envelope(type.includes("json") ? Buffer.from(toJsonString(DaemonMessageSchema, message)) : toBinary(DaemonMessageSchema, message));
};

/** A daemon stream over raw HTTP/2: its answers as they are read, reading stopped and started, the connection dropped. */
interface RawStream {
  send(m: Sent): void;
  /** Stops reading: the answers pile up in the connection's buffers, then in the server's. */
  stopReading(): void;
  /** Reads again. */
  read(): void;
  /** The answers read so far. */
  answers: Envelopes;
  /** The connection destroyed, whatever it had not read. */
  destroy(): void;
}

function rawHttp2(key: string, type: string): RawStream {
  const session = http2.connect(srv.url);
  session.on("error", () => {});
  const stream = session.request({ ":method": "POST", ":path": PATH, "content-type": type, te: "trailers", "x-provider-key": key });
  stream.on("error", () => {});
  const answers = new Envelopes();
  stream.on("data", (chunk: Buffer) => answers.push(chunk));
  return {
    send: (m) => stream.write(encoded(type, m)),
    stopReading: () => stream.pause(),
    read: () => stream.resume(),
    answers,
    destroy: () => session.destroy(),
  };
}

const openRaw = (wire: Wire, key: string) => rawHttp2(key, wire.type);
/** An answer's message, in the wire's codec. */
const answerOf = (wire: Wire, payload: Buffer) =>
  wire.type.includes("json") ? fromJsonString(ServerMessageSchema, payload.toString("utf8")) : fromBinary(ServerMessageSchema, payload);

const streamsConnected = async () => (await srv.app.deps.metrics!.daemonStreams.get()).values.reduce((n, v) => n + v.value, 0);
const hub = () => jobSignalHub(srv.app.deps.sql, srv.app.deps.log);

/** The process's heap and buffers once collected, in MiB (what handles closed a moment ago let go of included). */
async function heldMb(): Promise<number> {
  for (let i = 0; i < 3; i++) {
    gc();
    await new Promise((r) => setTimeout(r, 50));
  }
  gc();
  const m = process.memoryUsage();
  return (m.heapUsed + m.arrayBuffers) / MB;
}

/**
 * Opens `count` streams that each name thousands of unknown jobs in their hello, read the welcome, stop
 * reading, and leave; waits for the server to end them. Answers what the process held (heldMb) while
 * they were open.
 */
async function leaveUnread(wire: Wire, count: number, tag: string): Promise<number> {
  const subscribed = hub().subscribers;
  const connected = await streamsConnected();
  const slots = openStreamCount(srv.app.deps.sql);
  const left: RawStream[] = [];
  let held = 0;
  try {
    for (let i = 0; i < count; i++) {
      const p = await makeProvider(srv);
      const s = openRaw(wire, p.key);
      left.push(s);
      s.send(helloNaming(unknownIds(`${tag}${i}`)));
      // The welcome and the first answers are read; then nothing more.
      await waitFor(() => s.answers.payloads.length > 0, 10_000, "the welcome");
      s.stopReading();
    }
    await waitFor(() => hub().subscribers === subscribed + count, 5_000, "every stream subscribed");
    // Long enough for every stream to queue its cancels, and to be held back writing them.
    await new Promise((r) => setTimeout(r, 1000));
    held = await heldMb();
    expect(await streamsConnected()).toBe(connected + count);
  } finally {
    for (const s of left) s.destroy();
  }
  // The server ends each stream: it no longer hears its provider's notices, counts it, or holds its slot.
  await waitFor(() => hub().subscribers === subscribed, 3_000, "the streams unsubscribed");
  await waitFor(async () => (await streamsConnected()) === connected, 3_000, "no stream counted as connected");
  await waitFor(() => openStreamCount(srv.app.deps.sql) === slots, 3_000, "no stream slot held");
  return held;
}

describe.each(WIRES)("a daemon stream over HTTP/2, $name", (wire) => {
  it("ends once its client left with thousands of answers unread, and lets go of them", async () => {
    const STREAMS = 6;
    // A first round warms up what serving streams allocates once (optimised code, pools, caches).
    await leaveUnread(wire, STREAMS, "warm");
    const before = await heldMb();
    const held = await leaveUnread(wire, STREAMS, "left");
    // The unsent answers (about 0.8 MB of cancels a stream, more as objects) were held while the streams
    // were open, and are let go once they ended.
    expect(held - before).toBeGreaterThan(STREAMS);
    expect((await heldMb()) - before).toBeLessThan(STREAMS / 2);
  });

  it("serves a client that reads slowly every answer, in order", async () => {
    const p = await makeProvider(srv);
    const subscribed = hub().subscribers;
    const s = openRaw(wire, p.key);
    const ids = unknownIds("slow");
    try {
      s.send(helloNaming(ids));
      await waitFor(() => s.answers.payloads.length > 0, 10_000, "the welcome");
      // Reads in short bursts with pauses between them, the server held back meanwhile.
      s.stopReading();
      await waitFor(async () => {
        s.read();
        await new Promise((r) => setTimeout(r, 5));
        s.stopReading();
        await new Promise((r) => setTimeout(r, 50));
        return s.answers.payloads.length >= 1 + ids.length;
      }, 60_000, "every cancel");
      expect(hub().subscribers).toBe(subscribed + 1);
      const [welcome, ...rest] = s.answers.payloads.map((b) => answerOf(wire, b).kind);
      expect(welcome?.case).toBe("welcome");
      expect(rest.map((k) => (k.case === "cancel" ? k.value.jobId : k.case))).toEqual(ids);
    } finally {
      s.destroy();
    }
    await waitFor(() => hub().subscribers === subscribed, 3_000, "the stream unsubscribed");
  });
});

describe("a daemon stream over HTTP/1.1", () => {
  it.each(WIRES.filter((w) => w.type.startsWith("application/connect")))("$name: is refused (505, the connection closed), and holds nothing", async (wire) => {
    const p = await makeProvider(srv);
    const subscribed = hub().subscribers;
    const connected = await streamsConnected();
    const socket = net.connect(srv.port, "127.0.0.1");
    socket.on("error", () => {});
    let received = "";
    socket.on("data", (chunk: Buffer) => (received += chunk.toString("latin1")));
    const closedSocket = new Promise<void>((resolve) => socket.once("close", () => resolve()));
    const hello = encoded(wire.type, helloNaming(unknownIds("h1")));
    socket.write(`POST ${PATH} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: ${wire.type}\r\nx-provider-key: ${p.key}\r\ntransfer-encoding: chunked\r\n\r\n`);
    socket.write(`${hello.length.toString(16)}\r\n`);
    socket.write(hello);
    socket.write("\r\n");
    // A bidirectional stream needs both halves at once, which HTTP/1.1 does not give: Connect refuses it.
    await closedSocket;
    expect(received).toMatch(/^HTTP\/1\.1 505 /);
    expect(hub().subscribers).toBe(subscribed);
    expect(await streamsConnected()).toBe(connected);
  });
});
