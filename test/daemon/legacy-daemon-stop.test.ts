// svc_daemon.py (from src, its placeholders given by the environment) stopped with SIGTERM while its server
// accepts connections and answers nothing: a job that finished within the stop grace has its result on disk
// before anything of the stop waits on the server, and the daemon exits on its own well inside a service
// manager's stop timeout (systemd's TimeoutStopSec) instead of waiting out each request's own timeout; its
// next start sends the result.
import fs from "node:fs";
import http from "node:http";
import path from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { signTask } from "../../src/shared/task-signature.js";
import { LEGACY_DIR, realPython, runLegacyDaemon, tempDir, waitFor, writeExecutable, type Spawned } from "./helpers.js";

const SECRET = "stop-hmac-secret";
const KEY = "svc-provider-stopkey";

interface Fake {
  url: string;
  /** While set, every request is taken and never answered (a server that stopped answering). */
  hang: boolean;
  /** The requests taken while `hang` held: "METHOD /path", the body, and whether the job's kept result was on disk as it came. */
  hung: { route: string; body: string; keptThen: boolean }[];
  /** Bodies of the job-result requests answered. */
  results: Record<string, any>[];
  close(): Promise<void>;
}

/** A fake server: one job at the first poll (`job`), `running` for its status, 200 for everything else, unless `hang`. */
async function fakeServer(job: Record<string, unknown>, keptFile: string): Promise<Fake> {
  let polled = false;
  const server = http.createServer((req, res) => {
    let body = "";
    req.on("data", (d) => (body += d));
    req.on("end", () => {
      const route = `${req.method} ${req.url!.split("?")[0]}`;
      if (fake.hang) {
        fake.hung.push({ route, body, keptThen: fs.existsSync(keptFile) });
        return; // never answered
      }
      const send = (v: unknown) => res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify(v));
      if (route === `GET /api/providers/${KEY}/jobs`) {
        const first = !polled;
        polled = true;
        return send({ job: first ? job : null });
      }
      if (route.startsWith("GET /api/jobs/")) return send({ status: "running", attempt: 1 });
      if (route === "POST /api/providers/job-result") fake.results.push(JSON.parse(body));
      return send({ ok: true });
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const fake: Fake = {
    url: `http://127.0.0.1:${(server.address() as { port: number }).port}`,
    hang: false,
    hung: [],
    results: [],
    close: () => new Promise((r) => { server.closeAllConnections(); server.close(() => r()); }),
  };
  return fake;
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

/** Waits for the daemon's exit up to `ms`, as a service manager's stop timeout does, then kills it: its exit code, or "killed". */
async function stopTimeout(d: Spawned, ms: number): Promise<number | null | "killed"> {
  let timer: NodeJS.Timeout | undefined;
  const code = await Promise.race([d.exited, new Promise<"killed">((r) => (timer = setTimeout(() => r("killed"), ms)))]);
  clearTimeout(timer);
  if (code === "killed") {
    d.kill("SIGKILL");
    await d.exited;
  }
  return code;
}

describe("svc_daemon.py stopped while its server answers nothing", { timeout: 90_000 }, () => {
  it("keeps a job's result on disk before it sends the job's last logs, exits within its stop grace, and sends the result at its next start", async () => {
    const dir = tempDir("py-stop-hang");
    const jobId = "job-stop-hang";
    const task = {
      version: 1, job_id: jobId, job_type: "llm-inference", container: { image: "nvidia/cuda:12.4.1-runtime-ubuntu22.04", image_type: "cuda" },
      inputs: { prompt: "hi" }, limits: { max_duration_seconds: 120, gpu_requirements: null },
      workspace: { volume: `svc-ws-${jobId}`, mount_path: "/workspace", checkpoint_enabled: false },
    };
    const job = { id: 1, job_id: jobId, job_type: "llm-inference", attempt: 1, max_duration_seconds: 120, duration_minutes: 2, gpu_requirements: null, task_spec: task, task_spec_hmac: signTask(SECRET, task) };
    const kept = path.join(dir, "work", ".svc-results", `${jobId}.json`);
    const fake = await fakeServer(job, kept);
    servers.push(fake);
    const started = path.join(dir, "started");
    const gate = path.join(dir, "go");
    const runner = writeExecutable(dir, "runner.py", [
      "import json, os, sys, time",
      "json.load(sys.stdin)",
      'print("working", flush=True)',
      `open(${JSON.stringify(started)}, "w").close()`,
      `while not os.path.exists(${JSON.stringify(gate)}):`,
      "    time.sleep(0.05)",
      'print("finishing", flush=True)',
      'json.dump({"response": "done"}, open(os.environ["SVC_RESULT_FILE"], "w"))',
      "",
    ].join("\n"));
    const env = { SVC_BACKEND_URL: fake.url, SVC_API_KEY: KEY, SVC_HMAC_SECRET: SECRET, SVC_RUNNERS: `llm-inference=${realPython()} ${runner}`, SVC_STOP_GRACE_SECONDS: "3" };
    const a = runLegacyDaemon(path.join(LEGACY_DIR, "svc_daemon.py"), dir, env, realPython());
    daemons.push(a);
    await waitFor(() => fs.existsSync(started), 20_000, `the job running (${a.output()})`);
    // The server stops answering; the daemon's requests (its polls, the job's logs and status checks) wait on it.
    fake.hang = true;
    await waitFor(() => fake.hung.some((h) => h.route === `GET /api/providers/${KEY}/jobs`), 10_000, `a poll waiting on the server (${a.output()})`);
    await waitFor(() => fake.hung.some((h) => h.route.includes(`/api/jobs/${jobId}`)), 10_000, `a report or status check of the job waiting on the server (${a.output()})`);
    a.kill("SIGTERM");
    // The job finishes within the stop grace, while its thread still waits for that answer.
    fs.writeFileSync(gate, "");
    // A service manager's stop timeout: above the grace (3 s) and the hand-back's 5 s after it, under a request's own 30 s timeout.
    const code = await stopTimeout(a, 20_000);
    expect(code, a.output()).toBe(0);
    expect(JSON.parse(fs.readFileSync(kept, "utf8")).body).toMatchObject({ job_id: jobId, attempt: 1, success: true, result: { response: "done" } });
    // The job's last lines went after its result was on disk.
    const lastLogs = fake.hung.filter((h) => h.route === `POST /api/jobs/${jobId}/logs` && h.body.includes("finishing"));
    expect(lastLogs.length, JSON.stringify(fake.hung)).toBeGreaterThan(0);
    expect(lastLogs.map((h) => h.keptThen)).toEqual(lastLogs.map(() => true));
    expect(a.output()).toMatch(/1 job result\(s\) not delivered yet, kept in .*; the next start sends them/);

    // Started again with the server back: the kept result goes first.
    fake.hang = false;
    const b = runLegacyDaemon(path.join(LEGACY_DIR, "svc_daemon.py"), dir, env, realPython());
    daemons.push(b);
    await waitFor(() => fake.results.find((r) => r.job_id === jobId), 20_000, `the kept result sent (${b.output()})`);
    expect(fake.results.filter((r) => r.job_id === jobId)).toMatchObject([{ success: true, attempt: 1, result: { response: "done" } }]);
    await waitFor(() => !fs.existsSync(kept), 5_000, "the kept result removed");
  });
});
