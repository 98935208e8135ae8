// A unary call in the binary codec whose free-form JSON (a result, its metrics, a job's params, a log line)
// nests past what protobuf-es reads is refused as its JSON form is, naming the top-level field, whatever
// the depth: Connect reads a unary message before any interceptor, and had answered protobuf-es's own
// "parse binary: ... maximum recursion depth of 202 reached", naming nothing.
import zlib from "node:zlib";
import { describe, expect, it } from "vitest";
import { create, fromJson, toBinary, type JsonValue } from "@bufbuild/protobuf";
import { ValueSchema } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import { AppendJobLogsRequestSchema, JobService } from "../../gen/svc/v1/jobs_pb.js";
import { MAX_JSON_DEPTH } from "../../src/shared/json-nesting.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { useTestServer } from "../helpers/server.js";
import { pickUp } from "../jobs/helpers.js";

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000" });
const api = client(srv);

/** `depth` arrays around a string, as JSON (a scalar adds no level), and as the google.protobuf.Value a client sends. */
const nest = (depth: number) => JSON.parse(`${"[".repeat(depth)}"deep"${"]".repeat(depth)}`) as JsonValue;
const deepValue = (depth: number) => fromJson(ValueSchema, nest(depth), { recursionLimit: 10_000 });
const refusal = (field: string) => `request body must not nest objects and arrays more than ${MAX_JSON_DEPTH} levels deep; field '${field}' nests deeper`;
const failure = (p: Promise<unknown>) =>
  p.then(
    () => undefined,
    (e: unknown) => ConnectError.from(e),
  );

/** A benchmark job for a new provider, picked up by it. */
async function runningJob() {
  const [renter, provider] = await Promise.all([makeRenter(srv, 1_000), makeProvider(srv)]);
  const body = { job_type: "benchmark", duration_minutes: 1, provider_id: provider.id, params: { suite: "quick", iterations: 1 } };
  expect((await api.post("/api/jobs/submit", body, renter.headers)).status).toBe(201);
  const job = await pickUp(api, provider.key);
  return { provider, jobId: job!.job_id };
}

const stored = async (jobId: string) => (await srv.sql<{ status: string }[]>`SELECT status FROM jobs WHERE job_id = ${jobId}`)[0];

describe("a unary call in Connect's binary protocol nested past what protobuf-es reads", () => {
  const rpc = () => createClient(JobService, createConnectTransport({ baseUrl: srv.url, httpVersion: "1.1", useBinaryFormat: true }));

  it("is refused naming the field: a ReportResult's result or metrics, one level past the bound or far past it", async () => {
    const { provider, jobId } = await runningJob();
    const headers = { "x-provider-key": provider.key };
    for (const depth of [MAX_JSON_DEPTH + 1, 400]) {
      const over = await failure(rpc().reportResult({ jobId, success: true, result: deepValue(depth) }, { headers }));
      expect(over?.code, `${depth} levels`).toBe(Code.InvalidArgument);
      expect(over?.rawMessage, `${depth} levels`).toBe(refusal("result"));
    }
    const metrics = await failure(rpc().reportResult({ jobId, success: true, result: deepValue(0), metrics: { deep: nest(400) } }, { headers }));
    expect(metrics?.rawMessage).toBe(refusal("metrics"));
    expect((await stored(jobId)).status).toBe("running");
    // And as deep as it may nest, taken.
    const r = await rpc().reportResult({ jobId, success: true, result: deepValue(MAX_JSON_DEPTH - 1) }, { headers });
    expect(r.status).toBe("completed");
  });

  it("is refused naming a job's params, and a log line (a request type with a bounded list), compressed or not", async () => {
    const renter = await makeRenter(srv, 1_000);
    const submit = await failure(rpc().submit({ jobType: "benchmark", durationMinutes: 1, params: { suite: "quick", deep: nest(300) } }, { headers: renter.headers }));
    expect(submit?.code).toBe(Code.InvalidArgument);
    expect(submit?.rawMessage).toBe(refusal("params"));
    const provider = await makeProvider(srv);
    const binary = toBinary(AppendJobLogsRequestSchema, create(AppendJobLogsRequestSchema, { jobId: "job-1", logs: [deepValue(0), deepValue(300)] }));
    for (const [what, headers, body] of [
      ["binary", { "content-type": "application/proto" }, binary],
      ["binary, gzip", { "content-type": "application/proto", "content-encoding": "gzip" }, zlib.gzipSync(binary)],
    ] as const) {
      const r = await fetch(`${srv.url}/svc.v1.JobService/AppendLogs`, {
        method: "POST",
        headers: { "connect-protocol-version": "1", "x-provider-key": provider.key, ...headers },
        body: new Uint8Array(body),
      });
      expect(r.status, what).toBe(400);
      expect(await r.json(), what).toEqual({ code: "invalid_argument", message: refusal("logs") });
    }
  });
});

describe("a unary gRPC call in the binary codec nested past what protobuf-es reads", () => {
  it("is refused naming the field too", async () => {
    const { provider, jobId } = await runningJob();
    const rpc = createClient(JobService, createGrpcTransport({ baseUrl: srv.url }));
    const over = await failure(rpc.reportResult({ jobId, success: true, result: deepValue(400) }, { headers: { "x-provider-key": provider.key } }));
    expect(over?.code).toBe(Code.InvalidArgument);
    expect(over?.rawMessage).toBe(refusal("result"));
    expect((await stored(jobId)).status).toBe("running");
  });
});
