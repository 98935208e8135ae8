// Values a wire can carry that the service cannot keep or read, answered as the caller's error
// rather than a 500:
// - a number JSON cannot write (JSON text's 1e400 reads as Infinity; binary protobuf's double can
//   be NaN) in free-form JSON (google.protobuf.Struct/Value): a caller's is refused naming the
//   field; in machine output (a job's result, log lines, telemetry) it is kept as null, as
//   JSON.stringify writes it, so the report is taken (src/http/nul.ts finiteJson);
// - a request message whose binary encoding does not decode: invalid_argument (400 on Connect),
//   as an unreadable JSON request is (bin/patch-connect.mjs).
import http from "node:http";
import { describe, expect, it } from "vitest";
import http2 from "node:http2";
import { Code, ConnectError } from "@connectrpc/connect";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { useTestServer } from "../helpers/server.js";
import { unstorableHelpers } from "./unstorable.js";

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000", SVC_RATE_LIMITS: "off" });
const helpers = unstorableHelpers(srv);
const { jobRow, jobsOf } = helpers;

/** One request with a body sent exactly as given (JSON text a client library would not write). */
function send(path: string, headers: Record<string, string>, body: string | Buffer): Promise<{ status: number; text: string }> {
  return new Promise((resolve, reject) => {
    const req = http.request(`${srv.url}${path}`, { method: "POST", headers: { ...headers, "content-length": String(Buffer.byteLength(body)) } }, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("end", () => resolve({ status: res.statusCode!, text: Buffer.concat(chunks).toString("utf8") }));
    });
    req.on("error", reject);
    req.end(body);
  });
}

describe("a number JSON cannot write", () => {
  it("in a caller's free-form JSON (submit params) is refused naming the field; no job is written", async () => {
    const renter = await makeRenter(srv, 100_000);
    await makeProvider(srv);
    const r = await send("/api/jobs/submit", { "content-type": "application/json", ...renter.headers }, '{"job_type":"benchmark","params":{"iterations":1e400}}');
    expect(r.status, r.text).toBe(400);
    expect(JSON.parse(r.text)).toEqual({ error: "params.iterations must be a finite number (JSON has no NaN or Infinity)" });
    expect(await jobsOf(renter.id)).toBe(0);
  });

  it("in a job's result or log lines (machine output) is kept as null: the report is taken and the job ends", async () => {
    const { jobId, p: provider } = await helpers.polled();
    const logs = await send(`/api/jobs/${jobId}/logs`, { "content-type": "application/json", "x-provider-key": provider.key }, '{"logs":[{"message":"loss","value":-1e400}]}');
    expect(logs.status, logs.text).toBe(200);
    const done = await send(
      "/api/providers/job-result",
      { "content-type": "application/json", "x-provider-key": provider.key },
      `{"job_id":"${jobId}","success":true,"result":{"score":1e400,"runs":[1,-1e400]}}`,
    );
    expect(done.status, done.text).toBe(200);
    expect(await jobRow(jobId)).toMatchObject({ status: "completed", result: { score: null, runs: [1, null] } });
  });

  it("in a heartbeat's telemetry over Connect is kept as null, not an internal error", async () => {
    const p = await makeProvider(srv);
    const r = await send(
      "/svc.v1.ProviderService/Heartbeat",
      { "content-type": "application/json", "connect-protocol-version": "1", "x-provider-key": p.key },
      '{"gpuStatus":{"gpu_name":"RTX","temp_c":1e400}}',
    );
    expect(r.status, r.text).toBe(200);
  });
});

describe("a request message that does not decode", () => {
  const renterHeaders = async () => (await makeRenter(srv, 0)).headers;

  for (const [what, hex] of [
    ["a length-delimited field running past the end", "0a7f"],
    ["an invalid varint", "ffffffffffffffffffff01"],
    ["a start-group wire type", "0b"],
  ] as const) {
    it(`Connect's binary codec, ${what}: 400 invalid_argument`, async () => {
      const r = await send(
        "/svc.v1.RenterService/GetMe",
        { "content-type": "application/proto", "connect-protocol-version": "1", ...(await renterHeaders()) },
        Buffer.from(hex, "hex"),
      );
      expect(r.status, r.text).toBe(400);
      expect(JSON.parse(r.text)).toMatchObject({ code: "invalid_argument", message: expect.stringMatching(/^parse binary: /) });
    });
  }

  it("over gRPC: invalid_argument", async () => {
    const err = await sendGrpc(Buffer.from("0a7f", "hex"), await renterHeaders()).catch((e: unknown) => e);
    expect(ConnectError.from(err).code).toBe(Code.InvalidArgument);
  });
});

/** A gRPC unary call to RenterService/GetMe whose message bytes are `message`, over h2c; rejects with the status. */
async function sendGrpc(message: Buffer, headers: Record<string, string>): Promise<void> {
  const session = http2.connect(srv.url);
  try {
    const frame = Buffer.alloc(5 + message.length);
    frame.writeUInt32BE(message.length, 1);
    message.copy(frame, 5);
    const stream = session.request({ ":method": "POST", ":path": "/svc.v1.RenterService/GetMe", "content-type": "application/grpc", te: "trailers", ...headers });
    stream.end(frame);
    const status = await new Promise<{ code: number; message: string }>((resolve, reject) => {
      let head: http2.IncomingHttpHeaders = {};
      stream.on("response", (h) => (head = h));
      stream.on("trailers", (t) => resolve({ code: Number(t["grpc-status"]), message: decodeURIComponent(String(t["grpc-message"] ?? "")) }));
      stream.on("end", () => resolve({ code: Number(head["grpc-status"] ?? -1), message: String(head["grpc-message"] ?? "") }));
      stream.on("error", reject);
      stream.resume();
    });
    if (status.code !== 0) throw new ConnectError(status.message, status.code as Code);
  } finally {
    session.close();
  }
}
