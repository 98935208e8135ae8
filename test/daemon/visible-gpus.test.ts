// CUDA_VISIBLE_DEVICES in the TypeScript daemon's environment: which GPUs it
// names (visibleGpus, as CUDA reads it), and a daemon started with it reports
// and hands its jobs only those.
import { describe, expect, it } from "vitest";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { visibleGpus } from "../../src/daemon/ts/visible-gpus.js";
import { fakeDocker, optionOf, tempDir, waitFor } from "./helpers.js";
import { useTsDaemonServer } from "./ts-harness.js";

const h = useTsDaemonServer();

const host = [
  { index: 0, uuid: "GPU-5c7e4b6a-2b8f-4d2a-9a53-0e1f7f2c9d11" },
  { index: 1, uuid: "GPU-0b9d1e44-7a3c-11ee-b962-0242ac120002" },
  { index: 2, uuid: "GPU-0b9d77aa-0000-11ee-b962-0242ac120002" },
  { index: 3, uuid: null },
];
const names = (visible: string | undefined) => {
  const v = visibleGpus(host, visible);
  return { indices: v.gpus.map((g) => g.index), ignored: v.ignored };
};

describe("CUDA_VISIBLE_DEVICES (TypeScript daemon)", { timeout: 120_000 }, () => {
  it("names GPUs by nvidia-smi index or UUID; unset is every GPU, empty none; an entry naming no GPU ends the list", () => {
    expect(names(undefined)).toEqual({ indices: [0, 1, 2, 3], ignored: [] });
    expect(names("")).toEqual({ indices: [], ignored: [] });
    expect(names(" ")).toEqual({ indices: [], ignored: [] });
    expect(names("1,3")).toEqual({ indices: [1, 3], ignored: [] });
    // In the host's order, each once.
    expect(names(" 3, 1 ,1")).toEqual({ indices: [1, 3], ignored: [] });
    expect(names("GPU-5c7e4b6a-2b8f-4d2a-9a53-0e1f7f2c9d11,2")).toEqual({ indices: [0, 2], ignored: [] });
    // A UUID prefix that names one GPU (case aside); an ambiguous one names none.
    expect(names("gpu-0B9D1E44")).toEqual({ indices: [1], ignored: [] });
    expect(names("0,GPU-0b9d,1")).toEqual({ indices: [0], ignored: ["GPU-0b9d", "1"] });
    // As CUDA reads it: the list ends at the first entry naming no GPU (-1 hides them all).
    expect(names("-1")).toEqual({ indices: [], ignored: ["-1"] });
    expect(names("1,7,2")).toEqual({ indices: [1], ignored: ["7", "2"] });
    expect(names("all")).toEqual({ indices: [], ignored: ["all"] });
    expect(names("MIG-4f1e2c3b-1111-2222-3333-444455556666")).toEqual({ indices: [], ignored: ["MIG-4f1e2c3b-1111-2222-3333-444455556666"] });
    expect(names("1,")).toEqual({ indices: [1], ignored: [""] });
  });

  it("a daemon started with CUDA_VISIBLE_DEVICES=1 on a 2-GPU host reports one GPU and runs every job on GPU 1", async () => {
    const p = await makeProvider(h.srv);
    const renter = await makeRenter(h.srv, 1_000);
    const docker = fakeDocker(tempDir("visible-docker"));
    const d = h.startDaemon(p.key, ["--docker", docker.path], { CUDA_VISIBLE_DEVICES: "1" });
    await waitFor(async () => (await h.srv.sql`SELECT readiness_status FROM providers WHERE id = ${p.id}`)[0].readiness_status, 45_000, `daemon up (${d.output()})`);
    // Its heartbeats report GPU 1 alone (the row's gpu_count is 1 before any heartbeat too).
    const row = await waitFor(async () => (await h.srv.sql`SELECT gpu_count, gpu_telemetry FROM providers WHERE id = ${p.id}`).find((r) => r.gpu_telemetry?.all_gpus), 15_000, "a heartbeat");
    expect(row.gpu_count).toBe(1);
    expect(row.gpu_telemetry.all_gpus.map((g: { index: number }) => g.index)).toEqual([1]);
    const gpuOf = (jobId: string) => {
      const run = docker.runs().find((r) => r.includes(`svc.job_id=${jobId}`));
      return run && optionOf(run, "--gpus");
    };
    const job = { job_type: "custom_container", duration_minutes: 2, params: { command: ["wait"] } };
    const jobs: string[] = [];
    try {
      const first = await h.submit(renter, job);
      const second = await h.submit(renter, job);
      jobs.push(first.job_id, second.job_id);
      await waitFor(() => gpuOf(first.job_id), 45_000, `first container started (${d.output()})`);
      expect(gpuOf(first.job_id)).toBe("device=1");
      // One GPU reported, one job at a time: the second waits for GPU 1.
      await new Promise((r) => setTimeout(r, 1000));
      expect(gpuOf(second.job_id)).toBeUndefined();
      docker.release(first.job_id);
      await waitFor(() => gpuOf(second.job_id), 45_000, `second container started (${d.output()})`);
      expect(gpuOf(second.job_id)).toBe("device=1");
      docker.release(second.job_id);
      await waitFor(async () => (await h.job(second.job_id)).status === "completed", 45_000, `second job completed (${d.output()})`);
    } finally {
      for (const id of jobs) docker.release(id);
    }
    expect(d.output()).toContain('CUDA_VISIBLE_DEVICES="1": jobs get GPUs 1 of the 2 nvidia-smi lists');
  });
});
