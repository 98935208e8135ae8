// The TypeScript daemon running container jobs through a fake docker engine
// (test/daemon/helpers.ts fakeDocker) against the real server: a container
// that ran and exited 125 itself is the renter's failure (billed), docker
// failing before the container started is the provider's (re-queued, no
// charge); on a 2-GPU provider two concurrent jobs each get their own GPU,
// a third waits in the queue until one ends and then gets the GPU it freed;
// a submit whose env would choose GPUs is refused; a vllm_serve engine is
// started with a key of the job's own, given to docker by name only, and
// reported with its endpoint, which the /v1 gateway then reaches with it.
// One daemon serves the tests that need nothing of their own (keptDockerDaemon):
// each test ends its jobs, and the next finds it idle.
import { describe, expect, it } from "vitest";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import fs from "node:fs";
import path from "node:path";
import { endedFirstAttempt, endedJob, fakeDocker, FIXTURES, optionOf, tempDir, waitFor, writeExecutable } from "./helpers.js";
import { keptDockerDaemon, useTsDaemonServer } from "./ts-harness.js";

const h = useTsDaemonServer();

const custom = (command: string[]) => ({ job_type: "custom_container", duration_minutes: 2, params: { command } });

const ended = (jobId: string, what: string) => endedJob(h.srv.sql, jobId, what);

const firstAttempt = (jobId: string, what: string) => endedFirstAttempt(h.srv.sql, jobId, what);

describe("svc-daemon (TypeScript) with containers", { timeout: 120_000 }, () => {
  describe("on one daemon, 2 GPUs, served endpoints at 127.0.0.1", () => {
    const k = keptDockerDaemon(h, { args: ["--public-host", "127.0.0.1"] });

    it("bills a container that ran and exited 125 itself as the renter's failure; docker failing before it started is re-queued at no charge", async () => {
      const { p, d } = k;
      const renter = await makeRenter(h.srv, 1_000);

      // Both at once, a GPU each.
      const own = await h.submit(renter, custom(["exit-125"]));
      const refused = await h.submit(renter, custom(["docker-fails"]));
      expect([own.provider_id, refused.provider_id]).toEqual([p.id, p.id]);
      expect(await firstAttempt(own.job_id, `first attempt end (${d.output()})`)).toMatchObject({ end_reason: "runtime_error", fault: "renter" });
      const done = await ended(own.job_id, `job end (${d.output()})`);
      expect(done).toMatchObject({ status: "failed", end_reason: "runtime_error", fault: "renter" });
      expect(done.actual_cost_halala).toBeGreaterThan(0);
      expect(done.provider_earned_halala + done.platform_fee_halala).toBe(done.actual_cost_halala);
      expect(done.error).toMatch(/exited with status 125/);
      const logs = await h.api().get(`/api/jobs/${own.job_id}/logs`, renter.headers);
      expect(logs.body.logs.map((l: { message: string }) => l.message)).toContain("work done; exiting with status 125");
      const paid = done.actual_cost_halala;
      expect((await h.api().get("/api/renters/balance", renter.headers)).body).toMatchObject({ balance_halala: 1_000 - paid });

      const a = await firstAttempt(refused.job_id, `first attempt end (${d.output()})`);
      expect(a).toMatchObject({ status: "requeued", end_reason: "provider_error", fault: "provider", cost_halala: 0 });
      expect(a.error).toMatch(/could not select device driver/);
      // Nothing charged for it.
      expect((await h.api().get("/api/renters/balance", renter.headers)).body.balance_halala).toBe(1_000 - paid);
      expect(await ledgerProblems(h.srv.sql)).toEqual([]);
    });

    it("gives two concurrent jobs on a 2-GPU provider a GPU each; a third waits for one and gets the GPU it freed", async () => {
      const { p, docker, d } = k;
      const renter = await makeRenter(h.srv, 1_000);
      const gpuOf = (jobId: string) => {
        const run = docker.runs().find((r) => r.includes(`svc.job_id=${jobId}`));
        return run && optionOf(run, "--gpus");
      };

      const first = await h.submit(renter, custom(["wait"]));
      const second = await h.submit(renter, custom(["wait"]));
      expect([first.provider_id, second.provider_id]).toEqual([p.id, p.id]);
      await waitFor(() => gpuOf(first.job_id) && gpuOf(second.job_id), 45_000, `both containers started (${d.output()})`);
      expect([gpuOf(first.job_id), gpuOf(second.job_id)].sort()).toEqual(["device=0", "device=1"]);
      for (const run of docker.runs()) expect(run.filter((a) => a === "--gpus")).toHaveLength(1);

      // Both GPUs are taken: the server sends this provider no third job; it waits in the queue, and
      // still does once the server has heard the daemon's next heartbeat.
      const third = await h.submit(renter, custom(["wait"]));
      expect(third.provider_id).toBeNull();
      await waitFor(async () => {
        const [r] = await h.srv.sql`SELECT p.last_heartbeat > j.submitted_at AS beat FROM providers p, jobs j WHERE p.id = ${p.id} AND j.job_id = ${third.job_id}`;
        return r.beat;
      }, 15_000, `a heartbeat after the third job's submit (${d.output()})`);
      expect((await h.job(third.job_id)).status).toBe("queued");
      expect(gpuOf(third.job_id)).toBeUndefined();

      // The first ends: its GPU is given back, and the third runs on it.
      docker.release(first.job_id);
      expect((await ended(first.job_id, "first job end")).status).toBe("completed");
      await waitFor(() => gpuOf(third.job_id), 45_000, `third container started (${d.output()})`);
      expect(gpuOf(third.job_id)).toBe(gpuOf(first.job_id));

      docker.release(second.job_id);
      docker.release(third.job_id);
      for (const j of [second, third]) expect((await ended(j.job_id, `job end (${d.output()})`)).status).toBe("completed");
      expect(await ledgerProblems(h.srv.sql)).toEqual([]);
    });

    it("judges min_vram_gb on the GPU's total memory less the reserve, as placement does, not on the memory free now", async () => {
      const { p, docker, d } = k;
      const renter = await makeRenter(h.srv, 10_000);
      const faults = async () => (await h.srv.sql`SELECT coalesce(sum(faults), 0)::int AS n FROM provider_attempt_days WHERE provider_id = ${p.id}`)[0].n as number;
      const faultsBefore = await faults();
      // The fake GPUs: 24564 MiB in all with 22936 free, and 24576 with 24222 free. 24.3 GB (24300 MiB)
      // fits either's total (placement's judgement), not what either has free at the moment.
      const j = await h.submit(renter, { ...custom(["true"]), gpu_requirements: { min_vram_gb: 24.3 } });
      expect(j.provider_id).toBe(p.id);
      const done = await ended(j.job_id, `job end (${d.output()})`);
      expect(done.status, done.error).toBe("completed");
      expect(done.attempt).toBe(1);
      expect(docker.runs().filter((argv) => argv.includes(`svc.job_id=${j.job_id}`))).toHaveLength(1);
      // Not held against the provider.
      expect(await faults()).toBe(faultsBefore);
    });

    it("serves vllm_serve with a key of the job's own: in the engine's env, on no command line, reported with the endpoint", async () => {
      const { p, docker, d } = k;
      const renter = await makeRenter(h.srv, 10_000);
      const model = "TinyLlama/TinyLlama-1.1B-Chat-v1.0";
      const job = await h.submit(renter, { job_type: "vllm_serve", duration_minutes: 5, params: { model } });
      expect(job.provider_id).toBe(p.id);
      const row = await waitFor(async () => {
        const r = await h.job(job.job_id);
        return r.endpoint_url ? r : undefined;
      }, 45_000, `endpoint ready (${d.output()})`);
      expect(row.status).toBe("running");
      expect(row.endpoint_url).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
      const key: string = row.endpoint_api_key;
      expect(key).toMatch(/^[A-Za-z0-9_-]{43}$/); // 32 random bytes, base64url

      // docker got it by name: `-e VLLM_API_KEY`, its value from the CLI's environment, never in an argument.
      const run = docker.runs().find((argv) => argv.includes(`svc.job_id=${job.job_id}`))!;
      expect(run[run.indexOf("VLLM_API_KEY") - 1]).toBe("-e");
      expect(run.filter((a) => a.startsWith("VLLM_API_KEY"))).toEqual(["VLLM_API_KEY"]);
      expect(JSON.stringify(docker.calls())).not.toContain(key);
      const container = docker.containers().find((c) => c.labels["svc.job_id"] === job.job_id)!;
      expect(container.env.VLLM_API_KEY).toBe(key);
      expect(d.output()).not.toContain(key);

      // The engine wants it; the gateway has it (the renter's own endpoint).
      expect((await fetch(`${row.endpoint_url}/v1/models`)).status).toBe(401);
      expect((await fetch(`${row.endpoint_url}/v1/models`, { headers: { authorization: `Bearer ${key}` } })).status).toBe(200);
      const chat = await fetch(`${h.srv.url}/v1/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${renter.key}`, "content-type": "application/json" },
        body: JSON.stringify({ model, messages: [{ role: "user", content: "Hi" }], max_tokens: 16 }),
      });
      const text = await chat.text();
      expect(chat.status, text).toBe(200);
      expect(JSON.parse(text).choices[0].message.content).toBe("Hello from a fake engine.");
      expect(text).not.toContain(key);

      // Cancelled: the container goes, and the server forgets the key.
      expect((await h.api().post(`/api/jobs/${job.job_id}/cancel`, {}, renter.headers)).status).toBe(200);
      await waitFor(() => !docker.containers().some((c) => c.labels["svc.job_id"] === job.job_id), 45_000, `container removed (${d.output()})`);
      expect((await h.job(job.job_id)).endpoint_api_key).toBeNull();
    });

    it("publishes a custom_container's expose_port and shows its endpoint_url once the port answers; no key, not a /v1 endpoint", async () => {
      const { p, docker, d } = k;
      const renter = await makeRenter(h.srv, 10_000);
      const job = await h.submit(renter, { job_type: "custom_container", duration_minutes: 5, params: { command: ["serve"], expose_port: 8080 } });
      // Beside it, on the other GPU, one without expose_port.
      const plain = await h.submit(renter, custom(["wait"]));
      expect([job.provider_id, plain.provider_id]).toEqual([p.id, p.id]);
      const shown = await waitFor(async () => {
        const r = await h.api().get(`/api/jobs/${job.job_id}`, renter.headers);
        return r.body.endpoint_url ? r.body : undefined;
      }, 45_000, `endpoint shown (${d.output()})`);
      expect(shown.status).toBe("running");
      const run = docker.runs().find((argv) => argv.includes(`svc.job_id=${job.job_id}`))!;
      const [hostPort, containerPort] = optionOf(run, "-p")!.split(":");
      expect(containerPort).toBe("8080");
      expect(shown.endpoint_url).toBe(`http://127.0.0.1:${hostPort}`);
      expect(run).not.toContain("--network");
      expect(run.join(" ")).not.toContain("VLLM_API_KEY");
      expect((await h.job(job.job_id)).endpoint_api_key).toBeNull();
      // The renter's own service, reached directly; the /v1 gateway serves model endpoints only.
      expect((await fetch(`${shown.endpoint_url}/health`)).status).toBe(200);
      const models = await fetch(`${h.srv.url}/v1/models`, { headers: { authorization: `Bearer ${renter.key}` } });
      expect(JSON.stringify(await models.json())).not.toContain(job.job_id);

      // Without expose_port nothing is published.
      await waitFor(() => docker.runs().some((argv) => argv.includes(`svc.job_id=${plain.job_id}`)), 45_000, `plain container started (${d.output()})`);
      const plainRun = docker.runs().find((argv) => argv.includes(`svc.job_id=${plain.job_id}`))!;
      expect(plainRun).not.toContain("-p");
      expect(optionOf(plainRun, "--network")).toBe("none");
      docker.release(plain.job_id);
      expect((await ended(plain.job_id, `plain job end (${d.output()})`)).endpoint_url).toBeNull();

      expect((await h.api().post(`/api/jobs/${job.job_id}/cancel`, {}, renter.headers)).status).toBe(200);
      await waitFor(() => !docker.containers().some((c) => c.labels["svc.job_id"] === job.job_id), 45_000, `container removed (${d.output()})`);
    });
  });

  it("judges a job on the GPUs no other job holds: one busy GPU does not refuse it when another is free", async () => {
    const p = await makeProvider(h.srv);
    // The provider caps usage at 80%; GPU 0 is at 100% (another workload), GPU 1 idle.
    await h.srv.sql`UPDATE providers SET gpu_usage_cap_pct = 80 WHERE id = ${p.id}`;
    const dir = tempDir("tsd-smi");
    const csv = path.join(dir, "gpus.csv");
    fs.writeFileSync(
      csv,
      fs.readFileSync(path.join(FIXTURES, "nvidia-smi-query-2gpu.csv"), "utf8").replace(/^(0, [^,]+, [^,]+, \d+, \d+, \d+), \d+,/m, "$1, 100,"),
    );
    const smi = writeExecutable(dir, "nvidia-smi", `#!/bin/sh\ncase "$1" in\n  --query-gpu=*) cat '${csv}' ;;\n  *) cat '${path.join(FIXTURES, "nvidia-smi.txt")}' ;;\nesac\n`);
    const docker = fakeDocker(tempDir("tsd-docker"));
    const d = h.startDaemon(p.key, ["--docker", docker.path, "--nvidia-smi", smi]);
    await waitFor(async () => (await h.srv.sql`SELECT readiness_status FROM providers WHERE id = ${p.id}`)[0].readiness_status, 45_000, `daemon up (${d.output()})`);
    const renter = await makeRenter(h.srv, 10_000);
    const j = await h.submit(renter, custom(["true"]));
    const done = await ended(j.job_id, `job end (${d.output()})`);
    expect(done.status, done.error).toBe("completed");
    expect(done.attempt).toBe(1);
    // It ran on the idle GPU.
    const runs = docker.runs().filter((argv) => argv.includes(`svc.job_id=${j.job_id}`));
    expect(runs.map((argv) => optionOf(argv, "--gpus"))).toEqual(["device=1"]);
  });

  it("refuses at submit an env that would choose the job's GPUs or the host devices it gets, naming the field", async () => {
    const renter = await makeRenter(h.srv, 1_000);
    await makeProvider(h.srv);
    // Every NVIDIA_* name, those the runtime may read in a later version too.
    for (const name of ["NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "NVIDIA_GDS", "NVIDIA_MOFED", "NVIDIA_NVSWITCH", "NVIDIA_GDRCOPY", "NVIDIA_TF32_OVERRIDE", "NVIDIA_SOMETHING_NEW"]) {
      const r = await h.api().post("/api/jobs/submit", { job_type: "custom_container", duration_minutes: 1, params: { command: ["nvidia-smi"], env: { A: "1", [name]: "all" } } }, renter.headers);
      expect(r.status, name).toBe(400);
      expect(r.body.error, name).toMatch(new RegExp(`params\\.env\\.${name}\\b`));
    }
    const ok = await h.api().post("/api/jobs/submit", { job_type: "custom_container", duration_minutes: 1, params: { command: ["nvidia-smi"], env: { CUDA_LAUNCH_BLOCKING: "1", NVIDIA: "x" } } }, renter.headers);
    expect(ok.status, ok.text).toBe(201);
  });
});
