// svc_daemon.py, exactly as the server serves it, run with the machine's
// python3 against the real server (its BACKEND_URL is this server's own
// address): heartbeat with nvidia-smi telemetry, readiness, events, a
// benchmark job polled, verified, run as a plain process, logs, progress,
// settled 75/25; each failure reported with its end reason and fault (the
// job's own failure billed, a signature it cannot verify re-queued, a task
// changed behind the service's back never handed out); SIGTERM mid-job leaves
// no child and hands the job back; a host job's folder goes once it ended,
// however it did; self-update from an old version.
import crypto from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { describe, expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import { FIXTURES, runLegacyDaemon, endedJob, killedAfterEach, tempDir, waitFor, writeExecutable } from "./helpers.js";
import { jobProcesses } from "./procs.js";
import { clearMarketplace } from "../helpers/isolation.js";

const srv = useTestServer({ SVC_DAEMON_MIN_VERSION: "3.1.0", SVC_DAEMON_LATEST_VERSION: "3.2.0", SVC_JOB_SWEEP_MS: "60000" });
const daemons = killedAfterEach(() => clearMarketplace(srv));
const api = () => client(srv.url);

async function download(key: string): Promise<{ file: string; dir: string; text: string }> {
  const r = await api().get(`/api/providers/download/daemon?key=${key}`);
  expect(r.status).toBe(200);
  const dir = tempDir("py");
  const file = path.join(dir, "svc_daemon.py");
  fs.writeFileSync(file, r.text);
  return { file, dir, text: r.text };
}

function run(file: string, dir: string, env: Record<string, string> = {}) {
  const d = runLegacyDaemon(file, dir, env);
  daemons.push(d);
  return d;
}

const job = async (jobId: string) => (await srv.sql`SELECT * FROM jobs WHERE job_id = ${jobId}`)[0];
const ended = (jobId: string, what: string) => endedJob(srv.sql, jobId, what);

async function submit(renter: { headers: Record<string, string> }, params: Record<string, unknown>) {
  const r = await api().post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 1, params }, renter.headers);
  expect(r.status, r.text).toBe(201);
  return r.body.job as { job_id: string; provider_id: number };
}

describe("svc_daemon.py", { timeout: 90_000 }, () => {
  it("heartbeats, reports readiness, runs a polled job as a plain process and gets it settled 75/25", async () => {
    const p = await makeProvider(srv);
    const renter = await makeRenter(srv, 1_000);
    const { file, dir } = await download(p.key);
    const d = run(file, dir);
    const row = await waitFor(async () => {
      const [r] = await srv.sql`SELECT * FROM providers WHERE id = ${p.id}`;
      return r.gpu_count === 2 && r.readiness_status ? r : undefined;
    }, 45_000, `heartbeat (${d.output()})`);
    expect(row.daemon_version).toBe("3.2.0");
    expect(row.gpu_cuda_version).toBe("12.4");
    expect(row.gpu_telemetry.all_gpus[1].name).toBe("NVIDIA GeForce RTX 3090");

    const j = await submit(renter, { suite: "full", iterations: 2 });
    expect(j.provider_id).toBe(p.id);
    const done = await ended(j.job_id, `job end (${d.output()})`);
    expect(done.status, done.error).toBe("completed");
    expect(done).toMatchObject({ actual_cost_halala: 10, provider_earned_halala: 7, platform_fee_halala: 3, progress_pct: 100 });
    expect(done.metrics.executor).toBe("process");
    const out = await api().get(`/api/jobs/${j.job_id}/output`, renter.headers);
    expect(out.body.scores.cpu_matmul_gflops).toBeGreaterThan(0);
    const logs = await api().get(`/api/jobs/${j.job_id}/logs`, renter.headers);
    expect(logs.body.logs.map((l: { message: string }) => l.message).join("\n")).toMatch(/memory: median .* over 2 runs/);
    // job_completed is posted after the result, so it may land a moment after the settlement.
    const eventTypes = async () => (await srv.sql`SELECT event_type FROM daemon_events WHERE provider_id = ${p.id}`).map((e) => e.event_type);
    await expect.poll(eventTypes, { timeout: 10_000 }).toEqual(expect.arrayContaining(["daemon_started", "job_started", "job_completed"]));
    expect((await api().get("/api/renters/balance", renter.headers)).body).toMatchObject({ balance_halala: 990, held_halala: 0 });
    expect(await ledgerProblems(srv.sql)).toEqual([]);

    d.kill("SIGTERM");
    expect(await d.exited).toBe(0);
    await waitFor(async () => (await srv.sql`SELECT 1 FROM daemon_events WHERE provider_id = ${p.id} AND event_type = 'daemon_stopped'`).length > 0, 10_000, "stop event");
  });

  it("runs a built-in job type in its container with our script mounted (docker CLI faked), settled 75/25", async () => {
    const p = await makeProvider(srv);
    const renter = await makeRenter(srv, 1_000);
    const { file, dir } = await download(p.key);
    // Plays `docker run`: records its argv, reads the task from the mounted output folder, answers.
    const calls = path.join(dir, "docker-calls.jsonl");
    const docker = writeExecutable(
      dir,
      "docker",
      `#!/usr/bin/env python3
import json, os, sys
args = sys.argv[1:]
open(${JSON.stringify(calls)}, "a").write(json.dumps(args) + "\\n")
if args[:1] != ["run"]:
    sys.exit(0)
out = [a.split(":")[0] for a in args if a.endswith(":/svc-output")][0]
scripts = [a.split(":")[0] for a in args if a.endswith(":/svc-scripts:ro")][0]
task = json.load(open(os.path.join(out, "task.json")))
print("SVC_PROGRESS 40 generating", flush=True)
print("script: " + open(os.path.join(scripts, "llm.py")).readline().strip(), flush=True)
json.dump({"response": "from the container: " + task["task_spec"]["inputs"]["prompt"]}, open(os.path.join(out, "result.json"), "w"))
`,
    );
    const d = run(file, dir, { SVC_DOCKER: docker });
    const r = await api().post("/api/jobs/submit", { job_type: "llm-inference", duration_minutes: 1, params: { prompt: "hello", max_tokens: 64 } }, renter.headers);
    expect(r.status, r.text).toBe(201);
    const j = r.body.job as { job_id: string; provider_id: number };
    expect(j.provider_id).toBe(p.id);
    const done = await ended(j.job_id, `container job end (${d.output()})`);
    expect(done.status, done.error).toBe("completed");
    expect(done.metrics.executor).toBe("docker");
    expect(done.provider_earned_halala + done.platform_fee_halala).toBe(done.actual_cost_halala);
    expect(done.provider_earned_halala).toBe(Math.floor((done.actual_cost_halala * 75) / 100));
    expect((await api().get(`/api/jobs/${j.job_id}/output`, renter.headers)).body.response).toBe("from the container: hello");
    const logs = await api().get(`/api/jobs/${j.job_id}/logs`, renter.headers);
    expect(logs.body.logs.map((l: { message: string }) => l.message).join("\n")).toMatch(/script: """llm-inference inside the job's container/);

    const runArgs = fs.readFileSync(calls, "utf8").trim().split("\n").map((l) => JSON.parse(l) as string[]).find((a) => a[0] === "run")!;
    expect(runArgs).toContain("--gpus");
    expect(runArgs).not.toContain("--network"); // the model is downloaded
    expect(runArgs.join(" ")).toContain(`-v ${path.join(dir, "work", ".svc-scripts")}:/svc-scripts:ro`);
    expect(runArgs.slice(-2)).toEqual(["python", "/svc-scripts/llm.py"]);
    // The mounted program is the TypeScript daemon's, byte for byte.
    expect(fs.readFileSync(path.join(dir, "work", ".svc-scripts", "llm.py"), "utf8")).toBe(
      fs.readFileSync(new URL("../../src/daemon/ts/container-scripts/llm.py", import.meta.url), "utf8"),
    );
    // With the download helper that train.py and render.py import from beside them.
    expect(fs.readFileSync(path.join(dir, "work", ".svc-scripts", "svc_fetch.py"), "utf8")).toBe(
      fs.readFileSync(new URL("../../src/daemon/ts/container-scripts/svc_fetch.py", import.meta.url), "utf8"),
    );
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("runs the minimal custom_container and rendering jobs on their defaults, offline (docker CLI faked)", async () => {
    const p = await makeProvider(srv);
    const renter = await makeRenter(srv, 1_000);
    const { file, dir } = await download(p.key);
    const calls = path.join(dir, "docker-calls.jsonl");
    // Plays the container: nvidia-smi prints what the real one prints; our render program reports the scene it was given.
    const docker = writeExecutable(
      dir,
      "docker",
      `#!/usr/bin/env python3
import json, os, sys
args = sys.argv[1:]
open(${JSON.stringify(calls)}, "a").write(json.dumps(args) + "\\n")
if args[:1] != ["run"]:
    sys.exit(0)
out = [a.split(":")[0] for a in args if a.endswith(":/svc-output")][0]
task = json.load(open(os.path.join(out, "task.json")))["task_spec"]
if args[-1] == "nvidia-smi":
    sys.stdout.write(open(${JSON.stringify(path.join(FIXTURES, "nvidia-smi.txt"))}).read())
elif args[-1] == "/svc-scripts/render.py":
    json.dump({"files": [], "frames": 1, "scene": task["inputs"]["scene_url"]}, open(os.path.join(out, "result.json"), "w"))
else:
    sys.exit(9)
`,
    );
    const d = run(file, dir, { SVC_DOCKER: docker });
    const runs = () => fs.readFileSync(calls, "utf8").trim().split("\n").map((l) => JSON.parse(l) as string[]).filter((a) => a[0] === "run");

    const smoke = await api().post("/api/jobs/submit", { job_type: "custom_container", duration_minutes: 2 }, renter.headers);
    expect(smoke.status, smoke.text).toBe(201);
    const smokeDone = await ended(smoke.body.job.job_id, `smoke check end (${d.output()})`);
    expect(smokeDone.status, smokeDone.error).toBe("completed");
    expect((await api().get(`/api/jobs/${smoke.body.job.job_id}/output`, renter.headers)).body.response).toMatch(/NVIDIA-SMI/);
    const smokeRun = runs()[0];
    expect(smokeRun.slice(-2)).toEqual(["nvidia/cuda:12.4.1-runtime-ubuntu22.04", "nvidia-smi"]);
    expect(smokeRun.join(" ")).toContain("--gpus device=0 --network none");

    const render = await api().post("/api/jobs/submit", { job_type: "rendering", duration_minutes: 2 }, renter.headers);
    expect(render.status, render.text).toBe(201);
    const renderDone = await ended(render.body.job.job_id, `render end (${d.output()})`);
    expect(renderDone.status, renderDone.error).toBe("completed");
    expect(renderDone.result).toMatchObject({ scene: "builtin:benchmark-scene" });
    const renderRun = runs()[1];
    expect(renderRun.slice(-3)).toEqual(["linuxserver/blender:4.2.3", "python", "/svc-scripts/render.py"]);
    // The built-in scene is built in the container: nothing to download, so no network.
    expect(renderRun).toContain("--network");
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("never gets a task changed behind the service's back: the job fails as the platform's fault, refunded", async () => {
    const p = await makeProvider(srv);
    const renter = await makeRenter(srv, 1_000);
    const j = await submit(renter, { suite: "quick", iterations: 1 });
    await srv.sql`UPDATE jobs SET task_spec = jsonb_set(task_spec, '{inputs,iterations}', '1000') WHERE job_id = ${j.job_id}`;
    const { file, dir } = await download(p.key);
    const d = run(file, dir);
    const done = await ended(j.job_id, `refusal (${d.output()})`);
    expect(done).toMatchObject({ status: "failed", end_reason: "platform_error", fault: "platform", actual_cost_halala: 0 });
    expect(done.error).toMatch(/no longer matches the signature/);
    expect(jobProcesses(j.job_id)).toEqual([]);
    expect((await api().get("/api/renters/balance", renter.headers)).body).toMatchObject({ balance_halala: 1000, held_halala: 0 });
    const [a] = await srv.sql`SELECT fault, end_reason FROM job_attempts WHERE job_id = ${done.id}`;
    expect(a).toEqual({ fault: "platform", end_reason: "platform_error" });
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("reports a task it cannot verify as signature_mismatch: the provider's fault, the job re-queued at no charge", async () => {
    const p = await makeProvider(srv);
    const renter = await makeRenter(srv, 1_000);
    const { file, dir } = await download(p.key);
    // A daemon holding the wrong secret (a stale file, a wrong environment): it refuses every task.
    const d = run(file, dir, { SVC_HMAC_SECRET: "not-this-servers-secret" });
    await waitFor(async () => (await srv.sql`SELECT readiness_status FROM providers WHERE id = ${p.id}`)[0].readiness_status, 45_000, `readiness (${d.output()})`);
    const j = await submit(renter, { suite: "quick", iterations: 1 });
    const a = await waitFor(async () => {
      const [row] = await srv.sql`SELECT a.* FROM job_attempts a JOIN jobs j ON j.id = a.job_id WHERE j.job_id = ${j.job_id} AND a.attempt = 1 AND a.ended_at IS NOT NULL`;
      return row;
    }, 45_000, `refusal (${d.output()})`);
    expect(a).toMatchObject({ status: "requeued", end_reason: "signature_mismatch", fault: "provider", cost_halala: 0 });
    expect(await job(j.job_id)).toMatchObject({ status: "queued", attempt: 2 });
    expect(jobProcesses(j.job_id)).toEqual([]);
    // Nothing charged, nothing earned; the hold waits for the next provider.
    expect((await api().get("/api/renters/balance", renter.headers)).body).toMatchObject({ balance_halala: 1000, held_halala: 10 });
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("removes a runner job's folder once its result is read, before it is reported; never what a link in it points to", async () => {
    const p = await makeProvider(srv);
    const renter = await makeRenter(srv, 1_000);
    const { file, dir } = await download(p.key);
    const outside = path.join(dir, "outside");
    fs.mkdirSync(outside);
    fs.writeFileSync(path.join(outside, "keep.txt"), "the provider's");
    // Outputs, a nested folder, links out of the folder (to a folder and to a file), then the result.
    const runner = writeExecutable(
      dir,
      "writer",
      [
        "#!/bin/sh",
        'cd "$SVC_WORKSPACE"',
        "mkdir -p out/deep && head -c 100000 /dev/zero > out/deep/weights.bin",
        `ln -s '${outside}' link-dir && ln -s '${outside}/keep.txt' link-file`,
        `echo '{"answer": 42}' > "$SVC_RESULT_FILE"`,
        "",
      ].join("\n"),
    );
    const work = path.join(dir, "work");
    const d = run(file, dir, { SVC_RUNNERS: `benchmark=${runner}` });
    const j = await submit(renter, { suite: "quick", iterations: 1 });
    const done = await ended(j.job_id, "job end").catch((err) => Promise.reject(new Error(`${err.message}: ${d.output()}`)));
    expect(done.status, done.error).toBe("completed");
    expect((await api().get(`/api/jobs/${j.job_id}/output`, renter.headers)).body).toMatchObject({ answer: 42 });
    expect(fs.existsSync(path.join(work, j.job_id)), d.output()).toBe(false);
    expect(fs.readdirSync(path.join(work, ".svc-procs"))).toEqual([]);
    expect(fs.readdirSync(outside)).toEqual(["keep.txt"]);
    expect(fs.readFileSync(path.join(outside, "keep.txt"), "utf8")).toBe("the provider's");
  });

  it("reports the job's own failure as the renter's: the time used is billed 75/25", async () => {
    const p = await makeProvider(srv);
    const renter = await makeRenter(srv, 1_000);
    const { file, dir } = await download(p.key);
    const runner = writeExecutable(dir, "bad-input", "#!/bin/sh\necho 'bad input'\nexit 3\n");
    const d = run(file, dir, { SVC_RUNNERS: `benchmark=${runner}` });
    const j = await submit(renter, { suite: "quick", iterations: 1 });
    const done = await ended(j.job_id, "job end").catch((err) => Promise.reject(new Error(`${err.message}: ${d.output()}`)));
    expect(done).toMatchObject({ status: "failed", end_reason: "runtime_error", fault: "renter", actual_cost_halala: 10, provider_earned_halala: 7, platform_fee_halala: 3 });
    expect(done.error).toMatch(/exited with status 3/);
    // However the job ended, its folder went once it did.
    expect(fs.existsSync(path.join(dir, "work", j.job_id))).toBe(false);
    expect((await api().get("/api/renters/balance", renter.headers)).body).toMatchObject({ balance_halala: 990, held_halala: 0 });
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("on SIGTERM mid-job stops the job, leaves no child process and hands it back as interrupted (no charge)", async () => {
    const p = await makeProvider(srv);
    const renter = await makeRenter(srv, 1_000);
    const { file, dir } = await download(p.key);
    const d = run(file, dir, { SVC_STOP_GRACE_SECONDS: "1" });
    const j = await submit(renter, { suite: "memory", iterations: 1000 });
    await waitFor(async () => (await job(j.job_id)).status === "running" && jobProcesses(j.job_id).length > 0, 45_000, `running (${d.output()})`);
    d.kill("SIGTERM");
    expect(await d.exited).toBe(0);
    expect(jobProcesses(j.job_id)).toEqual([]);
    // The built-in benchmark's folder went with the stopped job.
    expect(fs.existsSync(path.join(dir, "work", j.job_id))).toBe(false);
    const a = await waitFor(async () => {
      const [row] = await srv.sql`SELECT a.* FROM job_attempts a JOIN jobs j ON j.id = a.job_id WHERE j.job_id = ${j.job_id} AND a.attempt = 1 AND a.ended_at IS NOT NULL`;
      return row;
    }, 20_000, "hand back");
    expect(a).toMatchObject({ status: "requeued", end_reason: "provider_interrupted", fault: "provider", cost_halala: 0 });
    expect(a.error).toMatch(/interrupted/);
    expect(await job(j.job_id)).toMatchObject({ status: "queued", attempt: 2 });
    expect((await api().get("/api/renters/balance", renter.headers)).body).toMatchObject({ balance_halala: 1000, held_halala: 10 });
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("updates itself when the server says so: downloads, verifies, replaces its file, restarts", async () => {
    const p = await makeProvider(srv);
    const { file, dir, text } = await download(p.key);
    fs.writeFileSync(file, text.replace('DAEMON_VERSION = "3.2.0"', 'DAEMON_VERSION = "3.0.0"'));
    const d = run(file, dir);
    await waitFor(async () => (await srv.sql`SELECT daemon_version FROM providers WHERE id = ${p.id}`)[0].daemon_version === "3.2.0", 45_000, `update (${d.output()})`);
    const onDisk = fs.readFileSync(file);
    const check = await api().get(`/api/providers/download/daemon?key=${p.key}&check_only=true`);
    expect(crypto.createHash("sha256").update(onDisk).digest("hex")).toBe(check.body.sha256);
    // It holds the provider key and the task-signing secret: its owner's only.
    expect(fs.statSync(file).mode & 0o777).toBe(0o700);
    expect(d.output()).toMatch(/updated to 3\.2\.0; restarting/);
    const events = (await srv.sql`SELECT event_type FROM daemon_events WHERE provider_id = ${p.id}`).map((e) => e.event_type);
    expect(events).toContain("self_update");
  });
});
