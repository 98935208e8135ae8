// Containers through the `docker` CLI: the job's own GPU with --gpus, no
// network unless the task needs one (a model or an input to download, a
// served endpoint), memory and pids limits, no new privileges, the job's
// workspace volume at /workspace, and a host folder at /svc-output for the
// result (0700, in a 0700 work folder; task.json there 0600). The task's
// volume, mount path and image are checked before they reach docker's
// command line (containerTaskProblem): never a host path nor an option. Stop =
// `docker kill`; the container is removed once the job ended, however it
// ended, and with it the job's workspace volume and host folder (what the job
// wrote does not stay on the provider's disk). The container and the volume
// carry the daemon's labels, so that what a killed daemon left is found and
// removed at its next start (leftovers.ts). `docker run` exits 125 both
// when docker itself failed and when the container's own program exited 125:
// the container's state tells which.
// vllm_serve runs the engine, waits for its health check, reports the
// endpoint, and keeps it until it is cancelled or expires. The engine's port is
// published on every interface, so it is started with a secret of its own
// (VLLM_API_KEY, new for each job) that only the server's /v1 gateway is told
// (endpoint-ready): anyone else who finds the port is refused. The secret goes
// to docker through the CLI's environment (`-e VLLM_API_KEY`, no value), never
// on a command line, where `ps` would show it to every user of the machine.
// A custom_container with params.expose_port has that port published the same
// way (same host port, every interface) and its endpoint reported once a TCP
// connection to it holds (its protocol is the renter's: no key, no /health).
// A custom_container's own env (the renter's secrets, often) goes the same
// way; a name the docker CLI itself could read (DOCKER_HOST, PATH, a proxy,
// one already in the daemon's environment...) goes through an --env-file
// instead (envRoute), written 0600 beside the job's folder and removed with
// it.
// Before a job is accepted (prepare), its image is made present: `docker image
// inspect`, else `docker pull` (one per image at a time, killed after
// PULL_LIMIT_MS), so that `docker run` does not pull inside the job's billed
// time and under its kill timer. The container can write in its host folder
// (/svc-output) and leave links there: the daemon never writes through one.
// A job's env sets no NVIDIA_* name (the NVIDIA runtime reads them), and the
// runtime's device features are set off on every container.
import crypto from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import type { JsonObject } from "@bufbuild/protobuf";
import { childEnv, runCommand } from "../exec.js";
import { DEVICE_FEATURE_ENV_NAMES, isReservedEnvName } from "../../../shared/gpu-env.js";
import { startChildJob } from "./child.js";
import type { Executor, JobHooks, JobSpec, Outcome, PrepareOptions, RunningJob } from "./types.js";

export interface DockerOptions {
  /** The docker CLI (a path or a name on PATH). */
  docker: string;
  /** Host folder for per-job output folders. */
  workRoot: string;
  /** Whether the host has NVIDIA GPUs to hand to containers (each job gets those in its JobSpec.gpus). */
  gpus: boolean;
  /** Memory limit when the task names none (MiB). */
  defaultMemoryMb?: number;
  pidsLimit?: number;
  /** Folder with the in-container programs of the built-in job types, mounted read-only at /svc-scripts. */
  scriptsDir?: string;
  /**
   * vllm_serve and a custom_container's expose_port: the first host port to publish (0: any free one; else this port plus the job's first
   * GPU's index, so that jobs on different GPUs do not collide) and the address the endpoint is reached at.
   */
  servePort?: number;
  publicHost?: string;
  /** How often to probe a served endpoint's health (ms). */
  healthPollMs?: number;
  /** The daemon's DAEMON_LABEL value: its next start removes the containers and volumes a killed run left (leftovers.ts). */
  daemonLabel?: string;
  /** How long one `docker pull` may run before it is killed (ms; default PULL_LIMIT_MS). */
  pullLimitMs?: number;
  /** The daemon's own log (not a job's): what could not be cleaned up after a job. */
  log?: (line: string) => void;
}

/**
 * How long one `docker pull` may run (30 minutes). A job waits for it only within the daemon's
 * preparation time (daemon.ts); the pull goes on past a job handed back, for the next job of the image.
 */
export const PULL_LIMIT_MS = 30 * 60_000;

/** Labels of every container and workspace volume a daemon creates: which daemon (leftovers.ts daemonLabel), which job. */
export const DAEMON_LABEL = "svc.daemon";
export const JOB_LABEL = "svc.job_id";

/** How many times a job's container is asked to be removed, RM_RETRY_MS, then twice that, apart. */
const RM_TRIES = 3;
const RM_RETRY_MS = 1000;

/** The pulls running now, by CLI and image: a second job of the same image waits for the same pull. */
const pulls = new Map<string, Promise<string | undefined>>();

/** The last line of a command's output that says something (an error of docker's), shortened. */
const lastLine = (text: string) =>
  text
    .split("\n")
    .map((l) => l.trim())
    .filter(Boolean)
    .pop()
    ?.slice(0, 500) ?? "";

/** Settles with p's value, or "timeout" at the deadline (epoch ms), or "aborted" when signal aborts first. */
async function awaitUntil<T>(p: Promise<T>, deadline: number, signal: AbortSignal): Promise<T | "timeout" | "aborted"> {
  let timer: NodeJS.Timeout | undefined;
  let onAbort: (() => void) | undefined;
  try {
    return await Promise.race([
      p,
      new Promise<"timeout">((resolve) => (timer = setTimeout(() => resolve("timeout"), Math.max(0, deadline - Date.now())))),
      new Promise<"aborted">((resolve) => {
        onAbort = () => resolve("aborted");
        if (signal.aborted) onAbort();
        else signal.addEventListener("abort", onAbort, { once: true });
      }),
    ]);
  } finally {
    clearTimeout(timer);
    if (onAbort) signal.removeEventListener("abort", onAbort);
  }
}

const obj = (v: unknown): JsonObject => (v && typeof v === "object" && !Array.isArray(v) ? (v as JsonObject) : {});

/** A job id as a file or container name: never "." or "..", never hidden (a leading dot becomes "-"). */
export function safeName(jobId: string): string {
  return jobId.replace(/[^A-Za-z0-9_.-]/g, "-").replace(/^\./, "-").slice(0, 100);
}

/**
 * A job's host folder (a container's /svc-output, a runner's SVC_WORKSPACE) and, beside it, out
 * of the container's reach, the file `docker run --cidfile` writes the container's id to.
 */
export function jobFiles(workRoot: string, jobId: string): { outDir: string; cidFile: string; envFile: string } {
  const outDir = path.join(workRoot, safeName(jobId));
  return { outDir, cidFile: `${outDir}.cid`, envFile: `${outDir}.env` };
}

/**
 * Makes a folder (and its missing parents) that only the daemon's user may list or enter (0700):
 * the work folder and each job's folder hold tasks with the renter's env. One already there is
 * made so too (an earlier version made them with the umask's mode, 0755 as a rule); one that cannot
 * be (another user's) throws, and the job does not start.
 */
export function privateFolder(dir: string): void {
  fs.mkdirSync(dir, { recursive: true, mode: 0o700 });
  // Windows has no such mode bits: the folder inherits its parent's access list.
  if (process.platform !== "win32" && (fs.statSync(dir).mode & 0o077) !== 0) fs.chmodSync(dir, 0o700);
}

/** Built-in job types run a program of ours inside their image. */
const SCRIPTS: Record<string, string> = {
  "llm-inference": "llm.py",
  llm_inference: "llm.py",
  image_generation: "image.py",
  rendering: "render.py",
  training: "train.py",
};

/** A URL to download; the built-in inputs ("builtin:...") are made inside the container. */
const remote = (v: unknown): boolean => typeof v === "string" && /^https?:\/\//i.test(v);

/** A custom_container's params.expose_port: the container port published as its endpoint (undefined: none). */
export function exposedPortOf(job: JobSpec): number | undefined {
  const port = obj(job.taskSpec.inputs).expose_port;
  return job.jobType === "custom_container" && typeof port === "number" && Number.isInteger(port) && port >= 1 && port <= 65535 ? port : undefined;
}

export function needsNetwork(job: JobSpec): boolean {
  const t = job.taskSpec;
  const inputs = obj(t.inputs);
  if (t.network === true || job.jobType === "vllm_serve" || exposedPortOf(job) !== undefined) return true;
  return typeof t.model === "string" || remote(inputs.dataset_url) || remote(inputs.scene_url);
}


/** docker's `--gpus` value for the given device indices (a list is quoted: docker reads the value as CSV). */
export function gpusFlag(devices: readonly number[]): string {
  return devices.length === 1 ? `device=${devices[0]}` : `"device=${devices.join(",")}"`;
}

export interface DockerPlan {
  argv: string[];
  name: string;
  outDir: string;
  /**
   * Where `docker run --cidfile` writes the container's id once it is created: beside the job's
   * folder, not in it (the container could rewrite what it sees at /svc-output).
   */
  cidFile: string;
  /** The job's workspace volume (a named volume: removed once the job ended). */
  volume: string;
  /** Names of the task's env that were left out (isReservedEnvName). */
  droppedEnv: string[];
  /** Names of the task's env left out because no safe route carries their value (see envRoute). */
  unpassableEnv?: string[];
  /**
   * The task's env that goes by `--env-file` (names the docker CLI could read itself): written 0600
   * at `path` before `docker run`, removed with the job's data.
   */
  envFile?: { path: string; text: string };
  /** vllm_serve, and a custom_container's expose_port: host port published. */
  hostPort?: number;
  /**
   * Variables the `docker` CLI itself is given, on top of the daemon's environment: those `argv`
   * names with `-e NAME` alone, which docker copies into the container from its own environment.
   */
  cliEnv?: Record<string, string>;
  /** vllm_serve: the task's own env named the engine's key, which the daemon sets: left out. */
  droppedKeyEnv?: boolean;
}

/**
 * Names the docker CLI, or what it runs (credential helpers, the Go runtime, the dynamic loader),
 * may read from its own environment. Given as `-e NAME` with the value in the CLI's environment,
 * such a name would change how docker itself behaves (DOCKER_HOST: which engine it talks to; PATH:
 * which programs it runs; LD_PRELOAD: code loaded into it) as well as reach the container.
 */
const CLI_READS_ENV =
  /^(?:DOCKER_|BUILDKIT_|BUILDX_|COMPOSE_|NOTARY_|OTEL_|GO|LD_|DYLD_|SSL_|SSH_|XDG_|LC_|AWS_|AZURE_|GOOGLE_|GCLOUD_|CLOUDSDK_|SVC_)|_PROXY$|^(?:PATH|HOME|TMPDIR|TMP|TEMP|USER|LOGNAME|SHELL|TERM|LANG|LANGUAGE|TZ|PWD|SYSTEMROOT|USERPROFILE|APPDATA|LOCALAPPDATA|PATHEXT|COMSPEC)$/i;

/**
 * How one variable of the task's env reaches the container, never on a command line (`ps` shows
 * those to every user of the host): "cli" by name (`-e NAME`), its value in the docker CLI's own
 * environment, as the engine's key goes; "file" in an --env-file (0600) when the CLI could read
 * the name itself (CLI_READS_ENV, or a name the CLI's environment already has: the daemon's own
 * settings), which the file leaves the CLI's environment untouched for; "none" when neither can
 * carry the value: a NUL (no environment can), or a line break in a value bound for the file
 * (docker reads it one line per variable).
 */
export function envRoute(name: string, value: string, cliBase: NodeJS.ProcessEnv): "cli" | "file" | "none" {
  if (value.includes("\0")) return "none";
  if (!CLI_READS_ENV.test(name) && !Object.hasOwn(cliBase, name)) return "cli";
  return /[\r\n]/.test(value) ? "none" : "file";
}

/** The variable vLLM reads its API key from (the same as its --api-key). */
export const VLLM_API_KEY_ENV = "VLLM_API_KEY";

/** A new secret for a served endpoint: 32 random bytes, base64url. */
export function newEndpointKey(): string {
  return crypto.randomBytes(32).toString("base64url");
}

/** The job's container image, as its task names it (undefined: none). */
export function imageOf(job: JobSpec): string | undefined {
  const t = job.taskSpec;
  const container = obj(t.container);
  return typeof container.image === "string" ? container.image : typeof t.image === "string" ? t.image : undefined;
}

/** A docker volume name (docker's own rule): never a host path, which `-v` would bind-mount. */
const VOLUME_NAME = /^[A-Za-z0-9][A-Za-z0-9_.-]*$/;
/** docker's reference grammar, [registry[:port]/]path[:tag][@digest]: never an option, nor anything but one word. */
const IMAGE_COMPONENT = "[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*";
const IMAGE_REFERENCE = new RegExp(
  "^(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*(?::[0-9]{1,5})?/)?" +
    `${IMAGE_COMPONENT}(?:/${IMAGE_COMPONENT})*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$`,
);
const IMAGE_MAX = 255;

/**
 * The job's workspace volume and where it is mounted, as its task names them (the server names
 * svc-ws-<job> at /workspace), else the daemon's own svc-<job>-workspace at /workspace.
 */
export function workspaceOf(job: JobSpec): { volume: string; mount: string } {
  const workspace = obj(job.taskSpec.workspace);
  return {
    volume: typeof workspace.volume === "string" ? workspace.volume : `svc-${safeName(job.jobId)}-workspace`,
    mount: typeof workspace.mount_path === "string" ? workspace.mount_path : "/workspace",
  };
}

/**
 * Why the daemon never runs a container task as it is, or undefined. `docker run` is built from
 * fields of the signed task that the server fills itself; they are checked all the same, so that a
 * task that verifies yet names a host path as its volume (`-v /:/host`), a mount path docker would
 * read more from, or an "image" docker would take for an option gets a refusal, not the host.
 */
export function containerTaskProblem(job: JobSpec): string | undefined {
  const image = imageOf(job);
  if (image !== undefined && (image.length > IMAGE_MAX || !IMAGE_REFERENCE.test(image))) {
    return `the task's container image ${JSON.stringify(image.slice(0, IMAGE_MAX))} is not an image reference`;
  }
  const { volume, mount } = workspaceOf(job);
  if (!VOLUME_NAME.test(volume)) return `the task's workspace volume ${JSON.stringify(volume)} is not a volume name (letters, digits, '_', '.', '-')`;
  if (!mount.startsWith("/") || /[:\0\r\n]/.test(mount)) return `the task's workspace mount_path ${JSON.stringify(mount)} is not an absolute path without ':'`;
  return undefined;
}

/**
 * The `docker run` command line of a job (pure; tested on its own). `serveKey`: vllm_serve's
 * secret, passed by name (`cliEnv`), never in `argv`; the task's env likewise (envRoute).
 * `cliBase`: the environment the docker CLI runs with, before `cliEnv`.
 */
export function dockerRunArgs(job: JobSpec, opts: DockerOptions, hostPort?: number, serveKey?: string, cliBase: NodeJS.ProcessEnv = childEnv()): DockerPlan {
  const t = job.taskSpec;
  const limits = obj(t.limits);
  const image = imageOf(job);
  if (!image) throw new Error("the task names no container image");
  const problem = containerTaskProblem(job);
  if (problem) throw new Error(problem);
  const name = `svc-${safeName(job.jobId)}`;
  const { outDir, cidFile, envFile } = jobFiles(opts.workRoot, job.jobId);
  const { volume, mount } = workspaceOf(job);
  const memoryMb = typeof limits.memory_mb === "number" ? limits.memory_mb : (opts.defaultMemoryMb ?? Math.floor((os.totalmem() / 1048576) * 0.8));
  // No --rm: a container removed the moment it exits could not be asked whether it ever started
  // (exit status 125); the executor removes it itself once the job ended.
  const argv = [opts.docker, "run", "--name", name, "--label", `${JOB_LABEL}=${job.jobId}`, "--cidfile", cidFile];
  if (opts.daemonLabel) argv.push("--label", `${DAEMON_LABEL}=${opts.daemonLabel}`);
  // The job's own GPU, never every GPU of the host: the server runs one job per GPU here.
  if (opts.gpus && job.gpus?.length) argv.push("--gpus", gpusFlag(job.gpus));
  if (!needsNetwork(job)) argv.push("--network", "none");
  // --memory-swap (memory and swap together) equal to it: no swap. Docker's default lets a container swap
  // as much again as its memory, and the host's disk is not the job's.
  const memory = `${Math.max(256, Math.floor(memoryMb))}m`;
  argv.push("--memory", memory, "--memory-swap", memory, "--pids-limit", String(opts.pidsLimit ?? 4096));
  // No process of the container gains privileges through a setuid or file-capability program.
  argv.push("--security-opt", "no-new-privileges");
  argv.push("-v", `${volume}:${mount}`, "-v", `${outDir}:/svc-output`);
  argv.push("-e", "SVC_RESULT_FILE=/svc-output/result.json", "-e", "SVC_TASK_FILE=/svc-output/task.json", "-e", `SVC_JOB_ID=${job.jobId}`);
  for (const k of DEVICE_FEATURE_ENV_NAMES) argv.push("-e", `${k}=disabled`);
  const env = obj(t.env);
  const droppedEnv: string[] = [];
  const serving = job.jobType === "vllm_serve";
  const unpassableEnv: string[] = [];
  const fileLines: string[] = [];
  let droppedKeyEnv = false;
  let cliEnv: Record<string, string> | undefined;
  for (const k of Object.keys(env).sort()) {
    if (isReservedEnvName(k)) droppedEnv.push(k);
    else if (serving && k === VLLM_API_KEY_ENV) droppedKeyEnv = true;
    else {
      const value = String(env[k]);
      const route = envRoute(k, value, cliBase);
      if (route === "cli") {
        argv.push("-e", k);
        (cliEnv ??= {})[k] = value;
      } else if (route === "file") fileLines.push(`${k}=${value}`);
      else unpassableEnv.push(k);
    }
  }
  if (fileLines.length > 0) argv.push("--env-file", envFile);
  if (serving && serveKey) {
    argv.push("-e", VLLM_API_KEY_ENV);
    (cliEnv ??= {})[VLLM_API_KEY_ENV] = serveKey;
  }
  const inputs = obj(t.inputs);
  if (typeof inputs.workdir === "string") argv.push("-w", inputs.workdir);
  let command: string[] = Array.isArray(t.command) ? t.command.map(String) : [];
  if (job.jobType === "vllm_serve") {
    const serve = obj(t.serve);
    const port = typeof serve.container_port === "number" ? serve.container_port : 8000;
    argv.push("-p", `${hostPort ?? 0}:${port}`);
    command = ["--model", String(t.model ?? inputs.model), "--port", String(port)];
    if (typeof inputs.max_model_len === "number") command.push("--max-model-len", String(inputs.max_model_len));
    if (typeof inputs.dtype === "string") command.push("--dtype", inputs.dtype);
    if (typeof inputs.gpu_memory_utilization === "number") command.push("--gpu-memory-utilization", String(inputs.gpu_memory_utilization));
  } else if (exposedPortOf(job) !== undefined) {
    argv.push("-p", `${hostPort ?? 0}:${exposedPortOf(job)}`);
  } else if (command.length === 0 && SCRIPTS[job.jobType] && opts.scriptsDir) {
    argv.push("-v", `${opts.scriptsDir}:/svc-scripts:ro`);
    command = ["python", `/svc-scripts/${SCRIPTS[job.jobType]}`];
  }
  argv.push(image, ...command);
  return {
    argv,
    name,
    outDir,
    cidFile,
    volume,
    droppedEnv,
    hostPort,
    ...(cliEnv ? { cliEnv } : {}),
    ...(droppedKeyEnv ? { droppedKeyEnv } : {}),
    ...(unpassableEnv.length > 0 ? { unpassableEnv } : {}),
    ...(fileLines.length > 0 ? { envFile: { path: envFile, text: fileLines.join("\n") + "\n" } } : {}),
  };
}

/**
 * Writes a new file at `file` in a folder a container can write: whatever is there goes first (a
 * link is removed, never followed), and the file is created anew without following a link. A
 * directory there throws: the job cannot start on this machine.
 */
function writeNewFile(file: string, text: string, mode = 0o600): void {
  try {
    fs.unlinkSync(file);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "ENOENT") throw err;
  }
  const { O_WRONLY, O_CREAT, O_EXCL, O_NOFOLLOW } = fs.constants;
  const fd = fs.openSync(file, O_WRONLY | O_CREAT | O_EXCL | (O_NOFOLLOW ?? 0), mode);
  try {
    fs.writeFileSync(fd, text);
  } finally {
    fs.closeSync(fd);
  }
}

/** The container id `docker run --cidfile` wrote, or undefined (docker failed before creating one). */
function containerId(file: string): string | undefined {
  try {
    const id = fs.readFileSync(file, "utf8").trim();
    return /^[0-9a-f]{12,64}$/.test(id) ? id : undefined;
  } catch {
    return undefined;
  }
}

/**
 * What a container job wrote on this machine, once its container is gone and its result read (the
 * daemon keeps a result waiting for the server in memory): its container id file and host folder,
 * then its named workspace volumes, which `docker rm --volumes` leaves (it removes anonymous ones
 * only). The volume goes last: its labels name the job to the next start if the daemon is killed
 * before this ends (leftovers.ts). No documented behaviour resumes a job from either
 * (checkpoint_enabled included), and a re-queued job may run elsewhere. A host job's folder never
 * comes here (job-processes.ts removeJobFolder). Files the container made as another user (root) may not be
 * removable: logged, the job's outcome stands. Returns what went.
 */
export async function removeJobData(
  docker: string,
  data: { outDir?: string; cidFile?: string; envFile?: string; volumes: string[] },
  log: (line: string) => void = () => {},
): Promise<{ folder: boolean; volumes: number }> {
  const gone = { folder: false, volumes: 0 };
  if (data.cidFile) fs.rmSync(data.cidFile, { force: true });
  if (data.envFile) fs.rmSync(data.envFile, { force: true });
  if (data.outDir && fs.existsSync(data.outDir)) {
    try {
      fs.rmSync(data.outDir, { recursive: true, force: true });
      gone.folder = true;
    } catch (err) {
      log(`could not remove the job's folder ${data.outDir}: ${(err as Error).message}`);
    }
  }
  for (const volume of data.volumes) {
    const r = await runCommand(docker, ["volume", "rm", volume], { timeoutMs: 30_000 });
    if (r.code === 0) gone.volumes++;
    // No such volume: docker failed before it made one.
    else if (!/no such volume/i.test(r.stderr)) log(`could not remove the workspace volume ${volume}: ${lastLine(r.stderr) || `exit status ${r.code}`}`);
  }
  return gone;
}

/** Whether a container's state (`docker inspect`'s .State) says it started, and has exited with `code`. */
export function ranAndExited(state: JsonObject, code: number): boolean {
  // A container that never started shows the zero time, 0001-01-01T00:00:00Z.
  const started = typeof state.StartedAt === "string" && /^\d{4}-\d\d-\d\dT/.test(state.StartedAt) && !state.StartedAt.startsWith("0001-01-01");
  return started && state.Running === false && state.ExitCode === code;
}

async function freePort(): Promise<number> {
  const net = await import("node:net");
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once("error", reject);
    s.listen(0, () => {
      const port = (s.address() as import("node:net").AddressInfo).port;
      s.close(() => resolve(port));
    });
  });
}

export class DockerExecutor implements Executor {
  readonly name = "docker";
  constructor(private readonly opts: DockerOptions) {}

  /**
   * The job's image on this machine: there already (`docker image inspect`), or pulled now. The job
   * waits for the pull until opts.deadline; a pull still running then goes on (up to pullLimitMs) for
   * the next job of the image. Why the image is not here, or undefined when it is (or the task names
   * none: start() fails such a job).
   */
  async prepare(job: JobSpec, opts: PrepareOptions): Promise<string | undefined> {
    const image = imageOf(job);
    if (!image) return undefined;
    // Never handed to `docker image inspect` or `docker pull` as an option (executorFor refuses such a task first).
    const problem = containerTaskProblem(job);
    if (problem) return problem;
    const docker = this.opts.docker;
    const inspect = await runCommand(docker, ["image", "inspect", "--format", "{{.Id}}", image], { timeoutMs: 30_000, signal: opts.signal });
    if (inspect.code === 0) return undefined;
    if (opts.signal.aborted) return "stopped while checking the job's image";
    const key = `${docker}\0${image}`;
    let pull = pulls.get(key);
    if (!pull) {
      const limitMs = this.opts.pullLimitMs ?? PULL_LIMIT_MS;
      opts.log(`pulling image ${image} (job ${job.jobId}), for up to ${Math.round(limitMs / 1000)} s`);
      const started = Date.now();
      pull = runCommand(docker, ["pull", image], { timeoutMs: limitMs, signal: opts.stop }).then((r) => {
        pulls.delete(key);
        if (r.code === 0) {
          opts.log(`pulled image ${image} in ${Math.round((Date.now() - started) / 1000)} s`);
          return undefined;
        }
        const why = r.code === null && !r.missing ? `killed after ${Math.round((Date.now() - started) / 1000)} s` : lastLine(r.stderr) || lastLine(r.stdout) || `exit status ${r.code}`;
        opts.log(`could not pull image ${image}: ${why}`);
        return why;
      });
      pulls.set(key, pull);
    }
    const waitedFrom = Date.now();
    opts.preparing(`pulling image ${image}`);
    const r = await awaitUntil(pull, opts.deadline, opts.signal);
    if (r === "aborted") return "stopped while pulling the job's image";
    if (r === "timeout") {
      return `the job's image ${image} is not on this machine and its pull had not finished ${Math.round((Date.now() - waitedFrom) / 1000)} s later (it goes on for the next job of the image)`;
    }
    return r === undefined ? undefined : `could not pull the job's image ${image}: ${r}`;
  }

  start(job: JobSpec, hooks: JobHooks): RunningJob {
    if (job.jobType === "vllm_serve" || exposedPortOf(job) !== undefined) return this.serve(job, hooks);
    return this.run(job, hooks, dockerRunArgs(job, this.opts));
  }

  private run(job: JobSpec, hooks: JobHooks, plan: DockerPlan): RunningJob {
    // Private, as what goes there and beside it: the task (the renter's env), the env file, the container id.
    privateFolder(this.opts.workRoot);
    privateFolder(plan.outDir);
    // An earlier run of this job (a re-queue back to this provider) may have left a link here.
    // Readable by this user only: it holds the whole task, the renter's env included.
    writeNewFile(path.join(plan.outDir, "task.json"), JSON.stringify({ job_id: job.jobId, job_type: job.jobType, task_spec: job.taskSpec }), 0o600);
    // docker run refuses a container id file that exists: one an earlier run left goes first.
    fs.rmSync(plan.cidFile, { force: true });
    for (const k of plan.droppedEnv) hooks.log(`env ${k} was left out: the provider's daemon decides which GPU the job sees`);
    if (plan.droppedKeyEnv) hooks.log(`env ${VLLM_API_KEY_ENV} was left out: the provider's daemon sets the endpoint's key`);
    for (const k of plan.unpassableEnv ?? []) hooks.log(`env ${k} was left out: its value holds a character docker cannot pass for this name (a NUL, or a line break)`);
    // Readable by this user only; beside the job's folder, out of the container's reach (as the id file).
    if (plan.envFile) writeNewFile(plan.envFile.path, plan.envFile.text, 0o600);
    let child: RunningJob | undefined;
    let stopped: { reason: string; killAfterMs?: number } | undefined;
    const started = this.createVolume(job, plan).then(async (): Promise<RunningJob> => {
      // Stopped while its volume was made (a cancel, a newer attempt of it): its container never starts.
      if (stopped) return { done: Promise.resolve({ success: false, error: stopped.reason, metrics: { duration_seconds: 0, executor: "docker" } }), stop: async () => {} };
      child = startChildJob(
        {
          argv: plan.argv,
          env: { ...childEnv(), ...plan.cliEnv },
          cwd: plan.outDir,
          stdin: "",
          resultFile: path.join(plan.outDir, "result.json"),
          executor: "docker",
          // Killing the CLI does not stop the container: kill it by name.
          onStop: async () => {
            await runCommand(this.opts.docker, ["kill", plan.name], { timeoutMs: 30_000 });
          },
          killGraceMs: 15_000,
        },
        hooks,
      );
      return child;
    });
    const remove = async () => {
      await this.removeContainer(job, plan);
      await removeJobData(this.opts.docker, { outDir: plan.outDir, cidFile: plan.cidFile, envFile: plan.envFile?.path, volumes: [plan.volume] }, this.opts.log);
    };
    const done = started.then(
      (c) =>
        c.done.then(async (outcome) => {
          try {
            if (!outcome.success && outcome.endReason === "runtime_error" && outcome.metrics.exit_code === 125) return await this.judgeExit125(outcome, containerId(plan.cidFile));
            return outcome;
          } finally {
            await remove();
          }
        }),
      async (err: unknown) => {
        await remove();
        throw err;
      },
    );
    return {
      done,
      async stop(reason, killAfterMs) {
        if (child) return child.stop(reason, killAfterMs);
        // Its volume is still being made: it does not start.
        stopped ??= { reason, killAfterMs };
        await started.catch(() => undefined);
      },
    };
  }

  /**
   * Removes the job's container (by its id when docker wrote one; else by name: one an earlier run of
   * this job left behind), tried RM_TRIES times: the daemon gives the job's GPU back next, and a
   * container that is still there may still be running on it. One that stays is logged as such; the
   * next start of the daemon removes it (leftovers.ts).
   */
  private async removeContainer(job: JobSpec, plan: DockerPlan): Promise<void> {
    const ref = containerId(plan.cidFile) ?? plan.name;
    let why = "";
    for (let attempt = 1; attempt <= RM_TRIES; attempt++) {
      const r = await runCommand(this.opts.docker, ["rm", "--force", "--volumes", ref], { timeoutMs: 30_000 });
      // Not there: docker failed before creating it, or it is gone already.
      if (r.code === 0 || /no such container/i.test(r.stderr)) return;
      why = lastLine(r.stderr) || (r.code === null ? "timed out" : `exit status ${r.code}`);
      if (attempt < RM_TRIES) {
        this.opts.log?.(`could not remove container ${ref} of job ${job.jobId} (try ${attempt} of ${RM_TRIES}): ${why}; trying again`);
        await new Promise((r) => setTimeout(r, RM_RETRY_MS * attempt));
      }
    }
    const gpus = job.gpus?.length ? ` on GPU ${job.gpus.join(", ")}` : "";
    this.opts.log?.(
      `ERROR: container ${ref} of job ${job.jobId} could not be removed after ${RM_TRIES} tries (${why}): it may still be running${gpus}, ` +
        "which the next job is given; remove it by hand (docker rm --force), or restart the daemon, which removes it",
    );
  }

  /**
   * The job's workspace volume, made before its container with this daemon's labels (one that
   * `docker run` makes carries none), so that the next start finds it if this daemon is killed
   * before it removed it (leftovers.ts). A volume of that name already there is used as it is. One
   * that docker could not make is left to `docker run`, which makes it or fails for the same reason.
   */
  private async createVolume(job: JobSpec, plan: DockerPlan): Promise<void> {
    if (!this.opts.daemonLabel) return;
    const labels = ["--label", `${DAEMON_LABEL}=${this.opts.daemonLabel}`, "--label", `${JOB_LABEL}=${job.jobId}`];
    const r = await runCommand(this.opts.docker, ["volume", "create", ...labels, plan.volume], { timeoutMs: 30_000 });
    if (r.code !== 0) this.opts.log?.(`could not create the workspace volume ${plan.volume} of job ${job.jobId}: ${lastLine(r.stderr) || `exit status ${r.code}`}`);
  }

  /**
   * `docker run` exited 125: docker itself failed (no container created, or created but never
   * started: its daemon, the image, the GPU runtime), which is this machine's failure; or the
   * container ran and its own program exited 125, which is the job's. Only a container that
   * started and exited 125 is the job's.
   */
  private async judgeExit125(outcome: Outcome, id: string | undefined): Promise<Outcome> {
    const state = id ? await this.containerState(id) : undefined;
    if (state && ranAndExited(state, 125)) return outcome;
    const error = (outcome.error ?? "").replace(/^the job exited with status 125/, "docker could not run the job's container (docker run exited 125)");
    return { ...outcome, endReason: "provider_error", error };
  }

  private async containerState(id: string): Promise<JsonObject | undefined> {
    const r = await runCommand(this.opts.docker, ["inspect", "--format", "{{json .State}}", id], { timeoutMs: 30_000 });
    if (r.code !== 0) return undefined;
    try {
      return obj(JSON.parse(r.stdout));
    } catch {
      return undefined;
    }
  }

  private serve(job: JobSpec, hooks: JobHooks): RunningJob {
    let inner: RunningJob | undefined;
    let stopped: string | undefined;
    const ready = (async () => {
      const hostPort = this.opts.servePort ? servePortOf(this.opts.servePort, job.gpus) : await freePort();
      // vllm_serve: this job's own, which the engine requires on /v1, and only the server is told.
      const engine = job.jobType === "vllm_serve";
      const apiKey = engine ? newEndpointKey() : undefined;
      const plan = dockerRunArgs(job, this.opts, hostPort, apiKey);
      inner = this.run(job, hooks, plan);
      if (stopped) await inner.stop(stopped);
      const probe = apiKey ? () => engineHealthy(hostPort, apiKey) : () => portAnswers(hostPort);
      void this.waitHealthy(probe, inner, () => stopped !== undefined).then((ok) => {
        if (!ok) return;
        if (engine) hooks.progress(100, "serving");
        const host = this.opts.publicHost;
        hooks.endpointReady?.(host ? `http://${host.includes(":") ? `[${host}]` : host}:${hostPort}` : `port:${hostPort}`, apiKey);
      });
      return inner;
    })();
    return {
      done: ready.then((r) => r.done),
      async stop(reason, killAfterMs) {
        stopped ??= reason;
        await (await ready).stop(reason, killAfterMs);
      },
    };
  }

  /** Probes the served port until it answers, the job ends or it is stopped. */
  private async waitHealthy(probe: () => Promise<boolean>, job: RunningJob, stopped: () => boolean): Promise<boolean> {
    let ended = false;
    void job.done.then(() => (ended = true));
    while (!ended && !stopped()) {
      if (await probe()) return true;
      await new Promise((r) => setTimeout(r, this.opts.healthPollMs ?? 2000));
    }
    return false;
  }
}

/** vllm_serve: whether the engine's /health answers 2xx (vLLM answers it without the key; it is sent all the same). */
async function engineHealthy(port: number, apiKey: string): Promise<boolean> {
  try {
    const r = await fetch(`http://127.0.0.1:${port}/health`, { headers: { authorization: `Bearer ${apiKey}` }, signal: AbortSignal.timeout(2000) });
    return r.ok;
  } catch {
    return false;
  }
}

/** How long a connection to a published port must stay open, or answer, to count as the container listening. */
export const PORT_HOLD_MS = 500;

/**
 * custom_container: whether something in the container listens on its published port. docker's
 * proxy accepts a connection on the host port whether or not the container listens, and closes it
 * at once when it does not: a connection that says something, or stays open PORT_HOLD_MS, counts.
 */
export async function portAnswers(port: number): Promise<boolean> {
  const net = await import("node:net");
  return new Promise((resolve) => {
    const socket = net.connect({ host: "127.0.0.1", port });
    const settle = (ok: boolean) => {
      clearTimeout(timer);
      socket.destroy();
      resolve(ok);
    };
    const timer = setTimeout(() => settle(false), 2000 + PORT_HOLD_MS);
    socket.once("connect", () => {
      clearTimeout(timer);
      setTimeout(() => settle(!socket.destroyed && !socket.readableEnded), PORT_HOLD_MS);
    });
    socket.once("data", () => settle(true));
    socket.once("end", () => settle(false));
    socket.once("error", () => settle(false));
  });
}

/** A serving job's host port from a fixed first port: one port per GPU, so concurrent jobs (one per GPU) never share one. */
export function servePortOf(first: number, gpus: readonly number[] | undefined): number {
  return first + (gpus && gpus.length > 0 ? Math.min(...gpus) : 0);
}
