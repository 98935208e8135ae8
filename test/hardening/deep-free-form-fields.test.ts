// The free-form JSON of a request (a result, its metrics, a job's params, a heartbeat's telemetry, a
// completion's body) is taken as deep as a body may nest (MAX_JSON_DEPTH, counting the body's own object),
// whichever route or codec carries it, and a body nested deeper is refused naming the nesting.
import { describe, expect, it } from "vitest";
import { JsonDepthMeter, MAX_JSON_DEPTH } from "../../src/http/json-depth.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { useTestServer } from "../helpers/server.js";

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000" });
const api = client(srv);

const nest = (depth: number, inner = '"deep"') => "[".repeat(depth) + inner + "]".repeat(depth);
const tooDeep = (field: string) => `JSON body must not nest objects and arrays more than ${MAX_JSON_DEPTH} levels deep; field '${field}' nests deeper`;

async function runningJob() {
  const renter = await makeRenter(srv, 10_000);
  const provider = await makeProvider(srv);
  const sub = await api.post("/api/jobs/submit", { job_type: "llm-inference", duration_minutes: 2, provider_id: provider.id, params: { prompt: "hi" } }, renter.headers);
  expect(sub.status, sub.text).toBe(201);
  const jobId: string = sub.body.job.job_id;
  expect((await api.get(`/api/providers/${provider.key}/jobs`)).body.job?.job_id).toBe(jobId);
  return { renter, provider, jobId };
}

const stored = async (jobId: string) =>
  (await srv.sql<{ status: string; result: unknown; params: unknown }[]>`SELECT status, result, params FROM jobs WHERE job_id = ${jobId}`)[0];

describe("a result as deep as a body may nest", () => {
  it("is taken on POST /api/providers/job-result, and one level deeper is refused naming the nesting", async () => {
    const { provider, jobId } = await runningJob();
    const report = (result: string) => `{"api_key":"${provider.key}","job_id":"${jobId}","success":true,"result":${result}}`;
    // The body's own object is one level: its result may nest MAX_JSON_DEPTH - 1.
    const over = await api.post("/api/providers/job-result", report(nest(MAX_JSON_DEPTH)));
    expect(over.status).toBe(400);
    expect(over.body).toEqual({ error: tooDeep("result") });
    const result = nest(MAX_JSON_DEPTH - 1);
    const r = await api.post("/api/providers/job-result", report(result));
    expect(r.status, r.text.slice(0, 300)).toBe(200);
    const row = await stored(jobId);
    expect(row.status).toBe("completed");
    expect(JSON.stringify(row.result)).toContain(nest(MAX_JSON_DEPTH - 2));
    // And it is read back as it was stored.
    const job = await api.get(`/api/jobs/${jobId}`, { "x-provider-key": provider.key });
    expect(job.status, job.text.slice(0, 300)).toBe(200);
  });

  it("in its metrics too", async () => {
    const { provider, jobId } = await runningJob();
    const metrics = `{"m":${nest(MAX_JSON_DEPTH - 2)}}`;
    const r = await api.post("/api/providers/job-result", `{"api_key":"${provider.key}","job_id":"${jobId}","success":true,"result":"ok","metrics":${metrics}}`);
    expect(r.status, r.text.slice(0, 300)).toBe(200);
    expect((await stored(jobId)).status).toBe("completed");
  });

  it("on POST /api/jobs/{id}/complete", async () => {
    const { provider, jobId } = await runningJob();
    const body = `{"out":${nest(MAX_JSON_DEPTH - 1)}}`;
    const r = await api.post(`/api/jobs/${jobId}/complete`, body, provider.headers);
    expect(r.status, r.text.slice(0, 300)).toBe(200);
    expect((await stored(jobId)).status).toBe("completed");
  });

  it("over Connect's JSON codec", async () => {
    const { provider, jobId } = await runningJob();
    const call = (result: string) =>
      fetch(`${srv.url}/svc.v1.JobService/ReportResult`, {
        method: "POST",
        headers: { "content-type": "application/json", "x-provider-key": provider.key },
        body: `{"jobId":"${jobId}","success":true,"result":${result}}`,
      });
    const over = await call(nest(MAX_JSON_DEPTH));
    expect(await over.json()).toEqual({
      code: "invalid_argument",
      message: `request body must not nest objects and arrays more than ${MAX_JSON_DEPTH} levels deep; field 'result' nests deeper`,
    });
    const r = await call(nest(MAX_JSON_DEPTH - 1));
    expect(r.status, await r.clone().text()).toBe(200);
    expect((await stored(jobId)).status).toBe("completed");
  });
});

describe("a job's params as deep as a body may nest", () => {
  it("are read on POST /api/jobs/submit, and one level deeper is refused naming them", async () => {
    const renter = await makeRenter(srv, 10_000);
    const provider = await makeProvider(srv);
    const body = (depth: number) => `{"job_type":"llm-inference","duration_minutes":2,"provider_id":${provider.id},"params":{"prompt":"hi","extra":${nest(depth)}}}`;
    const over = await api.post("/api/jobs/submit", body(MAX_JSON_DEPTH - 1), renter.headers);
    expect(over.status).toBe(400);
    expect(over.body).toEqual({ error: tooDeep("params") });
    // Read, and judged for what they hold: no job type takes a member of that name.
    const r = await api.post("/api/jobs/submit", body(MAX_JSON_DEPTH - 2), renter.headers);
    expect(r.body).toEqual({ error: "params.extra is not a parameter of llm-inference" });
  });
});

describe("the member a refusal names", () => {
  it("is the top-level member being read when the text went too deep, wherever the pieces are cut", () => {
    const cases: [string, number, string | undefined][] = [
      ['{"a":1,"b\\\"c":[[[1]]],"z":2}', 3, 'b"c'],
      ['{"s":"{[[[\\"","k":{"x":[[1]]}}', 3, "k"],
      ['{"a":"\\u0072esult","r\\u00e9sum\\u00e9":[[{}]]}', 3, "résumé"],
      ["[[[[1]]]]", 3, undefined],
      ['{"a":[{"b":[[1]]}]}', 4, "a"],
      ['{"ok":[[1]]}', 3, undefined],
    ];
    for (const [text, max, member] of cases) {
      const bytes = Buffer.from(text);
      for (let cut = 0; cut <= bytes.length; cut++) {
        const meter = new JsonDepthMeter(max);
        meter.exceeds(bytes.subarray(0, cut)) || meter.exceeds(bytes.subarray(cut));
        expect(meter.member(), `${text} cut at ${cut}`).toBe(member);
      }
    }
  });
});

describe("a heartbeat's telemetry as deep as a body may nest", () => {
  it("is taken on POST /api/providers/heartbeat", async () => {
    const provider = await makeProvider(srv);
    const r = await api.post("/api/providers/heartbeat", `{"api_key":"${provider.key}","gpu_status":{"gpu_name":"x","deep":${nest(MAX_JSON_DEPTH - 2)}}}`);
    expect(r.status, r.text.slice(0, 300)).toBe(200);
  });
});
