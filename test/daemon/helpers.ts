// Shared pieces of the daemon tests: daemon processes killed after each test,
// fake executables on a PATH, running the machine's python3, and a process that
// stops listening for notices. (A test server's BACKEND_URL is its own address
// by default, so served installers and daemons reach it as rendered.)
import { spawn, spawnSync } from "node:child_process";
import fs from "node:fs";
import http from "node:http";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { afterEach } from "vitest";
import type { Sql } from "../../src/db/index.js";
import type { Logger } from "../../src/log.js";
import { jobSignalHub } from "../../src/workers/job-signals.js";

export const LEGACY_DIR = path.resolve("src/daemon/legacy");
export const FIXTURES = path.resolve("test/daemon/fixtures");

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const port = (s.address() as net.AddressInfo).port;
      s.close(() => resolve(port));
    });
  });
}

/**
 * The daemon processes a test starts: SIGKILLed and waited for after each test, then `after` runs
 * (clearing the marketplace, say, which wants them gone).
 */
export function killedAfterEach(after?: () => unknown): Spawned[] {
  const spawned: Spawned[] = [];
  afterEach(async () => {
    for (const d of spawned.splice(0)) {
      d.kill("SIGKILL");
      await d.exited;
    }
    await after?.();
  });
  return spawned;
}

export function tempDir(prefix: string): string {
  return fs.mkdtempSync(path.join(os.tmpdir(), `svc-${prefix}-`));
}

/** Writes an executable script into dir. */
export function writeExecutable(dir: string, name: string, body: string): string {
  const file = path.join(dir, name);
  fs.writeFileSync(file, body, { mode: 0o755 });
  return file;
}

/** The python3 interpreter itself, not a version manager's shim that would die first of a signal. */
export function realPython(): string {
  return spawnSync("python3", ["-c", "import sys; print(sys.executable)"], { encoding: "utf8" }).stdout.trim();
}

/** Runs python3 code with stdin; returns stdout (throws with stderr on failure). */
export function python(code: string, stdin = "", env: Record<string, string> = {}): string {
  const r = spawnSync("python3", ["-c", code], {
    input: stdin,
    encoding: "utf8",
    env: { ...process.env, PYTHONDONTWRITEBYTECODE: "1", PYTHONPATH: LEGACY_DIR, ...env },
    maxBuffer: 64 * 1024 * 1024,
  });
  if (r.status !== 0) throw new Error(`python3 failed (${r.status}): ${r.stderr}`);
  return r.stdout;
}

export interface Ran {
  status: number | null;
  stdout: string;
  stderr: string;
}

/** Runs a command to completion without blocking the event loop (the server under test lives in this process). */
export function run(cmd: string, args: string[], opts: { env?: Record<string, string | undefined>; input?: string; cwd?: string } = {}): Promise<Ran> {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { env: opts.env ?? process.env, cwd: opts.cwd, stdio: ["pipe", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (d) => (stdout += d));
    child.stderr.on("data", (d) => (stderr += d));
    child.on("error", reject);
    child.on("close", (status) => resolve({ status, stdout, stderr }));
    child.stdin.end(opts.input ?? "");
  });
}

/**
 * A server on 127.0.0.1 that answers every request with a redirect to one on 127.0.0.2, which records the
 * `x-provider-key` of each request it gets. Both answers are a shell command that creates `marker`, so a
 * command that runs either leaves it behind.
 */
export async function keyRedirector(marker: string): Promise<{ url: string; otherHostKeys: (string | undefined)[]; close(): Promise<void> }> {
  const otherHostKeys: (string | undefined)[] = [];
  const body = `: > '${marker}'\n`;
  const listen = (host: string, handle: http.RequestListener) =>
    new Promise<http.Server>((resolve) => {
      const s = http.createServer(handle);
      s.listen(0, host, () => resolve(s));
    });
  const other = await listen("127.0.0.2", (req, res) => {
    otherHostKeys.push(req.headers["x-provider-key"] as string | undefined);
    req.resume();
    res.writeHead(200, { "content-type": "text/plain" }).end(body);
  });
  const otherUrl = `http://127.0.0.2:${(other.address() as net.AddressInfo).port}`;
  const first = await listen("127.0.0.1", (req, res) => {
    req.resume();
    res.writeHead(302, { location: `${otherUrl}${req.url ?? "/"}`, "content-type": "text/plain" }).end(body);
  });
  return {
    url: `http://127.0.0.1:${(first.address() as net.AddressInfo).port}`,
    otherHostKeys,
    close: async () => {
      for (const s of [first, other]) {
        s.closeAllConnections();
        await new Promise((resolve) => s.close(resolve));
      }
    },
  };
}

export function hasCommand(cmd: string): boolean {
  return spawnSync("sh", ["-c", `command -v ${cmd}`]).status === 0;
}

/** Polls until fn returns a truthy value (or throws after timeoutMs). */
export async function waitFor<T>(fn: () => Promise<T | undefined | null | false> | T | undefined | null | false, timeoutMs = 15_000, what = "condition"): Promise<T> {
  const end = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      const v = await fn();
      if (v) return v as T;
    } catch (err) {
      last = err;
    }
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}${last ? `: ${String(last)}` : ""}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** A job's row once it has ended (completed, failed or cancelled), waited for up to 45 s. */
export function endedJob(sql: Sql, jobId: string, what: string): Promise<Record<string, any>> {
  return waitFor(async () => {
    const [r] = await sql`SELECT * FROM jobs WHERE job_id = ${jobId}`;
    return ["completed", "failed", "cancelled"].includes(r.status) ? r : undefined;
  }, 45_000, what);
}

/** The job's first attempt once it has ended (its row in job_attempts). */
export function endedFirstAttempt(sql: Sql, jobId: string, what: string): Promise<Record<string, any>> {
  return waitFor(async () => {
    const [row] = await sql`SELECT a.* FROM job_attempts a JOIN jobs j ON j.id = a.job_id WHERE j.job_id = ${jobId} AND a.attempt = 1 AND a.ended_at IS NOT NULL`;
    return row;
  }, 45_000, what);
}

export interface Spawned {
  output(): string;
  exited: Promise<number | null>;
  pid: number;
  kill(signal?: NodeJS.Signals): void;
}

/**
 * Starts a long-running process, collecting its combined output. `detached`:
 * in a process group of its own, as a service manager runs it (`kill` then
 * signals the whole group).
 */
export function start(cmd: string, args: string[], opts: { env?: Record<string, string | undefined>; cwd?: string; detached?: boolean } = {}): Spawned {
  const child = spawn(cmd, args, { env: { ...process.env, ...opts.env }, cwd: opts.cwd, stdio: ["ignore", "pipe", "pipe"], detached: opts.detached });
  let out = "";
  child.stdout.on("data", (d) => (out += d));
  child.stderr.on("data", (d) => (out += d));
  const exited = new Promise<number | null>((resolve) => child.on("exit", (code) => resolve(code)));
  const kill = (s: NodeJS.Signals = "SIGTERM") => {
    if (!opts.detached) return void child.kill(s);
    try {
      process.kill(-child.pid!, s);
    } catch {
      // The group is gone already.
    }
  };
  return { output: () => out, exited, pid: child.pid!, kill };
}

/** Whether a process id is alive. */
export function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/**
 * Runs `fn` while the server's process does not listen for notices (what a lost LISTEN connection
 * does), then listens again, as the next stream to subscribe would make it.
 */
export async function whileNotListening(app: { sql: Sql; deps: { log: Logger } }, fn: () => Promise<void>): Promise<void> {
  const hub = jobSignalHub(app.sql, app.deps.log);
  await hub.stop();
  try {
    await fn();
  } finally {
    const unsubscribe = await hub.subscribe(0, { assigned: () => {}, cancel: () => {}, settings: () => {}, resync: () => {} });
    unsubscribe();
  }
}

/**
 * An llm-inference runner (`llm-inference=…` for --runner or SVC_RUNNERS) that runs until `open()`,
 * then writes its result; `started()` once it runs. On SIGTERM it takes a second to stop, as a job
 * saving its state does. It prints "started" and "stopping" (log lines), unless `quiet`.
 */
export function gatedRunner(opts: { quiet?: boolean } = {}): { runner: string; started(): boolean; open(): void } {
  const dir = tempDir("gate");
  const gate = path.join(dir, "go");
  const started = path.join(dir, "started");
  const say = (word: string) => (opts.quiet ? "None" : `print(${JSON.stringify(word)}, flush=True)`);
  const runner = writeExecutable(
    dir,
    "gated.py",
    [
      "#!/usr/bin/env python3",
      "import json, os, signal, sys, time",
      `signal.signal(signal.SIGTERM, lambda *_: (${say("stopping")}, time.sleep(1), sys.exit(143)))`,
      say("started"),
      "json.load(sys.stdin)",
      `open(${JSON.stringify(started)}, "w").close()`,
      `while not os.path.exists(${JSON.stringify(gate)}):`,
      "    time.sleep(0.05)",
      'json.dump({"response": "done"}, open(os.environ["SVC_RESULT_FILE"], "w"))',
      "",
    ].join("\n"),
  );
  return { runner: `llm-inference=${realPython()} ${runner}`, started: () => fs.existsSync(started), open: () => fs.writeFileSync(gate, "") };
}

/**
 * Runs a served svc_daemon.py with a fake nvidia-smi, no docker, a fast heartbeat and poll; its work dir is `<dir>/work`.
 * `interpreter`: realPython() for a test that signals the daemon.
 */
export function runLegacyDaemon(file: string, dir: string, env: Record<string, string | undefined> = {}, interpreter = "python3"): Spawned {
  const smi = writeExecutable(
    dir,
    "nvidia-smi",
    `#!/bin/sh\ncase "$1" in\n  --query-gpu=*) cat '${path.join(FIXTURES, "nvidia-smi-query-2gpu.csv")}' ;;\n  *) cat '${path.join(FIXTURES, "nvidia-smi.txt")}' ;;\nesac\n`,
  );
  return start(interpreter, [file, "--heartbeat-seconds", "1", "--poll-seconds", "0.3"], {
    // Not the test's own CUDA_VISIBLE_DEVICES: it would choose among the fake GPUs.
    env: { SVC_NVIDIA_SMI: smi, SVC_DOCKER: "none", SVC_WORK_DIR: path.join(dir, "work"), HOME: dir, PYTHONDONTWRITEBYTECODE: "1", CUDA_VISIBLE_DEVICES: undefined, ...env },
  });
}

export interface FakeDocker {
  /** The fake `docker` executable. */
  path: string;
  /** Its state folder: `<container name>.go` lets a waiting container finish. */
  dir: string;
  /** Every invocation's argv (after `docker`), in order. */
  calls(): string[][];
  /** The `docker run` invocations. */
  runs(): string[][];
  /** Lets every container of a job (labelled `svc.job_id=<job_id>`) that runs `wait` finish. */
  release(jobId: string): void;
  /** Forgets the images `pull` fetched (as `docker image rm` would) and closes the "gate" again (removes `pull-release`). */
  forgetPulls(): void;
  /** The containers it holds now (not removed), with their labels and the process playing each. */
  containers(): FakeContainer[];
  /** The volumes it holds now, with their labels. */
  volumes(): FakeVolume[];
}

export interface FakeVolume {
  name: string;
  labels: Record<string, string>;
}

export interface FakeContainer {
  id: string;
  name: string;
  labels: Record<string, string>;
  /** Its environment as docker builds it from `--env-file` and `-e`: `NAME=value`, or `NAME` alone, copied from the CLI's own environment (left out when unset there). */
  env: Record<string, string>;
  /** The `--env-file` it was run with, and that file's mode bits then (null: none). */
  envFile: string | null;
  envFileMode: number | null;
  /** What the `docker run` CLI process itself had of the variables that choose the engine it talks to. */
  cliEnv: { DOCKER_HOST: string | null; DOCKER_CONFIG: string | null };
  pid: number;
  running: boolean;
}

/**
 * A fake `docker` CLI playing the engine's part closely enough for the daemons: `run` creates a
 * container (its id written to `--cidfile`, which must not exist yet; refused, 125, while a container
 * of its `--name` exists), reads `--env-file`, makes each named volume of its `-v NAME:PATH` that is not there (with no
 * label), starts it and passes its exit status through; `--rm` removes it once it exits, as the
 * engine does; `inspect` answers a container's state (`{{json .State}}`); `kill` stops a running one;
 * `rm` removes containers (a running one only with `-f`/`--force`, which kills it; never a named
 * volume), after failing its first `opts.rmFailures` calls as a stuck engine does; `ps` lists them (`-a`, `-q`, `--no-trunc`, `--filter label=KEY[=VALUE]` ANDed, `--format`
 * with `{{.ID}}`, `{{.Names}}`, `{{.Label "KEY"}}`); `volume create [--label KEY=VALUE]... NAME` makes
 * a volume (one of that name already there is kept as it is, labels included); `volume ls` lists them
 * (`-q`, `--filter label=KEY[=VALUE]` ANDed, `--format` with `{{.Name}}`, `{{.Label "KEY"}}`);
 * `volume rm` removes them, refusing one that is not there (`no such volume`) or that a container
 * (running or not) mounts (`volume is in use`).
 * Containers, their labels and their process, and volumes, are kept in its state folder across
 * invocations, so a container outlives the daemon that started it. Images: `image inspect` finds every image, unless
 * `opts.images` is "absent": then only those `pull` fetched; `pull` succeeds (`opts.pull` "ok", the
 * default; "gate": once the test writes `pull-release` in its folder), fails as an
 * unreachable registry does ("fail"), or hangs ("hang"; the `pull-mode` file of its folder holds the
 * mode, so a test may change it). What the container
 * does is the last word of the command line:
 * - `exit-125`: prints its work and exits 125 itself (the container ran);
 * - `docker-fails`: docker fails before creating the container (the GPU runtime refused), 125;
 * - `start-fails`: the container is created but cannot start (an OCI runtime error), 125;
 * - `wait`: runs until `release(jobId)`, then succeeds;
 * - `big-result`, `zeros-result`, `fifo-result`, `symlink-result`: leaves at result.json a 20 MB JSON
 *   string, a 7 MB JSON array of zeros (over 16 MiB as a protobuf Value), a FIFO, or a symbolic link
 *   to a file of the host (holding the JSON string "a file of the host"), and succeeds;
 * - `long-line`: prints a 5 MB line, then writes a result and succeeds;
 * - anything else: writes a result and succeeds.
 * A container published with `-p HOST:PORT` (vllm_serve) plays vLLM instead, on 127.0.0.1:HOST, until
 * it is killed: `/health` answers 200; every `/v1` path requires `Authorization: Bearer <VLLM_API_KEY>`
 * when its environment has that key (401 otherwise, as vLLM does); `GET /v1/models` lists the
 * `--model`, `POST /v1/chat/completions` answers "Hello from a fake engine." with its usage.
 */
export function fakeDocker(dir: string, opts: { images?: "present" | "absent"; pull?: "ok" | "fail" | "hang" | "gate"; rmFailures?: number } = {}): FakeDocker {
  const calls = path.join(dir, "docker-calls.jsonl");
  if (opts.rmFailures) fs.writeFileSync(path.join(dir, "rm-failures"), String(opts.rmFailures));
  if (opts.images === "absent") fs.writeFileSync(path.join(dir, "images-absent"), "");
  if (opts.pull) fs.writeFileSync(path.join(dir, "pull-mode"), opts.pull);
  const file = writeExecutable(
    dir,
    "docker",
    // Without site (-S): the standard library is all it uses, and each call starts in half the CPU time.
    `#!/usr/bin/env -S python3 -S
import hashlib, json, os, re, signal, sys, time
STATE = ${JSON.stringify(dir)}
args = sys.argv[1:]
with open(${JSON.stringify(calls)}, "a") as f:
    f.write(json.dumps(args) + "\\n")
cmd = args[0] if args else ""
NEVER = "0001-01-01T00:00:00Z"

def opt(name):
    return args[args.index(name) + 1] if name in args else None

def state_file(cid):
    return os.path.join(STATE, "container-" + cid + ".json")

def meta_file(cid):
    return os.path.join(STATE, "meta-" + cid + ".json")

def by_name(name):
    path = os.path.join(STATE, "name-" + name)
    return open(path).read() if os.path.exists(path) else None

def containers():
    return sorted(f[len("container-"):-len(".json")] for f in os.listdir(STATE) if f.startswith("container-") and f.endswith(".json"))

def resolve(ref):
    if os.path.exists(state_file(ref)):
        return ref
    found = [c for c in containers() if len(ref) >= 12 and c.startswith(ref)]
    return found[0] if len(found) == 1 else by_name(ref)

def load(path, default):
    try:
        return json.load(open(path))
    except (OSError, ValueError):
        return default

def flags():
    # Short flags, also combined (-aq).
    return {c for a in args[1:] if a.startswith("-") and not a.startswith("--") for c in a[1:]}

def option_values(name):
    return [args[i + 1] for i, a in enumerate(args[:-1]) if a == name]

def labelled(labels, wanted):
    # Every --filter label=KEY[=VALUE] holds.
    return all(kind == "label" and key in labels and (not eq or labels[key] == value)
               for kind, _, rest in (w.partition("=") for w in wanted) for key, eq, value in [rest.partition("=")])

def volume_file(name):
    return os.path.join(STATE, "volume-" + hashlib.sha256(name.encode()).hexdigest()[:16] + ".json")

def volumes():
    found = (load(os.path.join(STATE, f), None) for f in os.listdir(STATE) if f.startswith("volume-") and f.endswith(".json"))
    return sorted((v for v in found if v), key=lambda v: v["name"])

def make_volume(name, labels):
    if not os.path.exists(volume_file(name)):
        # Whole or not at all: another invocation may read it meanwhile.
        tmp = os.path.join(STATE, "tmp-volume-%d.json" % os.getpid())
        json.dump({"name": name, "labels": labels}, open(tmp, "w"))
        os.replace(tmp, volume_file(name))

def users_of(volume):
    # The containers (running or not) that mount the volume.
    return [cid for cid in containers() if volume in load(meta_file(cid), {}).get("volumes", [])]

if cmd == "version":
    print("24.0.7"); sys.exit(0)

def image_file(image):
    return os.path.join(STATE, "image-" + hashlib.sha256(image.encode()).hexdigest()[:16])

IMAGES_ABSENT = os.path.exists(os.path.join(STATE, "images-absent"))
if cmd == "image" and args[1:2] == ["inspect"]:
    image = args[-1]
    if IMAGES_ABSENT and not os.path.exists(image_file(image)):
        print("Error response from daemon: No such image: " + image, file=sys.stderr); sys.exit(1)
    print("sha256:" + hashlib.sha256(image.encode()).hexdigest()); sys.exit(0)
if cmd == "pull":
    image = args[-1]
    mode = open(os.path.join(STATE, "pull-mode")).read().strip() if os.path.exists(os.path.join(STATE, "pull-mode")) else "ok"
    print("Using default tag: latest" if ":" not in image else image.split(":")[-1] + ": Pulling from " + image.split(":")[0], flush=True)
    if mode == "hang":
        print("3c645031de29: Waiting", flush=True)
        # Until killed, or its daemon is gone (a test's SIGKILL leaves no pull behind).
        parent = os.getppid()
        while os.getppid() == parent:
            time.sleep(0.2)
        sys.exit(1)
    if mode == "gate":
        # Until the test writes pull-release (or its daemon is gone).
        print("3c645031de29: Downloading", flush=True)
        parent = os.getppid()
        while not os.path.exists(os.path.join(STATE, "pull-release")):
            if os.getppid() != parent:
                sys.exit(1)
            time.sleep(0.1)
    if mode == "fail":
        print("Error response from daemon: Get https://registry-1.docker.io/v2/: dial tcp: lookup registry-1.docker.io: no such host", file=sys.stderr)
        sys.exit(1)
    open(image_file(image), "w").close()
    print("Status: Downloaded newer image for " + image, flush=True)
    sys.exit(0)
if cmd == "inspect":
    ref = args[-1]
    cid = ref if os.path.exists(state_file(ref)) else by_name(ref)
    if not cid or not os.path.exists(state_file(cid)):
        print("Error: No such object: " + ref, file=sys.stderr); sys.exit(1)
    state = json.load(open(state_file(cid)))
    fmt = opt("--format") or opt("-f") or ""
    if fmt == "{{json .State}}":
        print(json.dumps(state))
    elif fmt == "{{.State.StartedAt}}":
        print(state["StartedAt"])
    else:
        print(json.dumps([{"Id": cid, "State": state}]))
    sys.exit(0)
if cmd == "kill":
    name = args[-1]
    pidfile = os.path.join(STATE, name + ".pid")
    if os.path.exists(pidfile):
        try:
            os.kill(int(open(pidfile).read()), signal.SIGTERM)
        except OSError:
            pass
    print(name); sys.exit(0)
if cmd == "ps":
    wanted = [args[i + 1] for i, a in enumerate(args) if a == "--filter"]
    fmt = opt("--format")
    for cid in containers():
        state, meta = load(state_file(cid), None), load(meta_file(cid), {"name": "", "labels": {}})
        if state is None or not (state["Running"] or "a" in flags() or "--all" in args):
            continue
        labels = meta["labels"]
        if not labelled(labels, wanted):
            continue
        shown = cid if "--no-trunc" in args else cid[:12]
        if "q" in flags() or "--quiet" in args:
            print(shown)
        elif fmt:
            line = fmt.replace("{{.ID}}", shown).replace("{{.Names}}", meta["name"])
            print(re.sub(r'\\{\\{\\.Label "([^"]+)"\\}\\}', lambda m: labels.get(m.group(1), ""), line))
        else:
            print(shown + "   " + meta["name"])
    sys.exit(0)
if cmd == "rm":
    left = int(open(os.path.join(STATE, "rm-failures")).read()) if os.path.exists(os.path.join(STATE, "rm-failures")) else 0
    if left > 0:
        open(os.path.join(STATE, "rm-failures"), "w").write(str(left - 1))
        print("Error response from daemon: could not kill container: tried to kill container, but did not receive an exit event", file=sys.stderr)
        sys.exit(1)
    force = "f" in flags() or "--force" in args
    code = 0
    for ref in [a for a in args[1:] if not a.startswith("-")]:
        cid = resolve(ref)
        state = load(state_file(cid), None) if cid else None
        if state is None:
            if not force:
                print("Error response from daemon: No such container: " + ref, file=sys.stderr); code = 1
            continue
        meta = load(meta_file(cid), {"name": "", "labels": {}})
        if state["Running"]:
            if not force:
                print("Error response from daemon: cannot remove container: container is running: stop the container before removing or force remove", file=sys.stderr)
                code = 1; continue
            try:
                os.kill(meta["pid"], signal.SIGKILL)
            except (KeyError, OSError):
                pass
        for path in (state_file(cid), meta_file(cid)):
            if os.path.exists(path):
                os.remove(path)
        if by_name(meta["name"]) == cid:
            os.remove(os.path.join(STATE, "name-" + meta["name"]))
        print(ref)
    sys.exit(code)
if cmd == "volume" and args[1:2] == ["create"]:
    make_volume(args[-1], dict(l.partition("=")[::2] for l in option_values("--label")))
    print(args[-1]); sys.exit(0)
if cmd == "volume" and args[1:2] == ["ls"]:
    wanted, fmt = option_values("--filter"), opt("--format")
    for v in volumes():
        if not labelled(v["labels"], wanted):
            continue
        if "q" in flags() or "--quiet" in args:
            print(v["name"])
        elif fmt:
            line = fmt.replace("{{.Name}}", v["name"])
            print(re.sub(r'\\{\\{\\.Label "([^"]+)"\\}\\}', lambda m: v["labels"].get(m.group(1), ""), line))
        else:
            print("local     " + v["name"])
    sys.exit(0)
if cmd == "volume" and args[1:2] == ["rm"]:
    code = 0
    for name in [a for a in args[2:] if not a.startswith("-")]:
        if not os.path.exists(volume_file(name)):
            print("Error response from daemon: get %s: no such volume" % name, file=sys.stderr); code = 1
        elif users_of(name):
            print("Error response from daemon: remove %s: volume is in use - [%s]" % (name, ", ".join(users_of(name))), file=sys.stderr); code = 1
        else:
            os.remove(volume_file(name))
            print(name)
    sys.exit(code)
if cmd != "run":
    print("docker: unknown command " + cmd, file=sys.stderr); sys.exit(1)

name = opt("--name")
cidfile = opt("--cidfile")
out = [a.split(":")[0] for a in args if a.endswith(":/svc-output")][0]
what = args[-1]
if cidfile and os.path.exists(cidfile):
    print("docker: Container ID file found, make sure the other container isn't running or delete %s." % cidfile, file=sys.stderr)
    sys.exit(125)
if what == "docker-fails":
    print('docker: Error response from daemon: could not select device driver "" with capabilities: [[gpu]].', file=sys.stderr)
    sys.exit(125)
if name and by_name(name) and os.path.exists(state_file(by_name(name))):
    print('docker: Error response from daemon: Conflict. The container name "/%s" is already in use by container "%s". You have to remove (or rename) that container to be able to reuse that name.' % (name, by_name(name)), file=sys.stderr)
    sys.exit(125)
# Named volumes (-v NAME:PATH; a host path starts with "/"): made unlabelled when not there, as docker does.
mounted = [v.split(":")[0] for v in option_values("-v") if not v.startswith("/")]
for volume in mounted:
    make_volume(volume, {})
cid = hashlib.sha256(("%s-%s" % (name, time.time())).encode()).hexdigest()
open(os.path.join(STATE, "name-" + name), "w").write(cid)
if cidfile:
    open(cidfile, "w").write(cid)

def save(**state):
    base = {"Status": "created", "Running": False, "ExitCode": 0, "Error": "", "StartedAt": NEVER, "FinishedAt": NEVER}
    base.update(state)
    # Whole or not at all: another invocation may read it meanwhile.
    tmp = os.path.join(STATE, "tmp-%s-%d.json" % (cid, os.getpid()))
    json.dump(base, open(tmp, "w"))
    os.replace(tmp, state_file(cid))

labels = dict(args[i + 1].partition("=")[::2] for i, a in enumerate(args) if a == "--label")
# As docker does: --env-file first (NAME=value a line; NAME alone copies the CLI's own), then -e
# NAME=value sets it; -e NAME alone copies the CLI's own, or nothing when it has none.
env = {}
env_file = opt("--env-file")
env_file_mode = None
if env_file:
    env_file_mode = os.stat(env_file).st_mode & 0o777
    for line in open(env_file).read().split("\\n"):
        line = line.lstrip()
        if not line or line.startswith("#"):
            continue
        k, eq, v = line.partition("=")
        if eq:
            env[k] = v
        elif k in os.environ:
            env[k] = os.environ[k]
for i, a in enumerate(args):
    if a == "-e" and i + 1 < len(args):
        k, eq, v = args[i + 1].partition("=")
        if eq:
            env[k] = v
        elif k in os.environ:
            env[k] = os.environ[k]
cli = {k: os.environ.get(k) for k in ("DOCKER_HOST", "DOCKER_CONFIG")}
json.dump({"name": name, "labels": labels, "env": env, "envFile": env_file, "envFileMode": env_file_mode, "cliEnv": cli, "pid": os.getpid(), "volumes": mounted}, open(meta_file(cid), "w"))
save()
if what == "start-fails":
    save(ExitCode=128, Error="failed to create task for container: OCI runtime create failed")
    print("docker: Error response from daemon: failed to create task for container: OCI runtime create failed: unable to start container process.", file=sys.stderr)
    sys.exit(125)
started = time.strftime("%Y-%m-%dT%H:%M:%S.000000000Z", time.gmtime())
save(Status="running", Running=True, StartedAt=started)
open(os.path.join(STATE, name + ".pid"), "w").write(str(os.getpid()))

def finish(code):
    save(Status="exited", ExitCode=code, StartedAt=started, FinishedAt=time.strftime("%Y-%m-%dT%H:%M:%S.000000000Z", time.gmtime()))
    if "--rm" in args:
        os.remove(state_file(cid))
        os.remove(meta_file(cid))
    sys.exit(code)

signal.signal(signal.SIGTERM, lambda *_: finish(137))
print("container started", flush=True)
if "-p" in args:
    from http.server import BaseHTTPRequestHandler, HTTPServer
    key = env.get("VLLM_API_KEY")
    model = opt("--model") or "model"

    class Engine(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def answer(self, code, body):
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def events(self, chunks):
            data = "".join("data: " + (c if isinstance(c, str) else json.dumps(c)) + "\\n\\n" for c in chunks).encode()
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def handle_one(self):
            length = int(self.headers.get("content-length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}") if length else {}
            if self.path == "/health":
                return self.answer(200, {})
            if self.path.startswith("/v1") and key and self.headers.get("authorization") != "Bearer " + key:
                return self.answer(401, {"error": "Unauthorized"})
            if self.path == "/v1/models":
                return self.answer(200, {"object": "list", "data": [{"id": model, "object": "model"}]})
            usage = {"prompt_tokens": 9, "completion_tokens": 6, "total_tokens": 15}
            if self.path == "/v1/chat/completions" and self.command == "POST" and body.get("stream"):
                head = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": int(time.time()), "model": model}
                return self.events([
                    dict(head, choices=[{"index": 0, "delta": {"role": "assistant", "content": "Hello from a fake engine."}, "finish_reason": None}], usage=dict(usage)),
                    dict(head, choices=[{"index": 0, "delta": {}, "finish_reason": "stop"}], usage=dict(usage)),
                    dict(head, choices=[], usage=dict(usage)),
                    "[DONE]",
                ])
            if self.path == "/v1/chat/completions" and self.command == "POST":
                return self.answer(200, {"id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()), "model": model,
                                         "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello from a fake engine."}, "finish_reason": "stop"}],
                                         "usage": {"prompt_tokens": 9, "completion_tokens": 6, "total_tokens": 15}})
            return self.answer(404, {"error": "not found"})

        do_GET = do_POST = handle_one

    HTTPServer(("127.0.0.1", int(opt("-p").split(":")[0])), Engine).serve_forever()
if what == "exit-125":
    print("work done; exiting with status 125", flush=True)
    finish(125)
if what == "wait":
    # Released by its name, or with every container of its job (release()).
    job_go = "svc-" + re.sub(r"[^A-Za-z0-9_.-]", "-", labels.get("svc.job_id", "")) + ".go"
    while not any(os.path.exists(os.path.join(STATE, f)) for f in (name + ".go", job_go)):
        time.sleep(0.05)
# What a renter's program can leave at /svc-output/result.json.
target = os.path.join(out, "result.json")
if what == "big-result":
    with open(target, "w") as f:
        f.write('"' + "a" * 20000000 + '"')
    finish(0)
if what == "zeros-result":
    with open(target, "w") as f:
        f.write("[" + ",".join(["0"] * 3500000) + "]")
    finish(0)
if what == "fifo-result":
    os.mkfifo(target)
    finish(0)
if what == "symlink-result":
    secret = os.path.join(STATE, "host-file.json")
    with open(secret, "w") as f:
        f.write('"a file of the host"')
    os.symlink(secret, target)
    finish(0)
if what == "long-line":
    sys.stdout.write("x" * 5000000)
    print(" end", flush=True)
json.dump({"response": "done"}, open(os.path.join(out, "result.json"), "w"))
finish(0)
`,
  );
  const read = () => (fs.existsSync(calls) ? fs.readFileSync(calls, "utf8").trim().split("\n").filter(Boolean).map((l) => JSON.parse(l) as string[]) : []);
  return {
    path: file,
    dir,
    calls: read,
    runs: () => read().filter((a) => a[0] === "run"),
    release: (jobId) => fs.writeFileSync(path.join(dir, `svc-${jobId.replace(/[^A-Za-z0-9_.-]/g, "-")}.go`), ""),
    forgetPulls: () => {
      for (const f of fs.readdirSync(dir)) if (/^image-[0-9a-f]+$/.test(f) || f === "pull-release") fs.rmSync(path.join(dir, f), { force: true });
    },
    containers: () =>
      fs.readdirSync(dir).flatMap((f) => {
        const id = /^container-([0-9a-f]+)\.json$/.exec(f)?.[1];
        if (!id) return [];
        try {
          const state = JSON.parse(fs.readFileSync(path.join(dir, f), "utf8")) as { Running: boolean };
          const meta = JSON.parse(fs.readFileSync(path.join(dir, `meta-${id}.json`), "utf8")) as Omit<FakeContainer, "id" | "running">;
          return [{ id, ...meta, running: state.Running }];
        } catch {
          return []; // removed meanwhile
        }
      }),
    volumes: () =>
      fs.readdirSync(dir).flatMap((f) => {
        if (!/^volume-[0-9a-f]+\.json$/.test(f)) return [];
        try {
          return [JSON.parse(fs.readFileSync(path.join(dir, f), "utf8")) as FakeVolume];
        } catch {
          return []; // removed meanwhile
        }
      }),
  };
}

/** The value of an option in an argv (`--gpus device=0` -> "device=0"), or undefined. */
export function optionOf(argv: string[], name: string): string | undefined {
  const at = argv.indexOf(name);
  return at >= 0 ? argv[at + 1] : undefined;
}
