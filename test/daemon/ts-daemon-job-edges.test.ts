// Edges of a job's life in the TypeScript daemon: a job the server cancels
// while the daemon is still checking it (probing its GPUs) is neither accepted
// nor started; a container docker fails to remove at the job's end is asked
// again, and the failure logged, not forgotten while it may still hold the GPU.
import path from "node:path";
import { describe, expect, it } from "vitest";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { endedJob, FIXTURES, gatedRunner, tempDir, waitFor, writeExecutable } from "./helpers.js";
import { dockerDaemon, useTsDaemonServer } from "./ts-harness.js";

const h = useTsDaemonServer();

describe("svc-daemon (TypeScript): job edges", { timeout: 120_000 }, () => {
  it("does not accept or start a job the server cancelled while the daemon was still checking it", async () => {
    const p = await makeProvider(h.srv);
    const dir = tempDir("tsd-slow-smi");
    // No GPU (nvidia-smi -L lists none), and a slow telemetry query (a busy driver): 4 s.
    const smi = writeExecutable(
      dir,
      "nvidia-smi",
      `#!/bin/sh\ncase "$1" in\n  --query-gpu=*) sleep 4; exit 9 ;;\n  -L) exit 0 ;;\n  *) cat '${path.join(FIXTURES, "nvidia-smi.txt")}' ;;\nesac\n`,
    );
    const gate = gatedRunner();
    const d = h.startDaemon(p.key, ["--runner", gate.runner, "--nvidia-smi", smi]);
    await waitFor(async () => (await h.srv.sql`SELECT readiness_status FROM providers WHERE id = ${p.id}`)[0].readiness_status, 60_000, `daemon up (${d.output()})`);
    const renter = await makeRenter(h.srv, 10_000);
    const job = await h.submit(renter, { job_type: "llm-inference", params: { prompt: "hi", max_tokens: 32 } });
    expect(job.provider_id).toBe(p.id);
    // Cancelled at once: the daemon has the job and is still probing the GPUs.
    const c = await h.api().post(`/api/jobs/${job.job_id}/cancel`, {}, renter.headers);
    expect(c.status, c.text).toBe(200);
    // Whichever comes first once the probe is done: the job dropped, or its program started.
    await waitFor(() => gate.started() || d.output().includes(`job ${job.job_id} not started`), 30_000, `the job dropped or started (${d.output()})`);
    gate.open();
    expect(gate.started(), `the cancelled job's program ran (${d.output()})`).toBe(false);
    expect(d.output()).toContain(`job ${job.job_id} cancelled by the server`);
    expect((await h.job(job.job_id)).status).toBe("cancelled");
  });

  it("asks docker again to remove a job's container it failed to remove, and logs it", async () => {
    const { p, docker, d } = await dockerDaemon(h, { docker: { rmFailures: 2 } });
    const renter = await makeRenter(h.srv, 10_000);
    const job = await h.submit(renter, { job_type: "custom_container", duration_minutes: 2, params: { command: ["true"] } });
    expect(job.provider_id).toBe(p.id);
    const done = await endedJob(h.srv.sql, job.job_id, `job end (${d.output()})`);
    expect(done.status, done.error).toBe("completed");
    await waitFor(() => !docker.containers().some((c) => c.labels["svc.job_id"] === job.job_id), 30_000, `container removed (${d.output()})`);
    const rms = docker.calls().filter((a) => a[0] === "rm");
    expect(rms.length).toBe(3);
    expect(d.output()).toMatch(/could not remove container \S+ of job \S+ \(try 1 of 3\): .*did not receive an exit event; trying again/);
  });
});
