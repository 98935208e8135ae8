// REST over HTTP/2 (h2c on the service's port): a client that resets its
// stream while the server waits out backpressure lets go of what the answer
// held. An event stream's watcher (and its watch slot) is released, as on
// HTTP/1.1, instead of waiting for ever to write to a stream already closed.
import http2 from "node:http2";
import { beforeEach, expect, it } from "vitest";
import { jobWatchHub } from "../../src/workers/job-watch.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { client } from "../helpers/http.js";
import { useTestServer } from "../helpers/server.js";
import { clearMarketplace } from "../jobs/helpers.js";

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000" });
const api = client(srv);
beforeEach(() => clearMarketplace(srv));

it("an event stream whose HTTP/2 client resets it mid-answer releases its watcher", async () => {
  const renter = await makeRenter(srv, 10_000);
  const provider = await makeProvider(srv);
  const submit = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 3 }, renter.headers);
  expect(submit.status, submit.text).toBe(201);
  const jobId: string = submit.body.job.job_id;
  expect((await api.get(`/api/providers/${provider.key}/jobs`)).body.job.job_id).toBe(jobId);
  // Far more than an HTTP/2 stream's window: the answer waits on the client.
  const line = (i: number) => `${String(i).padStart(4, "0")} ${"y".repeat(15_995)}`;
  for (let from = 0; from < 100; from += 50) {
    const r = await api.post(`/api/jobs/${jobId}/logs`, { api_key: provider.key, logs: Array.from({ length: 50 }, (_, i) => line(from + i)) });
    expect(r.status, r.text).toBe(200);
  }
  const hub = jobWatchHub(srv.app.sql, srv.app.deps.log);
  const session = http2.connect(srv.url);
  session.on("error", () => {});
  try {
    const req = session.request({ ":path": `/api/jobs/${jobId}/events`, "x-renter-key": renter.key });
    req.on("error", () => {});
    const status = await new Promise<number>((resolve) => req.once("response", (h) => resolve(Number(h[":status"]))));
    expect(status).toBe(200);
    // The first bytes, then nothing read: the server's writes fill the window and wait.
    await new Promise((resolve) => req.once("data", resolve));
    req.pause();
    expect(hub.watchers).toBe(1);
    await new Promise((r) => setTimeout(r, 300));
    req.close(http2.constants.NGHTTP2_CANCEL);
    await expect.poll(() => hub.watchers, { timeout: 10_000 }).toBe(0);
  } finally {
    session.destroy();
  }
});
