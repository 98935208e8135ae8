// What a daemon stream takes of its reports. With rate limits on, its
// heartbeat messages are counted in windows of the rate table's heartbeat row,
// and a beat over the row is refused with a StreamError (resource_exhausted)
// before any work is done for it, while the stream stays open; its other
// reports without a budget of their own (readiness, job reports, results) are
// counted so in windows of the default row, and its refusals but results' are
// answered at that row's rate. A job's progress is written
// PROGRESS_WRITES_PER_SECOND times a second at most; past that the latest
// report waits for the next second, or for the job's result. A daemon that
// does not read its answers is not read either once OUT_QUEUE_HIGH_WATER wait.
import http2 from "node:http2";
import { create, toBinary, type MessageInitShape } from "@bufbuild/protobuf";
import { afterAll, describe, expect, it } from "vitest";
import { DaemonMessageSchema } from "../../gen/svc/v1/daemon_pb.js";
import { startTestServer, useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { OUT_QUEUE_HIGH_WATER, PROGRESS_WRITES_PER_SECOND } from "../../src/services/daemon.js";
import { openStream, type TestStream } from "./grpc-stream.js";
import { waitFor } from "./helpers.js";
import { flushHeartbeats } from "../providers/helpers.js";

const streams: TestStream[] = [];

// 3 heartbeats per 2 s, so that a window ends within the test.
const srv = useTestServer({ SVC_RATE_LIMITS: "on", SVC_RATE_LIMIT_OVERRIDES: "heartbeat=3/2" });
afterAll(() => {
  for (const s of streams) s.cancel();
});

async function connect(key: string) {
  const s = openStream(srv.port, key);
  streams.push(s);
  s.send({ case: "hello", value: { daemonVersion: "5.0.0" } });
  await s.next("welcome");
  return s;
}

/** The answers to the stream's heartbeats so far, in order: "ack" or the refusal's code. */
const answers = (s: TestStream) =>
  s.received.flatMap((m) =>
    m.kind.case === "heartbeatAck" ? ["ack"] : m.kind.case === "error" && m.kind.value.report === "heartbeat" ? [m.kind.value.code] : [],
  );

const lastBeatOf = async (id: number) => {
  const [r] = await srv.sql<{ last_heartbeat: Date | null }[]>`SELECT last_heartbeat FROM providers WHERE id = ${id}`;
  return r.last_heartbeat;
};

describe("daemon stream: the heartbeat row of the rate table", () => {
  it("refuses the beats over the row, keeps the stream open, and counts again in the next window", async () => {
    const p = await makeProvider(srv);
    const s = await connect(p.key);
    for (let i = 0; i < 5; i++) s.send({ case: "heartbeat", value: { daemonVersion: "5.0.0" } });
    await waitFor(() => answers(s).length === 5, 10_000);
    expect(answers(s)).toEqual(["ack", "ack", "ack", "resource_exhausted", "resource_exhausted"]);
    const refusal = s.received.find((m) => m.kind.case === "error")!.kind.value as { message: string; report: string };
    expect(refusal.message).toMatch(/too many heartbeats on this stream: at most 3 per 2 s; beat again in [12] s/);

    // Another provider's stream has its own count.
    const other = await makeProvider(srv);
    const o = await connect(other.key);
    o.send({ case: "heartbeat", value: {} });
    await waitFor(() => answers(o).length === 1, 10_000);
    expect(answers(o)).toEqual(["ack"]);

    // The refused stream is still open; after the window its beats are answered again.
    await new Promise((r) => setTimeout(r, 2100));
    s.send({ case: "heartbeat", value: { daemonVersion: "5.0.0" } });
    await waitFor(() => answers(s).length === 6, 10_000);
    expect(answers(s)[5]).toBe("ack");
    expect(await Promise.race([s.ended.then(() => "ended"), new Promise((r) => setTimeout(() => r("open"), 100))])).toBe("open");
    await flushHeartbeats(srv);
    expect(await lastBeatOf(p.id)).not.toBeNull();
  });
});

describe("daemon stream: rate limits off", () => {
  it("answers every heartbeat", async () => {
    const off = await startTestServer({});
    try {
      const p = await makeProvider(off);
      const s = openStream(off.port, p.key);
      streams.push(s);
      s.send({ case: "hello", value: { daemonVersion: "5.0.0" } });
      await s.next("welcome");
      for (let i = 0; i < 8; i++) s.send({ case: "heartbeat", value: {} });
      await waitFor(() => answers(s).length === 8, 10_000);
      expect(answers(s)).toEqual(Array(8).fill("ack"));
    } finally {
      await off.close();
    }
  });
});

describe("daemon stream: progress reports", () => {
  it("writes a job's first reports of a second at once, then only the latest, and the waiting one before the result", async () => {
    const srv2 = await startTestServer({});
    try {
      const p = await makeProvider(srv2);
      const renter = await makeRenter(srv2, 1_000);
      const s = openStream(srv2.port, p.key);
      streams.push(s);
      s.send({ case: "hello", value: { daemonVersion: "5.0.0", gpus: [{ name: "NVIDIA GeForce RTX 4090", vram_mib: 24564 }] } });
      await s.next("welcome");
      const submitted = await client(srv2.url).post(
        "/api/jobs/submit",
        { job_type: "benchmark", duration_minutes: 1, params: { suite: "quick", iterations: 1 }, provider_id: p.id },
        renter.headers,
      );
      expect(submitted.status, submitted.text).toBe(201);
      const job = await s.next("job", 5_000);
      s.send({ case: "jobAccepted", value: { jobId: job.jobId } });
      const progressOf = async () =>
        (await srv2.sql<{ progress_pct: number | null; progress_phase: string | null }[]>`
          SELECT progress_pct, progress_phase FROM jobs WHERE job_id = ${job.jobId}`)[0];

      const n = PROGRESS_WRITES_PER_SECOND;
      const started = Date.now();
      for (let pct = 1; pct <= 3 * n; pct++) s.send({ case: "progress", value: { jobId: job.jobId, progressPct: pct, phase: `step ${pct}` } });
      // The first n are written at once; of the rest only the last, once the second is over.
      await waitFor(async () => (await progressOf()).progress_pct === n, 5_000);
      const early = await progressOf();
      if (Date.now() - started < 800) expect(early).toEqual({ progress_pct: n, progress_phase: `step ${n}` });
      await waitFor(async () => (await progressOf()).progress_pct === 3 * n, 5_000);
      expect(Date.now() - started).toBeGreaterThanOrEqual(950);
      expect(await progressOf()).toEqual({ progress_pct: 3 * n, progress_phase: `step ${3 * n}` });

      // Past the count again, a result writes the waiting report first: the job ends on its last progress.
      for (let pct = 31; pct <= 30 + n; pct++) s.send({ case: "progress", value: { jobId: job.jobId, progressPct: pct, phase: `step ${pct}` } });
      s.send({ case: "progress", value: { jobId: job.jobId, progressPct: 100, phase: "done" } });
      s.send({ case: "result", value: { jobId: job.jobId, success: true } });
      expect((await s.next("resultAck")).status).toBe("completed");
      expect(await progressOf()).toEqual({ progress_pct: 100, progress_phase: "done" });
      await new Promise((r) => setTimeout(r, 1200));
      expect(s.received.filter((m) => m.kind.case === "error")).toEqual([]);
    } finally {
      await srv2.close();
    }
  });
});

describe("daemon stream: the default row of the rate table", () => {
  // 4 reports per 2 s, so that a window ends within the test.
  const limited = useTestServer({ SVC_RATE_LIMITS: "on", SVC_RATE_LIMIT_OVERRIDES: "default=4/2" });
  const versionOf = async (id: number) => (await limited.sql<{ daemon_version: string | null }[]>`SELECT daemon_version FROM providers WHERE id = ${id}`)[0].daemon_version;
  const readiness = (i: number) => ({ case: "readiness", value: { daemonVersion: `5.0.${i}`, checks: { cuda: true } } }) as const;

  it("refuses readiness past the row, answers refusals at its rate but every refused result, and takes reports again in the next window", async () => {
    const p = await makeProvider(limited);
    const s = openStream(limited.port, p.key);
    streams.push(s);
    s.send({ case: "hello", value: { daemonVersion: "5.0.0" } });
    await s.next("welcome");
    for (let i = 1; i <= 10; i++) s.send(readiness(i));
    s.send({ case: "result", value: { jobId: "job-never-1", success: true } });
    s.send({ case: "result", value: { jobId: "job-never-2", success: true } });
    // Answered in order: once its ack is here, every answer to the reports before it is too.
    s.send({ case: "heartbeat", value: {} });
    await s.next("heartbeatAck");

    expect(await versionOf(p.id)).toBe("5.0.4");
    const errors = s.received.flatMap((m) => (m.kind.case === "error" ? [m.kind.value] : []));
    // 6 readiness reports refused, 4 of them answered (the row's rate); both results answered.
    expect(errors.map((e) => [e.report, e.code, e.jobId])).toEqual([
      ...Array(4).fill(["readiness", "resource_exhausted", ""]),
      ["result", "resource_exhausted", "job-never-1"],
      ["result", "resource_exhausted", "job-never-2"],
    ]);
    expect(errors[0].message).toMatch(/too many reports on this stream \(this one: readiness\): at most 4 per 2 s .*send again in [12] s/);

    // The stream stays open; after the window its reports are taken again.
    await new Promise((r) => setTimeout(r, 2100));
    s.send(readiness(11));
    await waitFor(async () => (await versionOf(p.id)) === "5.0.11", 5_000);
  });
});

/** A gRPC message frame: uncompressed, its length, its bytes. */
function frame(bytes: Uint8Array): Buffer {
  const out = Buffer.alloc(5 + bytes.length);
  out.writeUInt32BE(bytes.length, 1);
  out.set(bytes, 5);
  return out;
}

describe("daemon stream: a daemon that does not read its answers", () => {
  it("is not read either while its answers wait, and is read again once it reads them", async () => {
    const off = await startTestServer({});
    // A client whose window for the server's data is 0 until it widens it.
    const h2 = http2.connect(off.url, { settings: { initialWindowSize: 0 } });
    try {
      const p = await makeProvider(off);
      const req = h2.request({
        ":method": "POST",
        ":path": "/svc.v1.DaemonService/Connect",
        "content-type": "application/grpc+proto",
        te: "trailers",
        "x-provider-key": p.key,
      });
      req.on("error", () => {});
      const message = (kind: MessageInitShape<typeof DaemonMessageSchema>["kind"]) => frame(toBinary(DaemonMessageSchema, create(DaemonMessageSchema, { kind })));
      req.write(message({ case: "hello", value: { daemonVersion: "5.0.0" } }));
      // Empty messages, each refused with an answer: far more answers than the stream holds (nor the socket).
      req.write(Buffer.alloc(5 * 3 * OUT_QUEUE_HIGH_WATER));
      req.write(message({ case: "readiness", value: { daemonVersion: "9.9.9", checks: { cuda: true } } }));
      const versionOf = async () => (await off.sql<{ daemon_version: string | null }[]>`SELECT daemon_version FROM providers WHERE id = ${p.id}`)[0].daemon_version;
      await new Promise((r) => setTimeout(r, 1500));
      expect(await versionOf()).not.toBe("9.9.9");

      // Reading its answers, the daemon is read again.
      req.on("data", () => {});
      h2.settings({ initialWindowSize: 1 << 20 });
      await waitFor(async () => (await versionOf()) === "9.9.9", 10_000);
      req.close();
    } finally {
      h2.destroy();
      await off.close();
    }
  });
});
