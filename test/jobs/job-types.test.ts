// Placement by the job types a provider's daemon declares (supported_job_types
// in its heartbeats, REST and stream): a job is offered only to providers whose
// list holds its type or who declared none; a submit no live provider can run
// for its type (or pinned to one that does not run it) answers 503 naming it,
// and a queued job pinned to such a provider says why it waits.
import { beforeEach, describe, expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { flushHeartbeats, gpuStatus, newProvider } from "../providers/helpers.js";
import { openStream } from "../daemon/grpc-stream.js";
import { clearMarketplace, pickUp } from "./helpers.js";

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0" });
const api = client(srv);
beforeEach(() => clearMarketplace(srv));

const beat = (key: string, body: Record<string, unknown> = {}) => api.post("/api/providers/heartbeat", { api_key: key, gpu_status: gpuStatus(), ...body });

/** An approved provider whose first heartbeat (a state-changing one, written before its answer) declares `types`. */
async function declaring(types: string[] | undefined) {
  const p = await newProvider(srv);
  const r = await beat(p.key, types === undefined ? {} : { supported_job_types: types });
  expect(r.status, r.text).toBe(200);
  return p;
}

const submit = (headers: Record<string, string>, body: Record<string, unknown>) => api.post("/api/jobs/submit", { duration_minutes: 2, ...body }, headers);
const declared = async (id: number) => (await srv.sql<{ supported_job_types: string[] | null }[]>`SELECT supported_job_types FROM providers WHERE id = ${id}`)[0].supported_job_types;
const jobRow = async (jobId: string) => (await srv.sql<{ status: string; provider_id: number | null }[]>`SELECT status, provider_id FROM jobs WHERE job_id = ${jobId}`)[0];

describe("placement by declared job types", () => {
  it("offers vllm_serve only to a provider that declares it or declares nothing; one declaring nothing still gets everything", async () => {
    const renter = await makeRenter(srv, 100_000);
    const bench = await declaring(["benchmark"]);
    expect(await declared(bench.id)).toEqual(["benchmark"]);

    // The only live provider runs benchmarks only: nothing can take a vllm_serve job.
    const none = await submit(renter.headers, { job_type: "vllm_serve" });
    expect(none.status, none.text).toBe(503);
    expect(none.body.error).toMatch(/^no providers available: .*runs vllm_serve jobs/);
    expect((await api.get("/api/renters/balance", renter.headers)).body.held_halala).toBe(0);
    const b = await submit(renter.headers, { job_type: "benchmark", params: { suite: "quick", iterations: 1 } });
    expect(b.status, b.text).toBe(201);
    expect(b.body.job.provider_id).toBe(bench.id);

    const server = await declaring(["benchmark", "vllm_serve"]);
    const first = await submit(renter.headers, { job_type: "vllm_serve" });
    expect(first.status, first.text).toBe(201);
    expect(first.body.job.provider_id).toBe(server.id);
    // The server is busy now; the next one waits for it rather than going to the benchmark-only provider.
    const second = await submit(renter.headers, { job_type: "vllm_serve" });
    expect(second.status, second.text).toBe(201);
    expect(second.body.job).toMatchObject({ status: "queued", provider_id: null });
    // The benchmark provider's slot opens (its job ends, dispatch offers it the queue): it takes nothing it cannot run.
    expect((await pickUp(api, bench.key))?.job_id).toBe(b.body.job.job_id);
    const done = await api.post("/api/providers/job-result", { api_key: bench.key, job_id: b.body.job.job_id, success: true, result: { scores: {} } });
    expect(done.status, done.text).toBe(200);
    expect(await jobRow(second.body.job.job_id)).toEqual({ status: "queued", provider_id: null });
    expect((await api.get(`/api/providers/${bench.key}/jobs`)).body.job).toBeNull();

    // A provider that declares nothing (a daemon older than the field) is offered every type: it comes online and takes it.
    const old = await declaring(undefined);
    expect(await declared(old.id)).toBeNull();
    expect(await jobRow(second.body.job.job_id)).toEqual({ status: "pending", provider_id: old.id });
    await flushHeartbeats(srv);
    expect(await declared(old.id)).toBeNull();
  });

  it("looks past the most reliable providers when none of them runs the job type (a fleet wider than the candidate window)", async () => {
    const renter = await makeRenter(srv, 100_000);
    const fleet = [];
    for (let i = 0; i < 40; i++) fleet.push(await makeProvider(srv));
    const server = await makeProvider(srv);
    await srv.sql`UPDATE providers SET supported_job_types = '{benchmark,llm-inference}', reliability_score = 0.9 + id / 1e9 WHERE id = ANY(${fleet.map((p) => p.id)})`;
    await srv.sql`UPDATE providers SET supported_job_types = '{vllm_serve}', reliability_score = 0.1 WHERE id = ${server.id}`;
    const serve = await submit(renter.headers, { job_type: "vllm_serve" });
    expect(serve.status, serve.text).toBe(201);
    expect(serve.body.job.provider_id).toBe(server.id);
    const plain = await submit(renter.headers, { job_type: "benchmark" });
    expect(fleet.map((p) => p.id)).toContain(plain.body.job.provider_id);
  });

  it("takes the list leniently, and a beat without it declares nothing again (a daemon replaced by an older one)", async () => {
    const p = await declaring(["benchmark", "training"]);
    expect(await declared(p.id)).toEqual(["benchmark", "training"]);
    // The provider sees what it declared (GET /api/providers/me).
    const me = () => api.get("/api/providers/me", { "x-provider-key": p.key });
    expect((await me()).body.provider.supported_job_types).toEqual(["benchmark", "training"]);
    // A later beat is telemetry (coalesced, written by the flush): comma-separated text is read too.
    expect((await beat(p.key, { supported_job_types: "benchmark, rendering" })).status).toBe(200);
    await flushHeartbeats(srv);
    expect(await declared(p.id)).toEqual(["benchmark", "rendering"]);
    expect((await beat(p.key)).status).toBe(200);
    await flushHeartbeats(srv);
    expect(await declared(p.id)).toBeNull();
    expect((await me()).body.provider.supported_job_types).toEqual([]);
    expect((await beat(p.key, { supported_job_types: ["custom_container"] })).status).toBe(200);
    await flushHeartbeats(srv);
    expect(await declared(p.id)).toEqual(["custom_container"]);
    // Unreadable, or an empty list: nothing declared.
    expect((await beat(p.key, { supported_job_types: 42 })).status).toBe(200);
    await flushHeartbeats(srv);
    expect(await declared(p.id)).toBeNull();
  });

  it("stores what a stream daemon declares in its heartbeats", async () => {
    const p = await makeProvider(srv);
    const s = openStream(srv.port, p.key);
    try {
      s.send({ case: "hello", value: { daemonVersion: "5.1.0", gpus: [{ name: "NVIDIA GeForce RTX 4090", vram_mib: 24564 }] } });
      await s.next("welcome");
      s.send({ case: "heartbeat", value: { daemonVersion: "5.1.0", supportedJobTypes: ["benchmark", "llm-inference"] } });
      await s.next("heartbeatAck");
      await flushHeartbeats(srv);
      expect(await declared(p.id)).toEqual(["benchmark", "llm-inference"]);
      // Offered what it declared, and no other type.
      const renter = await makeRenter(srv, 100_000);
      const serve = await submit(renter.headers, { job_type: "vllm_serve" });
      expect(serve.status, serve.text).toBe(503);
      const llm = await submit(renter.headers, { job_type: "llm-inference" });
      expect(llm.status, llm.text).toBe(201);
      expect(llm.body.job.provider_id).toBe(p.id);
      expect((await s.next("job")).jobId).toBe(llm.body.job.job_id);
      // A beat that declares nothing: every type again.
      s.send({ case: "heartbeat", value: { daemonVersion: "5.1.0" } });
      await s.next("heartbeatAck");
      await flushHeartbeats(srv);
      expect(await declared(p.id)).toBeNull();
    } finally {
      s.cancel();
    }
  });
});

describe("when a declaration takes effect", () => {
  it("writes a steady beat that changes the declared types before answering it; one that keeps them waits for the flush", async () => {
    const renter = await makeRenter(srv, 100_000);
    const p = await declaring(["benchmark", "vllm_serve"]);
    // Steady beat, same types, new hostname: answered from the cache, written by the flush.
    expect((await beat(p.key, { supported_job_types: ["benchmark", "vllm_serve"], provider_hostname: "gpu-box-2" })).status).toBe(200);
    const hostname = async () => (await srv.sql<{ hostname: string | null }[]>`SELECT hostname FROM providers WHERE id = ${p.id}`)[0].hostname;
    expect(await hostname()).not.toBe("gpu-box-2");
    // The daemon stops running vllm_serve: written before the answer, so no serving job is placed on it after it.
    expect((await beat(p.key, { supported_job_types: ["benchmark"] })).status).toBe(200);
    expect(await declared(p.id)).toEqual(["benchmark"]);
    const serve = await submit(renter.headers, { job_type: "vllm_serve" });
    expect(serve.status, serve.text).toBe(503);
    // And back: a beat declaring nothing is written at once too.
    expect((await beat(p.key)).status).toBe(200);
    expect(await declared(p.id)).toBeNull();
    await flushHeartbeats(srv);
    expect(await declared(p.id)).toBeNull();
  });

  it("records what a stream daemon's hello declares before its welcome, before any heartbeat", async () => {
    const renter = await makeRenter(srv, 100_000);
    const p = await makeProvider(srv);
    expect(await declared(p.id)).toBeNull();
    const s = openStream(srv.port, p.key);
    try {
      s.send({ case: "hello", value: { daemonVersion: "5.2.1", gpus: [{ name: "NVIDIA GeForce RTX 4090", vram_mib: 24564 }], supportedJobTypes: ["benchmark"] } });
      await s.next("welcome");
      expect(await declared(p.id)).toEqual(["benchmark"]);
      const serve = await submit(renter.headers, { job_type: "vllm_serve" });
      expect(serve.status, serve.text).toBe(503);
      expect(serve.body.error).toMatch(/runs vllm_serve jobs/);
      const bench = await submit(renter.headers, { job_type: "benchmark" });
      expect(bench.body.job.provider_id).toBe(p.id);
      expect((await s.next("job")).jobId).toBe(bench.body.job.job_id);
    } finally {
      s.cancel();
    }
    // A hello that declares nothing (an older daemon) leaves the list to its heartbeats.
    const again = openStream(srv.port, p.key);
    try {
      again.send({ case: "hello", value: { daemonVersion: "5.1.0", gpus: [{ name: "NVIDIA GeForce RTX 4090", vram_mib: 24564 }] } });
      await again.next("welcome");
      expect(await declared(p.id)).toEqual(["benchmark"]);
    } finally {
      again.cancel();
    }
  });
});

describe("a job pinned to a provider", () => {
  it("is refused with 503 naming the job type when the provider's daemon does not run it, holding nothing", async () => {
    const renter = await makeRenter(srv, 100_000);
    const p = await declaring(["benchmark"]);
    const r = await submit(renter.headers, { job_type: "vllm_serve", provider_id: p.id });
    expect(r.status, r.text).toBe(503);
    expect(r.body.error).toBe(`provider ${p.id} is not available: it does not run vllm_serve jobs (its daemon runs benchmark)`);
    expect(r.headers.get("retry-after")).toBe("30");
    expect((await api.get("/api/renters/balance", renter.headers)).body.held_halala).toBe(0);
    // Hardware is judged first, as before providers declared job types.
    const big = await submit(renter.headers, { job_type: "vllm_serve", provider_id: p.id, gpu_requirements: { min_vram_gb: 80 } });
    expect(big.status).toBe(503);
    expect(big.body.error).toMatch(/must be approved, online and meet gpu_requirements/);
    const ok = await submit(renter.headers, { job_type: "benchmark", provider_id: p.id });
    expect(ok.status, ok.text).toBe(201);
    expect(ok.body.job.provider_id).toBe(p.id);
  });

  it("waits, saying why, when its provider stops declaring its type after it was queued", async () => {
    const renter = await makeRenter(srv, 100_000);
    const p = await declaring(undefined);
    const busy = await submit(renter.headers, { job_type: "benchmark", provider_id: p.id });
    expect(busy.body.job.provider_id).toBe(p.id);
    const waiting = await submit(renter.headers, { job_type: "training", provider_id: p.id });
    expect(waiting.status, waiting.text).toBe(201);
    expect(waiting.body.job.status).toBe("queued");
    expect((await beat(p.key, { supported_job_types: ["benchmark"] })).status).toBe(200);
    await flushHeartbeats(srv);
    const job = (await api.get(`/api/jobs/${waiting.body.job.job_id}`, renter.headers)).body;
    expect(job).toMatchObject({ status: "queued", queue_reason_code: "provider_unsupported_job_type" });
    expect(job.queue_reason).toBe(`requested provider ${p.id} does not run training jobs (its daemon runs benchmark)`);
    // Its slot opens: the pinned job is not handed to a daemon that would refuse it.
    expect((await pickUp(api, p.key))?.job_id).toBe(busy.body.job.job_id);
    expect((await api.post("/api/providers/job-result", { api_key: p.key, job_id: busy.body.job.job_id, success: true, result: { scores: {} } })).status).toBe(200);
    expect(await jobRow(waiting.body.job.job_id)).toEqual({ status: "queued", provider_id: null });
  });
});
