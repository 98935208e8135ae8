// svc_daemon.py, as the server serves it, running container jobs through a
// fake docker engine (helpers.ts fakeDocker): a container that ran and
// exited 125 itself is the renter's failure (billed), docker failing before
// the container started is the provider's (re-queued, no charge), and the
// container is removed either way; each job gets one GPU of the host
// (`--gpus device=N`, CUDA_VISIBLE_DEVICES for a plain process), handed out
// one per running job, and no NVIDIA_* env of the task reaches a container
// (whose runtime device features are set off). A result file that is too
// large, a FIFO or a symbolic link is the job's own failure (read without
// blocking, no host file read as its output); task.json is never written
// through a link the job left; the job's volume and folder go once it ended.
// The job's image is pulled before its container runs, and a pull that fails
// or runs too long is the provider's failure, not the renter's timeout.
import fs from "node:fs";
import path from "node:path";
import { describe, expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import { clearMarketplace } from "../helpers/isolation.js";
import { endedFirstAttempt, fakeDocker, optionOf, python, runLegacyDaemon, endedJob, killedAfterEach, tempDir, waitFor, writeExecutable } from "./helpers.js";

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000" });
const daemons = killedAfterEach(() => clearMarketplace(srv));
const api = () => client(srv.url);

async function daemonFor(key: string, env: Record<string, string> = {}, dockerOpts: Parameters<typeof fakeDocker>[1] = {}) {
  const r = await api().get(`/api/providers/download/daemon?key=${key}`);
  expect(r.status).toBe(200);
  const dir = tempDir("py-docker");
  const file = path.join(dir, "svc_daemon.py");
  fs.writeFileSync(file, r.text);
  const docker = fakeDocker(dir, dockerOpts);
  const d = runLegacyDaemon(file, dir, { SVC_DOCKER: docker.path, ...env });
  daemons.push(d);
  return { d, docker, dir };
}

const job = async (jobId: string) => (await srv.sql`SELECT * FROM jobs WHERE job_id = ${jobId}`)[0];
const ended = (jobId: string, what: string) => endedJob(srv.sql, jobId, what);

const firstAttempt = (jobId: string, what: string) => endedFirstAttempt(srv.sql, jobId, what);

async function submit(renter: { headers: Record<string, string> }, body: Record<string, unknown>) {
  const r = await api().post("/api/jobs/submit", { duration_minutes: 2, ...body }, renter.headers);
  expect(r.status, r.text).toBe(201);
  return r.body.job as { job_id: string; provider_id: number };
}

/**
 * Python driving svc_daemon's job threads in one process, without a server: a Daemon whose reports are
 * kept in `reports`, whose attempt 1 of the job is no longer its own once `moved` is set, and
 * run(attempt, gpu), which starts one attempt of `jobId` on a thread bookkept in d.jobs as the daemon does.
 */
const threadedDaemon = (work: string, docker: string, jobId: string, command: string) => `svc_daemon.verify_task = lambda *a: True
svc_daemon.CANCEL_CHECK_SECONDS = 0.2
d = svc_daemon.Daemon.__new__(svc_daemon.Daemon)
d.cfg = {"secret": "s", "runners": {}, "work_dir": ${JSON.stringify(work)}, "serve_port": 0}
d.docker = ${JSON.stringify(docker)}
d.scripts_dir = None
d.stop_event = threading.Event()
d.stop_deadline = time.time() + 1e6
d.jobs = {}
d.jobs_lock = threading.Lock()
reports = []
d.log = lambda m: None
d.event = lambda *a, **k: True
d.confirm_pickup = lambda *a, **k: True
d.notice_preparing = lambda *a, **k: True
d.post_quietly = lambda *a, **k: True
d.report = lambda job_id, success, result=None, error=None, metrics=None, end_reason=None, attempt=None, before_send=None: reports.append({"attempt": attempt, "success": success, "error": error})
moved = threading.Event()
d.job_status = lambda job_id, attempt=None: svc_daemon.GONE if attempt == 1 and moved.is_set() else "running"
def run(attempt, gpu):
    job = {"job_id": ${JSON.stringify(jobId)}, "job_type": "custom_container", "attempt": attempt, "max_duration_seconds": 60,
           "task_spec": {"job_id": ${JSON.stringify(jobId)}, "job_type": "custom_container", "limits": {"max_duration_seconds": 60},
                         "container": {"image": "nvidia/cuda:12.4.1-runtime-ubuntu22.04"}, "command": [${JSON.stringify(command)}]}}
    t = threading.Thread(target=d._run_job, args=(job, [gpu]))
    with d.jobs_lock:
        d.jobs[t] = job["job_id"]
    t.start()
    return t`;

describe("svc_daemon.py with containers", { timeout: 120_000 }, () => {
  it("bills a container that ran and exited 125 itself as the renter's failure; docker failing before it started is re-queued at no charge", async () => {
    const p = await makeProvider(srv);
    const renter = await makeRenter(srv, 1_000);
    const { d, docker } = await daemonFor(p.key);

    const own = await submit(renter, { job_type: "custom_container", params: { command: ["exit-125"] } });
    expect(own.provider_id).toBe(p.id);
    expect(await firstAttempt(own.job_id, `first attempt end (${d.output()})`)).toMatchObject({ end_reason: "runtime_error", fault: "renter" });
    const done = await ended(own.job_id, `job end (${d.output()})`);
    expect(done).toMatchObject({ status: "failed", end_reason: "runtime_error", fault: "renter" });
    expect(done.actual_cost_halala).toBeGreaterThan(0);
    expect(done.provider_earned_halala + done.platform_fee_halala).toBe(done.actual_cost_halala);
    expect(done.error).toMatch(/work done; exiting with status 125/);
    const paid = done.actual_cost_halala;
    expect((await api().get("/api/renters/balance", renter.headers)).body).toMatchObject({ balance_halala: 1_000 - paid });

    const refused = await submit(renter, { job_type: "custom_container", params: { command: ["docker-fails"] } });
    const a = await firstAttempt(refused.job_id, `first attempt end (${d.output()})`);
    expect(a).toMatchObject({ status: "requeued", end_reason: "provider_error", fault: "provider", cost_halala: 0 });
    expect(a.error).toMatch(/could not select device driver/);
    expect((await api().get("/api/renters/balance", renter.headers)).body.balance_halala).toBe(1_000 - paid);

    // Each run named a container id file outside the job's mounted folder, and no container is left.
    for (const run of docker.runs()) {
      const cidfile = optionOf(run, "--cidfile");
      expect(cidfile).toBeDefined();
      const mounted = run.find((x) => x.endsWith(":/svc-output"))!.split(":")[0];
      expect(path.relative(mounted, cidfile!).startsWith("..")).toBe(true);
    }
    await waitFor(() => fs.readdirSync(docker.dir).filter((f) => f.startsWith("container-")).length === 0, 10_000, "containers removed");
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("runs a container on one GPU of the host, not all of them", async () => {
    const p = await makeProvider(srv);
    const renter = await makeRenter(srv, 1_000);
    const { d, docker } = await daemonFor(p.key);
    const j = await submit(renter, { job_type: "custom_container", params: { command: ["ok"] } });
    const done = await ended(j.job_id, `job end (${d.output()})`);
    expect(done.status, done.error).toBe("completed");
    const run = docker.runs().find((r) => r.includes(`svc.job_id=${j.job_id}`))!;
    expect(run.filter((a) => a === "--gpus")).toHaveLength(1);
    expect(optionOf(run, "--gpus")).toBe("device=0");
  });

  it("fails a job whose result file is too large, a FIFO or a symbolic link as the renter's, without blocking or reading the host's file", async () => {
    const p = await makeProvider(srv);
    const renter = await makeRenter(srv, 10_000);
    const { d } = await daemonFor(p.key);
    for (const [command, error] of [
      ["big-result", /result file is 20000002 bytes, over the 8388608-byte limit/],
      ["fifo-result", /result file is not a regular file \(a FIFO\)/],
      ["symlink-result", /result file is a symbolic link/],
    ] as const) {
      const j = await submit(renter, { job_type: "custom_container", params: { command: [command] } });
      expect(j.provider_id).toBe(p.id);
      const done = await ended(j.job_id, `${command}: job end (${d.output()})`);
      expect(done, command).toMatchObject({ status: "failed", end_reason: "runtime_error", fault: "renter" });
      expect(done.error).toMatch(error);
      expect(JSON.stringify(done.result ?? null)).not.toContain("a file of the host");
    }
  });

  it("pulls the job's image before its container runs; a failed or hung pull is the provider's failure, at no charge", async () => {
    const p = await makeProvider(srv);
    const renter = await makeRenter(srv, 10_000);
    // It gives a pull 5 s (25 minutes by default) before it takes the job as its own failure.
    const { d, docker } = await daemonFor(p.key, { SVC_PREPARE_WAIT_SECONDS: "5" }, { images: "absent", pull: "fail" });

    const failed = await submit(renter, { job_type: "custom_container", params: { command: ["ok"] } });
    expect(failed.provider_id).toBe(p.id);
    const a = await firstAttempt(failed.job_id, `first attempt end (${d.output()})`);
    expect(a).toMatchObject({ status: "requeued", end_reason: "provider_error", fault: "provider", cost_halala: 0 });
    expect(a.error).toMatch(/could not pull the job's image nvidia\/cuda:.*no such host/);

    // A registry that hangs: the pull is stopped at the daemon's limit and reported as the provider's failure.
    fs.writeFileSync(path.join(docker.dir, "pull-mode"), "hang");
    const hung = await submit(renter, { job_type: "custom_container", duration_minutes: 1, max_duration_seconds: 20, params: { command: ["ok"] } });
    expect(hung.provider_id).toBe(p.id);
    const b = await firstAttempt(hung.job_id, `first attempt end (${d.output()})`);
    expect(b).toMatchObject({ status: "requeued", end_reason: "provider_error", fault: "provider", cost_halala: 0 });
    expect(b.error).toMatch(/was still being pulled after \d+ s/);
    expect(docker.runs()).toEqual([]);

    // A registry that answers: pulled, then run.
    fs.writeFileSync(path.join(docker.dir, "pull-mode"), "ok");
    const ok = await submit(renter, { job_type: "custom_container", params: { command: ["ok"] } });
    const done = await ended(ok.job_id, `job end (${d.output()})`);
    expect(done.status, done.error).toBe("completed");
    const verbs = docker.calls().map((c) => c[0]);
    expect(verbs.lastIndexOf("pull")).toBeLessThan(verbs.indexOf("run"));
  });

  it("tells the server it prepares the job while its image is pulled: the renter pays from the run, not the pull", async () => {
    const p = await makeProvider(srv);
    const renter = await makeRenter(srv, 10_000);
    const { d, docker } = await daemonFor(p.key, {}, { images: "absent", pull: "gate" });
    const j = await submit(renter, { job_type: "custom_container", params: { command: ["ok"] } });
    await waitFor(async () => (await job(j.job_id)).progress_phase === "preparing: pulling image nvidia/cuda:12.4.1-runtime-ubuntu22.04", 20_000, `preparing (${d.output()})`);
    const polled = await job(j.job_id);
    expect(polled).toMatchObject({ status: "running", acked_at: null });
    const seen = await api().get(`/api/jobs/${j.job_id}`, renter.headers);
    expect(seen.body).toMatchObject({ status: "running", progress_phase: "preparing: pulling image nvidia/cuda:12.4.1-runtime-ubuntu22.04" });
    await new Promise((r) => setTimeout(r, 2_000));
    fs.writeFileSync(path.join(docker.dir, "pull-release"), "");
    const done = await ended(j.job_id, `job end (${d.output()})`);
    expect(done.status, done.error).toBe("completed");
    // The run started after the pull, at the daemon's first report on the job.
    const [a] = await srv.sql`SELECT a.started_at FROM job_attempts a WHERE a.job_id = ${done.id} AND a.attempt = 1`;
    expect(new Date(a.started_at).getTime() - new Date(polled.started_at).getTime()).toBeGreaterThanOrEqual(1_900);
    expect(new Date(done.started_at).getTime()).toBe(new Date(a.started_at).getTime());
    expect(done.actual_cost_halala).toBeGreaterThan(0);
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("cuts each output line of a job at 16,000 bytes", () => {
    const out = JSON.parse(
      python(`import json, os, svc_daemon
run = svc_daemon.JobRun(["sh", "-c", "head -c 3000000 /dev/zero | tr '\\\\0' x; printf '\\\\r\\\\nafter\\\\nlast'"], "", dict(os.environ), ".")
lines = []
while True:
    line = run.lines.get(timeout=30)
    if line is None:
        break
    lines.append(line)
print(json.dumps([len(l) for l in lines] + lines[1:]))
`),
    );
    expect(out).toEqual([16_000, 5, 4, "after", "last"]);
  });

  it("gives a plain process its GPU in CUDA_VISIBLE_DEVICES", async () => {
    const p = await makeProvider(srv);
    const renter = await makeRenter(srv, 1_000);
    const dir = tempDir("py-runner");
    const runner = writeExecutable(dir, "gpu-runner", '#!/bin/sh\necho "visible=${CUDA_VISIBLE_DEVICES-unset} order=${CUDA_DEVICE_ORDER-unset}"\n');
    const { d } = await daemonFor(p.key, { SVC_RUNNERS: `benchmark=${runner}` });
    const j = await submit(renter, { job_type: "benchmark", duration_minutes: 1, params: { suite: "quick", iterations: 1 } });
    const done = await ended(j.job_id, `job end (${d.output()})`);
    expect(done.status, done.error).toBe("completed");
    expect((await api().get(`/api/jobs/${j.job_id}/output`, renter.headers)).body.response).toBe("visible=0 order=PCI_BUS_ID");
  });

  it("hands out one GPU per running job, drops the task's NVIDIA_* env and sets the runtime's device features off", () => {
    const out = JSON.parse(
      python(`import json, os, sys, tempfile, svc_daemon
work = tempfile.mkdtemp()
gpus = [{"index": 0}, {"index": 1}]
slots = svc_daemon.GpuSlots()
a, b = slots.take(gpus), slots.take(gpus)
third = slots.take(gpus)
slots.release(a)
again = slots.take(gpus)
job = {"job_id": "job-env1", "job_type": "custom_container",
       "task_spec": {"container": {"image": "nvidia/cuda:12.4.1-runtime-ubuntu22.04"}, "command": ["nvidia-smi"],
                     "env": {"NVIDIA_VISIBLE_DEVICES": "all", "CUDA_VISIBLE_DEVICES": "0,1", "NVIDIA_DRIVER_CAPABILITIES": "all",
                             "NVIDIA_GDS": "enabled", "NVIDIA_NOT_LISTED": "1", "KEEP": "1"}}}
argv, env = svc_daemon.plan_job(job, {}, "/usr/bin/docker", work, [1])[:2]
print(json.dumps({"taken": [a, b], "third": third, "again": again, "argv": argv, "keep": env.get("KEEP")}))
`),
    ) as { taken: number[]; third: number | null; again: number; argv: string[]; keep: string };
    expect([...out.taken].sort()).toEqual([0, 1]);
    expect(out.third).toBeNull();
    expect(out.again).toBe(out.taken[0]);
    expect(out.argv.filter((a) => a === "--gpus")).toHaveLength(1);
    expect(optionOf(out.argv, "--gpus")).toBe("device=1");
    expect(out.argv).not.toContain("all");
    expect(out.argv.filter((a) => /^(NVIDIA|CUDA)_/.test(a) && !a.endsWith("=disabled"))).toEqual([]);
    for (const k of ["NVIDIA_GDS", "NVIDIA_MOFED", "NVIDIA_NVSWITCH", "NVIDIA_GDRCOPY"]) expect(out.argv.join(" "), k).toContain(`-e ${k}=disabled`);
    // The task's own env by name only, its value in the docker CLI's environment.
    expect(out.argv.join(" ")).toContain("-e KEEP nvidia/cuda:12.4.1-runtime-ubuntu22.04 nvidia-smi");
    expect(out.keep).toBe("1");
  });

  it("never mounts a host path nor takes an option from the task's workspace or image, and gives no new privileges", () => {
    const work = path.join(tempDir("py-plan-fields"), "work");
    const plan = (spec: Record<string, unknown>) =>
      JSON.parse(
        python(`import json, svc_daemon
job = {"job_id": "job-fields", "job_type": "custom_container", "attempt": 1, "task_spec": json.loads(${JSON.stringify(JSON.stringify(spec))})}
try:
    print(json.dumps({"argv": svc_daemon.plan_job(job, {}, "/usr/bin/docker", ${JSON.stringify(work)}, [0])[0]}))
except RuntimeError as err:
    print(json.dumps({"error": str(err)}))
`),
      ) as { argv?: string[]; error?: string };
    const base = { container: { image: "nvidia/cuda:12.4.1-base-ubuntu22.04" }, command: ["sh", "-c", "cat /host/etc/shadow"] };
    const refused: [Record<string, unknown>, RegExp][] = [
      [{ ...base, workspace: { volume: "/", mount_path: "/host" } }, /workspace volume "\/" is not a volume name/],
      [{ ...base, workspace: { volume: "/var/run/docker.sock", mount_path: "/var/run/docker.sock" } }, /is not a volume name/],
      [{ ...base, workspace: { volume: "svc-ws-x", mount_path: "/w:/etc:rw" } }, /workspace mount_path "\/w:\/etc:rw" is not an absolute path without ':'/],
      [{ ...base, workspace: { volume: "svc-ws-x", mount_path: "relative" } }, /is not an absolute path/],
      [{ container: { image: "--privileged" }, command: ["ubuntu:22.04", "sh", "-c", "mount /dev/sda1 /mnt"] }, /container image "--privileged" is not an image reference/],
      [{ image: "-v/:/host", command: ["true"] }, /container image "-v\/:\/host" is not an image reference/],
    ];
    for (const [spec, why] of refused) {
      const r = plan(spec);
      expect(r.argv, JSON.stringify(spec)).toBeUndefined();
      expect(r.error, JSON.stringify(spec)).toMatch(/^the daemon does not run this task: /);
      expect(r.error, JSON.stringify(spec)).toMatch(why);
      // Refused before the task (the renter's env) is written anywhere.
      expect(fs.existsSync(path.join(work, "job-fields", "task.json"))).toBe(false);
    }
    const ok = plan({ ...base, workspace: { volume: "svc-ws-job-fields", mount_path: "/workspace", checkpoint_enabled: false } });
    expect(ok.error).toBeUndefined();
    expect(ok.argv!.join(" ")).toContain("-v svc-ws-job-fields:/workspace");
    expect(optionOf(ok.argv!, "--security-opt")).toBe("no-new-privileges");
  });

  it("writes task.json anew: never through a link a run of the job left in its folder", () => {
    const work = path.join(tempDir("py-link"), "work");
    const folder = path.join(work, "job-link");
    fs.mkdirSync(folder, { recursive: true });
    const victim = path.join(work, "..", "provider-key");
    fs.writeFileSync(victim, "the provider's key\n");
    fs.symlinkSync("../../provider-key", path.join(folder, "task.json"));
    const plan = (jobId: string) =>
      python(`import svc_daemon
job = {"job_id": "${jobId}", "job_type": "custom_container", "task_spec": {"container": {"image": "nvidia/cuda:12.4.1-runtime-ubuntu22.04"}, "command": ["ok"]}}
try:
    svc_daemon.plan_job(job, {}, "/usr/bin/docker", ${JSON.stringify(work)}, [])
except OSError as err:
    print(err.__class__.__name__)
`);
    expect(plan("job-link")).toBe("");
    expect(fs.readFileSync(victim, "utf8")).toBe("the provider's key\n");
    expect(JSON.parse(fs.readFileSync(path.join(folder, "task.json"), "utf8")).job_id).toBe("job-link");
    // A directory there that this machine could not remove: an OSError (_run_job reports it as this machine's failure).
    fs.mkdirSync(path.join(work, "job-dir", "task.json", "inside"), { recursive: true });
    expect(plan("job-dir").trim()).toBe("IsADirectoryError");
  });

  it("removes the job's workspace volume and folder once its result is in", async () => {
    const p = await makeProvider(srv);
    const renter = await makeRenter(srv, 1_000);
    const { d, docker, dir } = await daemonFor(p.key);
    const j = await submit(renter, { job_type: "custom_container", params: { command: ["ok"] } });
    const done = await ended(j.job_id, `job end (${d.output()})`);
    expect(done.status, done.error).toBe("completed");
    expect((await api().get(`/api/jobs/${j.job_id}/output`, renter.headers)).body).toMatchObject({ response: "done" });
    await waitFor(() => !fs.existsSync(path.join(dir, "work", j.job_id)), 10_000, `job folder removed (${d.output()})`);
    // The volume last: its labels name the job to the next start if the daemon is killed before it went.
    await waitFor(() => docker.volumes().length === 0, 10_000, `volume removed (${d.output()})`);
    const calls = docker.calls().map((a) => a.join(" "));
    expect(calls.indexOf(`volume rm svc-ws-${j.job_id}`)).toBeGreaterThan(calls.findIndex((c) => c.startsWith("rm --force --volumes")));
  });

  it("asks docker again to remove a job's container when a removal fails, then removes its volume", async () => {
    const p = await makeProvider(srv);
    const renter = await makeRenter(srv, 1_000);
    // The engine fails the first two removals, as one that did not get the container's exit event does.
    const { d, docker } = await daemonFor(p.key, {}, { rmFailures: 2 });
    const j = await submit(renter, { job_type: "custom_container", params: { command: ["ok"] } });
    const done = await ended(j.job_id, `job end (${d.output()})`);
    expect(done.status, done.error).toBe("completed");
    await waitFor(() => docker.containers().length === 0 && docker.volumes().length === 0, 15_000, `container and volume removed (${d.output()})`);
    expect(docker.calls().filter((c) => c[0] === "rm")).toHaveLength(3);
  });

  it("leaves a job's folder and volume to a newer attempt of it that runs on another GPU when the older one ends", () => {
    // Attempt 1 waits for its image; the job is re-queued and assigned back here as attempt 2 (polled on
    // the other GPU); attempt 1 then learns it moved and ends. Driven in one process with the daemon's
    // own threads and its bookkeeping of them (Daemon.jobs), without a server.
    const docker = fakeDocker(tempDir("legacy-reassigned-docker"), { images: "absent", pull: "gate" });
    const work = path.join(tempDir("legacy-reassigned"), "work");
    const out = JSON.parse(
      python(`import json, os, threading, time, svc_daemon
${threadedDaemon(work, docker.path, "job-again", "ok")}
def pulls():
    try:
        return sum(1 for l in open(os.path.join(${JSON.stringify(docker.dir)}, "docker-calls.jsonl")) if json.loads(l)[0] == "pull")
    except OSError:
        return 0
first = run(1, 0)
while pulls() < 1: time.sleep(0.05)
second = run(2, 1)
while pulls() < 2: time.sleep(0.05)
moved.set()
first.join(20)
with d.jobs_lock:
    d.jobs.pop(first, None)
kept = os.path.exists(os.path.join(${JSON.stringify(work)}, "job-again", "task.json"))
open(os.path.join(${JSON.stringify(docker.dir)}, "pull-release"), "w").close()
second.join(30)
print(json.dumps({"kept": kept, "reports": reports}))
`),
    );
    expect(out.kept).toBe(true);
    expect(out.reports.filter((r: { attempt: number }) => r.attempt === 2)).toMatchObject([{ success: true }]);
  });

  it("runs two attempts of a job at once in containers of their own: neither is refused for the other's name, nor removes the other's", () => {
    // Attempt 1's container runs; the job is re-queued and assigned back here as attempt 2 (polled on the
    // other GPU) before attempt 1 learns it moved. Driven in one process with the daemon's own threads.
    const docker = fakeDocker(tempDir("legacy-twice-docker"));
    const work = path.join(tempDir("legacy-twice"), "work");
    const out = JSON.parse(
      python(`import json, os, subprocess, threading, time, svc_daemon
${threadedDaemon(work, docker.path, "job-twice", "wait")}
def running():
    ps = subprocess.run([d.docker, "ps", "--filter", "label=svc.job_id=job-twice", "--format", "{{.Names}}"], capture_output=True, text=True)
    return sorted(ps.stdout.split())
def until(cond, seconds):
    end = time.time() + seconds
    while not cond() and time.time() < end:
        time.sleep(0.05)
    return cond()
first = run(1, 0)
until(lambda: len(running()) == 1, 20)
second = run(2, 1)
both = until(lambda: len(running()) == 2, 10)
names = running()
moved.set()
first.join(20)
with d.jobs_lock:
    d.jobs.pop(first, None)
left = running()
open(os.path.join(${JSON.stringify(docker.dir)}, "svc-job-twice.go"), "w").close()
second.join(30)
print(json.dumps({"both": both, "names": names, "left": left, "reports": reports, "folder": os.path.exists(os.path.join(${JSON.stringify(work)}, "job-twice"))}))
`),
    );
    expect(out.both).toBe(true);
    expect(out.names).toEqual(["svc-job-twice-1", "svc-job-twice-2"]);
    // Attempt 1 stopped (it moved: nothing reported) and removed its own container only.
    expect(out.left).toEqual(["svc-job-twice-2"]);
    expect(out.reports).toMatchObject([{ attempt: 2, success: true }]);
    // Attempt 2, the last to end, removed the container, the folder and the volume.
    expect(docker.containers()).toEqual([]);
    expect(out.folder).toBe(false);
    expect(docker.volumes()).toEqual([]);
  });
});
