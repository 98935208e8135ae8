// A UTF-16 surrogate without its pair: JSON text may escape one ("\ud800"; JSON.stringify writes
// a lone surrogate so, and Python's json.dumps writes "\udcXX" for each byte of badly decoded
// output), and PostgreSQL's jsonb refuses it, so unhandled it failed as a 500 "internal error".
// As with NUL (nul-text.test.ts): a caller's is refused on every wire that can carry one, naming
// the field (400 / invalid_argument, nothing written); what a provider's daemon reports about a
// job (its output, error, metrics, log lines, progress, events, telemetry) is machine output,
// stored with each lone surrogate replaced by U+FFFD, so the job ends instead of staying stuck.
// (Binary protobuf carries UTF-8, which cannot hold one: a gRPC client sends U+FFFD instead.)
import { describe, expect, it } from "vitest";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import type { MessageInitShape } from "@bufbuild/protobuf";
import { JobService } from "../../gen/svc/v1/jobs_pb.js";
import { DaemonService, type DaemonMessageSchema, type ServerMessage } from "../../gen/svc/v1/daemon_pb.js";
import { AsyncQueue } from "../../src/daemon/async-queue.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import { useStreamServer } from "../daemon/grpc-stream.js";
import { pickUp } from "../jobs/helpers.js";
import { refusedWith, unstorableHelpers } from "./unstorable.js";

const { srv } = useStreamServer();
const api = client(srv);
const helpers = unstorableHelpers(srv);
const { jobsOf, jobRow, logLines, submitRest } = helpers;
const polled = () => helpers.polled();
const refused = refusedWith;

const HIGH = "\ud800"; // a high surrogate with no low one after it
const LOW = "\udcff"; // a low one with no high one before it (Python's escape of byte 0xff)
const FFFD = "\ufffd";
const refusal = (field: string) => `${field} must not contain unpaired UTF-16 surrogates (\\ud800-\\udfff)`;

const MODEL = "TinyLlama/TinyLlama-1.1B-Chat-v1.0";

describe("a caller's lone surrogate is refused, naming the field", () => {
  it("REST: submit with one in params.prompt (the audit's body, as sent) is 400 {error}, no job written", async () => {
    const renter = await makeRenter(srv, 100_000);
    await makeProvider(srv);
    const r = await api.post("/api/jobs/submit", '{"job_type":"llm-inference","duration_minutes":1,"params":{"prompt":"hi \\ud800"}}', renter.headers);
    expect(r.status, r.text).toBe(400);
    expect(r.body).toEqual({ error: refusal("params.prompt") });
    expect(await jobsOf(renter.id)).toBe(0);
  });

  it("REST: a low one, one in a key, one in a top-level field alike; a paired surrogate (an emoji) is taken", async () => {
    const renter = await makeRenter(srv, 100_000);
    await makeProvider(srv);
    const submit = (body: unknown) => api.post("/api/jobs/submit", body, renter.headers);
    const low = await submit({ job_type: "llm-inference", duration_minutes: 1, params: { model: MODEL, prompt: `x${LOW}y` } });
    expect([low.status, low.body]).toEqual([400, { error: refusal("params.prompt") }]);
    const key = await submit({ job_type: "llm-inference", duration_minutes: 1, params: { model: MODEL, prompt: "hi", [`k${HIGH}`]: 1 } });
    expect([key.status, key.body]).toEqual([400, { error: refusal("params") }]);
    const type = await submit({ job_type: `llm${HIGH}`, duration_minutes: 1, params: { prompt: "hi" } });
    expect([type.status, type.body]).toEqual([400, { error: refusal("job_type") }]);
    const name = await api.patch("/api/renters/me", { name: `n${LOW}` }, renter.headers);
    expect([name.status, name.body]).toEqual([400, { error: refusal("name") }]);
    expect(await jobsOf(renter.id)).toBe(0);

    const emoji = await submit({ job_type: "llm-inference", duration_minutes: 1, params: { model: MODEL, prompt: "hi \ud83d\ude00" } });
    expect(emoji.status, emoji.text).toBe(201);
    expect((await jobRow(emoji.body.job.job_id)).params.prompt).toBe("hi \ud83d\ude00");
  });

  it("Connect (JSON codec): Submit with one in params is invalid_argument with the REST wording; in a string field too; no job written", async () => {
    const renter = await makeRenter(srv, 100_000);
    await makeProvider(srv);
    const jobs = createClient(JobService, createConnectTransport({ baseUrl: srv.url, httpVersion: "1.1", useBinaryFormat: false }));
    const err = await refused(jobs.submit({ jobType: "llm_inference", durationMinutes: 1, params: { model: MODEL, prompt: `hi ${HIGH}` } }, { headers: renter.headers }));
    expect([err.code, err.rawMessage]).toEqual([Code.InvalidArgument, refusal("params.prompt")]);
    // A string field: the Connect codec itself refuses it (invalid UTF-8), naming the field.
    const top = await refused(jobs.submit({ jobType: `llm${LOW}`, durationMinutes: 1, params: { prompt: "hi" } }, { headers: renter.headers }));
    expect(top.code).toBe(Code.InvalidArgument);
    expect(top.rawMessage).toContain("job_type");
    expect(await jobsOf(renter.id)).toBe(0);
  });

  it("gRPC (binary): the surrogate cannot travel (UTF-8 has none); what arrives, U+FFFD, is taken", async () => {
    const renter = await makeRenter(srv, 100_000);
    await makeProvider(srv);
    const jobs = createClient(JobService, createGrpcTransport({ baseUrl: srv.url }));
    const r = await jobs.submit({ jobType: "llm_inference", durationMinutes: 1, params: { model: MODEL, prompt: `hi ${HIGH}` } }, { headers: renter.headers });
    expect((await jobRow(r.job!.job!.jobId)).params.prompt).toBe(`hi ${FFFD}`);
  });
});

describe("a legacy daemon's JSON reports are stored with U+FFFD for a lone surrogate", () => {
  it("job-result whose output holds one (the audit's body, as sent): 200, completed, output readable", async () => {
    const { p, jobId, renter } = await polled();
    const r = await api.post("/api/providers/job-result", `{"api_key":"${p.key}","job_id":"${jobId}","success":true,"result":"out \\ud800 put","metrics":{"n\\udcff":"\\udc80"}}`);
    expect(r.status, r.text).toBe(200);
    expect(r.body).toMatchObject({ status: "completed" });
    expect(await jobRow(jobId)).toMatchObject({ status: "completed", result: `out ${FFFD} put`, metrics: { [`n${FFFD}`]: FFFD } });
    const out = await api.get(`/api/jobs/${jobId}/output`, renter.headers);
    expect(out.status, out.text).toBe(200);
    expect(out.text).toContain(FFFD);
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("job-result whose error holds one: 200, failed as reported", async () => {
    const { p, jobId } = await polled();
    const r = await api.post("/api/providers/job-result", { api_key: p.key, job_id: jobId, success: false, error: `Traceback ${LOW}: boom`, fault: "renter", end_reason: "runtime_error" });
    expect(r.status, r.text).toBe(200);
    expect(r.body).toMatchObject({ status: "failed" });
    expect(await jobRow(jobId)).toMatchObject({ status: "failed", end_reason: "runtime_error", error: `Traceback ${FFFD}: boom` });
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("ReportResult over Connect's JSON codec with one in its output: completed", async () => {
    const { p, jobId } = await polled();
    const jobs = createClient(JobService, createConnectTransport({ baseUrl: srv.url, httpVersion: "1.1", useBinaryFormat: false }));
    const ack = await jobs.reportResult(
      { jobId, success: true, result: { kind: { case: "structValue", value: { fields: { response: { kind: { case: "stringValue", value: `x${HIGH}y` } } } } } } },
      { headers: p.headers },
    );
    expect(ack).toMatchObject({ jobId, status: "completed" });
    expect(await jobRow(jobId)).toMatchObject({ status: "completed", result: { response: `x${FFFD}y` } });
  });

  it("complete (the whole body is the result) with one in a value and a key: 200, completed", async () => {
    const { p, jobId } = await polled();
    const r = await api.post(`/api/jobs/${jobId}/complete`, { api_key: p.key, response: `done${LOW}`, [`k${HIGH}`]: 1 });
    expect(r.status, r.text).toBe(200);
    expect(await jobRow(jobId)).toMatchObject({ status: "completed", result: { response: `done${FFFD}`, [`k${FFFD}`]: 1 } });
  });

  it("logs, progress and daemon events with one are stored with U+FFFD; one in a job id is still refused", async () => {
    const { p, jobId } = await polled();
    const logs = await api.post(`/api/jobs/${jobId}/logs`, { api_key: p.key, logs: [`plain${LOW}line`, { level: "error", message: `obj${HIGH}line` }] });
    expect(logs.status, logs.text).toBe(200);
    expect(await logLines(jobId)).toEqual([`plain${FFFD}line`, `obj${FFFD}line`]);

    const progress = await api.post(`/api/jobs/${jobId}/progress`, { api_key: p.key, progress_pct: 30, phase: `load${HIGH}ing` });
    expect(progress.status, progress.text).toBe(200);
    expect((await jobRow(jobId)).progress_phase).toBe(`load${FFFD}ing`);

    const event = await api.post("/api/providers/daemon-event", { api_key: p.key, event_type: `crash${LOW}`, details: `core${HIGH}dumped`, hostname: `rig${HIGH}`, job_id: jobId });
    expect(event.status, event.text).toBe(200);
    const [e] = await srv.sql`SELECT event_type, details, hostname FROM daemon_events WHERE provider_id = ${p.id} ORDER BY id DESC LIMIT 1`;
    expect(e).toMatchObject({ event_type: `crash${FFFD}`, details: `core${FFFD}dumped`, hostname: `rig${FFFD}` });

    const badBody = await api.post("/api/providers/job-result", `{"api_key":"${p.key}","job_id":"${jobId}\\ud800","success":true}`);
    expect([badBody.status, badBody.body]).toEqual([400, { error: refusal("job_id") }]);
    expect((await jobRow(jobId)).status).toBe("running");
  });

  it("a heartbeat with one in its telemetry and hostname is written (the batch's JSON is storable)", async () => {
    const p = await makeProvider(srv);
    const r = await api.post("/api/providers/heartbeat", {
      api_key: p.key,
      gpu_status: { gpu_name: `RTX${HIGH}4090`, gpu_vram_mib: 24564 },
      provider_hostname: `rig${LOW}-1`,
      cached_models: [`m${HIGH}`],
    });
    expect(r.status, r.text).toBe(200);
    await expect.poll(async () => (await srv.sql`SELECT hostname FROM providers WHERE id = ${p.id}`)[0].hostname).toBe(`rig${FFFD}-1`);
    const [row] = await srv.sql`SELECT gpu_telemetry::jsonb->>'gpu_name' AS gpu_name, cached_models FROM providers WHERE id = ${p.id}`;
    expect(row).toEqual({ gpu_name: `RTX${FFFD}4090`, cached_models: [`m${FFFD}`] });
  });
});

describe("a stream daemon's report in the Connect protocol's JSON codec is stored with U+FFFD", () => {
  // Its JSON free-form values (google.protobuf.Value, Struct) can hold one; a string field cannot (the
  // Connect codec refuses the message as invalid UTF-8, as protobuf-es decodes it).
  it("a result whose output and metrics hold one, after log lines that do, completes the job", async () => {
    const p = await makeProvider(srv);
    const renter = await makeRenter(srv, 1_000);
    const transport = createConnectTransport({ baseUrl: srv.url, httpVersion: "2", useBinaryFormat: false });
    const requests = new AsyncQueue<MessageInitShape<typeof DaemonMessageSchema>>();
    const abort = new AbortController();
    const responses = createClient(DaemonService, transport).connect(requests, { headers: { "x-provider-key": p.key }, signal: abort.signal })[Symbol.asyncIterator]();
    const send = (kind: MessageInitShape<typeof DaemonMessageSchema>["kind"]) => requests.push({ kind });
    async function next<K extends NonNullable<ServerMessage["kind"]["case"]>>(kind: K): Promise<Extract<ServerMessage["kind"], { case: K }>["value"]> {
      for (;;) {
        const m = await responses.next();
        if (m.done) throw new Error("stream ended");
        if (m.value.kind.case === kind) return m.value.kind.value as never;
      }
    }
    try {
      send({ case: "hello", value: { daemonVersion: "5.0.0", gpus: [{ name: "NVIDIA GeForce RTX 4090", vram_mib: 24564 }] as never } });
      await next("welcome");
      const jobId = await submitRest(renter, { provider_id: p.id });
      expect((await next("job")).jobId).toBe(jobId);
      send({ case: "jobAccepted", value: { jobId } });
      await expect.poll(async () => (await jobRow(jobId)).status).toBe("running");

      send({ case: "logs", value: { jobId, logs: [{ kind: { case: "stringValue", value: `line${LOW}` } }] } });
      send({
        case: "result",
        value: {
          jobId,
          success: true,
          result: { kind: { case: "structValue", value: { fields: { response: { kind: { case: "stringValue", value: `out ${HIGH} put` } } } } } },
          metrics: { [`tok${LOW}`]: 3 },
        },
      });
      expect(await next("resultAck")).toMatchObject({ jobId, status: "completed" });
      expect(await jobRow(jobId)).toMatchObject({
        status: "completed",
        result: { response: `out ${FFFD} put` },
        metrics: { [`tok${FFFD}`]: 3 },
      });
      expect(await logLines(jobId)).toEqual([`line${FFFD}`]);
      expect(await ledgerProblems(srv.sql)).toEqual([]);
    } finally {
      requests.close();
      abort.abort();
    }
  });
});
