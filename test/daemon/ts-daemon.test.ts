// The TypeScript daemon (bin/svc-daemon.js, a real child process) against the
// real server on the shared port: it registers over the stream, heartbeats
// with nvidia-smi telemetry (a fake nvidia-smi printing captured-format
// output), runs a benchmark job with the process executor, streams logs and
// progress, gets settled 75/25; refuses a tampered task; and runs a
// provider-configured runner (ts-daemon-lifecycle.test.ts: cancel, restart).
import fs from "node:fs";
import path from "node:path";
import { describe, expect, it } from "vitest";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import { tempDir, waitFor, writeExecutable } from "./helpers.js";
import { useTsDaemonServer } from "./ts-harness.js";
import { DAEMON_RELEASE } from "../../src/shared/daemon-release.js";

const h = useTsDaemonServer();

describe("svc-daemon (TypeScript)", { timeout: 90_000 }, () => {
  it("connects, heartbeats, runs a job with the process executor and gets it settled 75/25", async () => {
    const p = await makeProvider(h.srv);
    const renter = await makeRenter(h.srv, 1_000);
    const d = h.startDaemon(p.key);
    const row = await waitFor(async () => {
      const [r] = await h.srv.sql`SELECT * FROM providers WHERE id = ${p.id}`;
      return r.gpu_count === 2 && r.readiness_status ? r : undefined;
    }, 45_000, `heartbeat and readiness (${d.output()})`);
    expect(row.daemon_version).toBe(DAEMON_RELEASE);
    expect(row.gpu_vram_mib).toBe(24564);
    expect(row.gpu_cuda_version).toBe("12.4");
    expect(row.readiness_status).toBe("failed"); // no PyTorch here

    const j = await h.submit(renter, { job_type: "benchmark", params: { suite: "full", iterations: 3 } });
    expect(j.provider_id).toBe(p.id);
    const done = await waitFor(async () => {
      const r = await h.job(j.job_id);
      return r.status === "completed" || r.status === "failed" ? r : undefined;
    }, 45_000, `job end (${d.output()})`);
    expect(done.status, done.error).toBe("completed");
    expect(done).toMatchObject({ actual_cost_halala: 10, provider_earned_halala: 7, platform_fee_halala: 3 });
    expect(done.metrics.executor).toBe("process");
    const out = await h.api().get(`/api/jobs/${j.job_id}/output`, renter.headers);
    expect(out.status).toBe(200);
    expect(out.body.scores.cpu_matmul_gflops).toBeGreaterThan(0);
    expect(out.body.scores.memory_copy_gb_s).toBeGreaterThan(0);
    const logs = await h.api().get(`/api/jobs/${j.job_id}/logs`, renter.headers);
    expect(logs.body.logs.map((l: { message: string }) => l.message).join("\n")).toMatch(/matmul: median .* over 3 runs/);
    expect(done.progress_pct).toBe(100);
    // job_completed follows the result on the stream, so it may land a moment after the settlement.
    const eventTypes = async () => (await h.srv.sql`SELECT event_type FROM daemon_events WHERE provider_id = ${p.id}`).map((e) => e.event_type);
    await expect.poll(eventTypes, { timeout: 10_000 }).toEqual(expect.arrayContaining(["daemon_started", "job_started", "job_completed"]));
    expect((await h.api().get("/api/renters/balance", renter.headers)).body).toMatchObject({ balance_halala: 990, held_halala: 0 });
    expect(await ledgerProblems(h.srv.sql)).toEqual([]);

    expect(await h.stopDaemon(d)).toBe(0);
    expect(d.output()).toMatch(/stopped/);
  });

  it("is never pushed a task changed behind the service's back: the job fails as the platform's fault, refunded", async () => {
    const p = await makeProvider(h.srv);
    const renter = await makeRenter(h.srv, 1_000);
    const j = await h.submit(renter, { job_type: "benchmark", params: { suite: "quick", iterations: 1 } });
    expect(j.provider_id).toBe(p.id);
    // Changed behind the service's back: the stored HMAC no longer matches.
    await h.srv.sql`UPDATE jobs SET task_spec = jsonb_set(task_spec, '{inputs,iterations}', '1000') WHERE job_id = ${j.job_id}`;
    const d = h.startDaemon(p.key);
    const done = await waitFor(async () => {
      const row = await h.job(j.job_id);
      return row.status === "failed" ? row : undefined;
    }, 45_000, `platform failure (${d.output()})`);
    expect(done).toMatchObject({ end_reason: "platform_error", fault: "platform", actual_cost_halala: 0 });
    expect((await h.api().get("/api/renters/balance", renter.headers)).body).toMatchObject({ balance_halala: 1000, held_halala: 0 });
    // The daemon never saw it, so the provider is not docked: its attempt is the platform's.
    expect(d.output()).not.toMatch(new RegExp(j.job_id));
    const [a] = await h.srv.sql`SELECT a.fault FROM job_attempts a JOIN jobs j ON j.id = a.job_id WHERE j.job_id = ${j.job_id}`;
    expect(a.fault).toBe("platform");
    expect(await ledgerProblems(h.srv.sql)).toEqual([]);
  });

  it("reports a job its machine could not start as provider_error (re-queued, no charge) and stays up", async () => {
    const p = await makeProvider(h.srv);
    const renter = await makeRenter(h.srv, 1_000);
    // The work folder is a file: the job's folder cannot be made.
    const dir = tempDir("badwork");
    const workDir = `${dir}/work`;
    fs.writeFileSync(workDir, "not a folder");
    const runner = writeExecutable(dir, "noop.sh", "#!/bin/sh\necho hi\n");
    const d = h.startDaemon(p.key, ["--work-dir", workDir, "--runner", `llm-inference=${runner}`]);
    await waitFor(async () => (await h.srv.sql`SELECT readiness_status FROM providers WHERE id = ${p.id}`)[0].readiness_status, 45_000, "daemon up");
    const j = await h.submit(renter, { job_type: "llm-inference", params: { prompt: "hello", max_tokens: 64 } });
    expect(j.provider_id).toBe(p.id);
    const first = await waitFor(async () => {
      const [row] = await h.srv.sql`SELECT a.* FROM job_attempts a JOIN jobs j ON j.id = a.job_id WHERE j.job_id = ${j.job_id} AND a.attempt = 1 AND a.ended_at IS NOT NULL`;
      return row;
    }, 20_000, `the attempt's end (${d.output()})`);
    expect(first).toMatchObject({ end_reason: "provider_error", fault: "provider", cost_halala: 0 });
    expect(first.error).toMatch(/could not start the job/);
    // Still connected: it answers heartbeats.
    const before = (await h.srv.sql`SELECT last_heartbeat FROM providers WHERE id = ${p.id}`)[0].last_heartbeat;
    await waitFor(async () => (await h.srv.sql`SELECT last_heartbeat FROM providers WHERE id = ${p.id}`)[0].last_heartbeat > before, 10_000, `a later heartbeat (${d.output()})`);
  });

  it("runs a job type with the runner the provider configured (process executor)", async () => {
    const p = await makeProvider(h.srv);
    const renter = await makeRenter(h.srv, 1_000);
    const dir = tempDir("runner");
    const runner = writeExecutable(
      dir,
      "echo-llm.py",
      `#!/usr/bin/env python3\nimport json, os, sys\njob = json.load(sys.stdin)\nprint("SVC_PROGRESS 50 generating", flush=True)\nprint("loaded model", job["task_spec"].get("model"), flush=True)\nos.makedirs(os.path.join(os.environ["SVC_WORKSPACE"], "cache"))\nopen(os.path.join(os.environ["SVC_WORKSPACE"], "cache", "model.bin"), "wb").write(bytes(4096))\njson.dump({"response": "echo: " + job["task_spec"]["inputs"]["prompt"]}, open(os.environ["SVC_RESULT_FILE"], "w"))\n`,
    );
    const workDir = path.join(dir, "work");
    h.startDaemon(p.key, ["--work-dir", workDir, "--runner", `llm-inference=python3 ${runner}`]);
    await waitFor(async () => (await h.srv.sql`SELECT readiness_status FROM providers WHERE id = ${p.id}`)[0].readiness_status, 45_000, "daemon up");
    const j = await h.submit(renter, { job_type: "llm-inference", params: { prompt: "hello there", max_tokens: 64 } });
    expect(j.provider_id).toBe(p.id);
    const done = await waitFor(async () => {
      const r = await h.job(j.job_id);
      return r.status === "completed" || r.status === "failed" ? r : undefined;
    }, 45_000, "llm job end");
    expect(done.status, done.error).toBe("completed");
    const out = await h.api().get(`/api/jobs/${j.job_id}/output`, renter.headers);
    expect(out.body.response).toBe("echo: hello there");
    expect(fs.existsSync(runner)).toBe(true);
    // Its folder (what it wrote there, its result file) went once the result was read, before it was reported.
    expect(fs.readdirSync(workDir)).toEqual([".svc-procs"]);
  });

  it("reports the job's own failure as the renter's (billed), and a job type it cannot run as unsupported_on_provider (re-queued)", async () => {
    const p = await makeProvider(h.srv);
    const renter = await makeRenter(h.srv, 1_000);
    // Assigned before the daemon declared what it runs (no docker, and no runner for rendering here):
    // pushed at connect, refused as unsupported, the provider's fault, no charge, and not offered to it again.
    const r = await h.submit(renter, { job_type: "rendering" });
    expect(r.provider_id).toBe(p.id);
    const dir = tempDir("runner");
    const runner = writeExecutable(dir, "bad-input.sh", "#!/bin/sh\necho 'prompt rejected by the model'\nexit 2\n");
    const d = h.startDaemon(p.key, ["--runner", `llm-inference=${runner}`]);
    const a = await waitFor(async () => {
      const [row] = await h.srv.sql`SELECT a.* FROM job_attempts a JOIN jobs j ON j.id = a.job_id WHERE j.job_id = ${r.job_id} AND a.attempt = 1 AND a.ended_at IS NOT NULL`;
      return row;
    }, 45_000, `refusal (${d.output()})`);
    expect(a).toMatchObject({ status: "requeued", end_reason: "unsupported_on_provider", fault: "provider", cost_halala: 0 });
    expect(a.error).toMatch(/docker is not available/);
    expect(await h.job(r.job_id)).toMatchObject({ status: "queued", attempt: 2 });
    // Its heartbeats' declaration is written by the batched telemetry flush, a moment after the beat.
    const declared = await waitFor(async () => (await h.srv.sql`SELECT supported_job_types FROM providers WHERE id = ${p.id}`)[0].supported_job_types, 45_000, `declaration (${d.output()})`);
    expect(declared).not.toContain("rendering");
    // What it declares now keeps such jobs away from it: a rendering submit finds no provider.
    expect((await h.api().post("/api/jobs/submit", { job_type: "rendering", duration_minutes: 1 }, renter.headers)).status).toBe(503);

    const j = await h.submit(renter, { job_type: "llm-inference", params: { prompt: "hello", max_tokens: 64 } });
    const done = await waitFor(async () => {
      const r = await h.job(j.job_id);
      return r.status === "completed" || r.status === "failed" ? r : undefined;
    }, 45_000, `llm job end (${d.output()})`);
    // Under a minute of llm-inference (15/min): 15 billed, 11 to the provider, 4 to the platform.
    expect(done).toMatchObject({ status: "failed", end_reason: "runtime_error", fault: "renter", actual_cost_halala: 15, provider_earned_halala: 11, platform_fee_halala: 4 });
    // The rendering job's hold (20 halala) waits for another provider.
    expect((await h.api().get("/api/renters/balance", renter.headers)).body).toMatchObject({ balance_halala: 985, held_halala: 20 });
    expect(await ledgerProblems(h.srv.sql)).toEqual([]);
  });
});
