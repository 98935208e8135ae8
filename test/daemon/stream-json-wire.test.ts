// The daemon stream in the JSON codec (Connect's streaming protocol, and gRPC
// with the JSON codec), which Connect serves: a message nested deeper than
// requests may be is refused as it arrives, before it is parsed (millions of
// levels fit in a stream's 16 MiB message, and parsing them held the process
// for seconds), and the stream ends saying so. Once its answers ended, the
// client's half is closed too (RST_STREAM NO_ERROR, as on the gRPC path): a
// daemon stream has no deadline for its request, so a half left open held the
// stream, and its connection, for as long as the client liked.
import http2 from "node:http2";
import { describe, expect, it } from "vitest";
import { MAX_JSON_DEPTH } from "../../src/http/json-depth.js";
import { makeProvider } from "../helpers/fixtures.js";
import { useStreamServer } from "./grpc-stream.js";
import { waitFor } from "./helpers.js";

const { srv } = useStreamServer();

function envelope(body: string): Buffer {
  const payload = Buffer.from(body);
  const head = Buffer.alloc(5);
  head.writeUInt32BE(payload.length, 1);
  return Buffer.concat([head, payload]);
}

/** The JSON of each message of a framed body. */
function messages(chunks: Buffer[]): unknown[] {
  const body = Buffer.concat(chunks);
  const out: unknown[] = [];
  for (let at = 0; at + 5 <= body.length; at += 5 + body.readUInt32BE(at + 1)) out.push(JSON.parse(body.subarray(at + 5, at + 5 + body.readUInt32BE(at + 1)).toString("utf8")));
  return out;
}

/** A daemon stream over raw HTTP/2 in the given content type: what it received, and its trailers once it ended. */
function open(key: string, contentType: string) {
  const headers: http2.OutgoingHttpHeaders = { ":method": "POST", ":path": "/svc.v1.DaemonService/Connect", "content-type": contentType, te: "trailers" };
  if (key) headers["x-provider-key"] = key;
  const session = http2.connect(srv.url);
  session.on("error", () => {});
  const stream = session.request(headers);
  stream.on("error", () => {});
  const state = { received: "", chunks: [] as Buffer[], ended: false, closed: false, trailers: {} as http2.IncomingHttpHeaders };
  stream.on("close", () => (state.closed = true));
  stream.on("data", (chunk: Buffer) => {
    state.chunks.push(chunk);
    state.received += chunk.toString("utf8");
  });
  stream.on("trailers", (t) => (state.trailers = t));
  stream.on("end", () => (state.ended = true));
  return { stream, state, close: () => (stream.close(), session.close()) };
}

/** A result (a kind the stream takes 16 MiB of) whose value nests `levels` deep. */
const deepResult = (levels: number) => `{"result":{"jobId":"job-x","success":true,"result":${"[".repeat(levels)}${"]".repeat(levels)}}}`;
const refusal = `request body must not nest objects and arrays more than ${MAX_JSON_DEPTH} levels deep; field 'result' nests deeper`;

describe("a daemon stream in the JSON codec", () => {
  it("ends at a message nested deeper than the limit, refused before it is parsed, saying why", async () => {
    const p = await makeProvider(srv);
    const connect = open(p.key, "application/connect+json");
    try {
      connect.stream.write(envelope(JSON.stringify({ hello: { daemonVersion: "5.0.0" } })));
      await waitFor(async () => connect.state.received.includes('"welcome"'), 5_000, "welcome");
      connect.stream.write(envelope(deepResult(4_000_000)));
      await waitFor(async () => connect.state.ended, 10_000, "the stream's end");
      // Connect's end of stream, the last message: the refusal.
      expect(messages(connect.state.chunks).at(-1)).toMatchObject({ error: { code: "invalid_argument", message: refusal } });
    } finally {
      connect.close();
    }

    const grpc = open(p.key, "application/grpc+json");
    try {
      grpc.stream.write(envelope(JSON.stringify({ hello: { daemonVersion: "5.0.0" } })));
      await waitFor(async () => grpc.state.received.includes('"welcome"'), 5_000, "welcome");
      grpc.stream.write(envelope(deepResult(4_000_000)));
      await waitFor(async () => grpc.state.ended, 10_000, "the stream's end");
      expect(grpc.state.trailers["grpc-status"]).toBe("3");
      expect(decodeURIComponent(String(grpc.state.trailers["grpc-message"]))).toBe(refusal);
    } finally {
      grpc.close();
    }
  });

  it("closes the client's half once the answers ended, the status delivered first", async () => {
    const p = await makeProvider(srv);
    for (const type of ["application/connect+json", "application/grpc+json"]) {
      const s = open(p.key, type);
      try {
        // Refused at its first message (not a hello); the client never ends its half: the server does.
        s.stream.write(envelope(JSON.stringify({ heartbeat: {} })));
        await waitFor(async () => s.state.closed, 5_000, `${type}: the stream closed by the server`);
        expect(s.state.ended).toBe(true);
        const status =
          type === "application/grpc+json"
            ? { code: s.state.trailers["grpc-status"], message: decodeURIComponent(String(s.state.trailers["grpc-message"])) }
            : (messages(s.state.chunks).at(-1) as { error: { code: string; message: string } }).error;
        expect(status).toEqual({ code: type === "application/grpc+json" ? "3" : "invalid_argument", message: "the stream must open with a hello message" });
      } finally {
        s.close();
      }
    }
  });
});
