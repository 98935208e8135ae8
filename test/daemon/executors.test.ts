// The executors the TypeScript daemon runs jobs with, exercised through an
// injectable command path: a fake `docker` that records its argv and prints
// what the real CLI prints, and real child processes for the process
// executor (kill on stop, no process left behind).
import fs from "node:fs";
import http from "node:http";
import path from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { DockerExecutor, dockerRunArgs, portAnswers, servePortOf } from "../../src/daemon/ts/executors/docker.js";
import { ProcessExecutor } from "../../src/daemon/ts/executors/process.js";
import { CONTAINER_SCRIPTS, executorFor } from "../../src/daemon/ts/executors/plan.js";
import { parseProgress, type JobHooks, type JobSpec } from "../../src/daemon/ts/executors/types.js";
import type { JsonObject } from "@bufbuild/protobuf";
import { BUILTIN_DATASETS, BUILTIN_SCENES, DEFAULT_CONTAINERS, validateParams } from "../../src/domain/jobs/job-schemas.js";
import { buildTaskSpec, modelOf } from "../../src/domain/jobs/task-spec.js";
import type { JobType } from "../../src/domain/money/pricing.js";
import { backoffMs } from "../../src/daemon/ts/daemon.js";
import { configFromArgs, parseRunners } from "../../src/daemon/ts/cli.js";
import { GpuProbe } from "../../src/daemon/ts/nvidia-smi.js";
import { fakeDocker, optionOf, tempDir, waitFor, writeExecutable } from "./helpers.js";
import { jobProcesses } from "./procs.js";

const dir = tempDir("docker");
const calls = path.join(dir, "calls.log");
// Records each invocation as one JSON line; `run` prints a pull, the program's output and writes the result.
const FAKE_DOCKER = writeExecutable(
  dir,
  "docker",
  `#!/usr/bin/env python3
import json, os, sys, time, signal
args = sys.argv[1:]
with open(${JSON.stringify(calls)}, "a") as f:
    f.write(json.dumps(args) + "\\n")
cmd = args[0] if args else ""
if cmd == "version":
    print("24.0.7"); sys.exit(0)
if cmd == "kill":
    print(args[1])
    pidfile = ${JSON.stringify(dir)} + "/" + args[1] + ".pid"
    if os.path.exists(pidfile):
        os.kill(int(open(pidfile).read()), signal.SIGTERM)
    sys.exit(0)
if cmd == "run":
    name = args[args.index("--name") + 1]
    open(${JSON.stringify(dir)} + "/" + name + ".pid", "w").write(str(os.getpid()))
    out = [a.split(":")[0] for a in args if a.endswith(":/svc-output")][0]
    image = [a for a in args if "/" in a and ":" in a and not a.startswith("/") and "=" not in a][-1]
    print("Unable to find image '%s' locally" % image, flush=True)
    print("4.41.3: Pulling from huggingface/transformers-pytorch-gpu", flush=True)
    print("Digest: sha256:9f2b7e4c0d1a", flush=True)
    print("Status: Downloaded newer image for %s" % image, flush=True)
    if os.environ.get("FAKE_DOCKER_SLEEP"):
        time.sleep(float(os.environ["FAKE_DOCKER_SLEEP"]))
    print("SVC_PROGRESS 40 generating", flush=True)
    print("container says hello", flush=True)
    json.dump({"response": "generated text"}, open(os.path.join(out, "result.json"), "w"))
    sys.exit(0)
print("unknown command", cmd, file=sys.stderr); sys.exit(1)
`,
);

function invocations(): string[][] {
  return fs.existsSync(calls) ? fs.readFileSync(calls, "utf8").trim().split("\n").filter(Boolean).map((l) => JSON.parse(l)) : [];
}

function hooks() {
  const seen = { logs: [] as string[], progress: [] as [number | undefined, string | undefined][], endpoints: [] as string[], endpointKeys: [] as (string | undefined)[] };
  const h: JobHooks = {
    log: (l) => seen.logs.push(l),
    progress: (p, ph) => seen.progress.push([p, ph]),
    endpointReady: (u, k) => {
      seen.endpoints.push(u);
      seen.endpointKeys.push(k);
    },
  };
  return { seen, h };
}

/** The task a minimal submit ({job_type, duration_minutes}) produces, built by the server's own code. */
function minimalJob(jobType: JobType, gpus?: number[]): JobSpec {
  const jobId = `job-min-${jobType}`;
  const params = validateParams(jobType, undefined, { defaultImage: true });
  const taskSpec = buildTaskSpec({
    jobId, jobType, params, containerSpec: DEFAULT_CONTAINERS[jobType], gpuRequirements: null, maxDurationSeconds: 1800,
    workspaceVolumeName: `svc-ws-${jobId}`, checkpointEnabled: false, model: modelOf(jobType, params),
  });
  return { jobId, jobType, maxDurationSeconds: 1800, taskSpec: taskSpec as JsonObject, gpus };
}

const llmJob: JobSpec = {
  jobId: "job-llm1",
  jobType: "llm-inference",
  maxDurationSeconds: 60,
  taskSpec: {
    version: 1,
    job_id: "job-llm1",
    job_type: "llm-inference",
    container: { image: "huggingface/transformers-pytorch-gpu:4.41.3", image_type: "llm" },
    inputs: { prompt: "hi", max_tokens: 64 },
    model: "Qwen/Qwen2.5-7B-Instruct",
    workspace: { volume: "svc-ws-job-llm1", mount_path: "/workspace", checkpoint_enabled: false },
    limits: { max_duration_seconds: 60, gpu_requirements: null },
  },
};

describe("servePortOf", () => {
  it("gives each GPU its own port after a fixed first one, so concurrent serving jobs never share one", () => {
    expect(servePortOf(9000, undefined)).toBe(9000);
    expect(servePortOf(9000, [])).toBe(9000);
    expect(servePortOf(9000, [0])).toBe(9000);
    expect(servePortOf(9000, [3, 2])).toBe(9002);
  });
});

describe("executorFor", () => {
  it("never runs vllm_serve through a runner (it reports no endpoint), and without docker refuses it", () => {
    const serve: JobSpec = { jobId: "job-serve-runner", jobType: "vllm_serve", maxDurationSeconds: 60, taskSpec: {} };
    const runners = { vllm_serve: ["/bin/true"], training: ["/bin/true"] };
    const docker = { docker: FAKE_DOCKER, gpus: false };
    expect(executorFor(serve, { runners, workRoot: dir, docker })).toBeInstanceOf(DockerExecutor);
    expect(() => executorFor(serve, { runners, workRoot: dir, docker: undefined })).toThrow(/docker is not available/);
    expect(executorFor({ ...serve, jobType: "training" }, { runners, workRoot: dir, docker })).toBeInstanceOf(ProcessExecutor);
  });
});

describe("docker executor (fake docker CLI)", () => {
  const opts = { docker: FAKE_DOCKER, workRoot: path.join(dir, "work"), gpus: true, defaultMemoryMb: 2048, scriptsDir: "/opt/svc/scripts" };

  it("runs a model job on its GPU, network for the download, limits, the workspace volume and our script", async () => {
    const { seen, h } = hooks();
    const out = await new DockerExecutor(opts).start({ ...llmJob, gpus: [0] }, h).done;
    expect(out.success, out.error).toBe(true);
    expect(out.result).toEqual({ response: "generated text" });
    expect(out.metrics.executor).toBe("docker");
    const run = invocations().find((a) => a[0] === "run" && a.includes("svc-job-llm1"))!;
    expect(run.slice(0, 5)).toEqual(["run", "--name", "svc-job-llm1", "--label", "svc.job_id=job-llm1"]);
    expect(optionOf(run, "--gpus")).toBe("device=0");
    expect(run).not.toContain("--network");
    // No swap (--memory-swap counts memory and swap together; docker's default allows as much swap again).
    expect(run.join(" ")).toContain("--memory 2048m --memory-swap 2048m --pids-limit 4096");
    expect(run.join(" ")).toContain("-v svc-ws-job-llm1:/workspace");
    expect(run.join(" ")).toContain(`-v ${path.join(opts.workRoot, "job-llm1")}:/svc-output`);
    expect(run.join(" ")).toContain("-v /opt/svc/scripts:/svc-scripts:ro");
    expect(run.slice(-3)).toEqual(["huggingface/transformers-pytorch-gpu:4.41.3", "python", "/svc-scripts/llm.py"]);
    expect(seen.logs).toContain("container says hello");
    expect(seen.logs[0]).toMatch(/Unable to find image/);
    expect(seen.progress).toEqual([[40, "generating"]]);
  });

  it("runs a custom container with no network, its command and env, and no GPUs on a CPU host", () => {
    const plan = dockerRunArgs(
      {
        jobId: "job-c1",
        jobType: "custom_container",
        maxDurationSeconds: 60,
        taskSpec: { container: { image: "python:3.12-slim" }, command: ["python", "-c", "print(1)"], env: { B: "2", A: "1" }, inputs: { workdir: "/app" } },
      },
      { ...opts, gpus: false },
      undefined,
      undefined,
      {},
    );
    const a = plan.argv.join(" ");
    expect(a).toContain("--network none");
    expect(a).not.toContain("--gpus");
    // By name: the values go in docker's own environment, never on its command line.
    expect(a).toContain("-e A -e B -w /app python:3.12-slim python -c print(1)");
    expect(plan.cliEnv).toEqual({ A: "1", B: "2" });
    expect(plan.envFile).toBeUndefined();
  });

  it("passes a task's env that the docker CLI would read itself in an env file, leaving the CLI's environment alone", () => {
    const env = {
      DOCKER_HOST: "tcp://renter-engine:2375",
      PATH: "/renter/bin",
      LD_PRELOAD: "/renter/lib.so",
      http_proxy: "http://renter-proxy",
      SSH_AUTH_SOCK: "/renter/agent.sock",
      PROVIDER_SETTING: "renter-setting",
      TOKEN: "renter-token",
      MULTI: "renter\nlines",
      BAD_DOCKER_CONFIG: "renter-config",
      DOCKER_CONFIG: "renter\nconfig",
      NUL: "renter\u0000nul",
    };
    const plan = dockerRunArgs(
      { jobId: "job-c2", jobType: "custom_container", maxDurationSeconds: 60, taskSpec: { container: { image: "python:3.12-slim" }, command: ["true"], env } },
      opts,
      undefined,
      undefined,
      { PROVIDER_SETTING: "provider", PATH: "/usr/bin" },
    );
    expect(plan.cliEnv).toEqual({ BAD_DOCKER_CONFIG: "renter-config", MULTI: "renter\nlines", TOKEN: "renter-token" });
    expect(plan.envFile).toEqual({
      path: path.join(opts.workRoot, "job-c2.env"),
      // (SSH_*: ssh, which the CLI runs for an ssh:// engine, reads them.)
      text: "DOCKER_HOST=tcp://renter-engine:2375\nLD_PRELOAD=/renter/lib.so\nPATH=/renter/bin\nPROVIDER_SETTING=renter-setting\nSSH_AUTH_SOCK=/renter/agent.sock\nhttp_proxy=http://renter-proxy\n",
    });
    // No value can go by the file with a line break, nor anywhere with a NUL.
    expect(plan.unpassableEnv).toEqual(["DOCKER_CONFIG", "NUL"]);
    expect(optionOf(plan.argv, "--env-file")).toBe(plan.envFile!.path);
    for (const value of Object.values(env)) expect(plan.argv.some((a) => a.includes(value)), value).toBe(false);
  });

  it("vllm_serve: the engine's key goes to docker by name, with its value in the CLI's environment; a task's own is left out", () => {
    const serve = (env?: JsonObject): JobSpec => ({
      jobId: "job-serve-plan",
      jobType: "vllm_serve",
      maxDurationSeconds: 600,
      taskSpec: { container: { image: "vllm/vllm-openai:v0.6.3" }, model: "Qwen/Qwen2.5-7B-Instruct", serve: { api: "openai", container_port: 8000 }, ...(env ? { env } : {}) },
    });
    const plan = dockerRunArgs(serve({ VLLM_API_KEY: "renter-chosen", A: "1" }), opts, 8123, "the-jobs-own-key");
    expect(plan.argv.join(" ")).toContain("-e A -e VLLM_API_KEY -p 8123:8000");
    expect(plan.argv.join(" ")).not.toContain("renter-chosen");
    expect(plan.argv.join(" ")).not.toContain("the-jobs-own-key");
    expect(plan.cliEnv).toEqual({ A: "1", VLLM_API_KEY: "the-jobs-own-key" });
    expect(plan.droppedKeyEnv).toBe(true);
    // Other job types pass a task's VLLM_API_KEY like any variable, and get no key of ours.
    const other = dockerRunArgs({ ...llmJob, taskSpec: { ...llmJob.taskSpec, env: { VLLM_API_KEY: "x" } } }, opts, undefined, "unused");
    expect(other.argv).toContain("VLLM_API_KEY");
    expect(other.cliEnv).toEqual({ VLLM_API_KEY: "x" });
  });

  it("never mounts a host path nor takes an option from the task's workspace or image, and gives no new privileges", async () => {
    const custom = (spec: JsonObject): JobSpec => ({
      jobId: "job-bad-fields",
      jobType: "custom_container",
      maxDurationSeconds: 60,
      gpus: [0],
      taskSpec: { container: { image: "nvidia/cuda:12.4.1-base-ubuntu22.04" }, command: ["sh", "-c", "cat /host/etc/shadow"], ...spec },
    });
    const refused: [JsonObject, RegExp][] = [
      // A host path as the volume: `-v /:/host` would bind-mount the host's root read-write.
      [{ workspace: { volume: "/", mount_path: "/host" } }, /workspace volume "\/" is not a volume name/],
      [{ workspace: { volume: "/var/run/docker.sock", mount_path: "/var/run/docker.sock" } }, /workspace volume "\/var\/run\/docker.sock" is not a volume name/],
      [{ workspace: { volume: "../etc", mount_path: "/w" } }, /workspace volume "..\/etc" is not a volume name/],
      [{ workspace: { volume: "svc-ws-x", mount_path: "/w:/etc:rw" } }, /workspace mount_path "\/w:\/etc:rw" is not an absolute path without ':'/],
      [{ workspace: { volume: "svc-ws-x", mount_path: "workspace" } }, /workspace mount_path "workspace" is not an absolute path/],
      // An "image" docker would read as its option, the next word then being the image.
      [{ container: { image: "--privileged" }, command: ["ubuntu:22.04", "sh"] }, /container image "--privileged" is not an image reference/],
      [{ container: { image: "-v/:/host" } }, /container image "-v\/:\/host" is not an image reference/],
      [{ container: { image: "ubuntu:22.04 --privileged" } }, /is not an image reference/],
    ];
    for (const [spec, why] of refused) {
      const bad = custom(spec);
      expect(() => dockerRunArgs(bad, opts), JSON.stringify(spec)).toThrow(why);
      // The daemon refuses such a task before anything runs (sent back as unsupported_on_provider), with the reason.
      expect(() => executorFor(bad, { runners: {}, workRoot: opts.workRoot, docker: opts }), JSON.stringify(spec)).toThrow(/^the daemon does not run this task: /);
    }
    // Nor does docker see the image as an option while the job is prepared (image inspect, pull).
    const before = invocations().length;
    const signal = new AbortController().signal;
    const why = await new DockerExecutor(opts).prepare(custom({ container: { image: "--privileged" } }), { deadline: Date.now() + 10_000, signal, stop: signal, log: () => {}, preparing: () => {} });
    expect(why).toMatch(/is not an image reference/);
    expect(invocations().length).toBe(before);
    // What the server sends runs as it is: its own volume at /workspace, a pinned image, a digest, a registry with a port.
    for (const image of ["nvidia/cuda:12.4.1-runtime-ubuntu22.04", `registry.example.com:5000/team/app@sha256:${"a".repeat(64)}`, "python:3.12-slim"]) {
      const argv = dockerRunArgs(custom({ container: { image }, workspace: { volume: "svc-ws-job-lx2-0a1b2c", mount_path: "/workspace", checkpoint_enabled: false } }), opts).argv;
      expect(argv.join(" ")).toContain("-v svc-ws-job-lx2-0a1b2c:/workspace");
      expect(argv[argv.length - 4]).toBe(image);
    }
    // No process of any container gains privileges through a setuid program.
    for (const t of ["custom_container", "training", "rendering", "vllm_serve"] as JobType[]) {
      expect(optionOf(dockerRunArgs(minimalJob(t, [0]), opts, 8000, "k").argv, "--security-opt"), t).toBe("no-new-privileges");
    }
  });

  it("runs the minimal jobs' defaults: the built-in scene and the smoke check need no network", () => {
    const argv = (t: JobType) => dockerRunArgs(minimalJob(t, [0]), opts).argv;
    expect(argv("rendering")).toContain("--network");
    expect(argv("rendering").slice(-3)).toEqual(["linuxserver/blender:4.2.3", "python", "/svc-scripts/render.py"]);
    expect(argv("custom_container").join(" ")).toContain("--gpus device=0 --network none");
    expect(argv("custom_container").slice(-2)).toEqual(["nvidia/cuda:12.4.1-runtime-ubuntu22.04", "nvidia-smi"]);
    // Training still downloads its base model; the tiny dataset is made in the container.
    expect(argv("training")).not.toContain("--network");
    expect(argv("training").slice(-3)).toEqual(["pytorch/pytorch:2.4.1-cuda12.1-cudnn9-runtime", "python", "/svc-scripts/train.py"]);
    const remoteScene = minimalJob("rendering");
    (remoteScene.taskSpec.inputs as JsonObject).scene_url = "https://scenes.example.com/a.blend";
    expect(dockerRunArgs(remoteScene, opts).argv).not.toContain("--network");
  });

  it("publishes a custom_container's expose_port on the serving host port, with the network docker needs for it; without it, no port and no network", () => {
    const exposing = (port?: number): JobSpec => {
      const jobId = "job-expose";
      const params = validateParams("custom_container", { command: ["python", "-m", "http.server", "8080"], ...(port ? { expose_port: port } : {}) }, { defaultImage: true });
      const taskSpec = buildTaskSpec({
        jobId, jobType: "custom_container", params, containerSpec: DEFAULT_CONTAINERS.custom_container, gpuRequirements: null, maxDurationSeconds: 600,
        workspaceVolumeName: `svc-ws-${jobId}`, checkpointEnabled: false, model: null,
      });
      return { jobId, jobType: "custom_container", maxDurationSeconds: 600, taskSpec: taskSpec as JsonObject, gpus: [1] };
    };
    const plan = dockerRunArgs(exposing(8080), opts, servePortOf(9100, [1]));
    expect(optionOf(plan.argv, "-p")).toBe("9101:8080");
    expect(plan.hostPort).toBe(9101);
    expect(plan.argv).not.toContain("--network");
    // No key of the daemon's: the renter's program answers on its port as it chooses.
    expect(plan.argv.join(" ")).not.toContain("VLLM_API_KEY");
    expect(plan.argv.slice(-5)).toEqual(["nvidia/cuda:12.4.1-runtime-ubuntu22.04", "python", "-m", "http.server", "8080"]);

    const plain = dockerRunArgs(exposing(), opts).argv;
    expect(plain).not.toContain("-p");
    expect(optionOf(plain, "--network")).toBe("none");
  });

  it("counts a published port as answering only when a connection to it holds or says something", async () => {
    const net = await import("node:net");
    const listen = (onConnection: (s: import("node:net").Socket) => void) =>
      new Promise<import("node:net").Server>((resolve) => {
        const server = net.createServer(onConnection);
        server.listen(0, "127.0.0.1", () => resolve(server));
      });
    const portOf = (s: import("node:net").Server) => (s.address() as import("node:net").AddressInfo).port;
    const silent = await listen(() => {});
    const banner = await listen((s) => s.write("SSH-2.0-x\r\n"));
    // What docker's proxy does when nothing in the container listens: accepts, then closes.
    const closing = await listen((s) => s.destroy());
    try {
      expect(await portAnswers(portOf(silent))).toBe(true);
      expect(await portAnswers(portOf(banner))).toBe(true);
      expect(await portAnswers(portOf(closing))).toBe(false);
      const gone = portOf(closing);
      closing.close();
      await new Promise((r) => closing.once("close", r));
      expect(await portAnswers(gone)).toBe(false);
    } finally {
      for (const s of [silent, banner]) s.close();
    }
  });

  it("stops a job with docker kill and reports the reason", async () => {
    const { h } = hooks();
    process.env.FAKE_DOCKER_SLEEP = "30";
    const running = new DockerExecutor(opts).start({ ...llmJob, jobId: "job-kill1" }, h);
    // Until docker runs: the CLI is started once the job's volume is there.
    await waitFor(() => fs.existsSync(path.join(dir, "svc-job-kill1.pid")), 10_000, "container started").finally(() => delete process.env.FAKE_DOCKER_SLEEP);
    await running.stop("cancelled: renter asked");
    const out = await running.done;
    expect(out).toMatchObject({ success: false, error: "cancelled: renter asked" });
    expect(invocations()).toContainEqual(["kill", "svc-job-kill1"]);
  });

  it("vllm_serve: publishes the port, waits for health, reports the endpoint and its key, serves until stopped", async () => {
    const probes: (string | undefined)[] = [];
    const health = http.createServer((req, res) => {
      probes.push(req.headers.authorization);
      res.writeHead(req.url === "/health" ? 200 : 404).end();
    });
    await new Promise<void>((r) => health.listen(0, "127.0.0.1", () => r()));
    const port = (health.address() as import("node:net").AddressInfo).port;
    try {
      const { seen, h } = hooks();
      process.env.FAKE_DOCKER_SLEEP = "30";
      const running = new DockerExecutor({ ...opts, servePort: port, publicHost: "203.0.113.7", healthPollMs: 50 }).start(
        {
          jobId: "job-serve1",
          jobType: "vllm_serve",
          maxDurationSeconds: 600,
          taskSpec: { container: { image: "vllm/vllm-openai:v0.6.3" }, model: "Qwen/Qwen2.5-7B-Instruct", inputs: { max_model_len: 8192, dtype: "auto" }, serve: { api: "openai", container_port: 8000 } },
        },
        h,
      );
      // Until docker runs: the CLI is started once the job's volume is there.
      await waitFor(() => fs.existsSync(path.join(dir, "svc-job-serve1.pid")), 10_000, "container started").finally(() => delete process.env.FAKE_DOCKER_SLEEP);
      await waitFor(() => seen.endpoints.length > 0, 10_000, "endpoint ready");
      expect(seen.endpoints).toEqual([`http://203.0.113.7:${port}`]);
      const run = await waitFor(() => invocations().find((a) => a[0] === "run" && a.includes("svc-job-serve1")), 10_000, "docker run");
      expect(run.join(" ")).toContain(`-p ${port}:8000`);
      expect(run.slice(-9)).toEqual(["vllm/vllm-openai:v0.6.3", "--model", "Qwen/Qwen2.5-7B-Instruct", "--port", "8000", "--max-model-len", "8192", "--dtype", "auto"]);
      // A key of the job's own: reported with the endpoint, sent with the health probe, given to docker by name only.
      const [key] = seen.endpointKeys;
      expect(key).toMatch(/^[A-Za-z0-9_-]{43}$/);
      expect(probes).toContain(`Bearer ${key}`);
      expect(run.join(" ")).toContain("-e VLLM_API_KEY ");
      expect(run.join(" ")).not.toContain(key);
      await running.stop("cancelled: done serving");
      expect((await running.done).error).toBe("cancelled: done serving");
      expect(invocations()).toContainEqual(["kill", "svc-job-serve1"]);
    } finally {
      health.close();
    }
  });
});

describe("docker executor: exit status 125, clean-up and GPUs (fake docker engine)", () => {
  const engine = fakeDocker(tempDir("engine"));
  const eopts = { docker: engine.path, workRoot: path.join(engine.dir, "work"), gpus: true, defaultMemoryMb: 2048 };
  const job = (jobId: string, word: string, extra: Partial<JobSpec> = {}): JobSpec => ({
    jobId,
    jobType: "custom_container",
    maxDurationSeconds: 60,
    gpus: [1],
    taskSpec: { container: { image: "nvidia/cuda:12.4.1-runtime-ubuntu22.04" }, command: [word] },
    ...extra,
  });
  const containersLeft = () => fs.readdirSync(engine.dir).filter((f) => f.startsWith("container-"));

  it("tells the container's own exit status 125 (the job's) from docker failing before the container started (the machine's)", async () => {
    const own = await new DockerExecutor(eopts).start(job("job-125-own", "exit-125"), hooks().h).done;
    expect(own).toMatchObject({ success: false, endReason: "runtime_error", metrics: { exit_code: 125, executor: "docker" } });
    expect(own.error).toMatch(/work done; exiting with status 125/);

    const refused = await new DockerExecutor(eopts).start(job("job-125-docker", "docker-fails"), hooks().h).done;
    expect(refused).toMatchObject({ success: false, endReason: "provider_error", metrics: { exit_code: 125 } });
    expect(refused.error).toMatch(/could not select device driver/);

    const created = await new DockerExecutor(eopts).start(job("job-125-start", "start-fails"), hooks().h).done;
    expect(created).toMatchObject({ success: false, endReason: "provider_error", metrics: { exit_code: 125 } });
    expect(created.error).toMatch(/OCI runtime create failed/);

    // The container that ran was asked about by the id docker wrote, not by a name anyone could reuse.
    const inspected = engine.calls().filter((a) => a[0] === "inspect");
    expect(inspected.length).toBeGreaterThanOrEqual(1);
    expect(inspected.every((a) => /^[0-9a-f]{64}$/.test(a[a.length - 1]))).toBe(true);
  });

  it("keeps the container id out of the job's mounted folder and removes the container, its workspace volume and its folder however the job ended", async () => {
    const dataLeft = (id: string) => ({
      folder: fs.existsSync(path.join(eopts.workRoot, id)),
      volumeRemoved: engine.calls().some((a) => a.join(" ") === `volume rm svc-${id}-workspace`),
    });
    for (const [id, word] of [["job-rm-ok", "ok"], ["job-rm-125", "exit-125"], ["job-rm-start", "start-fails"]]) {
      const out = await new DockerExecutor(eopts).start(job(id, word), hooks().h).done;
      // The result was read before the folder went.
      if (word === "ok") expect(out.result).toEqual({ response: "done" });
      expect(dataLeft(id), id).toEqual({ folder: false, volumeRemoved: true });
      const run = engine.runs().find((a) => a.includes(`svc-${id}`))!;
      const cidfile = optionOf(run, "--cidfile");
      expect(cidfile, id).toBeDefined();
      const mounted = run.find((a) => a.endsWith(":/svc-output"))!.split(":")[0];
      expect(path.relative(mounted, cidfile!).startsWith(".."), `${cidfile} is outside ${mounted}`).toBe(true);
      expect(fs.existsSync(cidfile!), id).toBe(false);
      expect(containersLeft(), id).toEqual([]);
    }
    // A stopped job's container is killed by name and removed too.
    const running = new DockerExecutor(eopts).start(job("job-rm-kill", "wait"), hooks().h);
    await waitFor(() => fs.existsSync(path.join(engine.dir, "svc-job-rm-kill.pid")), 10_000, "container started");
    await running.stop("cancelled: renter asked");
    expect(await running.done).toMatchObject({ success: false, error: "cancelled: renter asked" });
    expect(engine.calls()).toContainEqual(["kill", "svc-job-rm-kill"]);
    expect(containersLeft()).toEqual([]);
    expect(dataLeft("job-rm-kill")).toEqual({ folder: false, volumeRemoved: true });
  });

  it("writes task.json anew: never through a link a run of the job left in its folder", async () => {
    const victim = path.join(engine.dir, "provider-key");
    fs.writeFileSync(victim, "the provider's key\n");
    const folder = path.join(eopts.workRoot, "job-link");
    fs.mkdirSync(folder, { recursive: true });
    fs.symlinkSync("../../provider-key", path.join(folder, "task.json"));
    const out = await new DockerExecutor(eopts).start(job("job-link", "ok"), hooks().h).done;
    expect(out.success, out.error).toBe(true);
    expect(fs.readFileSync(victim, "utf8")).toBe("the provider's key\n");
    // A directory there that this machine could not remove: the job does not start here.
    fs.mkdirSync(path.join(folder, "task.json", "inside"), { recursive: true });
    expect(() => new DockerExecutor(eopts).start(job("job-link", "ok"), hooks().h)).toThrow(/EISDIR|EPERM/);
    expect(fs.existsSync(path.join(folder, "task.json", "inside"))).toBe(true);
  });

  it("hands the container only the job's own GPU, passes no NVIDIA_* env of the task, and sets the runtime's device features off", () => {
    const plan = dockerRunArgs(
      job("job-gpu1", "ok", {
        taskSpec: {
          container: { image: "nvidia/cuda:12.4.1-runtime-ubuntu22.04" },
          command: ["nvidia-smi"],
          env: { NVIDIA_VISIBLE_DEVICES: "all", CUDA_VISIBLE_DEVICES: "0,1", NVIDIA_DRIVER_CAPABILITIES: "all", NVIDIA_MOFED: "enabled", NVIDIA_NOT_LISTED: "1", KEEP: "1" },
        },
      }),
      eopts,
    );
    expect(plan.argv.filter((a) => a === "--gpus")).toHaveLength(1);
    expect(optionOf(plan.argv, "--gpus")).toBe("device=1");
    expect(plan.argv).not.toContain("all");
    expect(plan.argv.filter((a) => /^(NVIDIA|CUDA)_/.test(a) && !a.endsWith("=disabled"))).toEqual([]);
    expect(plan.droppedEnv).toContain("NVIDIA_NOT_LISTED");
    // Whatever the image's own ENV says.
    for (const k of ["NVIDIA_GDS", "NVIDIA_MOFED", "NVIDIA_NVSWITCH", "NVIDIA_GDRCOPY"]) expect(plan.argv.join(" "), k).toContain(`-e ${k}=disabled`);
    expect(plan.argv.join(" ")).toContain("-e KEEP nvidia/cuda:12.4.1-runtime-ubuntu22.04 nvidia-smi");
    // No GPU handed to the job: it gets none, not every GPU of the host.
    expect(dockerRunArgs(job("job-gpu2", "ok", { gpus: undefined }), eopts).argv).not.toContain("--gpus");
  });

  it("hands out one GPU per running job: a busy GPU is not handed out again until it is given back", async () => {
    const { GpuPool } = await import("../../src/daemon/ts/gpu-pool.js");
    const gpu = (index: number, total = 20_000, free = total) => ({ index, vram_mib: total, vram_free_mib: free }) as import("../../src/daemon/ts/nvidia-smi.js").Gpu;
    const pool = new GpuPool();
    const two = [gpu(0), gpu(1)];
    const a = pool.take(two);
    const b = pool.take(two);
    expect([a, b].sort()).toEqual([0, 1]);
    expect(pool.take(two)).toBeUndefined();
    pool.release(a);
    expect(pool.take(two)).toBe(a);
    // A job that needs more memory gets the free GPU that has it.
    const roomy = new GpuPool();
    expect(roomy.take([gpu(0, 4_000), gpu(1, 20_000)], 10_000)).toBe(1);
    // Judged by the GPU's total memory, as placement judges it: not by what is free at the moment.
    const busyish = new GpuPool();
    expect(busyish.take([gpu(0, 8_000, 8_000), gpu(1, 24_000, 2_000)], 20_000)).toBe(1);
  });
});

describe("process executor", () => {
  it("stops the whole process group: no grandchild survives", async () => {
    const work = tempDir("proc");
    const script = writeExecutable(work, "job.sh", "#!/bin/sh\nsleep 300 &\necho started\nsleep 300\n");
    const { seen, h } = hooks();
    const running = new ProcessExecutor([script], work).start({ jobId: "job-proc-kill", jobType: "custom", maxDurationSeconds: 60, taskSpec: {} }, h);
    await waitFor(() => seen.logs.includes("started") && jobProcesses("job-proc-kill").length >= 2, 10_000, "job and grandchild running");
    await running.stop("max_duration_seconds (1 s) exceeded; the job was killed");
    const out = await running.done;
    expect(out.success).toBe(false);
    expect(out.error).toMatch(/max_duration_seconds/);
    await waitFor(() => jobProcesses("job-proc-kill").length === 0, 5_000, "no process left");
  });

  it("makes the work folder and the job's folder private (0700), also when they were there already", async () => {
    const work = path.join(tempDir("proc-modes"), "work");
    const old = process.umask(0o022);
    try {
      fs.mkdirSync(path.join(work, "job-proc-old"), { recursive: true, mode: 0o755 });
      // The job's folder is gone once the job ended: the program tells its mode while it runs.
      const script = writeExecutable(path.dirname(work), "ok.sh", '#!/bin/sh\nstat -c %a "$SVC_WORKSPACE"\n');
      for (const jobId of ["job-proc-old", "job-proc-new"]) {
        const out = await new ProcessExecutor([script], work).start({ jobId, jobType: "custom", maxDurationSeconds: 60, taskSpec: {} }, hooks().h).done;
        expect(out.success, out.error).toBe(true);
        expect(out.result, jobId).toEqual({ response: "700" });
      }
      expect((fs.statSync(work).mode & 0o777).toString(8)).toBe("700");
    } finally {
      process.umask(old);
    }
  });

  it("removes the job's folder once its result is read, however it ended; never what a link in it points to", async () => {
    const root = tempDir("proc-ws");
    const work = path.join(root, "work");
    const outside = path.join(root, "outside");
    fs.mkdirSync(outside);
    fs.writeFileSync(path.join(outside, "keep.txt"), "the provider's");
    // Outputs, a nested folder, links out of the folder (to a folder and to a file), then the result or a failure.
    const body = (end: string) =>
      [
        "#!/bin/sh",
        'cd "$SVC_WORKSPACE"',
        "mkdir -p out/deep && head -c 100000 /dev/zero > out/deep/weights.bin",
        `ln -s '${outside}' link-dir && ln -s '${outside}/keep.txt' link-file`,
        end,
        "",
      ].join("\n");
    const ok = writeExecutable(root, "ok.sh", body(`echo '{"answer": 42}' > "$SVC_RESULT_FILE"`));
    const bad = writeExecutable(root, "bad.sh", body("exit 3"));
    const slow = writeExecutable(root, "slow.sh", body("echo started\nsleep 300"));
    const job = (jobId: string): JobSpec => ({ jobId, jobType: "custom", maxDurationSeconds: 60, taskSpec: {} });
    const folder = (jobId: string) => path.join(work, jobId);
    const records = () => fs.readdirSync(path.join(work, ".svc-procs"));

    const done = await new ProcessExecutor([ok], work).start(job("job-ws-ok"), hooks().h).done;
    expect(done).toMatchObject({ success: true, result: { answer: 42 } });
    expect(fs.existsSync(folder("job-ws-ok"))).toBe(false);

    const failed = await new ProcessExecutor([bad], work).start(job("job-ws-bad"), hooks().h).done;
    expect(failed).toMatchObject({ success: false, metrics: { exit_code: 3 } });
    expect(fs.existsSync(folder("job-ws-bad"))).toBe(false);

    const { seen, h } = hooks();
    const running = new ProcessExecutor([slow], work).start(job("job-ws-stop"), h);
    await waitFor(() => seen.logs.includes("started"), 10_000, "slow job running");
    expect(fs.readdirSync(folder("job-ws-stop")).sort()).toEqual(["link-dir", "link-file", "out"]);
    await running.stop("max_duration_seconds (1 s) exceeded; the job was killed");
    expect((await running.done).error).toMatch(/max_duration_seconds/);
    expect(fs.existsSync(folder("job-ws-stop"))).toBe(false);

    expect(fs.readdirSync(work)).toEqual([".svc-procs"]);
    expect(records()).toEqual([]);
    expect(fs.readdirSync(outside)).toEqual(["keep.txt"]);
    expect(fs.readFileSync(path.join(outside, "keep.txt"), "utf8")).toBe("the provider's");
  });

  it("sees only the job's own GPU", async () => {
    const work = tempDir("proc");
    const script = writeExecutable(work, "gpu.sh", '#!/bin/sh\necho "visible=${CUDA_VISIBLE_DEVICES-unset} order=${CUDA_DEVICE_ORDER-unset}"\n');
    const job = { jobId: "job-proc-gpu", jobType: "custom", maxDurationSeconds: 60, taskSpec: {} };
    const out = await new ProcessExecutor([script], work).start({ ...job, gpus: [1] }, hooks().h).done;
    expect(out.result).toEqual({ response: "visible=1 order=PCI_BUS_ID" });
  });

  it("cuts each output line at 16,000 characters, without holding a longer one whole", async () => {
    const work = tempDir("proc");
    // 3 MB of one line (CRLF-ended), then a short one, then a last one without a newline.
    const script = writeExecutable(work, "long.sh", "#!/bin/sh\nhead -c 3000000 /dev/zero | tr '\\0' 'x'\nprintf '\\r\\nafter\\nlast'\n");
    const { seen, h } = hooks();
    const out = await new ProcessExecutor([script], work).start({ jobId: "job-proc-long", jobType: "custom", maxDurationSeconds: 60, taskSpec: {} }, h).done;
    expect(out.success).toBe(true);
    expect(seen.logs.map((l) => l.length)).toEqual([16_000, 5, 4]);
    expect(seen.logs.slice(1)).toEqual(["after", "last"]);
  });

  it("fails with the exit status and the last output lines", async () => {
    const work = tempDir("proc");
    const script = writeExecutable(work, "bad.sh", "#!/bin/sh\necho 'CUDA error: out of memory' >&2\nexit 3\n");
    const out = await new ProcessExecutor([script], work).start({ jobId: "job-proc-bad", jobType: "custom", maxDurationSeconds: 60, taskSpec: {} }, hooks().h).done;
    expect(out).toMatchObject({ success: false, metrics: { exit_code: 3 } });
    expect(out.error).toMatch(/exited with status 3: CUDA error: out of memory/);
  });

  it("ships a compiling in-container program for each built-in container job type", async () => {
    const { spawnSync } = await import("node:child_process");
    for (const script of ["llm.py", "image.py", "render.py", "train.py", "svc_fetch.py"]) {
      const file = path.join(CONTAINER_SCRIPTS, script);
      expect(fs.existsSync(file), script).toBe(true);
      const r = spawnSync("python3", ["-c", "import sys; compile(open(sys.argv[1]).read(), sys.argv[1], 'exec')", file], { encoding: "utf8" });
      expect(r.stderr, script).toBe("");
    }
  });

  it("the in-container programs make the built-in inputs the schemas default to, without a download", async () => {
    const { spawnSync } = await import("node:child_process");
    const py = (script: string, code: string) =>
      spawnSync("python3", ["-c", `import json, runpy, sys\nm = runpy.run_path(sys.argv[1], run_name="check")\n${code}`, path.join(CONTAINER_SCRIPTS, script)], { encoding: "utf8" });
    for (const name of BUILTIN_DATASETS) {
      const r = py("train.py", `lines = m["load_lines"](${JSON.stringify(name)})\nprint(json.dumps(lines))`);
      expect(r.stderr, name).toBe("");
      const lines = JSON.parse(r.stdout) as string[];
      expect(lines.length, name).toBeGreaterThanOrEqual(64);
      expect(lines.every((l) => l.trim() !== "" && !l.includes("\n")), name).toBe(true);
    }
    expect(py("train.py", `m["load_lines"]("builtin:nope")`).stderr).toMatch(/unknown built-in dataset 'builtin:nope'/);
    for (const name of BUILTIN_SCENES) {
      // The scene program is handed to Blender on its factory scene; it must at least be valid Python.
      const r = py("render.py", `a = m["blender_argv"]({"scene_url": ${JSON.stringify(name)}, "samples": 16}, "/tmp/out")\ncompile(a[4], "scene", "exec")\nprint(json.dumps(a))`);
      expect(r.stderr, name).toBe("");
      const a = JSON.parse(r.stdout) as string[];
      expect(a.slice(0, 4), name).toEqual(["blender", "--factory-startup", "-b", "--python-expr"]);
      expect(a[4], name).toMatch(/primitive_uv_sphere_add/);
      expect(a.slice(-9), name).toEqual(["-o", "/tmp/out/frame_####", "-F", "PNG", "-s", "1", "-e", "1", "-a"]);
    }
    expect(py("render.py", `m["blender_argv"]({"scene_url": "builtin:nope"}, "/tmp/out")`).stderr).toMatch(/unknown built-in scene 'builtin:nope'/);
  });

  it("picks the executor per job type", () => {
    const cfg = { runners: { "llm-inference": ["/usr/local/bin/llm"] }, workRoot: tempDir("plan"), docker: undefined };
    expect(executorFor(llmJob, cfg).name).toBe("process");
    expect(executorFor({ ...llmJob, jobType: "benchmark" }, cfg).name).toBe("process");
    expect(() => executorFor({ ...llmJob, jobType: "image_generation" }, cfg)).toThrow(/docker is not available/);
    expect(executorFor({ ...llmJob, jobType: "image_generation" }, { ...cfg, docker: { docker: "docker", gpus: true } }).name).toBe("docker");
  });
});

describe("daemon pieces", () => {
  it("parses progress directives, runners and options", async () => {
    expect(parseProgress("SVC_PROGRESS 42.5 downloading model")).toEqual({ pct: 42.5, phase: "downloading model" });
    expect(parseProgress("SVC_PROGRESS 140")).toEqual({ pct: 100, phase: undefined });
    expect(parseProgress("SVC_PROGRESS soon")).toBeUndefined();
    expect(parseProgress("progress 5")).toBeUndefined();
    expect(parseRunners(["llm-inference=python3 /opt/llm.py --fast;rendering='/opt/my render' -x", ""])).toEqual({
      "llm-inference": ["python3", "/opt/llm.py", "--fast"],
      rendering: ["/opt/my render", "-x"],
    });
    const cfg = await configFromArgs(["--", "--url", "http://127.0.0.1:9/", "--key", "svc-provider-x", "--docker", FAKE_DOCKER, "--nvidia-smi", "/nonexistent/nvidia-smi"], {}, () => {});
    expect(cfg.url).toBe("http://127.0.0.1:9");
    expect(cfg.executors.docker?.docker).toBe(FAKE_DOCKER);
    expect(cfg.executors.docker?.gpus).toBe(false);
    await expect(configFromArgs(["--url", "http://x"], {}, () => {})).rejects.toThrow(/--url and a provider key are required/);
    const fromEnv = await configFromArgs([], { SVC_URL: "http://h:1", SVC_API_KEY: "svc-provider-e", SVC_DOCKER: "none" }, () => {});
    expect(fromEnv.key).toBe("svc-provider-e");
    expect(fromEnv.executors.docker).toBeUndefined();
  });

  it("backs off exponentially with jitter, capped", () => {
    expect(backoffMs(0, 500, 30_000, () => 0)).toBe(250);
    expect(backoffMs(0, 500, 30_000, () => 0.999)).toBe(750);
    expect(backoffMs(3, 500, 30_000, () => 0.5)).toBe(4000);
    expect(backoffMs(50, 500, 30_000, () => 0.5)).toBe(30_000);
  });

  it("works with zero GPUs: no nvidia-smi means an empty snapshot", async () => {
    expect(await new GpuProbe("/nonexistent/nvidia-smi").snapshot()).toEqual({ gpus: [], cudaVersion: null, driverVersion: null });
    const none = writeExecutable(tempDir("smi"), "nvidia-smi", "#!/bin/sh\necho 'NVIDIA-SMI has failed because it couldn'\"'\"'t communicate with the NVIDIA driver.' >&2\nexit 9\n");
    expect((await new GpuProbe(none).snapshot()).gpus).toEqual([]);
  });
});

afterAll(() => {
  delete process.env.FAKE_DOCKER_SLEEP;
});
