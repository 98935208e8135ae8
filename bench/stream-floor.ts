// The floor of a message on a Connect bidirectional stream in this Node:
// a server whose DaemonService.Connect answers each heartbeat with a bare ack
// and does nothing else, driven by the same raw HTTP/2 client as
// bench:streams, in one process. What it costs per message is what any
// handler on this transport pays before doing its own work.
//
// `--server grpc-streams` serves the same implementation through the
// service's own path for streaming gRPC calls (src/http/grpc-streams.ts):
// Connect's handler context and interceptor chain, its own framing.
//
// `--server raw` answers the same way from a bare handler of Node's HTTP/2
// server (length-prefixed frames split from the stream's data, each decoded
// and its ack encoded with the generated schemas): the floor of a frame-level
// transport in this Node, for comparison. Both run with the same client, so
// their difference is the server side's.
//
//   npm run bench:stream-floor [-- --streams 500 --in-flight 64 --seconds 5 --server connect|grpc-streams|raw]
import http2 from "node:http2";
import { parseArgs } from "node:util";
import { create, fromBinary, toBinary, type MessageInitShape } from "@bufbuild/protobuf";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import { DaemonMessageSchema, DaemonService, ServerMessageSchema, type DaemonMessage } from "../gen/svc/v1/daemon_pb.js";
import { createContextValues } from "@connectrpc/connect";
import { AsyncQueue } from "../src/daemon/async-queue.js";
import { createGrpcStreamHandler } from "../src/http/grpc-streams.js";
import { createLogger } from "../src/log.js";
import { machine } from "./lib.js";

const { values: args } = parseArgs({
  options: {
    streams: { type: "string", default: "500" },
    "in-flight": { type: "string", default: "64" },
    seconds: { type: "string", default: "5" },
    server: { type: "string", default: "connect" },
  },
});
const STREAMS = Number(args.streams);
const IN_FLIGHT = Number(args["in-flight"]);
const SECONDS = Number(args.seconds);
if (!["connect", "grpc-streams", "raw"].includes(args.server)) throw new Error("--server is connect, grpc-streams or raw");

type Out = MessageInitShape<typeof ServerMessageSchema>;

async function* ackEach(requests: AsyncIterable<DaemonMessage>): AsyncIterable<Out> {
  const out = new AsyncQueue<Out>();
  void (async () => {
    for await (const m of requests) {
      out.push(m.kind.case === "heartbeat" ? { kind: { case: "heartbeatAck", value: { success: true, message: "Heartbeat received" } } } : { kind: { case: "welcome", value: {} } });
    }
    out.close();
  })();
  yield* out;
}

const handler = connectNodeAdapter({ routes: (router) => router.service(DaemonService, { connect: ackEach }) });

const grpcStreams = createGrpcStreamHandler({
  routes: [{ method: DaemonService.method.connect, impl: ackEach, readMaxBytes: 1 << 20 }],
  interceptors: [],
  contextValues: () => createContextValues(),
  shutdownSignal: new AbortController().signal,
  log: createLogger("warn"),
});

/** A bare gRPC bidi handler on Node's HTTP/2 stream: split frames, decode, answer with an encoded ack. */
function rawHandler(_req: http2.Http2ServerRequest, res: http2.Http2ServerResponse) {
  const stream = res.stream;
  stream.respond({ ":status": 200, "content-type": "application/grpc+proto" }, { waitForTrailers: true });
  stream.on("wantTrailers", () => stream.sendTrailers({ "grpc-status": "0" }));
  let buf: Buffer = Buffer.alloc(0);
  stream.on("data", (chunk: Buffer) => {
    buf = buf.length ? Buffer.concat([buf, chunk]) : chunk;
    while (buf.length >= 5 && buf.length >= 5 + buf.readUInt32BE(1)) {
      const len = buf.readUInt32BE(1);
      const m = fromBinary(DaemonMessageSchema, buf.subarray(5, 5 + len));
      buf = buf.subarray(5 + len);
      const out: Out = m.kind.case === "heartbeat" ? { kind: { case: "heartbeatAck", value: { success: true, message: "Heartbeat received" } } } : { kind: { case: "welcome", value: {} } };
      stream.write(frameBytes(toBinary(ServerMessageSchema, create(ServerMessageSchema, out))));
    }
  });
  stream.on("end", () => stream.end());
}

function frame(m: DaemonMessage): Buffer {
  return frameBytes(toBinary(DaemonMessageSchema, m));
}

function frameBytes(body: Uint8Array): Buffer {
  const f = Buffer.alloc(5 + body.length);
  f.writeUInt32BE(body.length, 1);
  f.set(body, 5);
  return f;
}

async function main() {
  const server = http2.createServer(
    {},
    args.server === "raw" ? rawHandler : args.server === "grpc-streams" ? (req, res) => void grpcStreams(req, res) : handler,
  );
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const { port } = server.address() as { port: number };
  const beat = frame(create(DaemonMessageSchema, { kind: { case: "heartbeat", value: { daemonVersion: "5.0.0", uptime: 1 } } }));
  const streams: { send(): Promise<void> }[] = [];
  for (let i = 0; i < STREAMS; i++) {
    const session = http2.connect(`http://127.0.0.1:${port}`);
    const stream = session.request({ ":method": "POST", ":path": `/${DaemonService.typeName}/${DaemonService.method.connect.name}`, "content-type": "application/grpc+proto", te: "trailers" });
    const waiting: (() => void)[] = [];
    let buf: Buffer = Buffer.alloc(0);
    stream.on("data", (chunk: Buffer) => {
      buf = buf.length ? Buffer.concat([buf, chunk]) : chunk;
      while (buf.length >= 5 && buf.length >= 5 + buf.readUInt32BE(1)) {
        buf = buf.subarray(5 + buf.readUInt32BE(1));
        waiting.shift()?.();
      }
    });
    const s = { send: () => new Promise<void>((r) => (waiting.push(r), stream.write(beat))) };
    await s.send();
    streams.push(s);
  }
  const cpu = process.cpuUsage();
  const started = performance.now();
  let messages = 0;
  let next = 0;
  await Promise.all(
    Array.from({ length: IN_FLIGHT }, async () => {
      while (performance.now() - started < SECONDS * 1000) {
        await streams[next++ % streams.length].send();
        messages++;
      }
    }),
  );
  const used = process.cpuUsage(cpu);
  const elapsed = (performance.now() - started) / 1000;
  console.log(
    JSON.stringify({
      benchmark: "stream-floor",
      server: args.server,
      streams: STREAMS,
      in_flight: IN_FLIGHT,
      messages_per_s: Math.round(messages / elapsed),
      // Server and client together: they share this process.
      cpu_us_per_message: Math.round((used.user + used.system) / messages),
      machine: machine(),
    }),
  );
  // Cutting the streams would only make the handlers log their premature close.
  process.exit(0);
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
