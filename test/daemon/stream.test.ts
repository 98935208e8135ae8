// DaemonService.Connect over standard gRPC (@grpc/grpc-js) on the shared
// port: handshake, pushed assignments, reports through the same domain code
// as the JSON routes, settlement, cancel, resumption after a reconnect
// (nothing twice), hand-back, and the drain notice on shutdown.
import crypto from "node:crypto";
import { describe, expect, it } from "vitest";
import * as grpc from "@grpc/grpc-js";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { AsyncQueue } from "../../src/daemon/async-queue.js";
import type { MessageInitShape } from "@bufbuild/protobuf";
import { DaemonService, type DaemonMessageSchema } from "../../gen/svc/v1/daemon_pb.js";
import { HMAC_SECRET, startTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { verifyTask, verifyTaskSignature } from "../../src/shared/task-signature.js";
import { taskSigner } from "../../src/shared/task-signature.js";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import { dispatchQueued } from "../../src/domain/dispatch/dispatch.js";
import { openStream, useStreamServer, type TestStream } from "./grpc-stream.js";
import { waitFor, whileNotListening } from "./helpers.js";
import { jobSignalHub } from "../../src/workers/job-signals.js";
import { HELLO_MAX_JOB_IDS } from "../../src/services/daemon.js";
import { ASSIGNED_CHANNEL } from "../../src/domain/notify/job-notices.js";

const { srv, streams } = useStreamServer();
const api = client(srv);

function connect(key: string | undefined, runningJobIds: string[] = []) {
  const s = openStream(srv.port, key);
  streams.push(s);
  s.send({ case: "hello", value: { daemonVersion: "5.0.0", runningJobIds, gpus: [{ name: "NVIDIA GeForce RTX 4090", vram_mib: 24564 }] } });
  return s;
}

async function submit(renter: { headers: Record<string, string> }, body: Record<string, unknown> = {}) {
  const r = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 1, params: { suite: "quick", iterations: 1 }, ...body }, renter.headers);
  expect(r.status, r.text).toBe(201);
  return r.body.job as { job_id: string; provider_id: number; status: string };
}

const jobStatus = async (jobId: string) => (await srv.sql<{ status: string }[]>`SELECT status FROM jobs WHERE job_id = ${jobId}`)[0]?.status;

describe("handshake", () => {
  it("welcomes with the provider's settings and answers heartbeats like the JSON route", async () => {
    const p = await makeProvider(srv);
    await srv.sql`UPDATE providers SET temp_limit_c = 77, gpu_usage_cap_pct = 60 WHERE id = ${p.id}`;
    const s = connect(p.key);
    const welcome = await s.next("welcome");
    expect(Number(welcome.providerId)).toBe(p.id);
    expect(welcome.heartbeatIntervalSeconds).toBe(30);
    expect(welcome.approvalStatus).toBe("approved");
    expect(welcome.settings).toMatchObject({ paused: false, tempLimitC: 77, gpuUsageCapPct: 60, runMode: "always-on" });
    // The task-signing key is the server's own random key (server_keys), not derivable from the HMAC secret
    // that legacy daemon files carry: the old derivation does not give it.
    const [{ secret }] = await srv.sql<{ secret: Buffer }[]>`SELECT secret FROM server_keys WHERE name = 'task-signing-ed25519'`;
    expect(welcome.taskSigningKey).toBe(taskSigner(secret).publicKey);
    const derived = crypto.createHmac("sha256", HMAC_SECRET).update("svc stream task signing ed25519 v1").digest();
    expect(welcome.taskSigningKey).not.toBe(taskSigner(derived).publicKey);

    s.send({ case: "heartbeat", value: { daemonVersion: "5.0.0", gpuStatus: { kind: { case: "structValue", value: { fields: {} } } } as never } });
    const ack = await s.next("heartbeatAck");
    const json = await api.post("/api/providers/heartbeat", { api_key: p.key, gpu_status: {} });
    expect(json.status).toBe(200);
    expect(ack).toMatchObject({ success: true, approved: json.body.approved, approvalStatus: json.body.approval_status, latestVersion: json.body.latest_version, minVersion: json.body.min_version });

    // Pausing is pushed as a settings change at once, without waiting for a heartbeat.
    expect((await api.post("/api/providers/pause", { key: p.key })).status).toBe(200);
    const changed = await s.next("settings");
    expect(changed.paused).toBe(true);
    s.end();
    expect((await s.ended).code).toBeUndefined();
  });

  it("refuses a stream without a key or with a bad one, and reports a refused heartbeat without closing", async () => {
    const anon = connect(undefined);
    expect([grpc.status.INVALID_ARGUMENT, grpc.status.UNAUTHENTICATED]).toContain((await anon.ended).code);
    const bad = connect("svc-provider-not-a-key");
    expect((await bad.ended).code).toBe(grpc.status.UNAUTHENTICATED);

    const pending = await makeProvider(srv, { approved: false });
    const s = connect(pending.key);
    expect((await s.next("welcome")).approvalStatus).toBe("pending");
    s.send({ case: "heartbeat", value: {} });
    const err = await s.next("error");
    expect(err.code).toBe("permission_denied");
    // Still open: a report about someone else's job is refused with its id.
    s.send({ case: "logs", value: { jobId: "job-nope", logs: [] } });
    expect(await s.next("error")).toMatchObject({ jobId: "job-nope", report: "logs" });
    // The refused kind is named, so a daemon gives up a result only when the result was refused.
    s.send({ case: "result", value: { jobId: "job-nope", success: true } });
    expect(await s.next("error")).toMatchObject({ jobId: "job-nope", report: "result" });
    s.end();
  });

  it("refuses a hello whose task_signing_key is not an Ed25519 public key", async () => {
    const p = await makeProvider(srv);
    const s = openStream(srv.port, p.key);
    streams.push(s);
    s.send({ case: "hello", value: { daemonVersion: "5.0.0", taskSigningKey: "not-a-key" } });
    expect((await s.ended).code).toBe(grpc.status.INVALID_ARGUMENT);
  });

  it("refuses a hello naming more jobs than a daemon can hold, before answering any of them", async () => {
    const p = await makeProvider(srv);
    // Each id named would be answered (a cancel for a job unknown here), held for a daemon that does not read:
    // a hello of a few megabytes made hundreds of megabytes of answers.
    const s = openStream(srv.port, p.key);
    streams.push(s);
    const ids = Array.from({ length: HELLO_MAX_JOB_IDS + 1 }, (_, i) => `job-${i}`);
    s.send({ case: "hello", value: { daemonVersion: "5.0.0", runningJobIds: ids } });
    const ended = await s.ended;
    expect(ended.code).toBe(grpc.status.INVALID_ARGUMENT);
    expect(ended.details).toBe(`hello.running_job_ids must hold at most ${HELLO_MAX_JOB_IDS} items`);
    expect(s.received).toEqual([]);
    // As many as that are taken.
    const held = connect(p.key, ids.slice(1));
    await held.next("welcome");
    expect((await held.next("cancel")).reason).toBe("unknown job");
    held.end();
  });
});

describe("jobs over the stream", () => {
  it("pushes an assignment at once, takes logs/progress/result, and settles 75/25", async () => {
    const p = await makeProvider(srv);
    const renter = await makeRenter(srv, 1_000);
    const s = connect(p.key);
    await s.next("welcome");
    const submitted = await submit(renter);
    expect(submitted.provider_id).toBe(p.id);
    const job = await s.next("job", 5_000);
    expect(job.jobId).toBe(submitted.job_id);
    expect(job.jobType).toBe("benchmark");
    expect(verifyTask(HMAC_SECRET, job.taskSpec, job.taskSpecHmac)).toBe(true);

    s.send({ case: "jobAccepted", value: { jobId: job.jobId } });
    s.send({ case: "logs", value: { jobId: job.jobId, logs: [{ kind: { case: "stringValue", value: "line one" } }, { kind: { case: "stringValue", value: "line two" } }] as never } });
    s.send({ case: "progress", value: { jobId: job.jobId, progressPct: 50, phase: "matmul" } });
    s.send({ case: "event", value: { eventType: "job_started", jobId: job.jobId } });
    s.send({ case: "result", value: { jobId: job.jobId, success: true, result: { kind: { case: "structValue", value: { fields: { response: { kind: { case: "stringValue", value: "ok" } } } } } } as never, metrics: { duration_seconds: 3 } } });
    const ack = await s.next("resultAck");
    expect(ack).toMatchObject({ success: true, jobId: job.jobId, status: "completed", actualMinutes: 1n, costHalala: 10n, providerEarnedHalala: 7n, platformFeeHalala: 3n });

    const logs = await api.get(`/api/jobs/${job.jobId}/logs`, renter.headers);
    expect(logs.body.logs.map((l: { message: string }) => l.message)).toEqual(["line one", "line two"]);
    const out = await api.get(`/api/jobs/${job.jobId}/output`, renter.headers);
    expect(out.status).toBe(200);
    expect(out.body.response).toBe("ok");
    const events = await srv.sql`SELECT event_type FROM daemon_events WHERE provider_id = ${p.id}`;
    expect(events.map((e) => e.event_type)).toContain("job_started");
    const bal = await api.get("/api/renters/balance", renter.headers);
    expect(bal.body.balance_halala).toBe(990);
    expect(bal.body.held_halala).toBe(0);
    expect(await ledgerProblems(srv.sql)).toEqual([]);
    // A repeated result answers the same figures and moves no money.
    s.send({ case: "result", value: { jobId: job.jobId, success: true } });
    expect((await s.next("resultAck")).costHalala).toBe(10n);
    expect((await api.get("/api/renters/balance", renter.headers)).body.balance_halala).toBe(990);
    s.end();
  });

  it("pushes a job too large to ride in the assignment notice, read from the database, signed", async () => {
    const p = await makeProvider(srv);
    const renter = await makeRenter(srv, 1_000);
    const s = connect(p.key);
    await s.next("welcome");
    // Queued at submit and assigned from another connection, so that only the notice tells this process
    // (the submitting process pushes its own submit's job from memory).
    await srv.sql`UPDATE providers SET is_paused = true WHERE id = ${p.id}`;
    const submitted = await submit(renter, { job_type: "llm-inference", params: { prompt: "y".repeat(9000) } });
    expect(submitted.status).toBe("queued");
    await srv.sql`UPDATE providers SET is_paused = false WHERE id = ${p.id}`;
    await dispatchQueued(srv.sql);
    const job = await s.next("job", 5_000);
    expect(job.jobId).toBe(submitted.job_id);
    expect((job.taskSpec as { inputs: { prompt: string } }).inputs.prompt).toHaveLength(9000);
    expect(verifyTask(HMAC_SECRET, job.taskSpec, job.taskSpecHmac)).toBe(true);
    s.end();
  });

  it("pushes the same signed task to a stream in the Connect protocol's JSON codec as to a binary one", async () => {
    const [p, q] = [await makeProvider(srv), await makeProvider(srv)];
    const renter = await makeRenter(srv, 1_000);
    const gpuRequirements = { min_vram_gb: 8, gpu_model: "RTX" };
    // A JSON stream (the binary codec's pre-encoded task spec would be lost on this one).
    const transport = createConnectTransport({ baseUrl: srv.url, httpVersion: "2", useBinaryFormat: false });
    const requests = new AsyncQueue<MessageInitShape<typeof DaemonMessageSchema>>();
    const abort = new AbortController();
    const responses = createClient(DaemonService, transport).connect(requests, { headers: { "x-provider-key": q.key }, signal: abort.signal })[Symbol.asyncIterator]();
    requests.push({ kind: { case: "hello", value: { daemonVersion: "5.0.0", gpus: [{ name: "NVIDIA GeForce RTX 4090", vram_mib: 24564 }] as never } } });
    const nextOf = async (kind: string) => {
      for (;;) {
        const m = await responses.next();
        if (m.done) throw new Error("stream ended");
        if (m.value.kind.case === kind) return m.value;
      }
    };
    await nextOf("welcome");
    const s = connect(p.key);
    await s.next("welcome");
    try {
      const a = await submit(renter, { provider_id: p.id, gpu_requirements: gpuRequirements });
      const b = await submit(renter, { provider_id: q.id, gpu_requirements: gpuRequirements });
      const binary = await s.next("job", 5_000);
      const json = await nextOf("job");
      if (json.kind.case !== "job") throw new Error("not a job");
      expect([binary.jobId, json.kind.value.jobId]).toEqual([a.job_id, b.job_id]);
      for (const job of [binary, json.kind.value]) {
        expect(job.taskSpec).toMatchObject({ job_id: job.jobId, job_type: "benchmark" });
        expect(job.gpuRequirements).toEqual(gpuRequirements);
        expect(verifyTask(HMAC_SECRET, job.taskSpec, job.taskSpecHmac)).toBe(true);
      }
      const [rowA, rowB] = await Promise.all([a, b].map(async (j) => (await srv.sql<{ task_spec: unknown }[]>`SELECT task_spec FROM jobs WHERE job_id = ${j.job_id}`)[0].task_spec));
      expect(binary.taskSpec).toEqual(rowA);
      expect(json.kind.value.taskSpec).toEqual(rowB);
    } finally {
      s.end();
      requests.close();
      abort.abort();
    }
  });

  it("pushes the submit's own assignment from the submitting process, without waiting for its notice, and once", async () => {
    const p = await makeProvider(srv);
    await srv.sql`UPDATE providers SET gpu_count = 2, approved_gpu_count = 2 WHERE id = ${p.id}`;
    const renter = await makeRenter(srv, 1_000);
    const s = connect(p.key);
    await s.next("welcome");
    const hub = jobSignalHub(srv.app.sql, srv.app.deps.log);
    const heard: string[] = [];
    let unsubscribe = () => {};
    // Without notices (this process no longer listens), the submit still reaches the stream.
    await hub.stop();
    try {
      const first = await submit(renter);
      expect((await s.next("job", 5_000)).jobId).toBe(first.job_id);
    } finally {
      // Listening again, as a new stream starts it.
      unsubscribe = await hub.subscribe(p.id, { assigned: (jobId) => heard.push(jobId), cancel: () => {}, settings: () => {}, resync: () => {} });
    }
    try {
      const second = await submit(renter);
      expect((await s.next("job", 5_000)).jobId).toBe(second.job_id);
      // Its notice comes too (heard here a second time) and pushes nothing more.
      await waitFor(() => heard.filter((id) => id === second.job_id).length === 2, 5_000, "the notice");
      s.send({ case: "heartbeat", value: {} });
      await s.next("heartbeatAck");
      expect(s.received.filter((m) => m.kind.case === "job" && m.kind.value.jobId === second.job_id)).toHaveLength(1);
    } finally {
      unsubscribe();
    }
    s.end();
  });

  it("reaches a provider's stream on another process through the notice, and every stream of a provider held on two processes", async () => {
    const other = await startTestServer({ SVC_JOB_SWEEP_MS: "60000" }, srv.databaseUrl);
    const notices: string[] = [];
    const listening = await srv.sql.listen(ASSIGNED_CHANNEL, (payload) => notices.push(payload));
    const noticeOf = async (jobId: string) => {
      await waitFor(() => notices.some((n) => n.includes(jobId)), 5_000, "the notice");
      return JSON.parse(notices.find((n) => n.includes(jobId))!);
    };
    try {
      const renter = await makeRenter(srv, 1_000);
      const [{ secret }] = await srv.sql<{ secret: Buffer }[]>`SELECT secret FROM server_keys WHERE name = 'task-signing-ed25519'`;
      const signer = taskSigner(secret);
      // The job as pushed, with the signature its message carries, verifies as the daemon checks it.
      const verified = (stream: TestStream, jobId: string) => {
        const m = stream.received.find((r) => r.kind.case === "job" && r.kind.value.jobId === jobId)!;
        const job = m.kind.value as { taskSpec?: unknown };
        return verifyTaskSignature(signer.publicKey, jobId, job.taskSpec, m.taskSignature);
      };

      // Only the other process holds the provider's stream: the notice carries the job, and it is pushed from it.
      const away = await makeProvider(srv);
      const remote = openStream(other.port, away.key);
      streams.push(remote);
      remote.send({ case: "hello", value: { daemonVersion: "5.0.0", runningJobIds: [], gpus: [{ name: "NVIDIA GeForce RTX 4090", vram_mib: 24564 }] } });
      await remote.next("welcome");
      const first = await submit(renter, { provider_id: away.id });
      const carried = await remote.next("job", 5_000);
      expect(carried.jobId).toBe(first.job_id);
      expect(verified(remote, first.job_id)).toBe(true);
      expect((await noticeOf(first.job_id)).job).toMatchObject({ job_id: first.job_id, task_spec: expect.any(Object) });

      // Both hold a stream of it (a daemon reconnecting before its old stream was seen to close): each gets the job.
      const both = await makeProvider(srv);
      await srv.sql`UPDATE providers SET gpu_count = 2, approved_gpu_count = 2 WHERE id = ${both.id}`;
      const here = connect(both.key);
      await here.next("welcome");
      const there = openStream(other.port, both.key);
      streams.push(there);
      there.send({ case: "hello", value: { daemonVersion: "5.0.0", runningJobIds: [], gpus: [{ name: "NVIDIA GeForce RTX 4090", vram_mib: 24564 }] } });
      await there.next("welcome");
      const second = await submit(renter, { provider_id: both.id });
      expect((await here.next("job", 5_000)).jobId).toBe(second.job_id);
      const read = await there.next("job", 5_000);
      expect(read.jobId).toBe(second.job_id);
      expect(verified(there, second.job_id)).toBe(true);
    } finally {
      await listening.unlisten();
      await other.app.close();
      await other.sql.end();
    }
  });

  it("pushes nothing for an assignment's notice that comes after the job ended on the stream", async () => {
    const p = await makeProvider(srv);
    const renter = await makeRenter(srv, 1_000);
    const s = connect(p.key);
    await s.next("welcome");
    const notices: string[] = [];
    const listening = await srv.sql.listen(ASSIGNED_CHANNEL, (payload) => notices.push(payload));
    try {
      const submitted = await submit(renter);
      const job = await s.next("job", 5_000);
      expect(job.jobId).toBe(submitted.job_id);
      await waitFor(() => notices.some((n) => n.includes(submitted.job_id)), 5_000, "the assignment's notice");
      s.send({ case: "jobAccepted", value: { jobId: job.jobId } });
      s.send({ case: "result", value: { jobId: job.jobId, success: true } });
      expect((await s.next("resultAck")).status).toBe("completed");
      // The same notice, job and all, once more: as if it had been held up until now.
      const late = notices.find((n) => n.includes(submitted.job_id))!;
      await srv.sql`SELECT pg_notify(${ASSIGNED_CHANNEL}, ${late})`;
      s.send({ case: "heartbeat", value: {} });
      await s.next("heartbeatAck");
      await new Promise((r) => setTimeout(r, 200));
      expect(s.received.filter((m) => m.kind.case === "job")).toHaveLength(1);
    } finally {
      await listening.unlisten();
    }
    s.end();
  });

  it("delivers at its next heartbeat an assignment whose notice the stream missed", async () => {
    const p = await makeProvider(srv);
    const renter = await makeRenter(srv, 1_000);
    await srv.sql`UPDATE providers SET is_paused = true, status = 'paused' WHERE id = ${p.id}`;
    const queued = await submit(renter);
    expect(queued.status).toBe("queued");
    const s = connect(p.key);
    await s.next("welcome");
    // This process stops listening: the assignment below commits with a notice nobody hears.
    await whileNotListening(srv.app, async () => {
      await srv.sql`UPDATE providers SET is_paused = false, status = 'online' WHERE id = ${p.id}`;
      expect(await dispatchQueued(srv.sql)).toBe(1);
      expect(await jobStatus(queued.job_id)).toBe("pending");
      await new Promise((r) => setTimeout(r, 200));
      expect(s.received.filter((m) => m.kind.case === "job")).toHaveLength(0);
      s.send({ case: "heartbeat", value: {} });
      await s.next("heartbeatAck");
      expect((await s.next("job", 5_000)).jobId).toBe(queued.job_id);
      // Later beats push it no more.
      s.send({ case: "heartbeat", value: {} });
      await s.next("heartbeatAck");
      s.send({ case: "heartbeat", value: {} });
      await s.next("heartbeatAck");
      await new Promise((r) => setTimeout(r, 100));
      expect(s.received.filter((m) => m.kind.case === "job")).toHaveLength(1);
    });
    s.end();
  });

  it("delivers jobs assigned while away on reconnect, never twice, and hands back lost ones", async () => {
    const p = await makeProvider(srv);
    const renter = await makeRenter(srv, 1_000);
    const a = await submit(renter);
    expect(a.status).toBe("pending");

    // First stream: gets the backlog, but drops before accepting it.
    const s1 = connect(p.key);
    expect((await s1.next("job")).jobId).toBe(a.job_id);
    s1.cancel();

    // Second stream: the same job again (never accepted), accepted this time.
    const s2 = connect(p.key);
    expect((await s2.next("job")).jobId).toBe(a.job_id);
    s2.send({ case: "jobAccepted", value: { jobId: a.job_id } });
    await waitFor(async () => (await jobStatus(a.job_id)) === "running", 5_000, "running");
    s2.cancel();

    // Third stream: the daemon still runs it; nothing is pushed twice.
    const s3 = connect(p.key, [a.job_id]);
    await s3.next("welcome");
    s3.send({ case: "heartbeat", value: {} });
    await s3.next("heartbeatAck");
    await new Promise((r) => setTimeout(r, 200));
    expect(s3.received.filter((m) => m.kind.case === "job")).toHaveLength(0);
    expect(await jobStatus(a.job_id)).toBe("running");
    s3.cancel();

    // Fourth stream: the daemon restarted without it; the job is handed back to the queue.
    const s4 = connect(p.key, []);
    await s4.next("welcome");
    await waitFor(async () => (await srv.sql`SELECT attempt FROM jobs WHERE job_id = ${a.job_id}`)[0].attempt === 2, 5_000, "second attempt");
    const history = await api.get(`/api/jobs/${a.job_id}/history`, renter.headers);
    expect(history.body.attempts[0], JSON.stringify(history.body)).toMatchObject({ attempt: 1 });
    expect(history.body.attempts[0].end_reason ?? history.body.attempts[0].status, JSON.stringify(history.body)).toBe("provider_interrupted");
    s4.cancel();
  });

  it("pushes a job again to a stream that sent a refused result for its earlier attempt", async () => {
    const p = await makeProvider(srv);
    const renter = await makeRenter(srv, 1_000);
    const a = await submit(renter);
    const s1 = connect(p.key);
    expect((await s1.next("job")).jobId).toBe(a.job_id);
    s1.send({ case: "jobAccepted", value: { jobId: a.job_id } });
    await waitFor(async () => (await jobStatus(a.job_id)) === "running", 5_000, "running");
    s1.cancel();

    // The daemon comes back without naming the job: it is handed back, and its late result is refused.
    const s2 = connect(p.key, []);
    await s2.next("welcome");
    await waitFor(async () => (await srv.sql`SELECT attempt FROM jobs WHERE job_id = ${a.job_id}`)[0].attempt === 2, 5_000, "second attempt");
    s2.send({ case: "result", value: { jobId: a.job_id, success: true } });
    expect(await s2.next("error")).toMatchObject({ jobId: a.job_id, report: "result" });

    // Beating again makes the provider a candidate for the job's new attempt, on this same stream.
    s2.send({ case: "heartbeat", value: {} });
    await s2.next("heartbeatAck");
    await waitFor(async () => {
      await dispatchQueued(srv.sql);
      return (await jobStatus(a.job_id)) === "pending";
    }, 5_000, "assigned again");
    expect((await s2.next("job")).jobId).toBe(a.job_id);
    s2.send({ case: "jobAccepted", value: { jobId: a.job_id } });
    await waitFor(async () => (await jobStatus(a.job_id)) === "running", 5_000, "running again");
    s2.cancel();
  });

  it("tells the daemon to stop a job the renter cancelled, and re-queues a rejected job", async () => {
    const p = await makeProvider(srv);
    const renter = await makeRenter(srv, 1_000);
    const s = connect(p.key);
    await s.next("welcome");
    const j = await submit(renter);
    await s.next("job");
    s.send({ case: "jobAccepted", value: { jobId: j.job_id } });
    await waitFor(async () => (await jobStatus(j.job_id)) === "running", 5_000, "running");
    expect((await api.post(`/api/jobs/${j.job_id}/cancel`, {}, renter.headers)).status).toBe(200);
    const cancel = await s.next("cancel");
    expect(cancel.jobId).toBe(j.job_id);

    const k = await submit(renter);
    expect((await s.next("job")).jobId).toBe(k.job_id);
    // A second provider comes online; the job p refuses goes there (never back to p), pushed at once.
    const p2 = await makeProvider(srv);
    const s2 = connect(p2.key);
    await s2.next("welcome");
    s.send({ case: "jobRejected", value: { jobId: k.job_id, reason: "temperature limit" } });
    expect((await s2.next("job")).jobId).toBe(k.job_id);
    const row = (await srv.sql`SELECT attempt, provider_id FROM jobs WHERE job_id = ${k.job_id}`)[0];
    expect(row).toMatchObject({ attempt: 2, provider_id: p2.id });
    s.end();
    s2.end();
  });

  it("takes back a job its paused provider hands back, keeping the attempt in its history, and pushes it again once the provider resumes", async () => {
    const p = await makeProvider(srv);
    const renter = await makeRenter(srv, 1_000);
    const s = connect(p.key);
    await s.next("welcome");
    const j = await submit(renter, { provider_id: p.id });
    expect((await s.next("job")).jobId).toBe(j.job_id);
    // Paused with the job pushed and not accepted: its daemon hands the job back (daemon.ts refusal()).
    expect((await api.post("/api/providers/pause", { key: p.key })).status).toBe(200);
    s.send({ case: "jobRejected", value: { jobId: j.job_id, reason: "the provider is paused", attempt: 1 } });
    await waitFor(async () => (await jobStatus(j.job_id)) === "queued", 5_000, "handed back");
    // Resumed: assigned to it again as the next attempt, and pushed on the same stream.
    expect((await api.post("/api/providers/resume", { key: p.key })).status).toBe(200);
    expect((await s.next("job", 5_000)).jobId).toBe(j.job_id);
    const attempts = await srv.sql`
      SELECT attempt, status, end_reason, fault FROM job_attempts WHERE job_id = (SELECT id FROM jobs WHERE job_id = ${j.job_id}) ORDER BY attempt`;
    expect(attempts).toEqual([
      { attempt: 1, status: "requeued", end_reason: "provider_paused", fault: "none" },
      { attempt: 2, status: "pending", end_reason: null, fault: null },
    ]);
    s.end();
  });

  it("re-queues a job the provider interrupted, at no charge, and offers it back to that provider only once it heartbeats again", async () => {
    const p = await makeProvider(srv);
    const renter = await makeRenter(srv, 1_000);
    const s = connect(p.key);
    await s.next("welcome");
    const j = await submit(renter);
    await s.next("job");
    s.send({ case: "jobAccepted", value: { jobId: j.job_id } });
    await waitFor(async () => (await jobStatus(j.job_id)) === "running", 5_000, "running");
    s.send({ case: "jobRejected", value: { jobId: j.job_id, reason: "the provider's daemon was stopped while the job ran", interrupted: true } });
    const row = await waitFor(async () => (await srv.sql`SELECT * FROM jobs WHERE job_id = ${j.job_id} AND attempt = 2`)[0], 5_000, "re-queued");
    expect(row).toMatchObject({ status: "queued", provider_id: null });
    const [first] = await srv.sql`SELECT status, end_reason, error, cost_halala FROM job_attempts WHERE job_id = ${row.id} AND attempt = 1`;
    expect(first).toMatchObject({ status: "requeued", end_reason: "provider_interrupted" });
    expect(first.error).toMatch(/interrupted the job/);
    expect((await api.get("/api/renters/balance", renter.headers)).body.balance_halala).toBe(1_000);
    // Still live by its last heartbeat, but its daemon went away: the queue does not hand the job back to it...
    await dispatchQueued(srv.sql);
    expect(await jobStatus(j.job_id)).toBe("queued");
    // ...until it heartbeats again (its daemon is back).
    await new Promise((r) => setTimeout(r, 5));
    s.send({ case: "heartbeat", value: {} });
    await s.next("heartbeatAck");
    await waitFor(async () => {
      await dispatchQueued(srv.sql);
      return (await jobStatus(j.job_id)) === "pending";
    }, 5_000, "offered again after a heartbeat");
    expect((await s.next("job")).jobId).toBe(j.job_id);
    expect(await ledgerProblems(srv.sql)).toEqual([]);
    s.end();
  });
});

describe("shutdown", () => {
  it("sends a drain notice and closes the stream cleanly", async () => {
    const own = await startTestServer();
    const p = await makeProvider(own);
    const s = openStream(own.port, p.key);
    s.send({ case: "hello", value: { daemonVersion: "5.0.0" } });
    await s.next("welcome");
    const closing = own.close();
    const drain = await s.next("drain");
    expect(drain.reconnectAfterMs).toBeGreaterThanOrEqual(1000);
    const ended = await s.ended;
    expect(ended.code === undefined || ended.code === grpc.status.OK).toBe(true);
    await closing;
  });
});
