// A serving job's endpoint reported as a port alone (endpoint-ready without
// endpoint_url): the server joins it to the provider's address its heartbeats
// reported, else to the address the report itself came from (daemons seldom
// know their own), on both wires.
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { openStream, type TestStream } from "../daemon/grpc-stream.js";
import { waitFor } from "../daemon/helpers.js";
import { clearMarketplace, pickUp } from "./helpers.js";

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0" });
const api = client(srv);
const streams: TestStream[] = [];
beforeEach(() => clearMarketplace(srv));
afterEach(() => {
  for (const s of streams.splice(0)) s.cancel();
});

const endpointOf = async (jobId: string) => (await srv.sql<{ endpoint_url: string | null }[]>`SELECT endpoint_url FROM jobs WHERE job_id = ${jobId}`)[0].endpoint_url;

/** A renter's vllm_serve job pinned to a fresh provider whose heartbeats reported `ip` (null: none). */
async function servingJob(ip: string | null) {
  const provider = await makeProvider(srv, { vramMib: 81920, gpuModel: "NVIDIA H100 80GB HBM3" });
  await srv.sql`UPDATE providers SET provider_ip = ${ip} WHERE id = ${provider.id}`;
  const renter = await makeRenter(srv, 100_000);
  const r = await api.post("/api/jobs/submit", { job_type: "vllm_serve", provider_id: provider.id, duration_minutes: 10 }, renter.headers);
  expect(r.status, r.text).toBe(201);
  return { provider, jobId: r.body.job.job_id as string };
}

describe("endpoint-ready with a port alone", () => {
  it("over JSON: joined to the reported address, else to the one the report came from", async () => {
    const fromReport = await servingJob(null);
    expect((await pickUp(api, fromReport.provider.key))?.job_id).toBe(fromReport.jobId);
    const r = await api.post(`/api/jobs/${fromReport.jobId}/endpoint-ready`, { api_key: fromReport.provider.key, port: 8123 });
    expect(r.status, r.text).toBe(200);
    expect(r.body.endpoint_url).toBe("http://127.0.0.1:8123");
    expect(await endpointOf(fromReport.jobId)).toBe("http://127.0.0.1:8123");

    const reported = await servingJob("203.0.113.7");
    expect((await pickUp(api, reported.provider.key))?.job_id).toBe(reported.jobId);
    const r2 = await api.post(`/api/jobs/${reported.jobId}/endpoint-ready`, { api_key: reported.provider.key, port: 8124 });
    expect(r2.status, r2.text).toBe(200);
    expect(await endpointOf(reported.jobId)).toBe("http://203.0.113.7:8124");
  });

  it("over the daemon stream: joined to the address the stream came from", async () => {
    const { provider, jobId } = await servingJob(null);
    const s = openStream(srv.port, provider.key);
    streams.push(s);
    s.send({ case: "hello", value: { daemonVersion: "5.2.0", runningJobIds: [], gpus: [{ name: "NVIDIA H100 80GB HBM3", vram_mib: 81920 }] } });
    await s.next("welcome");
    expect((await s.next("job")).jobId).toBe(jobId);
    s.send({ case: "jobAccepted", value: { jobId } });
    s.send({ case: "endpointReady", value: { jobId, port: 8125 } });
    expect(await waitFor(() => endpointOf(jobId), 5_000, "endpoint")).toBe("http://127.0.0.1:8125");
  });
});
