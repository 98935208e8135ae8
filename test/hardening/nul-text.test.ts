// PostgreSQL text and jsonb cannot hold U+0000. A caller's NUL is refused on
// every wire the way REST refuses it (400 / invalid_argument naming the field,
// nothing written); what a provider's daemon reports about a job (its output,
// error, metrics, log lines, progress, events) is machine output, stored with
// its NUL characters dropped, so the job ends instead of staying stuck.
import { describe, expect, it } from "vitest";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import { JobService } from "../../gen/svc/v1/jobs_pb.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import { openStream, useStreamServer, type TestStream } from "../daemon/grpc-stream.js";
import { pickUp } from "../jobs/helpers.js";
import { refusedWith, unstorableHelpers } from "./unstorable.js";

const { srv, streams } = useStreamServer();
const api = client(srv);
const helpers = unstorableHelpers(srv);
const { jobsOf, jobRow, logLines, submitRest } = helpers;
const polled = () => helpers.polled();
const refusal = refusedWith;

const SUBMIT = { jobType: "llm_inference", durationMinutes: 1, params: { model: "TinyLlama/TinyLlama-1.1B-Chat-v1.0", prompt: "a\u0000b" } };


describe("a caller's NUL is refused on every wire, naming the field", () => {
  for (const wire of ["connect", "grpc"] as const) {
    it(`${wire}: Submit with a NUL in params is invalid_argument and writes no job`, async () => {
      const renter = await makeRenter(srv, 10_000);
      await makeProvider(srv);
      const transport = wire === "grpc" ? createGrpcTransport({ baseUrl: srv.url }) : createConnectTransport({ baseUrl: srv.url, httpVersion: "1.1" });
      const jobs = createClient(JobService, transport);
      const err = await refusal(jobs.submit(SUBMIT, { headers: renter.headers }));
      expect(err.code).toBe(Code.InvalidArgument);
      expect(err.rawMessage).toBe("params.prompt must not contain NUL characters (\\u0000)");
      expect(await jobsOf(renter.id)).toBe(0);

      // A key of a Struct, a top-level string and a server-streamed request alike.
      const key = await refusal(jobs.submit({ ...SUBMIT, params: { model: "TinyLlama/TinyLlama-1.1B-Chat-v1.0", prompt: "hi", ["x\u0000"]: 1 } }, { headers: renter.headers }));
      expect([key.code, key.rawMessage]).toEqual([Code.InvalidArgument, "params must not contain NUL characters (\\u0000)"]);
      const type = await refusal(jobs.submit({ ...SUBMIT, jobType: "llm\u0000inference", params: { prompt: "hi" } }, { headers: renter.headers }));
      expect([type.code, type.rawMessage]).toEqual([Code.InvalidArgument, "job_type must not contain NUL characters (\\u0000)"]);
      const watch = await refusal(
        (async () => {
          for await (const e of jobs.watchJob({ jobId: "job-\u0000" }, { headers: renter.headers })) void e;
        })(),
      );
      expect([watch.code, watch.rawMessage]).toEqual([Code.InvalidArgument, "job_id must not contain NUL characters (\\u0000)"]);
      expect(await jobsOf(renter.id)).toBe(0);
    });
  }

  it("REST: the same field named, no job written", async () => {
    const renter = await makeRenter(srv, 10_000);
    const r = await api.post("/api/jobs/submit", { job_type: "llm_inference", duration_minutes: 1, params: { model: "TinyLlama/TinyLlama-1.1B-Chat-v1.0", prompt: "a\u0000b" } }, renter.headers);
    expect(r.status).toBe(400);
    expect(r.body.error).toBe("params.prompt must not contain NUL characters (\\u0000)");
    expect(await jobsOf(renter.id)).toBe(0);
  });
});

describe("a stream daemon's report is stored without its NUL characters", () => {
  async function running(): Promise<{ s: TestStream; jobId: string; renter: Awaited<ReturnType<typeof makeRenter>> }> {
    const p = await makeProvider(srv);
    const renter = await makeRenter(srv, 1_000);
    const s = openStream(srv.port, p.key);
    streams.push(s);
    s.send({ case: "hello", value: { daemonVersion: "5.0.0", runningJobIds: [], gpus: [{ name: "NVIDIA GeForce RTX 4090", vram_mib: 24564 }] } });
    await s.next("welcome");
    const jobId = await submitRest(renter, { provider_id: p.id });
    expect((await s.next("job")).jobId).toBe(jobId);
    s.send({ case: "jobAccepted", value: { jobId } });
    await expect.poll(async () => (await jobRow(jobId)).status).toBe("running");
    return { s, jobId, renter };
  }

  it("a result whose output holds NUL completes the job, settled and balanced", async () => {
    const { s, jobId, renter } = await running();
    s.send({ case: "logs", value: { jobId, logs: [{ kind: { case: "stringValue", value: "line\u0000one" } }] } });
    s.send({ case: "progress", value: { jobId, progressPct: 50, phase: "gen\u0000erating" } });
    s.send({
      case: "result",
      value: {
        jobId,
        success: true,
        result: { kind: { case: "structValue", value: { fields: { response: { kind: { case: "stringValue", value: "out\u0000put\u0000" } } } } } },
        metrics: { ["tok\u0000ens"]: 3, note: "n\u0000" },
      },
    });
    expect(await s.next("resultAck")).toMatchObject({ jobId, status: "completed" });
    expect(s.received.filter((m) => m.kind.case === "error")).toEqual([]);
    expect(await jobRow(jobId)).toMatchObject({ status: "completed", end_reason: "completed", result: { response: "output" }, progress_phase: "generating" });
    expect(await logLines(jobId)).toEqual(["lineone"]);
    expect((await api.get(`/api/jobs/${jobId}/output`, renter.headers)).body).toMatchObject({ response: "output" });
    expect(await ledgerProblems(srv.sql)).toEqual([]);
    s.end();
  });

  it("a failure report whose error holds NUL ends the job as reported", async () => {
    const { s, jobId } = await running();
    s.send({ case: "result", value: { jobId, success: false, error: "Traceback\u0000: boom", fault: "renter", endReason: "runtime_error" } });
    expect(await s.next("resultAck")).toMatchObject({ jobId, status: "failed", endReason: "runtime_error", fault: "renter" });
    expect(await jobRow(jobId)).toMatchObject({ status: "failed", end_reason: "runtime_error", error: "Traceback: boom" });
    expect(await ledgerProblems(srv.sql)).toEqual([]);
    s.end();
  });

  it("a NUL in what is not output (the job id) is refused as invalid_argument; the stream stays open", async () => {
    const { s, jobId } = await running();
    s.send({ case: "progress", value: { jobId: `${jobId}\u0000`, progressPct: 10 } });
    expect(await s.next("error")).toMatchObject({ code: "invalid_argument", report: "progress", message: "progress.job_id must not contain NUL characters (\\u0000)" });
    s.send({ case: "result", value: { jobId, success: true } });
    expect(await s.next("resultAck")).toMatchObject({ jobId, status: "completed" });
    s.end();
  });
});

describe("a legacy daemon's JSON reports are stored without their NUL characters", () => {
  it("job-result with NUL in its result: 200, completed", async () => {
    const { p, jobId } = await polled();
    const r = await api.post("/api/providers/job-result", { api_key: p.key, job_id: jobId, success: true, result: { response: "a\u0000b" }, metrics: { m: "x\u0000" } });
    expect(r.status, r.text).toBe(200);
    expect(r.body).toMatchObject({ status: "completed" });
    expect(await jobRow(jobId)).toMatchObject({ status: "completed", result: { response: "ab" } });
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("job-result with NUL in its error: 200, failed", async () => {
    const { p, jobId } = await polled();
    const r = await api.post("/api/providers/job-result", { api_key: p.key, job_id: jobId, success: false, error: "oom\u0000", fault: "renter" });
    expect(r.status, r.text).toBe(200);
    expect(r.body).toMatchObject({ status: "failed" });
    expect(await jobRow(jobId)).toMatchObject({ status: "failed", error: "oom" });
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("ReportResult over Connect with NUL in its output: completed", async () => {
    const { p, jobId } = await polled();
    const jobs = createClient(JobService, createConnectTransport({ baseUrl: srv.url, httpVersion: "1.1" }));
    const ack = await jobs.reportResult(
      { jobId, success: true, result: { kind: { case: "structValue", value: { fields: { response: { kind: { case: "stringValue", value: "x\u0000y" } } } } } } },
      { headers: p.headers },
    );
    expect(ack).toMatchObject({ jobId, status: "completed" });
    expect(await jobRow(jobId)).toMatchObject({ status: "completed", result: { response: "xy" } });
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("complete (the whole body is the result) with NUL: 200, completed", async () => {
    const { p, jobId } = await polled();
    const r = await api.post(`/api/jobs/${jobId}/complete`, { api_key: p.key, response: "done\u0000", ["k\u0000"]: 1 });
    expect(r.status, r.text).toBe(200);
    expect(await jobRow(jobId)).toMatchObject({ status: "completed", result: { response: "done", k: 1 } });
  });

  it("a heartbeat with NUL in its telemetry is taken, as on the stream", async () => {
    const p = await makeProvider(srv);
    const r = await api.post("/api/providers/heartbeat", { api_key: p.key, gpu_status: { gpu_name: "RTX\u00004090", gpu_vram_mib: 24564 }, provider_hostname: "rig\u0000-1" });
    expect(r.status, r.text).toBe(200);
    await expect.poll(async () => (await srv.sql`SELECT hostname FROM providers WHERE id = ${p.id}`)[0].hostname).toBe("rig-1");
  });

  it("logs, progress and daemon events with NUL are stored without it; a NUL in a job id is still refused", async () => {
    const { p, jobId } = await polled();
    const logs = await api.post(`/api/jobs/${jobId}/logs`, { api_key: p.key, logs: ["plain\u0000line", { level: "error", message: "obj\u0000line" }] });
    expect(logs.status, logs.text).toBe(200);
    expect(logs.body.count).toBe(2);
    expect(await logLines(jobId)).toEqual(["plainline", "objline"]);

    const progress = await api.post(`/api/jobs/${jobId}/progress`, { api_key: p.key, progress_pct: 30, phase: "load\u0000ing" });
    expect(progress.status, progress.text).toBe(200);
    expect((await jobRow(jobId)).progress_phase).toBe("loading");

    const event = await api.post("/api/providers/daemon-event", { api_key: p.key, event_type: "crash\u0000", details: "core\u0000dumped", job_id: jobId });
    expect(event.status, event.text).toBe(200);
    const [e] = await srv.sql`SELECT event_type, details FROM daemon_events WHERE provider_id = ${p.id} ORDER BY id DESC LIMIT 1`;
    expect(e).toMatchObject({ event_type: "crash", details: "coredumped" });

    const badId = await api.post(`/api/jobs/${encodeURIComponent(`${jobId}\u0000`)}/progress`, { api_key: p.key, progress_pct: 40 });
    expect(badId.status).toBe(400);
    expect(badId.body.error).toBe("job_id must not contain NUL characters (\\u0000)");
  });
});
