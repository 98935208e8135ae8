// svc_daemon.py, as the server serves it, on a host with two GPUs (fake
// nvidia-smi): the server gives the provider one job per GPU, and the daemon
// runs them at once, each on a GPU of its own (CUDA_VISIBLE_DEVICES for a
// plain process, `--gpus device=N` for a container), so a second job is
// picked up while the first still runs instead of waiting out the pickup
// window; SIGTERM hands every running job back; an operator's
// CUDA_VISIBLE_DEVICES limits which GPUs the daemon offers and hands out.
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { describe, expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { clearMarketplace } from "../helpers/isolation.js";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import { releaseUnclaimed } from "../../src/domain/dispatch/dispatch.js";
import { fakeDocker, optionOf, python, runLegacyDaemon, endedJob, killedAfterEach, tempDir, waitFor, writeExecutable } from "./helpers.js";
import { jobProcesses } from "./procs.js";

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000" });
const daemons = killedAfterEach(() => clearMarketplace(srv));
const api = () => client(srv.url);

const GPU1_UUID = "GPU-0b9d1e44-7a3c-11ee-b962-0242ac120002";

/**
 * An llm-inference runner that notes the CUDA_VISIBLE_DEVICES it got (`gpuOf(jobId)`, once it runs),
 * waits until `open(jobId)`, then answers with that GPU. On SIGTERM it takes a second to stop.
 */
function gpuRunner() {
  const dir = tempDir("gpu-gate");
  const script = writeExecutable(
    dir,
    "gated.py",
    [
      "#!/usr/bin/env python3",
      "import json, os, re, signal, sys, time",
      "signal.signal(signal.SIGTERM, lambda *_: (time.sleep(1), sys.exit(143)))",
      "json.load(sys.stdin)",
      `base = os.path.join(${JSON.stringify(dir)}, re.sub(r"[^A-Za-z0-9]", "-", os.environ["SVC_JOB_ID"]))`,
      'gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "unset")',
      'open(base + ".started.tmp", "w").write(gpu)',
      'os.replace(base + ".started.tmp", base + ".started")',
      'while not os.path.exists(base + ".go"):',
      "    time.sleep(0.05)",
      'json.dump({"response": "done", "gpu": gpu}, open(os.environ["SVC_RESULT_FILE"], "w"))',
      "",
    ].join("\n"),
  );
  const base = (jobId: string) => path.join(dir, jobId.replace(/[^A-Za-z0-9]/g, "-"));
  // The interpreter itself, not a version manager's shim, which would die first on a stop signal.
  const py = spawnSync("python3", ["-c", "import sys; print(sys.executable)"], { encoding: "utf8" }).stdout.trim();
  return {
    runner: `llm-inference=${py} ${script}`,
    gpuOf: (jobId: string) => (fs.existsSync(`${base(jobId)}.started`) ? fs.readFileSync(`${base(jobId)}.started`, "utf8") : undefined),
    open: (jobId: string) => fs.writeFileSync(`${base(jobId)}.go`, ""),
  };
}

const job = async (jobId: string) => (await srv.sql`SELECT * FROM jobs WHERE job_id = ${jobId}`)[0];
const ended = (jobId: string, what: string) => endedJob(srv.sql, jobId, what);
const firstAttempt = async (jobId: string) =>
  (await srv.sql`SELECT a.* FROM job_attempts a JOIN jobs j ON j.id = a.job_id WHERE j.job_id = ${jobId} AND a.attempt = 1`)[0];

/** A provider whose served daemon runs with `env`; returns once its heartbeat reported `gpus` GPUs. */
async function provider(env: Record<string, string>, gpus = 2) {
  const p = await makeProvider(srv);
  const r = await api().get(`/api/providers/download/daemon?key=${p.key}`);
  expect(r.status).toBe(200);
  const dir = tempDir("py-conc");
  const file = path.join(dir, "svc_daemon.py");
  fs.writeFileSync(file, r.text);
  const d = runLegacyDaemon(file, dir, env);
  daemons.push(d);
  // The server gives a provider as many jobs at once as its heartbeat reports GPUs.
  const row = await waitFor(async () => {
    const [x] = await srv.sql`SELECT * FROM providers WHERE id = ${p.id}`;
    return x.gpu_count === gpus && x.gpu_telemetry?.gpu_count === gpus && x.readiness_status ? x : undefined;
  }, 45_000, `heartbeat with ${gpus} GPUs (${d.output()})`);
  return { p, d, dir, row };
}

async function submit(renter: { headers: Record<string, string> }, body: Record<string, unknown>) {
  const r = await api().post("/api/jobs/submit", { duration_minutes: 2, ...body }, renter.headers);
  expect(r.status, r.text).toBe(201);
  return r.body.job as { job_id: string; provider_id: number };
}
const llm = { job_type: "llm-inference", params: { prompt: "hi", max_tokens: 32 } };

describe("svc_daemon.py on a host with two GPUs", { timeout: 120_000 }, () => {
  it("runs two jobs at once, each on a GPU of its own, and both complete with their results", async () => {
    const gate = gpuRunner();
    const { p, d } = await provider({ SVC_RUNNERS: gate.runner });
    const renter = await makeRenter(srv, 1_000);
    const a = await submit(renter, llm);
    const b = await submit(renter, llm);
    expect([a.provider_id, b.provider_id]).toEqual([p.id, p.id]);

    // Both run at the same time: neither has been let finish.
    await waitFor(() => gate.gpuOf(a.job_id) !== undefined && gate.gpuOf(b.job_id) !== undefined, 20_000, `both jobs running (${d.output()})`);
    expect([(await job(a.job_id)).status, (await job(b.job_id)).status]).toEqual(["running", "running"]);
    expect([gate.gpuOf(a.job_id), gate.gpuOf(b.job_id)].sort()).toEqual(["0", "1"]);

    gate.open(b.job_id);
    const doneB = await ended(b.job_id, `second job end (${d.output()})`);
    expect(doneB.status, doneB.error).toBe("completed");
    expect((await job(a.job_id)).status).toBe("running");
    gate.open(a.job_id);
    const doneA = await ended(a.job_id, `first job end (${d.output()})`);
    expect(doneA.status, doneA.error).toBe("completed");
    expect(doneA.result).toEqual({ response: "done", gpu: gate.gpuOf(a.job_id) });
    expect(doneB.result).toEqual({ response: "done", gpu: gate.gpuOf(b.job_id) });
    expect((await api().get("/api/renters/balance", renter.headers)).body.held_halala).toBe(0);
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("runs two containers at once with one GPU each (`--gpus device=N`)", async () => {
    const dir = tempDir("py-conc-docker");
    const docker = fakeDocker(dir);
    const { p, d } = await provider({ SVC_DOCKER: docker.path });
    const renter = await makeRenter(srv, 1_000);
    const a = await submit(renter, { job_type: "custom_container", params: { command: ["wait"] } });
    const b = await submit(renter, { job_type: "custom_container", params: { command: ["wait"] } });
    expect([a.provider_id, b.provider_id]).toEqual([p.id, p.id]);
    const runOf = (jobId: string) => docker.runs().find((r) => r.includes(`svc.job_id=${jobId}`));
    // Both containers run (neither released yet).
    await waitFor(() => runOf(a.job_id) && runOf(b.job_id), 20_000, `both containers started (${d.output()})`);
    expect([optionOf(runOf(a.job_id)!, "--gpus"), optionOf(runOf(b.job_id)!, "--gpus")].sort()).toEqual(["device=0", "device=1"]);
    docker.release(a.job_id);
    docker.release(b.job_id);
    for (const j of [a, b]) {
      const done = await ended(j.job_id, `job end (${d.output()})`);
      expect(done.status, done.error).toBe("completed");
      expect(done.result).toEqual({ response: "done" });
    }
  });

  it("picks up a second job while the first still runs, well within the pickup window", async () => {
    const gate = gpuRunner();
    const { d } = await provider({ SVC_RUNNERS: gate.runner });
    const renter = await makeRenter(srv, 1_000);
    const a = await submit(renter, llm);
    await waitFor(() => gate.gpuOf(a.job_id) !== undefined, 20_000, `first job running (${d.output()})`);
    const t0 = Date.now();
    const b = await submit(renter, llm);
    // The daemon confirmed it (a report naming it): the server counts it as picked up.
    const row = await waitFor(async () => {
      const r = await job(b.job_id);
      return r.acked_at ? r : undefined;
    }, 20_000, `second job picked up (${d.output()})`);
    expect(Date.now() - t0).toBeLessThan(20_000);
    expect(row.status).toBe("running");
    expect((await job(a.job_id)).status).toBe("running");
    await waitFor(() => gate.gpuOf(b.job_id) !== undefined, 10_000, `second job running (${d.output()})`);
    expect(gate.gpuOf(b.job_id)).not.toBe(gate.gpuOf(a.job_id));

    // Past the pickup window (both jobs' times moved back), neither is released as not picked up.
    await srv.sql`UPDATE jobs SET submitted_at = submitted_at - interval '10 minutes', assigned_at = assigned_at - interval '10 minutes',
      started_at = started_at - interval '10 minutes' WHERE job_id IN ${srv.sql([a.job_id, b.job_id])}`;
    await srv.sql`UPDATE platform_pulse SET up_since = '-infinity', last_at = now()`;
    expect(await releaseUnclaimed(srv.sql)).toEqual({ requeued: 0, failed: 0 });
    expect([(await firstAttempt(a.job_id)).end_reason, (await firstAttempt(b.job_id)).end_reason]).toEqual([null, null]);

    gate.open(a.job_id);
    gate.open(b.job_id);
    for (const j of [a, b]) {
      const done = await ended(j.job_id, `job end (${d.output()})`);
      expect(done.status, done.error).toBe("completed");
    }
  });

  it("on SIGTERM stops both running jobs, leaves no child process and hands each back as interrupted", async () => {
    const gate = gpuRunner();
    const { d } = await provider({ SVC_RUNNERS: gate.runner, SVC_STOP_GRACE_SECONDS: "1" });
    const renter = await makeRenter(srv, 1_000);
    const a = await submit(renter, llm);
    const b = await submit(renter, llm);
    await waitFor(() => gate.gpuOf(a.job_id) !== undefined && gate.gpuOf(b.job_id) !== undefined, 20_000, `both jobs running (${d.output()})`);
    expect(jobProcesses(a.job_id).length).toBeGreaterThan(0);
    expect(jobProcesses(b.job_id).length).toBeGreaterThan(0);
    d.kill("SIGTERM");
    expect(await d.exited, d.output()).toBe(0);
    expect(jobProcesses(a.job_id)).toEqual([]);
    expect(jobProcesses(b.job_id)).toEqual([]);
    for (const j of [a, b]) {
      const at = await waitFor(async () => {
        const r = await firstAttempt(j.job_id);
        return r?.ended_at ? r : undefined;
      }, 20_000, "hand back");
      expect(at).toMatchObject({ status: "requeued", end_reason: "provider_interrupted", fault: "provider", cost_halala: 0 });
      expect(at.error).toMatch(/interrupted/);
      expect(await job(j.job_id)).toMatchObject({ status: "queued", attempt: 2 });
    }
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("offers and hands out only the GPUs the operator's CUDA_VISIBLE_DEVICES names", async () => {
    const dir = tempDir("py-conc-cvd");
    const runner = writeExecutable(dir, "gpu-runner", '#!/bin/sh\necho "visible=${CUDA_VISIBLE_DEVICES-unset}"\n');
    // GPU 1 by its UUID: the heartbeat reports one GPU, so the server sends one job at a time.
    const { d, row } = await provider({ SVC_RUNNERS: `benchmark=${runner}`, CUDA_VISIBLE_DEVICES: GPU1_UUID }, 1);
    expect(row.gpu_telemetry.gpu_name).toBe("NVIDIA GeForce RTX 3090");
    expect(row.gpu_telemetry.all_gpus.map((g: { index: number }) => g.index)).toEqual([1]);
    const renter = await makeRenter(srv, 1_000);
    const j = await submit(renter, { job_type: "benchmark", duration_minutes: 1, params: { suite: "quick", iterations: 1 } });
    const done = await ended(j.job_id, `job end (${d.output()})`);
    expect(done.status, done.error).toBe("completed");
    expect(done.result.response).toBe("visible=1");
    expect(d.output()).toContain(`CUDA_VISIBLE_DEVICES='${GPU1_UUID}': jobs run on GPU 1`);
  });

  it("polls for another job only while a GPU is free, and on a host without GPUs only with no job running", () => {
    const out = JSON.parse(
      python(`import json, tempfile, svc_daemon
d = svc_daemon.Daemon({"url": "http://127.0.0.1:9", "key": "k", "nvidia_smi": "/nonexistent", "docker": "", "work_dir": tempfile.mkdtemp()})
seen = []
for gpus in ([], [{"index": 0}, {"index": 1}]):
    d.gpus.query = lambda: gpus
    d.jobs.clear()
    row = [d.can_take_job()]
    for n in range(2):
        d.gpu_slots.take(gpus)
        d.jobs[object()] = "job-%d" % n
        row.append(d.can_take_job())
    seen.append(row)
print(json.dumps(seen))
`),
    ) as boolean[][];
    // No GPUs: one job at a time. Two GPUs: a second job while one runs, none while both do.
    expect(out).toEqual([
      [true, false, false],
      [true, true, false],
    ]);
  });

  it("reads CUDA_VISIBLE_DEVICES as nvidia-smi indices or GPU UUIDs, ending at the first entry that names no GPU", () => {
    const out = JSON.parse(
      python(`import json, svc_daemon
gpus = [{"index": 0, "uuid": "GPU-5c7e4b6a-2b8f-4d2a-9a53-0e1f7f2c9d11"}, {"index": 1, "uuid": "${GPU1_UUID}"}]
specs = [None, "", "1", "1,0", " 0 , 1 ", "${GPU1_UUID.toLowerCase()}", "GPU-0b9d", "GPU-", "0,foo,1", "7,1", "-1,0", "0,0"]
print(json.dumps([[g["index"] for g in svc_daemon.visible_gpus(gpus, s)] for s in specs]))
`),
    ) as number[][];
    expect(out).toEqual([[0, 1], [], [1], [0, 1], [0, 1], [1], [1], [], [0], [], [], [0]]);
  });
});
