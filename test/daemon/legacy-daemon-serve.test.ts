// svc_daemon.py, as the server serves it, running vllm_serve through a fake
// docker engine (helpers.ts fakeDocker: a container published with -p plays
// vLLM): it declares vllm_serve only with docker, starts the engine on the
// job's GPU with a key of the job's own (in docker's environment, on no
// command line), reports the endpoint with that key once the engine is
// healthy, the /v1 gateway reaches the engine with it, and a cancel stops and
// removes the container. Without a public host it reports the port alone; an
// endpoint the server refuses ends the attempt as the provider's failure.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { describe, expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { clearMarketplace } from "../helpers/isolation.js";
import { dockerRunArgs, servePortOf } from "../../src/daemon/ts/executors/docker.js";
import { fakeDocker, freePort, optionOf, python, runLegacyDaemon, killedAfterEach, tempDir, waitFor, type FakeDocker, type Spawned } from "./helpers.js";

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000" });
const engines: FakeDocker[] = [];
const daemons = killedAfterEach(async () => {
  // A container a failed test left would go on serving: its process is ended here.
  for (const docker of engines.splice(0)) {
    for (const c of docker.containers()) {
      try {
        process.kill(c.pid, "SIGKILL");
      } catch {
        // Gone already.
      }
    }
  }
  await clearMarketplace(srv);
});
const api = () => client(srv.url);
const MODEL = "TinyLlama/TinyLlama-1.1B-Chat-v1.0";

/** The served daemon with a fake docker (or none), run until the test ends. */
async function daemonFor(key: string, env: Record<string, string> = {}, withDocker = true) {
  const r = await api().get(`/api/providers/download/daemon?key=${key}`);
  expect(r.status).toBe(200);
  const dir = tempDir("py-serve");
  const file = path.join(dir, "svc_daemon.py");
  fs.writeFileSync(file, r.text);
  const docker = fakeDocker(dir);
  engines.push(docker);
  const d = runLegacyDaemon(file, dir, { ...(withDocker ? { SVC_DOCKER: docker.path } : {}), ...env });
  daemons.push(d);
  return { d, docker };
}

const declared = (id: number, d: Spawned) =>
  waitFor(
    async () => (await srv.sql<{ supported_job_types: string[] | null }[]>`SELECT supported_job_types FROM providers WHERE id = ${id}`)[0].supported_job_types,
    45_000,
    `a declaration (${d.output()})`,
  );

const job = async (jobId: string) => (await srv.sql`SELECT * FROM jobs WHERE job_id = ${jobId}`)[0];

/** A vllm_serve job pinned to the provider, once its daemon has declared what it runs. */
async function serveOn(p: { id: number }, d: Spawned, renter: { headers: Record<string, string> }) {
  expect(await declared(p.id, d)).toContain("vllm_serve");
  const r = await api().post("/api/jobs/submit", { job_type: "vllm_serve", provider_id: p.id, duration_minutes: 5, params: { model: MODEL } }, renter.headers);
  expect(r.status, r.text).toBe(201);
  expect(r.body.job.provider_id).toBe(p.id);
  return r.body.job.job_id as string;
}

const endpointOf = (jobId: string, d: Spawned) =>
  waitFor(async () => {
    const r = await job(jobId);
    return r.endpoint_url ? r : undefined;
  }, 45_000, `endpoint ready (${d.output()})`);

async function chat(renterKey: string) {
  const r = await fetch(`${srv.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${renterKey}`, "content-type": "application/json" },
    body: JSON.stringify({ model: MODEL, messages: [{ role: "user", content: "Hi" }], max_tokens: 16 }),
  });
  return { status: r.status, text: await r.text() };
}

/** Cancels the job and waits until its container is gone. */
async function cancelAndWaitRemoved(jobId: string, renter: { headers: Record<string, string> }, docker: FakeDocker, d: Spawned) {
  expect((await api().post(`/api/jobs/${jobId}/cancel`, {}, renter.headers)).status).toBe(200);
  await waitFor(() => !docker.containers().some((c) => c.labels["svc.job_id"] === jobId), 45_000, `container removed (${d.output()})`);
}

describe("svc_daemon.py serving vllm_serve", { timeout: 120_000 }, () => {
  it("serves with a key of the job's own: in the engine's env, on no command line, reported with the endpoint; /v1 reaches it; a cancel removes the container", async () => {
    const p = await makeProvider(srv);
    const renter = await makeRenter(srv, 10_000);
    const { d, docker } = await daemonFor(p.key, { SVC_PUBLIC_HOST: "127.0.0.1" });
    const jobId = await serveOn(p, d, renter);

    const row = await endpointOf(jobId, d);
    expect(row.status).toBe("running");
    expect(row.endpoint_url).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
    const hostPort = new URL(row.endpoint_url).port;
    const key: string = row.endpoint_api_key;
    expect(key).toMatch(/^[A-Za-z0-9_-]{43}$/); // 32 random bytes, base64url

    // The container: labelled for leftover clean-up, on one GPU of the job's own, its port published.
    const run = docker.runs().find((argv) => argv.includes(`svc.job_id=${jobId}`))!;
    expect(run.filter((a) => a.startsWith("svc.daemon="))).toHaveLength(1);
    expect(run.filter((a) => a === "--gpus")).toHaveLength(1);
    expect(optionOf(run, "--gpus")).toMatch(/^device=[01]$/);
    expect(optionOf(run, "-p")).toBe(`${hostPort}:8000`);
    expect(run).not.toContain("--network");
    const image = run.indexOf("vllm/vllm-openai:v0.6.3");
    expect(run.slice(image, image + 5)).toEqual(["vllm/vllm-openai:v0.6.3", "--model", MODEL, "--port", "8000"]);
    // docker got the key by name: `-e VLLM_API_KEY`, its value from the CLI's environment, never in an argument.
    expect(run[run.indexOf("VLLM_API_KEY") - 1]).toBe("-e");
    expect(run.filter((a) => a.startsWith("VLLM_API_KEY"))).toEqual(["VLLM_API_KEY"]);
    expect(JSON.stringify(docker.calls())).not.toContain(key);
    const container = docker.containers().find((c) => c.labels["svc.job_id"] === jobId)!;
    expect(container.running).toBe(true);
    expect(container.env.VLLM_API_KEY).toBe(key);
    expect(d.output()).not.toContain(key);

    // The engine wants the key; the gateway has it.
    expect((await fetch(`${row.endpoint_url}/v1/models`)).status).toBe(401);
    const answer = await chat(renter.key);
    expect(answer.status, answer.text).toBe(200);
    expect(JSON.parse(answer.text).choices[0].message.content).toBe("Hello from a fake engine.");
    expect(answer.text).not.toContain(key);
    const logs = await api().get(`/api/jobs/${jobId}/logs`, renter.headers);
    expect(logs.status).toBe(200);
    expect(logs.text).not.toContain(key);

    // Cancelled: the container is stopped and removed, and the server forgets the key.
    await cancelAndWaitRemoved(jobId, renter, docker, d);
    const calls = docker.calls();
    // Killed by the name of this run's container (of the job's first attempt).
    expect(calls).toContainEqual(["kill", `svc-${jobId}-1`]);
    expect(calls.some((c) => c[0] === "rm" && c.includes("--force") && c.includes("--volumes"))).toBe(true);
    expect(await job(jobId)).toMatchObject({ status: "cancelled", endpoint_api_key: null });
    expect(d.output()).not.toContain(key);
  });

  it("without a public host reports the port alone (--serve-port / SVC_SERVE_PORT), which the server joins to the address the daemon reports from", async () => {
    const p = await makeProvider(srv);
    expect((await srv.sql`SELECT provider_ip FROM providers WHERE id = ${p.id}`)[0].provider_ip).toBeNull();
    const renter = await makeRenter(srv, 10_000);
    const port = await freePort();
    const { d, docker } = await daemonFor(p.key, { SVC_SERVE_PORT: String(port) });
    const jobId = await serveOn(p, d, renter);

    const row = await endpointOf(jobId, d);
    expect(row.endpoint_url).toBe(`http://127.0.0.1:${port}`);
    expect(optionOf(docker.runs().find((argv) => argv.includes(`svc.job_id=${jobId}`))!, "-p")).toBe(`${port}:8000`);
    const answer = await chat(renter.key);
    expect(answer.status, answer.text).toBe(200);
    await cancelAndWaitRemoved(jobId, renter, docker, d);
  });

  it("ends the attempt as the provider's failure, at no charge, when the server refuses its endpoint (a public host that makes no URL)", async () => {
    const p = await makeProvider(srv);
    const renter = await makeRenter(srv, 10_000);
    const { d, docker } = await daemonFor(p.key, { SVC_PUBLIC_HOST: "not a host" });
    const jobId = await serveOn(p, d, renter);

    const attempt = await waitFor(async () => {
      const [row] = await srv.sql`SELECT a.* FROM job_attempts a JOIN jobs j ON j.id = a.job_id WHERE j.job_id = ${jobId} AND a.attempt = 1 AND a.ended_at IS NOT NULL`;
      return row;
    }, 45_000, `first attempt end (${d.output()})`);
    expect(attempt).toMatchObject({ end_reason: "provider_error", fault: "provider", cost_halala: 0 });
    expect(attempt.error).toMatch(/refused the endpoint at .*: endpoint_url must be an absolute http\(s\) URL/);
    await waitFor(() => docker.containers().length === 0, 30_000, `container removed (${d.output()})`);
    expect((await api().get("/api/renters/balance", renter.headers)).body.balance_halala).toBe(10_000);
  });

  it("publishes a custom_container's expose_port and shows its endpoint_url once the port answers: no key, no /v1; without it no port", async () => {
    const p = await makeProvider(srv);
    const renter = await makeRenter(srv, 10_000);
    const port = await freePort();
    const { d, docker } = await daemonFor(p.key, { SVC_PUBLIC_HOST: "127.0.0.1", SVC_SERVE_PORT: String(port) });
    expect(await declared(p.id, d)).toContain("custom_container");
    const submit = async (params: Record<string, unknown>) => {
      const r = await api().post("/api/jobs/submit", { job_type: "custom_container", provider_id: p.id, duration_minutes: 5, params }, renter.headers);
      expect(r.status, r.text).toBe(201);
      return r.body.job.job_id as string;
    };
    const jobId = await submit({ command: ["serve"], expose_port: 8080 });
    const shown = await waitFor(async () => {
      const r = await api().get(`/api/jobs/${jobId}`, renter.headers);
      return r.body.endpoint_url ? r.body : undefined;
    }, 45_000, `endpoint shown (${d.output()})`);
    expect(shown.status).toBe("running");
    const run = docker.runs().find((argv) => argv.includes(`svc.job_id=${jobId}`))!;
    // The serving host port (--serve-port plus the job's GPU index), as vllm_serve's.
    const hostPort = Number(optionOf(run, "-p")!.split(":")[0]);
    expect(optionOf(run, "-p")).toBe(`${hostPort}:8080`);
    expect(hostPort - port).toBe(Number(optionOf(run, "--gpus")!.slice("device=".length)));
    expect(shown.endpoint_url).toBe(`http://127.0.0.1:${hostPort}`);
    expect(run).not.toContain("--network");
    expect(run.join(" ")).not.toContain("VLLM_API_KEY");
    expect((await job(jobId)).endpoint_api_key).toBeNull();
    // Not a model endpoint: the gateway has nothing to send there.
    expect((await chat(renter.key)).status).not.toBe(200);

    const plainId = await submit({ command: ["wait"] });
    await waitFor(() => docker.runs().some((argv) => argv.includes(`svc.job_id=${plainId}`)), 45_000, `plain container started (${d.output()})`);
    const plain = docker.runs().find((argv) => argv.includes(`svc.job_id=${plainId}`))!;
    expect(plain).not.toContain("-p");
    expect(optionOf(plain, "--network")).toBe("none");
    docker.release(plainId);
    await cancelAndWaitRemoved(jobId, renter, docker, d);
    const ended = await waitFor(async () => {
      const r = await job(plainId);
      return r.status === "completed" ? r : undefined;
    }, 45_000, `plain job end (${d.output()})`);
    expect(ended.endpoint_url).toBeNull();
  });

  it("plans a custom_container's expose_port as the TypeScript daemon does", () => {
    const taskSpec = { container: { image: "python:3.12-slim" }, command: ["python", "-m", "http.server", "8080"], inputs: { expose_port: 8080 } };
    const out = JSON.parse(
      python(
        `import json, sys, tempfile, svc_daemon as s
job = {"job_id": "job-expose-plan", "job_type": "custom_container", "task_spec": json.load(sys.stdin)}
argv, env, container, _ = s.plan_job(job, {}, "/usr/bin/docker", tempfile.mkdtemp(), [1], None, 9100)
print(json.dumps({"argv": argv, "port": container.serve.host_port, "key": container.serve.api_key}))
`,
        JSON.stringify(taskSpec),
      ),
    ) as { argv: string[]; port: number; key: string | null };
    expect(out.port).toBe(9101);
    expect(out.key).toBeNull();
    const ts = dockerRunArgs({ jobId: "job-expose-plan", jobType: "custom_container", maxDurationSeconds: 600, gpus: [1], taskSpec }, { docker: "/usr/bin/docker", workRoot: "/tmp", gpus: true }, 9101);
    const from = (argv: string[]) => argv.slice(argv.indexOf("-p"));
    expect(from(out.argv)).toEqual(["-p", "9101:8080", "python:3.12-slim", "python", "-m", "http.server", "8080"]);
    expect(from(ts.argv)).toEqual(from(out.argv));
    expect(out.argv).not.toContain("--network");
  });

  it("declares vllm_serve only with docker present, never for a runner", async () => {
    const withDocker = await makeProvider(srv);
    const a = await daemonFor(withDocker.key);
    expect(await declared(withDocker.id, a.d)).toContain("vllm_serve");
    const without = await makeProvider(srv);
    const b = await daemonFor(without.key, { SVC_RUNNERS: "vllm_serve=/bin/true" }, false);
    expect(await declared(without.id, b.d)).toEqual(["benchmark"]);
    const out = python(
      "import json, svc_daemon as s\n" +
        "print(json.dumps([s.supported_job_types({}, None), s.supported_job_types({}, '/usr/bin/docker'),\n" +
        "                  s.supported_job_types({'vllm_serve': ['y']}, None)]))",
    );
    expect(JSON.parse(out)).toEqual([["benchmark"], ["benchmark", "custom_container", "vllm_serve"], ["benchmark"]]);
  });

  it("builds the engine's command line as the TypeScript daemon does, leaving a task's own key out, whatever runner is configured", () => {
    const taskSpec = {
      container: { image: "vllm/vllm-openai:v0.6.3" },
      model: "Qwen/Qwen2.5-7B-Instruct",
      inputs: { model: "Qwen/Qwen2.5-7B-Instruct", max_model_len: 8192, dtype: "bfloat16", gpu_memory_utilization: 0.85, workdir: "/srv" },
      serve: { api: "openai", container_port: 8000 },
      env: { VLLM_API_KEY: "renter-chosen", A: "1" },
    };
    const out = JSON.parse(
      python(
        `import json, sys, tempfile, svc_daemon as s
job = {"job_id": "job-serve-plan", "job_type": "vllm_serve", "task_spec": json.load(sys.stdin)}
# A runner configured for vllm_serve is not used: only a container's engine is reported as an endpoint.
argv, env, container, _ = s.plan_job(job, {"vllm_serve": ["/bin/true"]}, "/usr/bin/docker", tempfile.mkdtemp(), [1], None, 8122)
print(json.dumps({"argv": argv, "key": env.get("VLLM_API_KEY"), "a": env.get("A"), "port": container.serve.host_port,
                  "served": container.serve.api_key == env.get("VLLM_API_KEY"), "dropped": container.dropped_key_env}))
`,
        JSON.stringify(taskSpec),
      ),
    ) as { argv: string[]; key: string; a: string; port: number; served: boolean; dropped: boolean };
    // The fixed first port plus the job's GPU index, as the TypeScript daemon picks it.
    expect(out.port).toBe(8123);
    expect(servePortOf(8122, [1])).toBe(8123);
    expect(out.key).toMatch(/^[A-Za-z0-9_-]{43}$/);
    expect(out.served).toBe(true);
    expect(out.dropped).toBe(true);
    expect(out.argv.join(" ")).not.toContain(out.key);
    expect(out.argv.join(" ")).not.toContain("renter-chosen");
    expect(optionOf(out.argv, "--gpus")).toBe("device=1");
    // No memory limit in the task: 80% of the host's, as the TypeScript daemon sets it.
    expect(optionOf(out.argv, "--memory")).toBe(`${Math.floor((os.totalmem() / 1048576) * 0.8)}m`);
    // From the endpoint's key on, the same words as the TypeScript daemon's.
    const ts = dockerRunArgs({ jobId: "job-serve-plan", jobType: "vllm_serve", maxDurationSeconds: 600, gpus: [1], taskSpec }, { docker: "/usr/bin/docker", workRoot: "/tmp", gpus: true }, 8123, "k");
    const from = (argv: string[]) => argv.slice(argv.indexOf("VLLM_API_KEY") - 1);
    expect(from(out.argv)).toEqual(from(ts.argv));
    // The task's own env by name only, its value in the docker CLI's environment (never on a command line).
    expect(out.argv.slice(out.argv.indexOf("A") - 1).join(" ")).toBe(
      "-e A -e VLLM_API_KEY -w /srv -p 8123:8000 vllm/vllm-openai:v0.6.3 --model Qwen/Qwen2.5-7B-Instruct --port 8000 --max-model-len 8192 --dtype bfloat16 --gpu-memory-utilization 0.85",
    );
    expect(out.a).toBe("1");
  });
});
