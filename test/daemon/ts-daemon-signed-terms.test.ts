// The TypeScript daemon object driven directly (no server can send what these
// need: an assignment altered around its signed task, a stream that stays
// away while a job prints): a job runs by its signed task_spec (job type,
// max_duration_seconds), and one whose unsigned fields disagree with it is
// refused as a signature mismatch; while the daemon cannot reach the server
// it holds a bounded amount of a job's log text (a notice line says how many
// lines were dropped), never at the cost of the job's result.
import crypto from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { describe, expect, it } from "vitest";
import { taskSigner } from "../../src/shared/task-signature.js";
import { ProviderDaemon, type DaemonConfig } from "../../src/daemon/ts/daemon.js";
import { tempDir, waitFor, writeExecutable } from "./helpers.js";

type Kind = { case: string; value: any };

/** A daemon whose runner for llm-inference is `runner`, never connected (its server's port is closed). */
function daemonWith(dir: string, runner: string, extra: Partial<DaemonConfig> = {}) {
  const signer = taskSigner(crypto.randomBytes(32));
  const lines: string[] = [];
  const daemon = new ProviderDaemon({
    url: "http://127.0.0.1:9",
    key: "svc-provider-test",
    serverKey: signer.publicKey,
    stateDir: path.join(dir, "state"),
    nvidiaSmi: path.join(dir, "no-nvidia-smi"),
    executors: { runners: { "llm-inference": [runner] }, workRoot: path.join(dir, "work"), docker: undefined },
    cachedModels: [],
    reconnectMinMs: 500,
    reconnectMaxMs: 500,
    stopGraceMs: 1000,
    log: (l) => lines.push(l),
    ...extra,
  });
  const d = daemon as any;
  const onJob = (job: Record<string, unknown>, taskSpec: Record<string, unknown>) => d.onJob({ taskSpecHmac: "", attempt: 1, gpuRequirements: undefined, ...job, taskSpec }, signer.sign(job.jobId as string, taskSpec));
  return { daemon, d, lines, onJob };
}

const ended = (sent: Kind[], jobId: string) =>
  sent.some((k) => k.value.jobId === jobId && (k.case === "jobRejected" || (k.case === "event" && /^job_(completed|failed)$/.test(k.value.eventType))));

describe("svc-daemon (TypeScript): runs what was signed", { timeout: 60_000 }, () => {
  it("refuses a job whose job_type or max_duration_seconds is not what its signed task_spec names, and runs one that matches by the signed terms", async () => {
    const dir = tempDir("tsd-signed");
    const ran = path.join(dir, "ran");
    // Records the job type and kill time it was given, then succeeds.
    const runner = writeExecutable(dir, "runner.sh", `#!/bin/sh\ncat >/dev/null\necho "$SVC_JOB_ID $SVC_JOB_TYPE $SVC_MAX_DURATION_SECONDS" >> '${ran}'\necho '{"response":"x"}' > "$SVC_RESULT_FILE"\n`);
    const { d, lines, onJob } = daemonWith(dir, runner);
    const sent: Kind[] = [];
    d.send = (kind: Kind) => (sent.push(kind), true);
    const spec = (jobId: string, jobType: string, max: number) => ({ version: 1, job_id: jobId, job_type: jobType, inputs: { prompt: "hi" }, limits: { max_duration_seconds: max, gpu_requirements: null } });
    const ranLines = () => (fs.existsSync(ran) ? fs.readFileSync(ran, "utf8") : "");

    // Signed as a benchmark, sent as llm-inference: the llm-inference runner would have run it.
    await onJob({ jobId: "job-type-swapped", jobType: "llm-inference", maxDurationSeconds: 60n }, spec("job-type-swapped", "benchmark", 60));
    // Signed for 60 s, sent with a day: its kill timer would have been the day.
    await onJob({ jobId: "job-limit-raised", jobType: "llm-inference", maxDurationSeconds: 86_400n }, spec("job-limit-raised", "llm-inference", 60));
    // As signed: runs.
    await onJob({ jobId: "job-as-signed", jobType: "llm-inference", maxDurationSeconds: 60n }, spec("job-as-signed", "llm-inference", 60));
    for (const jobId of ["job-type-swapped", "job-limit-raised", "job-as-signed"]) await waitFor(() => ended(sent, jobId), 20_000, `${jobId} ended (${JSON.stringify(sent)} ${lines.join("\n")})`);

    const rejected = (jobId: string) => sent.find((k) => k.case === "jobRejected" && k.value.jobId === jobId)?.value;
    expect(rejected("job-type-swapped")).toMatchObject({ endReason: "signature_mismatch" });
    expect(rejected("job-type-swapped").reason).toMatch(/job_type llm-inference is not the signed task's benchmark/);
    expect(rejected("job-limit-raised")).toMatchObject({ endReason: "signature_mismatch" });
    expect(rejected("job-limit-raised").reason).toMatch(/max_duration_seconds 86400 is not the signed task's 60/);
    expect(rejected("job-as-signed")).toBeUndefined();
    expect(sent.some((k) => k.case === "jobAccepted" && k.value.jobId === "job-as-signed")).toBe(true);
    // Only the job that matches ran, and with the signed terms.
    expect(ranLines().trim().split("\n")).toEqual(["job-as-signed llm-inference 60"]);
  });

  it("holds a bounded amount of a job's log text while it cannot reach the server, says how much it dropped, and keeps the result", async () => {
    const dir = tempDir("tsd-backlog");
    // 32 MB of output: 2,000 lines of 16,000 characters.
    const runner = writeExecutable(dir, "chatty.py", `#!/usr/bin/env python3\nimport sys\nsys.stdin.read()\nline = "x" * 16000 + "\\n"\nfor _ in range(2000):\n    sys.stdout.write(line)\nsys.stdout.flush()\n`);
    const { d, onJob } = daemonWith(dir, runner);
    const jobId = "job-chatty";
    // Not connected: everything waits in the backlog.
    await onJob({ jobId, jobType: "llm-inference", maxDurationSeconds: 600n }, { version: 1, job_id: jobId, job_type: "llm-inference", inputs: { prompt: "hi" }, limits: { max_duration_seconds: 600 } });
    const backlog = d.backlog as Kind[];
    await waitFor(() => backlog.some((k) => k.case === "event" && k.value.eventType === "job_completed" && k.value.jobId === jobId), 60_000, "job end");
    const logLines = backlog.filter((k) => k.case === "logs").flatMap((k) => k.value.logs.map((v: any) => String(v.kind?.value ?? "")));
    const held = logLines.reduce((n: number, l: string) => n + l.length, 0);
    // What the server keeps of an attempt (4 MiB of text), not 32 MB.
    expect(held, `${backlog.length} messages held`).toBeLessThanOrEqual(4 * 1024 * 1024);
    expect(held).toBeGreaterThan(3 * 1024 * 1024);
    const kept = logLines.filter((l: string) => l.startsWith("xxx")).length;
    // The last line says how many were dropped: every line not kept.
    expect(logLines.at(-1)).toMatch(new RegExp(`^\\[svc-daemon\\] ${2000 - kept} log line\\(s\\) of this job were dropped`));
    // The result waits for the server whole.
    expect(d.unackedResults.get(jobId)).toMatchObject({ case: "result", value: { jobId, success: true } });
  });

  it("caps what all jobs hold together while away, dropping log lines past it, never an accept or a result", async () => {
    const dir = tempDir("tsd-backlog-all");
    // 3.2 MB of output: 200 lines of 16,000 characters.
    const runner = writeExecutable(dir, "chatty.py", `#!/usr/bin/env python3\nimport sys\nsys.stdin.read()\nline = "x" * 16000 + "\\n"\nfor _ in range(200):\n    sys.stdout.write(line)\nsys.stdout.flush()\n`);
    const { d, onJob } = daemonWith(dir, runner, { backlogMaxBytes: 1024 * 1024 });
    const jobId = "job-chatty-2";
    await onJob({ jobId, jobType: "llm-inference", maxDurationSeconds: 600n }, { version: 1, job_id: jobId, job_type: "llm-inference", inputs: { prompt: "hi" }, limits: { max_duration_seconds: 600 } });
    const backlog = d.backlog as Kind[];
    await waitFor(() => backlog.some((k) => k.case === "event" && k.value.eventType === "job_completed" && k.value.jobId === jobId), 60_000, "job end");
    const logLines = backlog.filter((k) => k.case === "logs").flatMap((k) => k.value.logs.map((v: any) => String(v.kind?.value ?? "")));
    const held = logLines.reduce((n: number, l: string) => n + l.length, 0);
    expect(held).toBeLessThanOrEqual(1024 * 1024 + 1000);
    const kept = logLines.filter((l: string) => l.startsWith("xxx")).length;
    expect(kept).toBeLessThan(200);
    expect(logLines.at(-1)).toMatch(new RegExp(`^\\[svc-daemon\\] ${200 - kept} log line\\(s\\) of this job were dropped.*could not reach the server`));
    expect(backlog.some((k) => k.case === "jobAccepted" && k.value.jobId === jobId)).toBe(true);
    expect(d.unackedResults.get(jobId)).toMatchObject({ case: "result", value: { jobId, success: true } });
  });
});
