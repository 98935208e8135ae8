// `svc-daemon`: command-line and environment configuration of the TypeScript
// daemon, and its process lifecycle (SIGTERM/SIGINT stop it cleanly).
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { parseArgs } from "node:util";
import { runCommand } from "./exec.js";
import { GpuProbe } from "./nvidia-smi.js";
import { visibleGpus } from "./visible-gpus.js";
import { ProviderDaemon, type DaemonConfig } from "./daemon.js";
import { CONTAINER_SCRIPTS } from "./executors/plan.js";
import { daemonLabel } from "./leftovers.js";
import { DAEMON_VERSION } from "./version.js";

export const USAGE = `svc-daemon ${DAEMON_VERSION}: connects this host to the svc GPU marketplace.

  svc-daemon --url https://api.example.com --key-file ~/.svc-daemon/key    (the file: chmod 600)
  SVC_API_KEY="$PK" svc-daemon --url https://api.example.com
  npx svc-daemon -- --url ...                (npm needs the "--" before options)

The provider key comes from SVC_API_KEY or a file (--key-file), never from the command line: a
program's arguments are in the process list, where every user of the host can read them.

Options (environment variable in brackets):
  --url URL                 service origin [SVC_URL]
  --key-file PATH           read the provider key from PATH, a file only its owner may read or
                            write (chmod 600) [SVC_KEY_FILE]
  --hmac-secret-file PATH   read the HMAC secret from PATH (same rules) [SVC_HMAC_SECRET_FILE]
  [SVC_API_KEY]             the provider key itself
  [SVC_HMAC_SECRET]         also check task_spec_hmac with this secret
  --key KEY, --hmac-secret SECRET
                            still accepted, with a warning: every user of the host can read them
  --server-key BASE64       the server's task-signing key (default: pinned per server on first connect,
                            in <state-dir>/server-keys/) [SVC_SERVER_KEY]
  --trust-new-server-key    pin the key the server presents now, replacing a different pinned one; only
                            after checking it with the server's operator [SVC_TRUST_NEW_SERVER_KEY=1]
  --runner TYPE=COMMAND     run jobs of TYPE with a local program (repeatable) [SVC_RUNNERS="T=CMD;T2=CMD2"]
  --docker PATH|none        docker CLI [SVC_DOCKER] (default: docker when it answers)
  --nvidia-smi PATH         [SVC_NVIDIA_SMI]
  --state-dir DIR           pinned keys and state [SVC_STATE_DIR] (default ~/.svc-daemon)
  --work-dir DIR            job folders [SVC_WORK_DIR] (default <state-dir>/work)
  --public-host HOST        address served endpoints are reached at [SVC_PUBLIC_HOST]
  --serve-port PORT         first host port for vllm_serve and expose_port: PORT + the job's GPU index [SVC_SERVE_PORT]
  --cached-models A,B       models already on disk [SVC_CACHED_MODELS]
  --heartbeat-seconds N     override the server's interval [SVC_HEARTBEAT_SECONDS]
  --stop-grace-seconds N    on SIGTERM/SIGINT, stop running jobs (reported as interrupted:
                            re-queued, no charge) and exit within N s (default 10) [SVC_STOP_GRACE_SECONDS]

Environment: CUDA_VISIBLE_DEVICES (nvidia-smi indices or GPU UUIDs, comma-separated; empty: none)
limits the GPUs this daemon reports and hands to jobs.
`;

function splitCommand(command: string): string[] {
  // Whitespace-separated words; "..." or '...' keep spaces.
  const words: string[] = [];
  const re = /"([^"]*)"|'([^']*)'|(\S+)/g;
  for (let m; (m = re.exec(command)); ) words.push(m[1] ?? m[2] ?? m[3]);
  return words;
}

/** How long a stopped daemon may take to stop its jobs, report them and exit (README). */
export const DEFAULT_STOP_GRACE_SECONDS = 10;

export function parseRunners(specs: string[]): Record<string, string[]> {
  const out: Record<string, string[]> = {};
  for (const spec of specs) {
    for (const item of spec.split(";")) {
      const at = item.indexOf("=");
      if (at <= 0) continue;
      const type = item.slice(0, at).trim();
      const argv = splitCommand(item.slice(at + 1).trim());
      if (type && argv.length) out[type] = argv;
    }
  }
  return out;
}

export class UsageError extends Error {}

/** The largest secret file read: a key is tens of characters. */
const SECRET_FILE_MAX_BYTES = 4096;

/**
 * A secret kept in a file (--key-file, --hmac-secret-file): one line, in a regular file that no other
 * user may read or write (as svc keeps its profiles: 0600, or 0400), owned by this user (or root).
 * Checked on the open file, so the file checked is the file read. Windows has no such modes: read as is.
 */
function readSecretFile(file: string, option: string): string {
  let fd: number;
  try {
    fd = fs.openSync(file, fs.constants.O_RDONLY | (fs.constants.O_NONBLOCK ?? 0));
  } catch (err) {
    throw new UsageError(`${option}: cannot read ${file}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`);
  }
  try {
    const st = fs.fstatSync(fd);
    if (!st.isFile()) throw new UsageError(`${option}: ${file} is not a regular file`);
    if (process.platform !== "win32") {
      const uid = process.getuid?.();
      if (uid !== undefined && st.uid !== uid && st.uid !== 0) {
        throw new UsageError(`${option}: ${file} belongs to another user (uid ${st.uid}): it must be yours`);
      }
      if ((st.mode & 0o077) !== 0) {
        throw new UsageError(`${option}: ${file} can be read or written by other users (mode ${(st.mode & 0o777).toString(8).padStart(4, "0")}): chmod 600 ${file}`);
      }
    }
    if (st.size > SECRET_FILE_MAX_BYTES) throw new UsageError(`${option}: ${file} is larger than a key (${st.size} bytes)`);
    const text = fs.readFileSync(fd, "utf8").trim();
    if (!text) throw new UsageError(`${option}: ${file} is empty`);
    if (/\s/.test(text)) throw new UsageError(`${option}: ${file} must hold the secret alone, on one line`);
    return text;
  } finally {
    fs.closeSync(fd);
  }
}

/**
 * A secret from, in this order: its option (accepted, with a warning: every user of the host can read
 * a program's arguments), its file option, its environment variable, its file's environment variable.
 */
function secretFrom(
  arg: string | undefined,
  option: string,
  fileArg: string | undefined,
  fileOption: string,
  envValue: string | undefined,
  envFile: string | undefined,
  envFileName: string,
  log: (line: string) => void,
): string | undefined {
  if (arg !== undefined && fileArg !== undefined) throw new UsageError(`${option} and ${fileOption} are both given: use one`);
  if (arg !== undefined) {
    log(`warning: ${option} puts a secret in this process's arguments, which every user of this host can read (ps): use the environment or ${fileOption} instead`);
    return arg;
  }
  if (fileArg !== undefined) return readSecretFile(fileArg, fileOption);
  if (envValue) return envValue;
  if (envFile) return readSecretFile(envFile, envFileName);
  return undefined;
}

export async function configFromArgs(argv: string[], env: NodeJS.ProcessEnv = process.env, log = (l: string) => console.error(l)): Promise<DaemonConfig> {
  const { values } = parseArgs({
    args: argv.filter((a) => a !== "--"),
    options: {
      url: { type: "string" },
      key: { type: "string" },
      "key-file": { type: "string" },
      "hmac-secret": { type: "string" },
      "hmac-secret-file": { type: "string" },
      "server-key": { type: "string" },
      "trust-new-server-key": { type: "boolean" },
      runner: { type: "string", multiple: true },
      docker: { type: "string" },
      "nvidia-smi": { type: "string" },
      "state-dir": { type: "string" },
      "work-dir": { type: "string" },
      "public-host": { type: "string" },
      "serve-port": { type: "string" },
      "cached-models": { type: "string" },
      "heartbeat-seconds": { type: "string" },
      "stop-grace-seconds": { type: "string" },
      help: { type: "boolean", short: "h" },
    },
    strict: true,
  });
  if (values.help) throw new UsageError(USAGE);
  const url = values.url ?? env.SVC_URL ?? env.SVC_BACKEND_URL;
  const key = secretFrom(values.key, "--key", values["key-file"], "--key-file", env.SVC_API_KEY || env.SVC_PROVIDER_KEY, env.SVC_KEY_FILE, "SVC_KEY_FILE", log);
  if (!url || !key) throw new UsageError(`--url and a provider key are required (SVC_URL; SVC_API_KEY or --key-file)\n\n${USAGE}`);
  const hmacSecret = secretFrom(values["hmac-secret"], "--hmac-secret", values["hmac-secret-file"], "--hmac-secret-file", env.SVC_HMAC_SECRET, env.SVC_HMAC_SECRET_FILE, "SVC_HMAC_SECRET_FILE", log);
  try {
    new URL(url);
  } catch {
    throw new UsageError(`--url must be an absolute URL (got "${url}")`);
  }
  const number = (raw: string | undefined, name: string) => {
    if (raw === undefined || raw === "") return undefined;
    const n = Number(raw);
    if (!Number.isFinite(n) || n <= 0) throw new UsageError(`${name} must be a positive number (got "${raw}")`);
    return n;
  };
  const stateDir = path.resolve(values["state-dir"] ?? env.SVC_STATE_DIR ?? path.join(os.homedir(), ".svc-daemon"));
  const workRoot = path.resolve(values["work-dir"] ?? env.SVC_WORK_DIR ?? path.join(stateDir, "work"));
  const nvidiaSmi = values["nvidia-smi"] ?? env.SVC_NVIDIA_SMI ?? "nvidia-smi";
  const dockerCli = values.docker ?? env.SVC_DOCKER ?? "docker";
  let docker: string | undefined;
  if (dockerCli !== "none") {
    const v = await runCommand(dockerCli, ["version", "--format", "{{.Server.Version}}"], { timeoutMs: 15_000 });
    if (v.code === 0) docker = dockerCli;
    else log(`docker is not available (${(v.stderr || "not found").trim().split("\n")[0]}): container job types will be refused`);
  }
  const smi = await runCommand(nvidiaSmi, ["-L"], { timeoutMs: 15_000 });
  const visibleDevices = env.CUDA_VISIBLE_DEVICES;
  const listed = smi.code === 0 && smi.stdout.trim().length > 0;
  let gpus = listed;
  if (listed && visibleDevices !== undefined) {
    const all = (await new GpuProbe(nvidiaSmi).snapshot()).gpus;
    const visible = visibleGpus(all, visibleDevices);
    log(`CUDA_VISIBLE_DEVICES="${visibleDevices}": jobs get GPUs ${visible.gpus.map((g) => g.index).join(", ") || "none"} of the ${all.length} nvidia-smi lists`);
    if (visible.ignored.length > 0) log(`CUDA_VISIBLE_DEVICES entries ignored from "${visible.ignored[0]}" on: it names no GPU nvidia-smi lists`);
    gpus = visible.gpus.length > 0;
  }
  if (!listed) log("no NVIDIA GPU found (nvidia-smi): CPU-only job types only");
  else if (!gpus) log("CUDA_VISIBLE_DEVICES names no GPU of this host: CPU-only job types only");
  return {
    url: url.replace(/\/+$/, ""),
    key,
    hmacSecret,
    serverKey: values["server-key"] ?? env.SVC_SERVER_KEY,
    trustNewServerKey: values["trust-new-server-key"] ?? ["1", "true", "yes"].includes((env.SVC_TRUST_NEW_SERVER_KEY ?? "").toLowerCase()),
    stateDir,
    nvidiaSmi,
    visibleDevices,
    executors: {
      runners: parseRunners([...(values.runner ?? []), env.SVC_RUNNERS ?? ""]),
      workRoot,
      log,
      docker: docker
        ? {
            docker,
            gpus,
            scriptsDir: CONTAINER_SCRIPTS,
            publicHost: values["public-host"] ?? env.SVC_PUBLIC_HOST,
            servePort: number(values["serve-port"] ?? env.SVC_SERVE_PORT, "--serve-port"),
            daemonLabel: daemonLabel(url, workRoot),
            log,
          }
        : undefined,
    },
    cachedModels: (values["cached-models"] ?? env.SVC_CACHED_MODELS ?? "").split(",").map((s) => s.trim()).filter(Boolean),
    heartbeatSeconds: number(values["heartbeat-seconds"] ?? env.SVC_HEARTBEAT_SECONDS, "--heartbeat-seconds"),
    reconnectMinMs: 500,
    reconnectMaxMs: 30_000,
    stopGraceMs: (number(values["stop-grace-seconds"] ?? env.SVC_STOP_GRACE_SECONDS, "--stop-grace-seconds") ?? DEFAULT_STOP_GRACE_SECONDS) * 1000,
    log,
  };
}

export async function main(argv = process.argv.slice(2)): Promise<number> {
  const log = (line: string) => console.error(`[svc-daemon ${new Date().toISOString()}] ${line}`);
  let cfg: DaemonConfig;
  try {
    cfg = await configFromArgs(argv, process.env, log);
  } catch (err) {
    console.error(err instanceof UsageError || (err as { code?: string }).code?.startsWith("ERR_PARSE_ARGS") ? (err as Error).message : err);
    return (err as Error).message === USAGE ? 0 : 2;
  }
  const daemon = new ProviderDaemon(cfg);
  log(`starting ${DAEMON_VERSION} against ${cfg.url}`);
  let signalled = false;
  const onSignal = (sig: NodeJS.Signals) => {
    // A repeated signal must not kill the process by default action: the jobs' process groups would outlive it.
    if (signalled) return log(`${sig} received; already stopping (within ${cfg.stopGraceMs / 1000} s)`);
    signalled = true;
    log(`${sig} received`);
    void daemon.stop();
  };
  process.on("SIGTERM", onSignal);
  process.on("SIGINT", onSignal);
  await daemon.start();
  // The stream loop ends once stopping; the shutdown (jobs stopped and reported) may still be finishing.
  await daemon.stop();
  process.off("SIGTERM", onSignal);
  process.off("SIGINT", onSignal);
  log("stopped");
  // Safety net after the orderly shutdown: nothing of ours holds the event loop any more, so
  // this fires only if a library's handle still does; a service manager must not wait on it.
  setTimeout(() => {
    log(`exiting; still open: ${process.getActiveResourcesInfo().join(", ")}`);
    process.exit(process.exitCode ?? 0);
  }, 1000).unref();
  return daemon.exitCode;
}
