// Shared set-up of the TypeScript daemon's end-to-end tests: a real server on
// a fixed free port (daemons reconnect to it across restarts), spawned
// `bin/svc-daemon.js` processes with a fake nvidia-smi, and clean-up per test.
import path from "node:path";
import { afterAll, afterEach, beforeAll, expect } from "vitest";
import { freshDatabase, startTestServer, type TestServer } from "../helpers/server.js";
import { dbLink, type DbLink } from "../helpers/db-link.js";
import { client } from "../helpers/http.js";
import { clearMarketplace } from "../helpers/isolation.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { FIXTURES, fakeDocker, freePort, gatedRunner, start, tempDir, waitFor, writeExecutable, type Spawned } from "./helpers.js";

/** A fake nvidia-smi answering the CSV query and the banner from captured-format fixtures. */
function fakeSmi(dir: string): string {
  const csv = path.join(FIXTURES, "nvidia-smi-query-2gpu.csv");
  const banner = path.join(FIXTURES, "nvidia-smi.txt");
  return writeExecutable(
    dir,
    "nvidia-smi",
    `#!/bin/sh\ncase "$1" in\n  --query-gpu=*) cat '${csv}' ;;\n  -L) echo 'GPU 0: NVIDIA GeForce RTX 4090 (UUID: GPU-5c7e4b6a)' ;;\n  *) cat '${banner}' ;;\nesac\n`,
  );
}

/**
 * Registers the hooks and returns the harness; `srv` may be replaced by a test that restarts the server.
 * `dbLink`: the server reaches its database through a link the test can cut (`h.link`).
 */
export function useTsDaemonServer(opts: { dbLink?: boolean } = {}) {
  const daemons: Spawned[] = [];
  let database: { url: string; drop(): Promise<void> } | undefined;
  const h = {
    srv: undefined as unknown as TestServer,
    port: 0,
    link: undefined as DbLink | undefined,
    /**
     * `url`: another server (default: this one); `stateDir`: shared between daemons (default: a new one); `detached`: its own
     * process group. The daemon does not inherit the test's CUDA_VISIBLE_DEVICES (it would choose among the fake GPUs).
     * The key goes as the daemon's usage documents, in SVC_API_KEY: never on its command line.
     */
    startDaemon(key: string, extra: string[] = [], env: Record<string, string> = {}, opts: { url?: string; stateDir?: string; detached?: boolean } = {}) {
      const dir = tempDir("tsd");
      const d = start(process.execPath, [
        "bin/svc-daemon.js", "--url", opts.url ?? `http://127.0.0.1:${h.port}`, "--docker", "none",
        "--nvidia-smi", fakeSmi(dir), "--state-dir", opts.stateDir ?? path.join(dir, "state"), "--heartbeat-seconds", "1", "--stop-grace-seconds", "1", ...extra,
      ], { env: { CUDA_VISIBLE_DEVICES: undefined, SVC_API_KEY: key, SVC_PROVIDER_KEY: undefined, SVC_KEY_FILE: undefined, ...env }, detached: opts.detached });
      daemons.push(d);
      return d;
    },
    async stopDaemon(d: Spawned) {
      d.kill("SIGTERM");
      return d.exited;
    },
    /** SIGKILLs every daemon started so far and waits for them. */
    async killDaemons() {
      for (const d of daemons.splice(0)) {
        d.kill("SIGKILL");
        await d.exited;
      }
    },
    api: () => client(h.srv.url),
    job: async (jobId: string) => (await h.srv.sql`SELECT * FROM jobs WHERE job_id = ${jobId}`)[0],
    async submit(renter: { headers: Record<string, string> }, body: Record<string, unknown>) {
      const r = await h.api().post("/api/jobs/submit", { duration_minutes: 1, ...body }, renter.headers);
      expect(r.status, r.text).toBe(201);
      return r.body.job as { job_id: string; provider_id: number | null };
    },
  };
  beforeAll(async () => {
    h.port = await freePort();
    if (opts.dbLink) {
      database = await freshDatabase();
      h.link = await dbLink(database.url);
    }
    h.srv = await startTestServer({ PORT: String(h.port), SVC_JOB_SWEEP_MS: "60000" }, h.link?.url);
  });
  afterEach(async () => {
    await h.killDaemons();
    await clearMarketplace(h.srv);
  });
  afterAll(async () => {
    await h.srv?.close();
    await h.link?.close();
    await database?.drop();
  });
  return h;
}

/**
 * A daemon running one llm-inference job, on a runner that runs until `gate.open()` and then
 * writes its result (the test decides when the job ends), and takes a second to stop.
 */
/**
 * An approved provider whose daemon runs containers with a fake docker (fakeDocker's options);
 * returned once the daemon is up and its 2 GPUs are known.
 */
export async function dockerDaemon(
  h: ReturnType<typeof useTsDaemonServer>,
  opts: { docker?: Parameters<typeof fakeDocker>[1]; env?: Record<string, string> } = {},
) {
  const p = await makeProvider(h.srv);
  const docker = fakeDocker(tempDir("tsd-docker"), opts.docker);
  const d = h.startDaemon(p.key, ["--docker", docker.path], opts.env);
  await waitFor(async () => {
    const [r] = await h.srv.sql`SELECT gpu_count, readiness_status FROM providers WHERE id = ${p.id}`;
    return r.gpu_count === 2 && r.readiness_status;
  }, 45_000, `daemon up (${d.output()})`);
  return { p, docker, d };
}

export async function runGatedJob(h: ReturnType<typeof useTsDaemonServer>, opts: { pinned?: boolean } = {}) {
  const p = await makeProvider(h.srv);
  const renter = await makeRenter(h.srv, 1_000);
  const gate = gatedRunner();
  const daemon = h.startDaemon(p.key, ["--runner", gate.runner]);
  await waitFor(async () => (await h.srv.sql`SELECT readiness_status FROM providers WHERE id = ${p.id}`)[0].readiness_status, 45_000, "daemon up");
  const job = await h.submit(renter, { job_type: "llm-inference", params: { prompt: "hi", max_tokens: 32 }, ...(opts.pinned ? { provider_id: p.id } : {}) });
  expect(job.provider_id).toBe(p.id);
  await waitFor(async () => (await h.job(job.job_id)).status === "running" && gate.started(), 45_000, `running (${daemon.output()})`);
  return { gate, daemon, job };
}
