// Connections and streams that say nothing are not kept: an HTTP/2 connection
// with no stream open and no frame either way for edgeTimeouts.h2IdleMs is
// closed (as an idle HTTP/1.1 keep-alive one is), while one whose stream keeps
// beating, or whose request is still being answered, stays; a
// daemon stream that never sends its hello ends after streamTimeouts.helloMs
// with DEADLINE_EXCEEDED, and holds no stream slot afterwards. Both limits are
// shortened here (the same module instances the in-process server reads).
import http2 from "node:http2";
import net from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import * as grpc from "@grpc/grpc-js";
import { create, toBinary, type MessageInitShape } from "@bufbuild/protobuf";
import { DaemonMessageSchema, DaemonService } from "../../gen/svc/v1/daemon_pb.js";
import { edgeTimeouts } from "../../src/http/edge.js";
import { streamTimeouts } from "../../src/services/daemon.js";
import { openStreamCount } from "../../src/domain/accounts/open-streams.js";
import { useTestServer } from "../helpers/server.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { client } from "../helpers/http.js";
import { waitFor } from "./helpers.js";

// Short timeouts for this file, put back after it: a worker runs other files after this one, in the same process.
const found = { h2IdleMs: edgeTimeouts.h2IdleMs, helloMs: streamTimeouts.helloMs };
beforeAll(() => {
  edgeTimeouts.h2IdleMs = 1500;
  streamTimeouts.helloMs = 1000;
});
const srv = useTestServer();
const sessions: http2.ClientHttp2Session[] = [];
afterAll(() => {
  for (const s of sessions) s.destroy();
  edgeTimeouts.h2IdleMs = found.h2IdleMs;
  streamTimeouts.helloMs = found.helloMs;
});

const PATH = `/${DaemonService.typeName}/${DaemonService.method.connect.name}`;
const encoded = (m: MessageInitShape<typeof DaemonMessageSchema>) => {
  const body = toBinary(DaemonMessageSchema, create(DaemonMessageSchema, m));
  const f = Buffer.alloc(5 + body.length);
  f.writeUInt32BE(body.length, 1);
  f.set(body, 5);
  return f;
};

function daemonStream(key: string) {
  const session = http2.connect(`http://127.0.0.1:${srv.port}`);
  sessions.push(session);
  const stream = session.request({ ":method": "POST", ":path": PATH, "content-type": "application/grpc", te: "trailers", "x-provider-key": key });
  stream.on("data", () => {});
  stream.on("error", () => {});
  let trailers: http2.IncomingHttpHeaders | undefined;
  stream.once("trailers", (t) => (trailers = t));
  const closed = new Promise<void>((r) => stream.once("close", () => r()));
  return { session, stream, closed, trailers: () => trailers };
}

describe("idle connections and streams", () => {
  it("closes an HTTP/2 connection that sends nothing after its preface", async () => {
    const sock = net.connect(srv.port, "127.0.0.1");
    await new Promise((r) => sock.once("connect", r));
    sock.on("data", () => {});
    sock.on("error", () => {});
    let closed = false;
    sock.once("close", () => (closed = true));
    // The preface and an empty SETTINGS frame, then nothing.
    sock.write(Buffer.concat([Buffer.from("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), Buffer.from([0, 0, 0, 4, 0, 0, 0, 0, 0])]));
    await waitFor(() => closed, 15_000, "the idle connection to be closed");
  });

  it("keeps a connection whose daemon stream beats, and ends a stream that never sends its hello", async () => {
    const live = await makeProvider(srv);
    const beating = daemonStream(live.key);
    beating.stream.write(encoded({ kind: { case: "hello", value: { daemonVersion: "5.0.0" } } }));
    const beat = setInterval(() => beating.stream.write(encoded({ kind: { case: "heartbeat", value: { daemonVersion: "5.0.0", uptime: 1 } } })), 400);

    const mute = await makeProvider(srv);
    const silent = daemonStream(mute.key);
    try {
      await silent.closed;
      expect(silent.trailers()?.["grpc-status"]).toBe(String(grpc.status.DEADLINE_EXCEEDED));
      expect(decodeURIComponent(String(silent.trailers()?.["grpc-message"]))).toMatch(/hello message within 1 s/);
      // Three idle limits later the beating stream is still open, and the silent one holds no slot.
      await new Promise((r) => setTimeout(r, 3 * edgeTimeouts.h2IdleMs));
      expect(beating.session.closed || beating.session.destroyed).toBe(false);
      expect(beating.stream.closed).toBe(false);
      expect(openStreamCount(srv.app.sql)).toBe(1);
    } finally {
      clearInterval(beat);
      beating.stream.close();
    }
  });

  it("answers an HTTP/2 request that takes longer than the idle limit: a quiet connection with a stream open is not closed", async () => {
    const renter = await makeRenter(srv, 10_000);
    await makeProvider(srv);
    const job = (await client(srv).post("/api/jobs/submit", { job_type: "benchmark" }, renter.headers)).body.job.job_id as string;
    // The job's row held for twice the idle limit: the cancel below waits on it, sending nothing meanwhile.
    const held = srv.sql.begin(async (tx) => {
      await tx`SELECT id FROM jobs WHERE job_id = ${job} FOR UPDATE`;
      await new Promise((r) => setTimeout(r, 2 * edgeTimeouts.h2IdleMs));
    });
    await new Promise((r) => setTimeout(r, 100));
    const session = http2.connect(`http://127.0.0.1:${srv.port}`);
    sessions.push(session);
    session.on("error", () => {});
    const answer = await new Promise<{ status?: number; body: string; closedEarly?: boolean }>((resolve) => {
      const req = session.request({ ":method": "POST", ":path": `/api/jobs/${job}/cancel`, "content-type": "application/json", ...renter.headers });
      let status: number | undefined;
      let body = "";
      req.on("response", (h) => (status = Number(h[":status"])));
      req.on("data", (d) => (body += d));
      req.on("end", () => resolve({ status, body }));
      req.on("error", () => resolve({ status, body, closedEarly: true }));
      req.on("close", () => resolve({ status, body, closedEarly: status === undefined }));
      req.end("{}");
    });
    await held;
    expect(answer).toMatchObject({ status: 200 });
    expect(JSON.parse(answer.body).job.status).toBe("cancelled");
  });
});
