// Free-form JSON in the binary codec (a daemon's stream over gRPC, Connect's binary protocol) is taken as
// deep as the same message's JSON form may nest (MAX_JSON_DEPTH, the message's own object counted), as on
// the JSON wires, and a message nested deeper is refused saying so. protobuf-es's binary reader, at its
// default recursion limit, refused a result nested some 50 levels deep.
import { describe, expect, it } from "vitest";
import * as grpc from "@grpc/grpc-js";
import { fromJson, type JsonValue, type MessageInitShape } from "@bufbuild/protobuf";
import { ValueSchema } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { DaemonService, type DaemonMessageSchema } from "../../gen/svc/v1/daemon_pb.js";
import { JobService } from "../../gen/svc/v1/jobs_pb.js";
import { MAX_JSON_DEPTH } from "../../src/shared/json-nesting.js";
import { AsyncQueue } from "../../src/daemon/async-queue.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { streamWithJob } from "../helpers/stream-job.js";
import { openStream, useStreamServer } from "./grpc-stream.js";
import { waitFor } from "./helpers.js";

const { srv, streams } = useStreamServer();
const api = client(srv);

/** `depth` arrays around a string (a scalar adds no level). */
const nest = (depth: number): JsonValue => {
  let v: JsonValue = "deep";
  for (let i = 0; i < depth; i++) v = [v];
  return v;
};
/** As a google.protobuf.Value (read with room to spare: the client side builds it). */
const value = (v: JsonValue) => fromJson(ValueSchema, v, { recursionLimit: 10_000 });
const refusal = (field?: string) =>
  `request body must not nest objects and arrays more than ${MAX_JSON_DEPTH} levels deep${field ? `; field '${field}' nests deeper` : ""}`;

const stored = async (jobId: string) => (await srv.sql<{ status: string; result: unknown; metrics: unknown }[]>`SELECT status, result, metrics FROM jobs WHERE job_id = ${jobId}`)[0];

describe("a daemon stream over gRPC (binary)", () => {
  // DaemonMessage {result: JobResultRequest {result: ...}}: the result's own arrays start at the third level.
  it(`takes a result and metrics nested as deep as their JSON form may (${MAX_JSON_DEPTH - 2} levels)`, async () => {
    for (const depth of [60, MAX_JSON_DEPTH - 2]) {
      const { s, jobId } = await streamWithJob(srv, streams);
      const metrics = { duration_seconds: 1, deep: nest(depth - 1) };
      s.send({ case: "result", value: { jobId, success: true, result: value(nest(depth)), metrics } });
      const ack = await s.next("resultAck");
      expect(ack.status, `${depth} levels`).toBe("completed");
      const row = await stored(jobId);
      expect(row.result).toEqual(nest(depth));
      expect(row.metrics).toMatchObject(metrics);
      s.end();
    }
  });

  it("ends the stream at a result one level deeper, or far deeper, saying why", async () => {
    for (const [depth, field] of [[MAX_JSON_DEPTH - 1, "result"], [400, "result"]] as const) {
      const { s, jobId } = await streamWithJob(srv, streams);
      s.send({ case: "result", value: { jobId, success: true, result: value(nest(depth)) } });
      const ended = await s.ended;
      expect(ended.code, `${depth} levels: ${ended.details}`).toBe(grpc.status.INVALID_ARGUMENT);
      expect(decodeURIComponent(ended.details!)).toBe(refusal(field));
      expect((await stored(jobId)).status).toBe("running");
    }
  });

  it("holds a heartbeat's telemetry to the same depth", async () => {
    const p = await makeProvider(srv);
    const s = openStream(srv.port, p.key);
    streams.push(s);
    s.send({ case: "hello", value: { daemonVersion: "5.0.0" } });
    await s.next("welcome");
    // DaemonMessage {heartbeat: {gpu_status: {...}}}: the telemetry's object is the third level.
    const telemetry = (depth: number) => value({ gpu_name: "x", deep: nest(depth) });
    s.send({ case: "heartbeat", value: { daemonVersion: "5.0.0", gpuStatus: telemetry(MAX_JSON_DEPTH - 3) } });
    expect((await s.next("heartbeatAck")).success).toBe(true);
    // Written with the next telemetry flush.
    const stored = await waitFor(async () => (await srv.sql<{ gpu_telemetry: unknown }[]>`SELECT gpu_telemetry FROM providers WHERE id = ${p.id}`)[0].gpu_telemetry, 10_000, "the telemetry written");
    expect(stored).toMatchObject({ gpu_name: "x", deep: nest(MAX_JSON_DEPTH - 3) });
    s.send({ case: "heartbeat", value: { daemonVersion: "5.0.0", gpuStatus: telemetry(MAX_JSON_DEPTH - 2) } });
    const ended = await s.ended;
    expect(ended.code).toBe(grpc.status.INVALID_ARGUMENT);
    expect(decodeURIComponent(ended.details!)).toBe(refusal("heartbeat"));
  });
});

describe("Connect's binary protocol", () => {
  it("takes a ReportResult whose result nests as deep as on REST (99 levels), and refuses one deeper naming it", async () => {
    const jobs = client(srv);
    const renter = await makeRenter(srv, 1_000);
    const p = await makeProvider(srv);
    const sub = await jobs.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 1, provider_id: p.id, params: { suite: "quick", iterations: 1 } }, renter.headers);
    expect(sub.status, sub.text).toBe(201);
    const jobId: string = sub.body.job.job_id;
    expect((await jobs.get(`/api/providers/${p.key}/jobs`)).body.job?.job_id).toBe(jobId);
    const rpc = createClient(JobService, createConnectTransport({ baseUrl: srv.url, httpVersion: "1.1", useBinaryFormat: true }));
    const headers = { "x-provider-key": p.key };
    const over = await rpc.reportResult({ jobId, success: true, result: value(nest(MAX_JSON_DEPTH)) }, { headers }).catch((e: unknown) => ConnectError.from(e));
    expect(over).toBeInstanceOf(ConnectError);
    expect((over as ConnectError).code).toBe(Code.InvalidArgument);
    expect((over as ConnectError).rawMessage).toBe(refusal("result"));
    const r = await rpc.reportResult({ jobId, success: true, result: value(nest(MAX_JSON_DEPTH - 1)) }, { headers });
    expect(r.status).toBe("completed");
    expect((await stored(jobId)).result).toEqual(nest(MAX_JSON_DEPTH - 1));
  });

  it("holds a daemon stream's messages to the same depth as gRPC does", async () => {
    const p = await makeProvider(srv);
    const renter = await makeRenter(srv, 1_000);
    const transport = createConnectTransport({ baseUrl: srv.url, httpVersion: "2", useBinaryFormat: true });
    const requests = new AsyncQueue<MessageInitShape<typeof DaemonMessageSchema>>();
    const abort = new AbortController();
    const responses = createClient(DaemonService, transport).connect(requests, { headers: { "x-provider-key": p.key }, signal: abort.signal })[Symbol.asyncIterator]();
    const nextOf = async (kind: string) => {
      for (;;) {
        const m = await responses.next();
        if (m.done) throw new Error("stream ended");
        if (m.value.kind.case === kind) return m.value.kind.value as { jobId?: string; status?: string };
      }
    };
    try {
      requests.push({ kind: { case: "hello", value: { daemonVersion: "5.0.0", gpus: [{ name: "NVIDIA GeForce RTX 4090", vram_mib: 24564 }] } } });
      await nextOf("welcome");
      const submitJob = async () => {
        const r = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 1, params: { suite: "quick", iterations: 1 }, provider_id: p.id }, renter.headers);
        expect(r.status, r.text).toBe(201);
        const jobId = (await nextOf("job")).jobId!;
        requests.push({ kind: { case: "jobAccepted", value: { jobId } } });
        return jobId;
      };
      const first = await submitJob();
      requests.push({ kind: { case: "result", value: { jobId: first, success: true, result: value(nest(MAX_JSON_DEPTH - 2)) } } });
      expect((await nextOf("resultAck")).status).toBe("completed");
      const second = await submitJob();
      requests.push({ kind: { case: "result", value: { jobId: second, success: true, result: value(nest(MAX_JSON_DEPTH - 1)) } } });
      const err = await nextOf("resultAck").then(
        () => undefined,
        (e: unknown) => ConnectError.from(e),
      );
      expect(err?.code).toBe(Code.InvalidArgument);
      expect(err?.rawMessage).toBe(refusal("result"));
      expect((await stored(second)).status).toBe("running");
    } finally {
      abort.abort();
    }
  });
});
