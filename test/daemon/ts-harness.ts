// Shared set-up of the TypeScript daemon's end-to-end tests: a real server on
// a fixed free port (daemons reconnect to it across restarts), spawned
// `bin/svc-daemon.js` processes with a fake nvidia-smi, and clean-up per test;
// or one docker daemon kept for the tests of a describe block (keptDockerDaemon).
import path from "node:path";
import { afterAll, afterEach, beforeAll, expect } from "vitest";
import { freshDatabase, startTestServer, type TestServer } from "../helpers/server.js";
import { dbLink, type DbLink } from "../helpers/db-link.js";
import { client } from "../helpers/http.js";
import { cancelUnfinishedJobs, clearMarketplace } from "../helpers/isolation.js";
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
  /** Daemons kept across tests (keptDockerDaemon), each with whether it runs no container now. */
  const kept = new Map<Spawned, () => boolean>();
  let database: { url: string; drop(): Promise<void> } | undefined;
  const h = {
    srv: undefined as unknown as TestServer,
    port: 0,
    link: undefined as DbLink | undefined,
    /**
     * `url`: another server (default: this one); `stateDir`: shared between daemons (default: a new one); `detached`: its own
     * process group. The daemon does not inherit the test's CUDA_VISIBLE_DEVICES (it would choose among the fake GPUs).
     * The key goes as the daemon's usage documents, in SVC_API_KEY: never on its command line.
     * `kept`: not killed after the test (keptDockerDaemon kills it).
     */
    startDaemon(key: string, extra: string[] = [], env: Record<string, string> = {}, opts: { url?: string; stateDir?: string; detached?: boolean; kept?: () => boolean } = {}) {
      const dir = tempDir("tsd");
      const d = start(process.execPath, [
        "bin/svc-daemon.js", "--url", opts.url ?? `http://127.0.0.1:${h.port}`, "--docker", "none",
        "--nvidia-smi", fakeSmi(dir), "--state-dir", opts.stateDir ?? path.join(dir, "state"), "--heartbeat-seconds", "1", "--stop-grace-seconds", "1", ...extra,
      ], { env: { CUDA_VISIBLE_DEVICES: undefined, SVC_API_KEY: key, SVC_PROVIDER_KEY: undefined, SVC_KEY_FILE: undefined, ...env }, detached: opts.detached });
      if (opts.kept) kept.set(d, opts.kept);
      else daemons.push(d);
      return d;
    },
    async stopDaemon(d: Spawned) {
      d.kill("SIGTERM");
      return d.exited;
    },
    /** SIGKILLs every daemon started so far (but kept ones) and waits for them. */
    async killDaemons() {
      for (const d of daemons.splice(0)) {
        d.kill("SIGKILL");
        await d.exited;
      }
    },
    api: () => client(h.srv.url),
    job: async (jobId: string) => (await h.srv.sql`SELECT * FROM jobs WHERE job_id = ${jobId}`)[0],
    /** Kills a kept daemon and clears the marketplace, as after a test. */
    async dropKept(d: Spawned) {
      if (!kept.delete(d)) return;
      d.kill("SIGKILL");
      await d.exited;
      await clearMarketplace(h.srv);
    },
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
    if (kept.size === 0) return clearMarketplace(h.srv);
    // A kept daemon's provider stays online for the next test: only what this one left unfinished ends.
    await cancelUnfinishedJobs(h.srv);
    for (const idle of kept.values()) await waitFor(idle, 45_000, "the kept daemon's containers removed");
  });
  afterAll(async () => {
    for (const d of kept.keys()) {
      d.kill("SIGKILL");
      await d.exited;
    }
    await h.srv?.close();
    await h.link?.close();
    await database?.drop();
  });
  return h;
}

interface DockerDaemonOptions {
  docker?: Parameters<typeof fakeDocker>[1];
  env?: Record<string, string>;
  args?: string[];
}

/**
 * An approved provider whose daemon runs containers with a fake docker (fakeDocker's options; `args`:
 * more of the daemon's options); returned once the daemon is up and its 2 GPUs are known. `kept`:
 * not killed after the test.
 */
export async function dockerDaemon(h: ReturnType<typeof useTsDaemonServer>, opts: DockerDaemonOptions & { kept?: boolean } = {}) {
  const p = await makeProvider(h.srv);
  const docker = fakeDocker(tempDir("tsd-docker"), opts.docker);
  const idle = () => docker.containers().length === 0;
  const d = h.startDaemon(p.key, ["--docker", docker.path, ...(opts.args ?? [])], opts.env, opts.kept ? { kept: idle } : {});
  await waitFor(async () => {
    const [r] = await h.srv.sql`SELECT gpu_count, readiness_status FROM providers WHERE id = ${p.id}`;
    return r.gpu_count === 2 && r.readiness_status;
  }, 45_000, `daemon up (${d.output()})`);
  return { p, docker, d };
}

/**
 * One docker daemon (dockerDaemon) for every test of the describe block this is called in: started
 * before its first test, killed after its last, when the marketplace is cleared for the tests after
 * the block. Between its tests the provider stays online: after each, the jobs it left unfinished
 * are cancelled and their containers waited out. The block's tests start no daemon of their own (a
 * job of theirs could go to the kept provider). The fake docker's record of calls spans the block.
 */
export function keptDockerDaemon(h: ReturnType<typeof useTsDaemonServer>, opts: DockerDaemonOptions = {}) {
  const kept = {} as Awaited<ReturnType<typeof dockerDaemon>>;
  beforeAll(async () => {
    Object.assign(kept, await dockerDaemon(h, { ...opts, kept: true }));
  });
  afterAll(async () => {
    if (kept.d) await h.dropKept(kept.d);
  });
  return kept;
}

/**
 * A daemon running one llm-inference job, on a runner that runs until `gate.open()` and then
 * writes its result (the test decides when the job ends), and takes a second to stop.
 */
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
