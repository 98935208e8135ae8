// svc following a job whose connection is lost right after the job's last
// event (its outcome) reached svc, before the stream's own end did: the job's
// end is known, so svc finishes as for a stream that ended (the result
// printed, the exit code the job's), instead of failing on the lost close.
// The proxy in front of the server forwards its HTTP/2 frames up to the one
// that completes the outcome event, then closes the connection.
import net from "node:net";
import { afterEach, describe, expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { runSvc } from "./run-svc.js";

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000" });

/** JobEvent's `outcome` (field 7, length-delimited), after its `cursor` (field 1). */
const OUTCOME_TAG = (7 << 3) | 2;
const CURSOR_TAG = (1 << 3) | 2;

/** Whether a JobEvent message (protobuf) is an outcome: its cursor (short here: one length byte), then the oneof. */
const isOutcome = (msg: Buffer) => {
  const i = msg[0] === CURSOR_TAG ? 2 + msg[1] : 0;
  return msg[i] === OUTCOME_TAG;
};

interface CutProxy {
  url: string;
  /** Connections it closed right after an outcome event. */
  cuts(): number;
  close(): Promise<void>;
}

/**
 * A proxy that passes the server's HTTP/2 frames (9-byte header: length, type, flags, stream) one
 * by one, reads the gRPC messages (1-byte flag, 4-byte length) in its DATA frames (type 0), and
 * closes both sides once a frame completed an outcome event: the trailers that end the stream
 * never reach the client.
 */
async function cutAfterOutcome(targetPort: number): Promise<CutProxy> {
  const sockets = new Set<net.Socket>();
  let cuts = 0;
  const server = net.createServer((client) => {
    const upstream = net.connect(targetPort, "127.0.0.1");
    sockets.add(client).add(upstream);
    const drop = () => {
      client.destroy();
      upstream.destroy();
    };
    client.on("error", drop).on("close", drop);
    upstream.on("error", drop).on("close", drop);
    client.pipe(upstream);
    let frames = Buffer.alloc(0);
    let messages = Buffer.alloc(0);
    upstream.on("data", (chunk: Buffer) => {
      frames = Buffer.concat([frames, chunk]);
      while (frames.length >= 9 && frames.length >= 9 + frames.readUIntBE(0, 3)) {
        const frame = frames.subarray(0, 9 + frames.readUIntBE(0, 3));
        frames = frames.subarray(frame.length);
        client.write(frame);
        if (frame[3] !== 0) continue;
        messages = Buffer.concat([messages, frame.subarray(9)]);
        let outcome = false;
        while (messages.length >= 5 && messages.length >= 5 + messages.readUInt32BE(1)) {
          const msg = messages.subarray(5, 5 + messages.readUInt32BE(1));
          messages = messages.subarray(5 + msg.length);
          outcome ||= isOutcome(msg);
        }
        if (outcome) {
          cuts++;
          upstream.removeAllListeners("data");
          client.end(() => drop());
          return;
        }
      }
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", () => resolve()));
  return {
    url: `http://127.0.0.1:${(server.address() as net.AddressInfo).port}`,
    cuts: () => cuts,
    async close() {
      for (const s of sockets) s.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

let proxy: CutProxy | undefined;
afterEach(async () => {
  await proxy?.close();
  proxy = undefined;
});

describe("svc following a job whose stream is cut right after its outcome", { timeout: 120_000 }, () => {
  it("prints the result and exits as the job ended: 0 completed, 1 cancelled; --json and logs -f alike", async () => {
    const api = client(srv.url);
    const renter = await makeRenter(srv, 10_000);
    const provider = await makeProvider(srv);
    const sub = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 2, provider_id: provider.id }, renter.headers);
    expect(sub.status, sub.text).toBe(201);
    const completed: string = sub.body.job.job_id;
    await api.get(`/api/providers/${provider.key}/jobs`);
    const done = await api.post("/api/providers/job-result", { api_key: provider.key, job_id: completed, success: true, result: { scores: { gflops: 3.5 } } });
    expect(done.status, done.text).toBe(200);
    const sub2 = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 2 }, renter.headers);
    const cancelled: string = sub2.body.job.job_id;
    expect((await api.post(`/api/jobs/${cancelled}/cancel`, {}, renter.headers)).status).toBe(200);

    proxy = await cutAfterOutcome(srv.port);
    const env = { SVC_URL: proxy.url, SVC_KEY: renter.key };

    const watched = await runSvc(["jobs", "watch", completed], { env });
    expect(watched.code, watched.stdout + watched.stderr).toBe(0);
    expect(watched.stdout).toMatch(/result: completed/);
    expect(watched.stdout).toMatch(/cost: 10 halala/);
    expect(watched.stderr).toBe("");

    const json = await runSvc(["--json", "jobs", "watch", completed], { env });
    expect(json.code, json.stdout + json.stderr).toBe(0);
    expect(JSON.parse(json.stdout.trim().split("\n").at(-1)!).outcome).toMatchObject({ status: "completed" });

    const logs = await runSvc(["jobs", "logs", "-f", cancelled], { env });
    expect(logs.code, logs.stdout + logs.stderr).toBe(1);
    expect(logs.stderr).toBe("");
    // Each run's stream was cut after its outcome (not ended by the server first).
    expect(proxy.cuts()).toBe(3);
  });
});
