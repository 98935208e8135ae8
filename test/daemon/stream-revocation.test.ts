// A daemon stream whose key is revoked ends both ways: its answers end with
// UNAUTHENTICATED, and nothing it sent is taken afterwards: neither a report
// read ahead of the implementation nor one sent on a wire (Connect's protocol,
// JSON codec) where the client may go on sending on its half of the HTTP/2
// stream after the answers ended.
import http2 from "node:http2";
import * as grpc from "@grpc/grpc-js";
import { describe, expect, it } from "vitest";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { client } from "../helpers/http.js";
import { openStream, useStreamServer } from "./grpc-stream.js";
import { waitFor } from "./helpers.js";

const { srv, streams } = useStreamServer();
const api = client(srv);

/** One message of Connect's streaming protocol (flag byte, length, JSON). */
function envelope(message: unknown): Buffer {
  const body = Buffer.from(JSON.stringify(message));
  const head = Buffer.alloc(5);
  head.writeUInt32BE(body.length, 1);
  return Buffer.concat([head, body]);
}

describe("a daemon stream whose key is revoked", () => {
  it("takes no report sent on it after its answers ended", async () => {
    const p = await makeProvider(srv);
    const renter = await makeRenter(srv, 1_000);
    const session = http2.connect(srv.url);
    session.on("error", () => {});
    const stream = session.request({
      ":method": "POST",
      ":path": "/svc.v1.DaemonService/Connect",
      "content-type": "application/connect+json",
      "x-provider-key": p.key,
    });
    stream.on("error", () => {});
    let received = "";
    let answersEnded = false;
    stream.on("data", (chunk: Buffer) => (received += chunk.toString("utf8")));
    stream.on("end", () => (answersEnded = true));
    try {
      stream.write(envelope({ hello: { daemonVersion: "5.0.0" } }));
      await waitFor(async () => received.includes('"welcome"'), 5_000, "welcome");
      const submitted = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 1, params: { suite: "quick", iterations: 1 } }, renter.headers);
      expect(submitted.status, submitted.text).toBe(201);
      const jobId: string = submitted.body.job.job_id;
      await waitFor(async () => received.includes(jobId), 5_000, "the job pushed");

      expect((await api.post("/api/providers/rotate-key", undefined, { "x-provider-key": p.key })).status).toBe(200);
      await waitFor(async () => answersEnded, 5_000, "the answers ended");
      expect(received).toContain('"unauthenticated"');

      // The old key's daemon goes on sending: an accept, progress, a result.
      stream.write(envelope({ jobAccepted: { jobId } }));
      stream.write(envelope({ progress: { jobId, progressPct: 50 } }));
      stream.write(envelope({ result: { jobId, success: true, result: { response: "ok" } } }));
      await new Promise((r) => setTimeout(r, 1_000));
      const [job] = await srv.sql<{ status: string; progress_pct: number | null }[]>`SELECT status, progress_pct FROM jobs WHERE job_id = ${jobId}`;
      expect(job).toMatchObject({ status: "pending", progress_pct: null });
      const balance = await api.get("/api/renters/balance", renter.headers);
      expect(balance.body.balance_halala).toBe(1_000);
    } finally {
      stream.close();
      session.close();
    }
  });

  it("takes none of the reports read ahead of it once the key is revoked", async () => {
    const p = await makeProvider(srv);
    const renter = await makeRenter(srv, 1_000);
    const s = openStream(srv.port, p.key);
    streams.push(s);
    s.send({ case: "hello", value: { daemonVersion: "5.0.0" } });
    await s.next("welcome");
    const submitted = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 1, params: { suite: "quick", iterations: 1 } }, renter.headers);
    expect(submitted.status, submitted.text).toBe(201);
    const jobId: string = (await s.next("job")).jobId;

    // The job's row held locked: the stream's progress report waits for it, and the accept behind it is read ahead.
    let release!: () => void;
    const held = new Promise<void>((resolve) => (release = resolve));
    let locked!: () => void;
    const isLocked = new Promise<void>((resolve) => (locked = resolve));
    const tx = srv.sql.begin(async (t) => {
      await t`SELECT id FROM jobs WHERE job_id = ${jobId} FOR UPDATE`;
      locked();
      await held;
    });
    try {
      await isLocked;
      s.send({ case: "progress", value: { jobId, progressPct: 10 } });
      s.send({ case: "jobAccepted", value: { jobId } });
      await waitFor(async () => (await srv.sql`SELECT 1 FROM pg_locks WHERE locktype IN ('transactionid', 'tuple') AND NOT granted`).length > 0, 5_000, "the report waiting for the row");

      expect((await api.post("/api/providers/rotate-key", undefined, { "x-provider-key": p.key })).status).toBe(200);
      expect((await s.ended).code).toBe(grpc.status.UNAUTHENTICATED);
    } finally {
      release();
      await tx;
    }
    await new Promise((r) => setTimeout(r, 1_000));
    const [job] = await srv.sql<{ status: string }[]>`SELECT status FROM jobs WHERE job_id = ${jobId}`;
    expect(job.status).toBe("pending");
  });
});
