// The lists of a request are counted before it is read (src/shared/list-bounds.ts): protobuf-es makes an
// object per item, and an item can be two bytes, so a daemon stream's message of millions of empty log lines
// (10 MB) took about a gigabyte of heap and seconds of the event loop to read before the 1,000 lines a logs
// message may hold were counted. A request with a list past its bound is refused (invalid_argument, naming
// the field; a stream ends) on every wire: gRPC, Connect's protocols in either codec (compressed too), REST.
// The documented maxima are taken.
import fs from "node:fs";
import http2 from "node:http2";
import zlib from "node:zlib";
import * as grpc from "@grpc/grpc-js";
import { fromJson } from "@bufbuild/protobuf";
import { ValueSchema } from "@bufbuild/protobuf/wkt";
import { describe, expect, it } from "vitest";
import { HelloSchema } from "../../gen/svc/v1/daemon_pb.js";
import { AppendJobLogsRequestSchema } from "../../gen/svc/v1/jobs_pb.js";
import { HeartbeatRequestSchema } from "../../gen/svc/v1/providers_pb.js";
import { MAX_LOG_LINE_CHARS, MAX_LOG_LINES_PER_CALL } from "../../src/domain/jobs/job-reports.js";
import { HELLO_MAX_JOB_IDS } from "../../src/services/daemon.js";
import { listBoundOf, MAX_LIST_ITEMS } from "../../src/shared/list-bounds.js";
import { client } from "../helpers/http.js";
import { makeProvider } from "../helpers/fixtures.js";
import { streamWithJob } from "../helpers/stream-job.js";
import { openStream, useStreamServer, type TestStream } from "./grpc-stream.js";
import { waitFor } from "./helpers.js";

const { srv, streams } = useStreamServer();
const api = client(srv);

const LOGS_REFUSAL = `logs.logs must hold at most ${MAX_LOG_LINES_PER_CALL} items`;

function varint(n: number): Buffer {
  const out: number[] = [];
  for (; n > 127; n = Math.floor(n / 128)) out.push((n & 127) | 128);
  out.push(n);
  return Buffer.from(out);
}
const part = (tag: number, body: Buffer) => Buffer.concat([Buffer.from([tag]), varint(body.length), body]);

/** AppendJobLogsRequest {job_id, logs: n empty google.protobuf.Values}: two bytes a line. */
function emptyLinesRequest(jobId: string, n: number): Buffer {
  const lines = Buffer.alloc(2 * n);
  for (let i = 0; i < lines.length; i += 2) lines[i] = 0x12;
  return Buffer.concat([part(0x0a, Buffer.from(jobId)), lines]);
}
/** DaemonMessage {logs: emptyLinesRequest}. */
const emptyLines = (jobId: string, n: number) => part(0x2a, emptyLinesRequest(jobId, n));

const statusKb = (key: string) => Number(new RegExp(`^${key}:\\s+(\\d+)`, "m").exec(fs.readFileSync("/proc/self/status", "utf8"))![1]);
/** This process's (the server's) peak resident memory from now on: the MiB it grew by, when called. */
function peakGrowth(): () => number {
  fs.writeFileSync("/proc/self/clear_refs", "5"); // the peak starts again from what is resident now
  const base = statusKb("VmRSS");
  return () => (statusKb("VmHWM") - base) / 1024;
}

const storedLines = async (jobId: string) =>
  (await srv.sql<{ n: number }[]>`SELECT count(*)::int AS n FROM job_logs l JOIN jobs j ON j.id = l.job_id WHERE j.job_id = ${jobId}`)[0]!.n;

/** How a stream answered a message it could not take: its end, or a StreamError (it stayed open). */
const answerOf = (s: TestStream) =>
  Promise.race([
    s.ended,
    s.next("error", 25_000).then(
      (e) => ({ streamError: e.message }),
      () => new Promise<never>(() => {}),
    ),
  ]);

describe("the bounds", () => {
  it("are the documented ones", () => {
    expect(listBoundOf(AppendJobLogsRequestSchema.field.logs)).toBe(MAX_LOG_LINES_PER_CALL);
    expect(listBoundOf(HelloSchema.field.runningJobIds)).toBe(HELLO_MAX_JOB_IDS);
    expect(listBoundOf(HelloSchema.field.runningJobAttempts)).toBe(MAX_LIST_ITEMS);
    expect(listBoundOf(HeartbeatRequestSchema.field.cachedModels)).toBe(MAX_LIST_ITEMS);
  });
});

describe("a daemon stream over gRPC", () => {
  it("ends at a logs message of five million empty lines, refused before it is read", async () => {
    const { s, jobId } = await streamWithJob(srv, streams);
    const grown = peakGrowth();
    s.sendBytes(emptyLines(jobId, 5_000_000));
    const answer = await answerOf(s);
    // Reading it took about a gigabyte; the message itself is 10 MB.
    expect(grown()).toBeLessThan(300);
    expect(answer).toEqual({ code: grpc.status.INVALID_ARGUMENT, details: LOGS_REFUSAL });
    expect(await storedLines(jobId)).toBe(0);
  });

  it("takes 1,000 lines of the longest a line may be", async () => {
    const { s, jobId } = await streamWithJob(srv, streams);
    const line = fromJson(ValueSchema, "x".repeat(MAX_LOG_LINE_CHARS));
    s.send({ case: "logs", value: { jobId, logs: Array.from({ length: MAX_LOG_LINES_PER_CALL }, () => line) } });
    // Reports are handled in order: the logs before this beat.
    s.send({ case: "heartbeat", value: { daemonVersion: "5.0.0" } });
    await s.next("heartbeatAck");
    expect(s.received.filter((m) => m.kind.case === "error")).toEqual([]);
    expect(await storedLines(jobId)).toBeGreaterThan(0);
  });

  it("ends at a hello whose map holds more entries than its bound, and takes one at the bounds", async () => {
    const p = await makeProvider(srv);
    const ids = Array.from({ length: MAX_LIST_ITEMS + 1 }, (_, i) => `job-${i}`);
    const s = openStream(srv.port, p.key);
    streams.push(s);
    s.send({ case: "hello", value: { daemonVersion: "5.0.0", runningJobAttempts: Object.fromEntries(ids.map((id) => [id, 1])) } });
    const answer = await Promise.race([s.ended, s.next("welcome").then(() => "welcomed", () => new Promise<never>(() => {}))]);
    expect(answer).toEqual({ code: grpc.status.INVALID_ARGUMENT, details: `hello.running_job_attempts must hold at most ${MAX_LIST_ITEMS} items` });
    expect(s.received).toEqual([]);

    const held = ids.slice(1);
    const ok = openStream(srv.port, p.key);
    streams.push(ok);
    ok.send({ case: "hello", value: { daemonVersion: "5.0.0", runningJobIds: held, runningJobAttempts: Object.fromEntries(held.map((id) => [id, 1])) } });
    await ok.next("welcome");
  });

  it("ends at a heartbeat (read by hand) naming more cached models than its bound", async () => {
    const p = await makeProvider(srv);
    const s = openStream(srv.port, p.key);
    streams.push(s);
    s.send({ case: "hello", value: { daemonVersion: "5.0.0" } });
    await s.next("welcome");
    const models = Array.from({ length: MAX_LIST_ITEMS }, (_, i) => `model-${i}`);
    s.send({ case: "heartbeat", value: { daemonVersion: "5.0.0", cachedModels: models } });
    await s.next("heartbeatAck");
    s.send({ case: "heartbeat", value: { daemonVersion: "5.0.0", cachedModels: [...models, "one-more"] } });
    const answer = Promise.race([answerOf(s), s.next("heartbeatAck").then(() => "acked", () => new Promise<never>(() => {}))]);
    expect(await answer).toEqual({ code: grpc.status.INVALID_ARGUMENT, details: `heartbeat.cached_models must hold at most ${MAX_LIST_ITEMS} items` });
  });
});

/** A message in an envelope (flags 1: compressed). */
function envelope(payload: Buffer, flags = 0): Buffer {
  const head = Buffer.alloc(5);
  head[0] = flags;
  head.writeUInt32BE(payload.length, 1);
  return Buffer.concat([head, payload]);
}

/** The payloads of a framed body's messages, with their flags. */
function frames(body: Buffer): { flags: number; payload: Buffer }[] {
  const out: { flags: number; payload: Buffer }[] = [];
  for (let at = 0; at + 5 <= body.length; at += 5 + body.readUInt32BE(at + 1)) out.push({ flags: body[at]!, payload: body.subarray(at + 5, at + 5 + body.readUInt32BE(at + 1)) });
  return out;
}

/** A daemon stream in Connect's streaming protocol over raw HTTP/2: what it received. */
function connectStream(key: string, headers: http2.OutgoingHttpHeaders) {
  const session = http2.connect(srv.url);
  session.on("error", () => {});
  const stream = session.request({ ":method": "POST", ":path": "/svc.v1.DaemonService/Connect", "x-provider-key": key, ...headers });
  stream.on("error", () => {});
  const state = { chunks: [] as Buffer[], ended: false };
  stream.on("data", (c: Buffer) => state.chunks.push(c));
  stream.on("end", () => (state.ended = true));
  /** Its end of stream's error, or the StreamError it answered instead. */
  const outcome = () =>
    waitFor(() => {
      for (const f of frames(Buffer.concat(state.chunks))) {
        const json = f.flags & 0x02 || headers["content-type"] === "application/connect+json" ? JSON.parse(f.payload.toString("utf8")) : undefined;
        if (f.flags & 0x02) return { end: json.error };
        if (json?.error) return { streamError: json.error.message };
        // A binary StreamError: ServerMessage.error (7).
        if (!json && f.payload[0] === 0x3a) return { streamError: "a StreamError" };
      }
      return state.ended ? { ended: "without an error" } : undefined;
    }, 25_000, "the stream's answer");
  return { stream, state, outcome, close: () => (stream.close(), session.close()) };
}

describe("a daemon stream in Connect's streaming protocol", () => {
  it("ends at such a logs message, binary, compressed or not, or JSON, refused before it is read", async () => {
    const p = await makeProvider(srv);
    const hello = (json: boolean) => (json ? Buffer.from(JSON.stringify({ hello: { daemonVersion: "5.0.0" } })) : Buffer.from([0x0a, 0x07, 0x0a, 0x05, ...Buffer.from("5.0.0")]));
    const binary = emptyLines("job-1", 5_000_000);
    const json = Buffer.from(`{"logs":{"jobId":"job-1","logs":[${"0,".repeat(5_000_000)}0]}}`);
    for (const [what, headers, message] of [
      ["binary", { "content-type": "application/connect+proto" }, envelope(binary)],
      ["binary, gzip", { "content-type": "application/connect+proto", "connect-content-encoding": "gzip" }, envelope(zlib.gzipSync(binary), 1)],
      ["JSON", { "content-type": "application/connect+json" }, envelope(json)],
    ] as const) {
      const s = connectStream(p.key, headers);
      try {
        const isJson = headers["content-type"].endsWith("json");
        s.stream.write(envelope(hello(isJson)));
        const grown = peakGrowth();
        s.stream.write(message);
        const outcome = await s.outcome();
        expect(grown(), what).toBeLessThan(300);
        expect(outcome, what).toEqual({ end: { code: "invalid_argument", message: LOGS_REFUSAL } });
      } finally {
        s.close();
      }
    }
  });
});

describe("AppendLogs, unary", () => {
  const refusal = `logs must hold at most ${MAX_LOG_LINES_PER_CALL} items`;
  const send = (path: string, headers: Record<string, string>, body: Buffer | string) => fetch(srv.url + path, { method: "POST", headers, body: typeof body === "string" ? body : new Uint8Array(body) });

  it("over Connect, binary (compressed or not) or JSON, refuses more lines than a call may hold before reading them", async () => {
    const p = await makeProvider(srv);
    // 1 MiB, the route's limit: half a million empty lines.
    const binary = emptyLinesRequest("job-1", (1024 * 1024 - 16) / 2);
    const lines = JSON.stringify(Array.from({ length: MAX_LOG_LINES_PER_CALL + 1 }, () => "a"));
    for (const [what, headers, body] of [
      ["binary", { "content-type": "application/proto" }, binary],
      ["binary, gzip", { "content-type": "application/proto", "content-encoding": "gzip" }, zlib.gzipSync(binary)],
      ["JSON", { "content-type": "application/json" }, `{"jobId":"job-1","logs":${lines}}`],
      ["JSON, its member's name escaped", { "content-type": "application/json" }, `{"jobId":"job-1","\\u006cogs":${lines}}`],
    ] as const) {
      const r = await send("/svc.v1.JobService/AppendLogs", { "connect-protocol-version": "1", "x-provider-key": p.key, ...headers }, body);
      expect(r.status, what).toBe(400);
      expect(await r.json(), what).toMatchObject({ code: "invalid_argument", message: refusal });
    }
  });

  it("on REST, the same", async () => {
    const p = await makeProvider(srv);
    const r = await api.post("/api/jobs/job-1/logs", { logs: Array.from({ length: MAX_LOG_LINES_PER_CALL + 1 }, () => "a") }, { "x-provider-key": p.key });
    expect(r.status, r.text).toBe(400);
    expect(r.body).toEqual({ error: refusal });
  });
});
