// Requests that never arrive in whole are not held for ever, nor left uncounted:
//  - HTTP/1.1: a request whose body stalls is answered 408 and its connection closed after
//    edgeTimeouts.requestMs (Node's requestTimeout); a request that arrived is answered however long
//    its answer takes.
//  - gRPC/Connect calls count against their per-IP row when their request starts, before their body
//    is read, and once: a unary call whose body stalls is counted, and one past the row is refused at
//    once (resource_exhausted, Retry-After) instead of once its body is in.
//  - HTTP/2: a stream whose request has not ended (no END_STREAM) after edgeTimeouts.requestMs is
//    answered (gRPC: DEADLINE_EXCEEDED; else 408) and reset, so its connection can go idle and close;
//    a stream whose request arrived (a watch, a slow answer) stays, and a daemon's bidirectional
//    stream keeps its own hello deadline (streamTimeouts.helloMs) and is not cut after its hello.
// The limits are shortened here (the same module instances the in-process servers read).
import http2 from "node:http2";
import net from "node:net";
import * as grpc from "@grpc/grpc-js";
import { create, toBinary, type DescMessage, type MessageInitShape } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { DaemonMessageSchema, DaemonService } from "../../gen/svc/v1/daemon_pb.js";
import { JobService, WatchJobRequestSchema } from "../../gen/svc/v1/jobs_pb.js";
import { ProviderService } from "../../gen/svc/v1/providers_pb.js";
import { edgeTimeouts } from "../../src/http/edge.js";
import { streamTimeouts } from "../../src/services/daemon.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { client, uniqueEmail } from "../helpers/http.js";
import { useTestServer, type TestServer } from "../helpers/server.js";

const ROW = 5;
const LOGIN = `/${ProviderService.typeName}/${ProviderService.method.loginEmail.name}`;
const WATCH = `/${JobService.typeName}/${JobService.method.watchJob.name}`;
const DAEMON = `/${DaemonService.typeName}/${DaemonService.method.connect.name}`;

const sockets: net.Socket[] = [];
const sessions: http2.ClientHttp2Session[] = [];
afterAll(() => {
  for (const s of sockets) s.destroy();
  for (const s of sessions) s.destroy();
});

let ipCounter = 0;
/** A fresh client address (the limited server trusts X-Forwarded-For). */
const freshIp = () => `10.${(process.pid >> 8) & 255}.${process.pid & 255}.${++ipCounter}`;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function envelope<S extends DescMessage>(schema: S, m: MessageInitShape<S>): Buffer {
  const body = toBinary(schema, create(schema, m));
  const f = Buffer.alloc(5 + body.length);
  f.writeUInt32BE(body.length, 1);
  f.set(body, 5);
  return f;
}

interface RawAnswer {
  /** The status line, once one came. */
  status(): string;
  text(): string;
  closed: Promise<void>;
  isClosed(): boolean;
}

/** An HTTP/1.1 POST that announces 1000 bytes of body and sends its first 4 only. */
function stalledH1(srv: TestServer, path: string, headers: Record<string, string> = {}): RawAnswer {
  const sock = net.connect(srv.port, "127.0.0.1");
  sockets.push(sock);
  let text = "";
  let closedNow = false;
  sock.on("data", (d) => (text += d.toString()));
  sock.on("error", () => {});
  const closed = new Promise<void>((r) =>
    sock.once("close", () => {
      closedNow = true;
      r();
    }),
  );
  const extra = Object.entries(headers).map(([k, v]) => `${k}: ${v}\r\n`).join("");
  sock.once("connect", () =>
    sock.write(`POST ${path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n${extra}\r\n{"em`),
  );
  return { status: () => text.split("\r\n")[0] ?? "", text: () => text, closed, isClosed: () => closedNow };
}

function h2session(srv: TestServer): http2.ClientHttp2Session {
  const s = http2.connect(`http://127.0.0.1:${srv.port}`);
  sessions.push(s);
  s.on("error", () => {});
  return s;
}

interface H2Answer {
  stream: http2.ClientHttp2Stream;
  headers(): http2.IncomingHttpHeaders | undefined;
  trailers(): http2.IncomingHttpHeaders | undefined;
  body(): string;
  closed: Promise<void>;
}

function h2request(session: http2.ClientHttp2Session, headers: http2.OutgoingHttpHeaders): H2Answer {
  const stream = session.request({ ":method": "POST", ...headers }, { endStream: false });
  let h: http2.IncomingHttpHeaders | undefined;
  let t: http2.IncomingHttpHeaders | undefined;
  let body = "";
  stream.on("error", () => {});
  stream.on("response", (x) => (h = x));
  stream.on("trailers", (x) => (t = x));
  stream.on("data", (d) => (body += d.toString()));
  const closed = new Promise<void>((r) => stream.once("close", () => r()));
  return { stream, headers: () => h, trailers: () => t, body: () => body, closed };
}

const grpcStatusOf = (a: H2Answer) => String(a.trailers()?.["grpc-status"] ?? a.headers()?.["grpc-status"]);

async function within<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error(`${what}: not within ${ms} ms`)), ms)));
  try {
    return await Promise.race([p, late]);
  } finally {
    clearTimeout(timer);
  }
}

// The edge's and the stream's timeouts as this file found them: each describe sets its own and puts
// them back (a worker runs other files after this one, in the same process).
const found = { ...edgeTimeouts, helloMs: streamTimeouts.helloMs };
const putBack = () => {
  Object.assign(edgeTimeouts, { requestMs: found.requestMs, h2IdleMs: found.h2IdleMs });
  streamTimeouts.helloMs = found.helloMs;
};

describe("gRPC/Connect calls count on their IP row as their request starts", () => {
  // Long enough that the held calls are still waiting when the test ends, on a loaded machine too.
  beforeAll(() => {
    edgeTimeouts.requestMs = 20_000;
  });
  afterAll(putBack);
  const srv = useTestServer({ SVC_RATE_LIMITS: "on", SVC_TRUST_PROXY: "on", SVC_RATE_LIMIT_OVERRIDES: `default=${ROW}/60` });

  it("counts a Connect unary call whose body stalls, and refuses the one past the row at once, its body unread", async () => {
    const ip = freshIp();
    const held = Array.from({ length: ROW }, () => stalledH1(srv, LOGIN, { "x-forwarded-for": ip }));
    await sleep(500);
    const started = Date.now();
    const past = stalledH1(srv, LOGIN, { "x-forwarded-for": ip });
    await within(
      (async () => {
        while (!past.text().includes("\r\n\r\n{")) await sleep(20);
      })(),
      8000,
      "the refusal",
    );
    expect(Date.now() - started).toBeLessThan(edgeTimeouts.requestMs / 2);
    expect(past.status()).toBe("HTTP/1.1 429 Too Many Requests");
    expect(past.text()).toMatch(/\r\nretry-after: \d+\r\n/i);
    expect(past.text()).toMatch(/\r\nx-request-id: /i);
    expect(JSON.parse(past.text().slice(past.text().indexOf("\r\n\r\n") + 4))).toMatchObject({ code: "resource_exhausted" });
    // Its body unread, its connection is closed at once rather than held to the request limit.
    expect(past.text()).toMatch(/\r\nconnection: close\r\n/i);
    await within(past.closed, 8000, "the refused call's connection closed");
    // The first ROW were counted, not refused: still waiting for their bodies.
    for (const h of held) expect(h.status()).toBe("");
  });

  it("counts each call once, on every wire and path", async () => {
    const withIp = (ip: string) => [(next: any) => (req: any) => (req.header.set("x-forwarded-for", ip), next(req))];
    const wires = {
      "connect, HTTP/1.1": (ip: string) => createConnectTransport({ baseUrl: srv.url, httpVersion: "1.1", interceptors: withIp(ip) }),
      "gRPC, HTTP/2": (ip: string) => createGrpcTransport({ baseUrl: srv.url, interceptors: withIp(ip) }),
    };
    for (const [wire, transport] of Object.entries(wires)) {
      // Unary (Connect's adapter) and server streaming (Connect's, or http/grpc-streams.ts for gRPC).
      const calls = {
        unary: (c: ReturnType<typeof createClient<typeof ProviderService>>) => c.loginEmail({ email: uniqueEmail("once") }),
        stream: async (_: unknown, jobs: ReturnType<typeof createClient<typeof JobService>>) => {
          for await (const _e of jobs.watchJob({ jobId: "job-none" })) break;
        },
      };
      for (const [kind, call] of Object.entries(calls)) {
        const t = transport(freshIp());
        const providers = createClient(ProviderService, t);
        const jobs = createClient(JobService, t);
        const codes: string[] = [];
        for (let i = 0; i <= ROW; i++) {
          try {
            await call(providers, jobs);
            codes.push("OK");
          } catch (err) {
            codes.push(Code[ConnectError.from(err).code]!);
          }
        }
        expect(codes.slice(0, -1), `${wire} ${kind}: ${codes}`).not.toContain("ResourceExhausted");
        expect(codes.at(-1), `${wire} ${kind}: ${codes}`).toBe("ResourceExhausted");
      }
    }
  });
});

describe("requests that do not arrive in whole within edgeTimeouts.requestMs", () => {
  beforeAll(() => {
    edgeTimeouts.requestMs = 1000;
    edgeTimeouts.h2IdleMs = 1500;
    streamTimeouts.helloMs = 1000;
  });
  afterAll(putBack);
  const srv = useTestServer();

  it("HTTP/1.1: a stalled body or stalled headers are answered 408 and the connection closed, on REST and Connect alike", async () => {
    const rest = stalledH1(srv, "/api/providers/login-email");
    const connect = stalledH1(srv, LOGIN);
    // Headers that never end (after the first bytes, which tell the protocol).
    const headers = net.connect(srv.port, "127.0.0.1", () => headers.write("POST /api/providers/login-email HTTP/1.1\r\nHost: x\r\n"));
    sockets.push(headers);
    let headersAnswer = "";
    headers.on("data", (d) => (headersAnswer += d.toString()));
    headers.on("error", () => {});
    const headersClosed = new Promise((r) => headers.once("close", r));
    await within(Promise.all([rest.closed, connect.closed, headersClosed]), 3 * edgeTimeouts.requestMs, "closing the stalled requests");
    expect(rest.status()).toBe("HTTP/1.1 408 Request Timeout");
    expect(connect.status()).toBe("HTTP/1.1 408 Request Timeout");
    expect(headersAnswer.split("\r\n")[0]).toBe("HTTP/1.1 408 Request Timeout");
  });

  it("HTTP/1.0 without Host on a Connect path is answered 400 (Connect cannot make its URL; it threw out of the handler, ending the process)", async () => {
    const s = net.connect(srv.port, "127.0.0.1");
    sockets.push(s);
    let text = "";
    s.on("data", (d) => (text += d.toString()));
    s.on("error", () => {});
    s.once("connect", () => s.write(`POST ${LOGIN} HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}`));
    await within(new Promise((r) => s.once("close", r)), 5000, "the answer");
    expect(text.split("\r\n")[0]).toBe("HTTP/1.1 400 Bad Request");
    expect((await client(srv).get("/healthz")).status).toBe(200);
  });

  it("HTTP/2: a stalled WatchJob (no message, no END_STREAM) ends with DEADLINE_EXCEEDED, and its idle connection then closes", async () => {
    const session = h2session(srv);
    const watch = h2request(session, { ":path": WATCH, "content-type": "application/grpc", te: "trailers" });
    await within(watch.closed, 3 * edgeTimeouts.requestMs, "ending the stalled watch");
    expect(grpcStatusOf(watch)).toBe(String(grpc.status.DEADLINE_EXCEEDED));
    expect(decodeURIComponent(String(watch.headers()?.["grpc-message"]))).toMatch(/did not arrive in whole within 1 s/);
    await within(new Promise((r) => session.once("close", r)), 3 * edgeTimeouts.h2IdleMs, "closing the idle connection");
  });

  it("HTTP/2: stalled Connect and REST requests are answered 408; many stalled watches are all ended", async () => {
    const session = h2session(srv);
    const connect = h2request(session, { ":path": LOGIN, "content-type": "application/json" });
    connect.stream.write('{"em');
    const rest = h2request(session, { ":path": "/api/providers/login-email", "content-type": "application/json" });
    rest.stream.write('{"em');
    const watches = Array.from({ length: 280 }, () => h2request(session, { ":path": WATCH, "content-type": "application/grpc", te: "trailers" }));
    await within(Promise.all([connect.closed, rest.closed, ...watches.map((w) => w.closed)]), 4 * edgeTimeouts.requestMs, "ending the stalled streams");
    for (const a of [connect, rest]) {
      expect(a.headers()?.[":status"]).toBe(408);
      expect(JSON.parse(a.body()).error).toMatch(/within 1 s/);
    }
    expect(watches.filter((w) => grpcStatusOf(w) !== String(grpc.status.DEADLINE_EXCEEDED))).toHaveLength(0);
  });

  it("keeps what arrived: a watch, a daemon stream past its hello, slow answers on both wires", async () => {
    const renter = await makeRenter(srv, 10_000);
    const provider = await makeProvider(srv);
    const submit = () => client(srv).post("/api/jobs/submit", { job_type: "benchmark" }, renter.headers);
    const watched = (await submit()).body.job.job_id as string;

    // A watch whose request arrived: open for as long as the job goes on.
    const session = h2session(srv);
    const watch = h2request(session, { ":path": WATCH, "content-type": "application/grpc", te: "trailers", ...renter.headers });
    watch.stream.end(envelope(WatchJobRequestSchema, { jobId: watched }));

    // A daemon's stream that said hello and beats: not held to requestMs; a silent one still ends at its hello deadline.
    const daemon = h2request(h2session(srv), { ":path": DAEMON, "content-type": "application/grpc", te: "trailers", "x-provider-key": provider.key });
    daemon.stream.write(envelope(DaemonMessageSchema, { kind: { case: "hello", value: { daemonVersion: "5.0.0" } } }));
    const beat = setInterval(
      () => daemon.stream.write(envelope(DaemonMessageSchema, { kind: { case: "heartbeat", value: { daemonVersion: "5.0.0", uptime: 1 } } })),
      400,
    );
    const mute = await makeProvider(srv);
    const silent = h2request(h2session(srv), { ":path": DAEMON, "content-type": "application/grpc", te: "trailers", "x-provider-key": mute.key });

    // Cancels that wait on a job row held for 2.5 requestMs: their requests arrived, their answers are slow.
    const slow = [(await submit()).body.job.job_id as string, (await submit()).body.job.job_id as string];
    const held = srv.sql.begin(async (tx) => {
      await tx`SELECT id FROM jobs WHERE job_id = ANY(${slow}) FOR UPDATE`;
      await sleep(2.5 * edgeTimeouts.requestMs);
    });
    await sleep(100);
    const overH1 = client(srv).post(`/api/jobs/${slow[0]}/cancel`, {}, renter.headers);
    const overH2 = h2request(h2session(srv), { ":path": `/api/jobs/${slow[1]}/cancel`, "content-type": "application/json", ...renter.headers });
    overH2.stream.end("{}");
    try {
      await silent.closed;
      expect(grpcStatusOf(silent)).toBe(String(grpc.status.DEADLINE_EXCEEDED));
      expect(decodeURIComponent(String(silent.trailers()?.["grpc-message"]))).toMatch(/hello message within 1 s/);

      await held;
      const h1 = await overH1;
      expect(h1.status, h1.text).toBe(200);
      expect(h1.body.job.status).toBe("cancelled");
      await within(overH2.closed, 2000, "the slow h2 answer");
      expect(overH2.headers()?.[":status"]).toBe(200);
      expect(JSON.parse(overH2.body()).job.status).toBe("cancelled");

      await sleep(2 * edgeTimeouts.requestMs);
      expect(watch.stream.closed, `watch ended: ${JSON.stringify(watch.trailers())}`).toBe(false);
      expect(watch.body().length).toBeGreaterThan(0); // its snapshot came
      expect(daemon.stream.closed, `daemon stream ended: ${JSON.stringify(daemon.trailers())}`).toBe(false);
    } finally {
      clearInterval(beat);
      daemon.stream.close();
      watch.stream.close();
    }
  });
});
