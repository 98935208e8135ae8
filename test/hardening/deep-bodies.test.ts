// JSON nested deep enough costs JSON.parse seconds and hundreds of megabytes
// (millions of levels fit in a result route's 16 MiB), and overflows the stack
// of whatever walks it afterwards. Request bodies are measured as text before
// they are parsed, so such a body is refused (400 naming the nesting) before
// any credential it carries is looked at, cheaply; a deep but reasonable result
// is taken as before.
import zlib from "node:zlib";
import { describe, expect, it } from "vitest";
import { jsonDepthExceeds, JsonDepthMeter, jsonTextDepthExceeds, MAX_JSON_DEPTH } from "../../src/http/json-depth.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { useTestServer } from "../helpers/server.js";

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000" });
const api = client(srv);

const nest = (depth: number, inner = "1") => "[".repeat(depth) + inner + "]".repeat(depth);

describe("the text measure", () => {
  it("counts as the parsed value is counted, whatever the strings hold", () => {
    const texts = [
      "1",
      '"[[[["',
      "{}",
      '{"a":[1,{"b":"]]]}}"}],"c":"\\"[{"}',
      '["\\\\", ["\\\\\\"[[[", {"k": []}]]',
      '{"\\"{": {"x": "\\\\\\\\"}}',
      nest(40, '{"s":"}}}]]]","t":[[["\\u005b"]]]}'),
    ];
    for (const text of texts) {
      const value = JSON.parse(text);
      for (let max = 0; max <= 50; max++) expect(jsonTextDepthExceeds(Buffer.from(text), max), `${text} at ${max}`).toBe(jsonDepthExceeds(value, max));
      // Fed in two pieces split anywhere (a body as it arrives), inside an escape or a string too.
      const bytes = Buffer.from(text);
      for (const max of [0, 1, 2, 3, 20, 41, 42]) {
        for (let cut = 0; cut <= bytes.length; cut++) {
          const meter = new JsonDepthMeter(max);
          const got = meter.exceeds(bytes.subarray(0, cut)) || meter.exceeds(bytes.subarray(cut));
          expect(got, `${text} cut at ${cut}, at ${max}`).toBe(jsonDepthExceeds(value, max));
        }
      }
    }
  });

  it("stops at the first level too many: a body of millions of levels is judged at once", () => {
    const huge = Buffer.from("[".repeat(8_000_000));
    const started = process.hrtime.bigint();
    expect(jsonTextDepthExceeds(huge, MAX_JSON_DEPTH)).toBe(true);
    // Looked at no more than the first levels: nowhere near a pass over 8 MB, let alone a parse.
    expect(Number(process.hrtime.bigint() - started) / 1e6).toBeLessThan(50);
  });
});

describe("an /api body nested deeper than the limit", () => {
  it("is refused before it is parsed, without credentials too: 400 naming the nesting", async () => {
    // 8 M levels: what a result route's 16 MiB allows.
    const body = '{"x":' + nest(8_000_000) + "}";
    const r = await api.post("/api/providers/job-result", body);
    expect(r.status, r.text.slice(0, 200)).toBe(400);
    expect(r.body).toEqual({ error: `JSON body must not nest objects and arrays more than ${MAX_JSON_DEPTH} levels deep; field 'x' nests deeper` });
    // The server is answering at once afterwards.
    expect((await api.get("/api/templates")).status).toBe(200);
  });

  it("but a result nested as deep as results are read is taken, and the job ends", async () => {
    const renter = await makeRenter(srv, 10_000);
    const provider = await makeProvider(srv);
    const sub = await api.post("/api/jobs/submit", { job_type: "llm-inference", duration_minutes: 2, provider_id: provider.id, params: { prompt: "hi" } }, renter.headers);
    expect(sub.status, sub.text).toBe(201);
    const jobId: string = sub.body.job.job_id;
    expect((await api.get(`/api/providers/${provider.key}/jobs`)).body.job?.job_id).toBe(jobId);
    const report = (result: string) => `{"api_key":"${provider.key}","job_id":"${jobId}","success":true,"result":${result}}`;
    // One level past the limit, counting the body's own object: refused as too deep, the job still running.
    const over = await api.post("/api/providers/job-result", report(nest(MAX_JSON_DEPTH, '"deep"')));
    expect(over.status).toBe(400);
    expect(over.body.error).toMatch(/nest objects and arrays more than 100 levels/);
    const result = `{"out":${nest(40, '"deep"')}}`;
    const r = await api.post("/api/providers/job-result", report(result));
    expect(r.status, r.text.slice(0, 300)).toBe(200);
    const [row] = await srv.sql<{ status: string; result: unknown }[]>`SELECT status, result FROM jobs WHERE job_id = ${jobId}`;
    expect(row.status).toBe("completed");
    expect(row.result).toEqual(JSON.parse(result));
  });
});

describe("a Connect call's JSON body nested deeper than the limit", () => {
  it("is refused as it arrives, before Connect parses it: invalid_argument naming the nesting", async () => {
    const body = '{"result":' + nest(8_000_000) + "}";
    const r = await fetch(`${srv.url}/svc.v1.JobService/ReportResult`, { method: "POST", headers: { "content-type": "application/json" }, body });
    expect(r.status).toBe(400);
    expect(await r.json()).toMatchObject({ code: "invalid_argument", message: `request body must not nest objects and arrays more than ${MAX_JSON_DEPTH} levels deep; field 'result' nests deeper` });
    // A shallow one goes on to be judged as before (here: no credentials).
    const shallow = await fetch(`${srv.url}/svc.v1.JobService/ReportResult`, { method: "POST", headers: { "content-type": "application/json" }, body: '{"jobId":"job-x","success":true,"result":[[1]]}' });
    const judged = await shallow.json();
    expect(judged.message).not.toMatch(/nest/);
    expect(judged).toEqual({ code: "invalid_argument", message: "API key required" });
  });

  it("is measured in gRPC-Web and gRPC framing too, message by message, and compressed as it inflates", async () => {
    const frame = (payload: Buffer, flags = 0) => {
      const head = Buffer.alloc(5);
      head[0] = flags;
      head.writeUInt32BE(payload.length, 1);
      return Buffer.concat([head, payload]);
    };
    const deep = Buffer.from('{"result":' + nest(8_000_000) + "}");
    const call = (type: string, body: Buffer, headers: Record<string, string> = {}) =>
      fetch(`${srv.url}/svc.v1.JobService/ReportResult`, { method: "POST", headers: { "content-type": type, ...headers }, body: new Uint8Array(body) });
    // gRPC-Web answers its status in a trailers frame at the end of the body.
    const trailers = async (r: Response) => {
      const text = Buffer.from(await r.arrayBuffer()).subarray(5).toString("latin1");
      return Object.fromEntries(text.split("\r\n").filter(Boolean).map((l) => [l.slice(0, l.indexOf(":")), decodeURIComponent(l.slice(l.indexOf(":") + 1).trim())]));
    };
    const web = await call("application/grpc-web+json", frame(deep));
    expect(await trailers(web)).toMatchObject({ "grpc-status": "3", "grpc-message": `request body must not nest objects and arrays more than ${MAX_JSON_DEPTH} levels deep; field 'result' nests deeper` });
    // A shallow message framed so is judged as before.
    const shallow = await call("application/grpc-web+json", frame(Buffer.from('{"jobId":"job-x","success":true,"result":[[1]]}')));
    expect(await trailers(shallow)).toMatchObject({ "grpc-message": "API key required" });
    // A compressed body is measured as it inflates (8 M levels are 16 KB of gzip), and a shallow one goes on.
    for (const [encoding, squeeze] of [["gzip", zlib.gzipSync], ["br", zlib.brotliCompressSync]] as const) {
      const gz = await call("application/json", squeeze(deep), { "content-encoding": encoding });
      expect(await gz.json(), encoding).toEqual({ code: "invalid_argument", message: `request body must not nest objects and arrays more than ${MAX_JSON_DEPTH} levels deep; field 'result' nests deeper` });
      const ok = await call("application/json", squeeze(Buffer.from('{"jobId":"job-x","success":true,"result":[[1]]}')), { "content-encoding": encoding });
      expect(await ok.json(), encoding).toEqual({ code: "invalid_argument", message: "API key required" });
    }
    // A message compressed in gRPC framing is not inflated to be measured: refused.
    const framed = await call("application/grpc-web+json", frame(zlib.gzipSync(deep), 1), { "grpc-encoding": "gzip" });
    expect(await trailers(framed)).toMatchObject({ "grpc-status": "12" });
  });
});

