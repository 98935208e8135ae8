// A daemon stream's message in the binary codec nested past what protobuf-es reads (its recursion limit,
// PROTO_RECURSION_LIMIT) ends the stream naming the top-level field that nests too deep, as a unary call
// in the binary codec is refused, and as a message one level past MAX_JSON_DEPTH is: on gRPC (served off
// its HTTP/2 stream, or by Connect when compressed) and on Connect's streaming protocol (connect+proto).
// Such a stream's refusal named no field.
import { describe, expect, it } from "vitest";
import * as grpc from "@grpc/grpc-js";
import { fromJson, type JsonValue, type MessageInitShape } from "@bufbuild/protobuf";
import { ValueSchema } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { DaemonService, type DaemonMessageSchema } from "../../gen/svc/v1/daemon_pb.js";
import { MAX_JSON_DEPTH, PROTO_RECURSION_LIMIT } from "../../src/shared/json-nesting.js";
import { AsyncQueue } from "../../src/daemon/async-queue.js";
import { makeProvider } from "../helpers/fixtures.js";
import { openStream, useStreamServer, type Sent } from "./grpc-stream.js";

const { srv, streams } = useStreamServer();

/** `depth` arrays around a string (a scalar adds no level), as the google.protobuf.Value a client sends. */
const deep = (depth: number) => fromJson(ValueSchema, JSON.parse(`${"[".repeat(depth)}"deep"${"]".repeat(depth)}`) as JsonValue, { recursionLimit: 10_000 });
const refusal = (field: string) => `request body must not nest objects and arrays more than ${MAX_JSON_DEPTH} levels deep; field '${field}' nests deeper`;

const hello: Sent = { case: "hello", value: { daemonVersion: "5.0.0", gpus: [{ name: "NVIDIA GeForce RTX 4090", vram_mib: 24564 }] } };
// Well past what protobuf-es reads (each level of free-form JSON is a Value and a ListValue).
const DEPTH = PROTO_RECURSION_LIMIT;
const tooDeep: [field: string, message: Sent][] = [
  ["result", { case: "result", value: { jobId: "job-1", success: true, result: deep(DEPTH) } }],
  ["heartbeat", { case: "heartbeat", value: { daemonVersion: "5.0.0", gpuStatus: deep(DEPTH) } }],
  ["logs", { case: "logs", value: { jobId: "job-1", logs: [deep(0), deep(DEPTH)] } }],
];

describe("a daemon stream over gRPC, a message nested past what protobuf-es reads", () => {
  for (const [wire, options] of [
    ["served off its HTTP/2 stream", undefined],
    ["compressed (served by Connect)", { "grpc.default_compression_algorithm": 2 }],
  ] as const) {
    it(`ends the stream naming the top-level field: ${wire}`, async () => {
      const p = await makeProvider(srv);
      for (const [field, message] of tooDeep) {
        const s = openStream(srv.port, p.key, options);
        streams.push(s);
        s.send(hello);
        await s.next("welcome");
        s.send(message);
        const ended = await s.ended;
        expect(ended.code, `${field}: ${ended.details}`).toBe(grpc.status.INVALID_ARGUMENT);
        expect(decodeURIComponent(ended.details!), field).toBe(refusal(field));
      }
    });
  }
});

describe("a daemon stream in Connect's streaming protocol (connect+proto), a message nested past what protobuf-es reads", () => {
  it("ends the stream naming the top-level field", async () => {
    const p = await makeProvider(srv);
    const transport = createConnectTransport({ baseUrl: srv.url, httpVersion: "2", useBinaryFormat: true });
    for (const [field, message] of tooDeep) {
      const requests = new AsyncQueue<MessageInitShape<typeof DaemonMessageSchema>>();
      const abort = new AbortController();
      const responses = createClient(DaemonService, transport).connect(requests, { headers: { "x-provider-key": p.key }, signal: abort.signal })[Symbol.asyncIterator]();
      try {
        requests.push({ kind: hello });
        const welcome = await responses.next();
        expect(welcome.done ? undefined : welcome.value.kind.case).toBe("welcome");
        requests.push({ kind: message });
        let err: ConnectError | undefined;
        try {
          while (!(await responses.next()).done);
        } catch (e) {
          err = ConnectError.from(e);
        }
        expect(err?.code, `${field}: ${err?.rawMessage}`).toBe(Code.InvalidArgument);
        expect(err?.rawMessage, field).toBe(refusal(field));
      } finally {
        abort.abort();
      }
    }
  });
});
