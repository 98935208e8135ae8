// svc_daemon.py (from src, its placeholders given by the environment) against a scripted fake server, for
// answers a real server does not give: a malformed poll, heartbeat or job status answer, a job whose
// unsigned fields disagree with its signed task. Also what it leaves where other users of the host could
// read it: a renter's env on docker's command line, task.json, kept results, its own secrets in what it runs.
import fs from "node:fs";
import http from "node:http";
import path from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { signTask } from "../../src/shared/task-signature.js";
import { fakeDocker, LEGACY_DIR, python, realPython, runLegacyDaemon, tempDir, waitFor, writeExecutable, type Spawned } from "./helpers.js";

const SECRET = "hardening-hmac-secret";
const KEY = "svc-provider-hardeningkey";

/** An answer's JSON text as it stands (JSON.stringify runs out of stack on some). */
class RawJson {
  constructor(readonly text: string) {}
}

/** An answer, or a function of how many times it was asked before and the request's path. */
type Answer = unknown | ((n: number, path: string) => unknown);

interface Fake {
  url: string;
  /** Bodies of POST /api/providers/job-result, those answered 503 included. */
  results: Record<string, any>[];
  /** Every request as "METHOD /raw/url" (the query left out). */
  requests: string[];
  /** Every request as sent: its whole URL (the query included) and its x-provider-key header. */
  sent: { method: string; url: string; keyHeader: string | undefined }[];
  close(): Promise<void>;
}

/**
 * A fake server answering each of `answers` (poll, heartbeat, readiness, status: GET /api/jobs/ID) as
 * given; `resultStatus`: the job-result route's HTTP status.
 */
async function fakeServer(answers: { poll?: Answer; heartbeat?: Answer; readiness?: Answer; status?: Answer; resultStatus?: number }): Promise<Fake> {
  const results: Record<string, any>[] = [];
  const requests: string[] = [];
  const sent: Fake["sent"] = [];
  const asked: Record<string, number> = {};
  const answer = (name: keyof typeof answers, fallback: unknown, raw: string) => {
    const n = (asked[name] = (asked[name] ?? -1) + 1);
    const a = answers[name];
    return a === undefined ? fallback : typeof a === "function" ? (a as (n: number, path: string) => unknown)(n, raw) : a;
  };
  const server = http.createServer((req, res) => {
    let body = "";
    req.on("data", (d) => (body += d));
    req.on("end", () => {
      const raw = req.url!.split("?")[0];
      requests.push(`${req.method} ${raw}`);
      sent.push({ method: req.method!, url: req.url!, keyHeader: req.headers["x-provider-key"] as string | undefined });
      const send = (v: unknown, status = 200) => {
        res.writeHead(status, { "content-type": "application/json" });
        res.end(v instanceof RawJson ? v.text : JSON.stringify(v));
      };
      if (req.method === "GET" && raw === `/api/providers/${KEY}/jobs`) return send(answer("poll", { job: null }, raw));
      if (req.method === "GET" && raw.startsWith("/api/jobs/")) return send(answer("status", { status: "running", attempt: 1 }, raw));
      if (raw === "/api/providers/heartbeat") return send(answer("heartbeat", { approved: true, paused: false }, raw));
      if (raw === "/api/providers/readiness") return send(answer("readiness", { readiness_status: "ready" }, raw));
      if (raw === "/api/providers/job-result") {
        results.push(JSON.parse(body));
        return send({ ok: answers.resultStatus === undefined }, answers.resultStatus ?? 200);
      }
      return send({ ok: true });
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const port = (server.address() as { port: number }).port;
  return {
    url: `http://127.0.0.1:${port}`,
    results,
    requests,
    sent,
    close: () => new Promise((r) => { server.closeAllConnections(); server.close(() => r()); }),
  };
}

const daemons: Spawned[] = [];
const servers: Fake[] = [];
afterEach(async () => {
  for (const d of daemons.splice(0)) {
    d.kill("SIGKILL");
    await d.exited;
  }
  for (const s of servers.splice(0)) await s.close();
});

async function serve(answers: Parameters<typeof fakeServer>[0]): Promise<Fake> {
  const fake = await fakeServer(answers);
  servers.push(fake);
  return fake;
}

function legacy(fake: Fake, dir: string, env: Record<string, string> = {}): Spawned {
  const d = runLegacyDaemon(path.join(LEGACY_DIR, "svc_daemon.py"), dir, { SVC_BACKEND_URL: fake.url, SVC_API_KEY: KEY, SVC_HMAC_SECRET: SECRET, ...env });
  daemons.push(d);
  return d;
}

/** The poll's job for a task: its unsigned fields (job_type, max_duration_seconds) as the server sends them, unless `extra` says otherwise. */
function signedJob(task: Record<string, any>, extra: Record<string, unknown> = {}) {
  return {
    id: 1, job_id: task.job_id, job_type: task.job_type, attempt: 1, max_duration_seconds: task.limits.max_duration_seconds, duration_minutes: 2,
    gpu_requirements: null, task_spec: task, task_spec_hmac: signTask(SECRET, task), ...extra,
  };
}

/** A task as the server builds it (src/domain/jobs/task-spec.ts). */
function task(jobId: string, jobType: string, inputs: Record<string, unknown>, more: Record<string, unknown> = {}, maxSeconds = 120) {
  return {
    version: 1, job_id: jobId, job_type: jobType, container: { image: "nvidia/cuda:12.4.1-runtime-ubuntu22.04", image_type: "cuda" }, inputs,
    limits: { max_duration_seconds: maxSeconds, gpu_requirements: null },
    workspace: { volume: `svc-ws-${jobId}`, mount_path: "/workspace", checkpoint_enabled: false }, ...more,
  };
}

const customTask = (jobId: string, command: string[], env: Record<string, string> = {}) => task(jobId, "custom_container", { command, env }, { command, env });

/** An llm-inference runner (SVC_RUNNERS) that runs `body` (python, after `import json, os, sys, time`) with the job on stdin. */
function runner(dir: string, body: string): string {
  const file = writeExecutable(dir, "runner.py", `import json, os, sys, time\njob = json.load(sys.stdin)\n${body}\n`);
  return `llm-inference=${realPython()} ${file}`;
}

const mode = (file: string) => (fs.statSync(file).mode & 0o777).toString(8);

describe("svc_daemon.py against unexpected answers", { timeout: 60_000 }, () => {
  it("logs and skips a malformed poll, heartbeat or readiness answer and keeps polling", async () => {
    const jobId = "job-after-malformed";
    const dir = tempDir("py-malformed");
    const fake = await serve({
      poll: (n: number) =>
        n < 5 ? [{ job: "oops" }, { job: { id: 5 } }, [], null, { job: { job_id: 7 } }][n] : n === 5 ? { job: signedJob(task(jobId, "llm-inference", { prompt: "hi" })) } : { job: null },
      heartbeat: (n: number) => (n < 2 ? [null, ["approved"]][n] : { approved: true, paused: false }),
      readiness: ["ready"],
    });
    const d = legacy(fake, dir, { SVC_RUNNERS: runner(dir, 'json.dump({"response": "ran"}, open(os.environ["SVC_RESULT_FILE"], "w"))') });
    // The job polled after every malformed answer runs: the daemon lived through them all.
    await waitFor(() => fake.results.length > 0, 20_000, `a result (${d.output()})`);
    expect(fake.results[0]).toMatchObject({ job_id: jobId, success: true, result: { response: "ran" } });
    expect(d.output()).toMatch(/poll answer ignored/);
    expect(d.output()).toMatch(/heartbeat answer ignored/);
    expect(d.output()).not.toMatch(/Traceback/);
  });

  it("lives through answers nesting deeper than Python's parser reads (poll, heartbeat, a job's status)", async () => {
    const jobId = "job-after-deep-answers";
    const dir = tempDir("py-deep");
    const nested = "[".repeat(5000) + "1" + "]".repeat(5000);
    const deep = new RawJson(nested);
    const fake = await serve({
      poll: (n: number) => (n === 0 ? new RawJson(`{"job": ${nested}}`) : n === 1 ? deep : n === 2 ? { job: signedJob(task(jobId, "llm-inference", { prompt: "hi" })) } : { job: null }),
      heartbeat: (n: number) => (n < 2 ? deep : { approved: true, paused: false }),
      status: (n: number) => (n === 0 ? deep : { status: "running", attempt: 1 }),
    });
    const d = legacy(fake, dir, { SVC_RUNNERS: runner(dir, 'time.sleep(4)\njson.dump({"response": "ran"}, open(os.environ["SVC_RESULT_FILE"], "w"))') });
    await waitFor(() => fake.results.length > 0, 30_000, "a result").catch((e) => { throw new Error(`${e}: ${d.output()}`); });
    expect(fake.results[0]).toMatchObject({ job_id: jobId, success: true, result: { response: "ran" } });
    // Its status was read past the deep answer, and it kept beating after the deep ones.
    expect(fake.requests.filter((r) => r.startsWith("GET /api/jobs/")).length).toBeGreaterThanOrEqual(1);
    await waitFor(() => fake.requests.filter((r) => r === "POST /api/providers/heartbeat").length >= 4, 10_000, `heartbeats go on (${d.output()})`);
    expect(d.output()).not.toMatch(/Traceback/);
  });

  it("keeps a running job's container in hand when a status read answers null or a list", async () => {
    const jobId = "job-status-shapes";
    const dir = tempDir("py-status");
    const docker = fakeDocker(dir);
    const fake = await serve({
      poll: (n: number) => (n === 0 ? { job: signedJob(customTask(jobId, ["wait"])) } : { job: null }),
      status: (n: number) => (n === 0 ? null : n === 1 ? [] : { status: "running", attempt: 1 }),
    });
    const d = legacy(fake, dir, { SVC_DOCKER: docker.path });
    // Released only after the third status read: the job was followed past both odd answers.
    await waitFor(() => fake.requests.filter((r) => r.startsWith("GET /api/jobs/")).length >= 3, 30_000, `three status reads (${d.output()})`);
    expect(docker.containers().filter((c) => c.running)).toHaveLength(1);
    docker.release(jobId);
    await waitFor(() => fake.results.length > 0, 20_000, `a result (${d.output()})`);
    expect(fake.results[0]).toMatchObject({ job_id: jobId, success: true });
    expect(d.output()).not.toMatch(/Traceback/);
  });

  it("stops the job's container and reports this machine's failure when following the job fails unexpectedly", () => {
    const dir = tempDir("py-guard");
    const docker = fakeDocker(dir);
    const work = path.join(dir, "work");
    const jobId = "job-guard";
    const t = customTask(jobId, ["wait"]);
    const out = python(
      `import json, sys, threading, time, svc_daemon
svc_daemon.CANCEL_CHECK_SECONDS = 0.2
d = svc_daemon.Daemon.__new__(svc_daemon.Daemon)
d.cfg = {"secret": ${JSON.stringify(SECRET)}, "key": ${JSON.stringify(KEY)}, "runners": {}, "work_dir": ${JSON.stringify(work)}, "serve_port": 0}
d.docker = ${JSON.stringify(docker.path)}
d.scripts_dir = None
d.stop_event = threading.Event()
d.stop_deadline = time.time() + 1e6
d.jobs, d.jobs_lock = {}, threading.Lock()
reports = []
d.log = lambda m: None
d.event = lambda *a, **k: True
d.confirm_pickup = d.post_quietly = lambda *a, **k: True
d.report = lambda job_id, success, result=None, error=None, metrics=None, end_reason=None, attempt=None: reports.append({"success": success, "error": error, "end_reason": end_reason})
def status(job_id, attempt=None):
    raise KeyError("a bug in reading the job's status")
d.job_status = status
d._run_job(json.load(sys.stdin), [0])
print(json.dumps(reports))
`,
      JSON.stringify(signedJob(t)),
    );
    const reports = JSON.parse(out) as { success: boolean; error: string; end_reason: string }[];
    expect(reports).toHaveLength(1);
    expect(reports[0]).toMatchObject({ success: false, end_reason: "provider_error" });
    expect(reports[0].error).toMatch(/a bug in reading the job's status/);
    // The container was stopped and removed, not left running on the GPU the next job gets.
    expect(docker.containers()).toEqual([]);
    expect(docker.calls().some((c) => c[0] === "kill")).toBe(true);
  });
});

describe("svc_daemon.py runs what the signature covers", { timeout: 60_000 }, () => {
  it("refuses a task whose job_type or max_duration_seconds beside it is not the signed task's", async () => {
    const dir = tempDir("py-unsigned");
    const marker = path.join(dir, "ran");
    const ran = runner(dir, `open(${JSON.stringify(marker)}, "w").close()\njson.dump({"response": "x"}, open(os.environ["SVC_RESULT_FILE"], "w"))`);
    const bench = task("job-signed-bench", "benchmark", { suite: "quick", iterations: 1 }, {}, 60);
    const llm = task("job-signed-llm", "llm-inference", { prompt: "hi" }, {}, 60);
    const fake = await serve({
      poll: (n: number) =>
        n === 0
          ? { job: signedJob(bench, { job_type: "llm-inference" }) }
          : n === 1
            ? { job: signedJob(llm, { max_duration_seconds: 86_400 }) }
            : n === 2
              ? { job: signedJob(llm, { job_id: "job-someone-else" }) }
              : { job: null },
    });
    const d = legacy(fake, dir, { SVC_RUNNERS: ran });
    await waitFor(() => fake.results.length >= 3, 20_000, `three results (${d.output()})`);
    expect(fs.existsSync(marker), "a runner ran a task whose unsigned fields were changed").toBe(false);
    for (const r of fake.results) expect(r).toMatchObject({ success: false, end_reason: "signature_mismatch", fault: "provider" });
    const errors = fake.results.map((r) => r.error).join("\n");
    expect(errors).toMatch(/job_type \("llm-inference"\) is not the signed task's \("benchmark"\)/);
    expect(errors).toMatch(/max_duration_seconds \(86400\) is not the signed task's \(60\)/);
    expect(errors).toMatch(/job_id \("job-someone-else"\) is not the signed task's \("job-signed-llm"\)/);
  });

  it("refuses a signed container task whose workspace or image docker would take for a host path or an option", async () => {
    const dir = tempDir("py-bad-fields");
    const docker = fakeDocker(dir);
    const hostRoot = customTask("job-host-root", ["sh", "-c", "cat /host/etc/shadow"]);
    hostRoot.workspace = { volume: "/", mount_path: "/host", checkpoint_enabled: false };
    const flagImage = customTask("job-flag-image", ["ubuntu:22.04", "sh"]);
    flagImage.container = { image: "--privileged", image_type: "cuda" };
    const badMount = customTask("job-bad-mount", ["ok"]);
    badMount.workspace = { volume: "svc-ws-job-bad-mount", mount_path: "/w:/etc", checkpoint_enabled: false };
    const jobs = [hostRoot, flagImage, badMount];
    const fake = await serve({ poll: (n: number) => ({ job: n < jobs.length ? signedJob(jobs[n]) : null }) });
    const d = legacy(fake, dir, { SVC_DOCKER: docker.path });
    await waitFor(() => fake.results.length >= 3, 20_000, `three results (${d.output()})`);
    // Refused before docker is asked anything about the job: no pull, no volume, no container.
    expect(docker.calls().filter((a) => ["run", "pull", "image"].includes(a[0]) || a.join(" ").startsWith("volume create"))).toEqual([]);
    for (const r of fake.results) expect(r).toMatchObject({ success: false, end_reason: "unsupported_on_provider", fault: "provider" });
    const errors = Object.fromEntries(fake.results.map((r) => [r.job_id, r.error]));
    expect(errors["job-host-root"]).toMatch(/^the daemon does not run this task: the task's workspace volume "\/" is not a volume name/);
    expect(errors["job-flag-image"]).toMatch(/^the daemon does not run this task: the task's container image "--privileged" is not an image reference/);
    expect(errors["job-bad-mount"]).toMatch(/workspace mount_path "\/w:\/etc" is not an absolute path without ':'/);
    // Nor does a refused job leave a folder of its own behind.
    const work = path.join(dir, "work");
    for (const job of jobs) expect(fs.existsSync(path.join(work, job.job_id as string)), `${job.job_id}'s folder`).toBe(false);
  });

  it("arms the kill timer from the signed limits.max_duration_seconds", async () => {
    const dir = tempDir("py-signed-timer");
    const t = task("job-signed-timer", "llm-inference", { prompt: "hi" }, {}, 1);
    // The envelope names no max_duration_seconds: before, the daemon gave such a job 1800 s.
    const fake = await serve({ poll: (n: number) => (n === 0 ? { job: signedJob(t, { max_duration_seconds: undefined }) } : { job: null }) });
    const d = legacy(fake, dir, { SVC_RUNNERS: runner(dir, "time.sleep(600)") });
    await waitFor(() => fake.results.length > 0, 20_000, `a result (${d.output()})`);
    expect(fake.results[0]).toMatchObject({ success: false, end_reason: "timeout" });
    expect(fake.results[0].error).toMatch(/max_duration_seconds \(1 s\) exceeded/);
  });
});

describe("svc_daemon.py keeps secrets from other users of the host", { timeout: 60_000 }, () => {
  it("gives a renter's env to the container by name only, the docker CLI's own variables by a private --env-file", async () => {
    const jobId = "job-env-private";
    const secret = "hf_renterSECRETtoken0987654321";
    const env = {
      HF_TOKEN: secret,
      DOCKER_HOST: "tcp://renter.invalid:2375",
      DOCKER_CONFIG: "/renter/docker-config",
      PATH: "/renter/bin",
      HOME: "/renter/home",
      LINES: "a\nb",
    };
    const dir = tempDir("py-env");
    const docker = fakeDocker(dir);
    const fake = await serve({ poll: (n: number) => (n === 0 ? { job: signedJob(customTask(jobId, ["wait"], env)) } : { job: null }) });
    const daemonConfig = path.join(dir, "docker-config");
    const d = legacy(fake, dir, { SVC_DOCKER: docker.path, DOCKER_CONFIG: daemonConfig });
    await waitFor(() => docker.containers().some((c) => c.running), 20_000, `the container (${d.output()})`);
    const work = path.join(dir, "work");
    const run = docker.runs()[0];
    const envFile = run[run.indexOf("--env-file") + 1];
    expect(run.indexOf("--env-file")).toBeGreaterThan(0);
    // Private while it exists: the work folder, the job's folder, task.json and the env file.
    const modes = { work: mode(work), folder: mode(path.join(work, jobId)), task: mode(path.join(work, jobId, "task.json")), envFile: mode(envFile) };
    expect(modes).toEqual({ work: "700", folder: "700", task: "600", envFile: "600" });
    expect(path.dirname(envFile)).toBe(work); // beside the job's folder: the container does not see it
    const [container] = docker.containers();
    docker.release(jobId);
    await waitFor(() => fake.results.length > 0, 20_000, `a result (${d.output()})`);
    // The CLI found python3 on its own PATH (the fake docker is a python script) and ran the container.
    expect(fake.results[0], JSON.stringify(fake.results[0])).toMatchObject({ job_id: jobId, success: true });
    // No value on any docker command line; every value in the container, the multi-line one by name.
    expect(JSON.stringify(docker.calls())).not.toContain(secret);
    expect(run).toContain("HF_TOKEN");
    expect(container.env).toMatchObject({ HF_TOKEN: secret, DOCKER_HOST: env.DOCKER_HOST, DOCKER_CONFIG: env.DOCKER_CONFIG, PATH: env.PATH, HOME: env.HOME, LINES: "a\nb" });
    // The docker CLI itself kept its own settings.
    expect(container.cliEnv).toEqual({ DOCKER_HOST: process.env.DOCKER_HOST ?? null, DOCKER_CONFIG: daemonConfig });
    expect(fs.existsSync(envFile), "the env file is removed once the job ended").toBe(false);
    expect(fs.readdirSync(work).filter((f) => f.endsWith(".env"))).toEqual([]);
  });

  it("keeps a result the server could not take in a private file", async () => {
    const jobId = "job-kept-private";
    const dir = tempDir("py-kept");
    const fake = await serve({
      poll: (n: number) => (n === 0 ? { job: signedJob(task(jobId, "llm-inference", { prompt: "hi" })) } : { job: null }),
      resultStatus: 503,
    });
    const d = legacy(fake, dir, { SVC_RUNNERS: runner(dir, 'json.dump({"response": "kept"}, open(os.environ["SVC_RESULT_FILE"], "w"))') });
    const kept = path.join(dir, "work", ".svc-results", `${jobId}.json`);
    await waitFor(() => fs.existsSync(kept), 20_000, `the kept result (${d.output()})`);
    expect({ folder: mode(path.dirname(kept)), file: mode(kept) }).toEqual({ folder: "700", file: "600" });
  });

  it("starts a runner without the daemon's own secrets in its environment", async () => {
    const dir = tempDir("py-child-env");
    const t = task("job-child-env", "llm-inference", { prompt: "hi" });
    const fake = await serve({ poll: (n: number) => (n === 0 ? { job: signedJob(t) } : { job: null }) });
    const d = legacy(fake, dir, {
      // The key again under a name of the operator's (a service's Environment= line, say).
      PROVIDER_KEY_COPY: KEY,
      OPERATOR_SETTING: "kept",
      SVC_RUNNERS: runner(dir, 'json.dump({"response": "ok", "env": dict(os.environ)}, open(os.environ["SVC_RESULT_FILE"], "w"))'),
    });
    await waitFor(() => fake.results.length > 0, 20_000, `a result (${d.output()})`);
    const seen = fake.results[0].result.env as Record<string, string>;
    expect(seen.SVC_JOB_ID).toBe("job-child-env");
    expect(seen.OPERATOR_SETTING).toBe("kept");
    expect(Object.keys(seen).filter((k) => /^SVC_(API_KEY|HMAC_SECRET)$|^PROVIDER_KEY_COPY$/.test(k))).toEqual([]);
    expect(JSON.stringify(seen)).not.toContain(KEY);
    expect(JSON.stringify(seen)).not.toContain(SECRET);
  });
});

describe("svc_daemon.py names a job in a URL", { timeout: 60_000 }, () => {
  it("quotes the job id in every job route: status, logs, progress, endpoint-ready", async () => {
    const runnerJob = "job-q/x?y";
    const serveJob = "job-s/../serve?z";
    const quoted = (id: string) => `/api/jobs/${encodeURIComponent(id)}`;
    const dir = tempDir("py-quote");
    const docker = fakeDocker(dir);
    let endpointReady = false;
    const serving = task(serveJob, "vllm_serve", { model: "m" }, {
      model: "m", container: { image: "vllm/vllm-openai:v0.6.3", image_type: "cuda" }, serve: { api: "openai", container_port: 8000 },
      // A volume name docker takes (the daemon refuses any other): this id's '/' and '?' are not in one.
      workspace: { volume: "svc-ws-job-s-serve-z", mount_path: "/workspace", checkpoint_enabled: false },
    });
    const fake = await serve({
      poll: (n: number) => (n === 0 ? { job: signedJob(task(runnerJob, "llm-inference", { prompt: "hi" })) } : n === 1 ? { job: signedJob(serving) } : { job: null }),
      // The served engine runs until the server says its job ended.
      status: (_n: number, raw: string) => ({ status: endpointReady && raw === quoted(serveJob) ? "completed" : "running", attempt: 1 }),
    });
    const d = legacy(fake, dir, {
      SVC_DOCKER: docker.path,
      SVC_RUNNERS: runner(dir, 'print("SVC_PROGRESS 50 halfway", flush=True)\nprint("a log line", flush=True)\ntime.sleep(4)\njson.dump({"response": "ok"}, open(os.environ["SVC_RESULT_FILE"], "w"))'),
    });
    await waitFor(() => (endpointReady = fake.requests.includes(`POST ${quoted(serveJob)}/endpoint-ready`)), 30_000, `endpoint-ready (${fake.requests.join("\n")}\n${d.output()})`);
    await waitFor(() => fake.results.length > 0, 20_000, `the runner job's result (${d.output()})`);
    await waitFor(() => docker.containers().length === 0, 20_000, `the engine stopped (${d.output()})`);
    const jobRequests = fake.requests.filter((r) => r.includes("/api/jobs/"));
    for (const [id, routes] of [
      [runnerJob, ["GET ", "POST /logs", "POST /progress"]],
      [serveJob, ["GET ", "POST /endpoint-ready", "POST /progress"]],
    ] as const) {
      for (const route of routes) {
        const [method, rest] = route.split(" ");
        expect(jobRequests, `${method} ${quoted(id)}${rest}`).toContain(`${method} ${quoted(id)}${rest}`);
      }
    }
    const ours = [quoted(runnerJob), quoted(serveJob)];
    expect(jobRequests.filter((r) => !ours.some((q) => r.split(" ")[1] === q || r.split(" ")[1].startsWith(`${q}/`)))).toEqual([]);
  });
});

describe("svc_daemon.py keeps its key out of URLs", { timeout: 60_000 }, () => {
  it("sends the key in x-provider-key when it reads a job's status and checks for an update, never in a query", async () => {
    const jobId = "job-key-in-header";
    const dir = tempDir("py-key-header");
    const fake = await serve({
      poll: (n: number) => (n === 0 ? { job: signedJob(task(jobId, "llm-inference", { prompt: "hi" })) } : { job: null }),
      // An update is offered: the daemon asks for the published version once no job runs (the fake's
      // answer names none newer, so the file is not replaced).
      heartbeat: { approved: true, paused: false, update_available: true },
    });
    const d = legacy(fake, dir, { SVC_RUNNERS: runner(dir, 'time.sleep(4)\njson.dump({"response": "ok"}, open(os.environ["SVC_RESULT_FILE"], "w"))') });
    const isUpdateCheck = (r: Fake["sent"][number]) => r.method === "GET" && r.url.startsWith("/api/providers/download/daemon");
    await waitFor(() => fake.results.length > 0 && fake.sent.some(isUpdateCheck), 30_000, `a result and an update check (${d.output()})`);
    const status = fake.sent.filter((r) => r.method === "GET" && r.url.startsWith(`/api/jobs/${jobId}`));
    const update = fake.sent.filter(isUpdateCheck);
    expect(status.length).toBeGreaterThan(0);
    expect(update[0].url).toBe("/api/providers/download/daemon?check_only=true");
    for (const r of [...status, ...update]) {
      expect(r.keyHeader, r.url).toBe(KEY);
      expect(r.url).not.toContain("key=");
    }
    // Apart from the poll, whose route has the key in its path (the spec's legacy protocol), no URL holds it.
    expect(fake.sent.filter((r) => r.url.includes(KEY) && r.url !== `/api/providers/${KEY}/jobs`)).toEqual([]);
    expect(d.output()).not.toMatch(/Traceback/);
  });

  it("takes its key from SVC_API_KEY; --key still works, with a warning on stderr that other users can read it", () => {
    const out = python(
      `import io, json, sys, svc_daemon
err = io.StringIO()
sys.stderr = err
from_env = svc_daemon.load_config(["--url", "http://127.0.0.1:9"])["key"]
quiet = err.getvalue()
from_argv = svc_daemon.load_config(["--url", "http://127.0.0.1:9", "--key", "svc-provider-argv"])["key"]
print(json.dumps([from_env, quiet, from_argv, err.getvalue()]))
`,
      "",
      { SVC_API_KEY: "svc-provider-env" },
    );
    const [fromEnv, quiet, fromArgv, warned] = JSON.parse(out) as string[];
    expect([fromEnv, quiet, fromArgv]).toEqual(["svc-provider-env", "", "svc-provider-argv"]);
    expect(warned).toMatch(/warning: --key puts the provider key in the process list, where every user of this host can read it; set SVC_API_KEY/);
    expect(warned).not.toContain("svc-provider-argv");
  });
});

describe("svc_daemon.py leaves nothing of a job running", { timeout: 60_000 }, () => {
  /** Whether a process is alive and not a zombie waiting to be reaped. */
  const running = (pid: number) => {
    try {
      const stat = fs.readFileSync(`/proc/${pid}/stat`, "utf8");
      return stat.slice(stat.lastIndexOf(")") + 2)[0] !== "Z";
    } catch {
      return false;
    }
  };
  /** A runner that leaves a process behind holding its output, writes that process's id to `pidFile`, then does `then`. */
  const leaving = (dir: string, pidFile: string, then: string) =>
    runner(dir, `import subprocess\np = subprocess.Popen(["sleep", "600"])\nopen(${JSON.stringify(pidFile)}, "w").write(str(p.pid))\n${then}`);

  it("reports a job whose program exited while a process it started still holds its output, and kills that process", async () => {
    const dir = tempDir("py-stray-exit");
    const pidFile = path.join(dir, "stray.pid");
    const t = task("job-stray-exit", "llm-inference", { prompt: "hi" });
    const fake = await serve({ poll: (n: number) => (n === 0 ? { job: signedJob(t) } : { job: null }) });
    const d = legacy(fake, dir, { SVC_RUNNERS: leaving(dir, pidFile, 'json.dump({"response": "done"}, open(os.environ["SVC_RESULT_FILE"], "w"))') });
    try {
      await waitFor(() => fake.results.length > 0, 15_000, `a result (${d.output()})`);
      expect(fake.results[0]).toMatchObject({ job_id: "job-stray-exit", success: true, result: { response: "done" } });
      const stray = Number(fs.readFileSync(pidFile, "utf8"));
      await waitFor(() => !running(stray), 5_000, "the process the job left to be killed");
    } finally {
      if (fs.existsSync(pidFile)) try { process.kill(Number(fs.readFileSync(pidFile, "utf8")), "SIGKILL"); } catch {}
    }
  });

  it("stops what a job's program left in its process group when the program itself has exited already", () => {
    const dir = tempDir("py-stray-stop");
    const out = python(`import os, time, svc_daemon
run = svc_daemon.JobRun(["sh", "-c", "sleep 600 & echo $!; exit 0"], "", dict(os.environ), ${JSON.stringify(dir)})
pid = run.lines.get(timeout=10)
while run.proc.poll() is None:
    time.sleep(0.05)
run.stop()
print(pid)
`);
    const stray = Number(out.trim());
    try {
      expect(stray).toBeGreaterThan(0);
      expect(running(stray)).toBe(false);
    } finally {
      try { process.kill(stray, "SIGKILL"); } catch {}
    }
  });
});

describe("svc_daemon.py applies the container limits the stream daemon applies", { timeout: 60_000 }, () => {
  it("keeps its own pids limit and a memory limit of at least 256 MiB whatever the task's limits say, and runs a task whose memory_mb is no number", async () => {
    const dir = tempDir("py-limits");
    const docker = fakeDocker(dir);
    const limited = (jobId: string, limits: Record<string, unknown>) => {
      const t = customTask(jobId, ["true"]);
      t.limits = { ...t.limits, ...limits } as typeof t.limits;
      return t;
    };
    const jobs = [
      limited("job-no-pids-limit", { pids: -1, memory_mb: 100 }),
      limited("job-text-memory", { memory_mb: "1g" }),
    ];
    const fake = await serve({ poll: (n: number) => ({ job: n < jobs.length ? signedJob(jobs[n]) : null }) });
    const d = legacy(fake, dir, { SVC_DOCKER: docker.path });
    await waitFor(() => fake.results.length >= 2, 20_000, `two results (${d.output()})`);
    expect(d.output()).not.toMatch(/Traceback/);
    for (const r of fake.results) expect(r, JSON.stringify(r)).toMatchObject({ success: true });
    const runs = Object.fromEntries(docker.runs().map((run) => [run[run.indexOf("--label") + 1].split("=")[1], run]));
    const opt = (run: string[], name: string) => run[run.indexOf(name) + 1];
    // As the stream daemon (executors/docker.ts): the daemon's pids limit, never the task's (-1 is none at all).
    expect(opt(runs["job-no-pids-limit"], "--pids-limit")).toBe("4096");
    expect(opt(runs["job-no-pids-limit"], "--memory")).toBe("256m");
    // No swap: --memory-swap counts memory and swap together.
    expect(opt(runs["job-no-pids-limit"], "--memory-swap")).toBe("256m");
    expect(opt(runs["job-text-memory"], "--memory-swap")).toBe(opt(runs["job-text-memory"], "--memory"));
    // No number: the host's default (80% of its memory).
    expect(opt(runs["job-text-memory"], "--memory")).toMatch(/^\d+m$/);
    expect(Number(opt(runs["job-text-memory"], "--memory").slice(0, -1))).toBeGreaterThanOrEqual(256);
  });
});
