// A daemon stream (the standard gRPC client) welcomed for a new provider, with a job on it.
import { expect } from "vitest";
import { openStream, type TestStream } from "../daemon/grpc-stream.js";
import { makeProvider, makeRenter } from "./fixtures.js";
import { client } from "./http.js";
import type { TestServer } from "./server.js";

/**
 * A new provider's stream, said hello to and welcomed, and a benchmark job submitted for that
 * provider, pushed to the stream and accepted. The stream goes into `streams` (useStreamServer's:
 * cancelled as the test ends).
 */
export async function streamWithJob(srv: TestServer, streams: TestStream[]) {
  const p = await makeProvider(srv);
  const renter = await makeRenter(srv, 1_000);
  const s = openStream(srv.port, p.key);
  streams.push(s);
  s.send({ case: "hello", value: { daemonVersion: "5.0.0", gpus: [{ name: "NVIDIA GeForce RTX 4090", vram_mib: 24564 }] } });
  await s.next("welcome");
  const r = await client(srv).post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 1, params: { suite: "quick", iterations: 1 }, provider_id: p.id }, renter.headers);
  expect(r.status, r.text).toBe(201);
  const job = await s.next("job", 5_000);
  s.send({ case: "jobAccepted", value: { jobId: job.jobId } });
  return { p, s, jobId: job.jobId };
}
