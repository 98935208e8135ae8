// svc following a job whose connection is lost right after the job's last
// event (its outcome) reached svc, before the stream's own end did: the job's
// end is known, so svc finishes as for a stream that ended (the result
// printed, the exit code the job's), instead of failing on the lost close.
// The proxy in front of the server forwards its HTTP/2 frames up to the one
// that completes the outcome event, then closes the connection.
import { afterEach, describe, expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { frameProxy, type FrameProxy } from "./proxy.js";
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

/**
 * A proxy that passes the server's HTTP/2 frames one by one, reads the gRPC messages (1-byte flag,
 * 4-byte length) in its DATA frames (type 0), and closes the connection once a frame completed an
 * outcome event: the trailers that end the stream never reach the client.
 */
const cutAfterOutcome = (targetPort: number): Promise<FrameProxy> =>
  frameProxy(targetPort, () => {
    let messages = Buffer.alloc(0);
    return (frame) => {
      if (frame[3] !== 0) return "pass";
      messages = Buffer.concat([messages, frame.subarray(9)]);
      let outcome = false;
      while (messages.length >= 5 && messages.length >= 5 + messages.readUInt32BE(1)) {
        const msg = messages.subarray(5, 5 + messages.readUInt32BE(1));
        messages = messages.subarray(5 + msg.length);
        outcome ||= isOutcome(msg);
      }
      return outcome ? "last" : "pass";
    };
  });

let proxy: FrameProxy | undefined;
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
