// Both reference daemons declare the job types they can run in every heartbeat
// (supported_job_types), from their configuration: the server stores it and
// never offers them another type. Both daemons declare the container types,
// vllm_serve among them, only with docker, and never for a runner.
import fs from "node:fs";
import path from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { supportedJobTypes } from "../../src/daemon/ts/executors/plan.js";
import { python, runLegacyDaemon, tempDir, waitFor, writeExecutable, type Spawned } from "./helpers.js";
import { useTsDaemonServer } from "./ts-harness.js";

const h = useTsDaemonServer();
const legacy: Spawned[] = [];
// Registered after the harness's: runs before its clean-up, which wants every daemon gone.
afterEach(async () => {
  for (const d of legacy.splice(0)) {
    d.kill("SIGKILL");
    await d.exited;
  }
});

const declared = (id: number) =>
  waitFor(async () => (await h.srv.sql<{ supported_job_types: string[] | null }[]>`SELECT supported_job_types FROM providers WHERE id = ${id}`)[0].supported_job_types, 45_000, "a declaration");

/** The served legacy daemon, run as a subprocess (killed after each test). */
async function legacyDaemon(key: string, env: Record<string, string> = {}): Promise<{ d: Spawned; dir: string }> {
  const r = await h.api().get(`/api/providers/download/daemon?key=${key}`);
  expect(r.status).toBe(200);
  const dir = tempDir("py-types");
  const file = path.join(dir, "svc_daemon.py");
  fs.writeFileSync(file, r.text);
  const d = runLegacyDaemon(file, dir, env);
  legacy.push(d);
  return { d, dir };
}

describe("svc_daemon.py", { timeout: 90_000 }, () => {
  it("declares the built-in container types and vllm_serve with docker", async () => {
    const p = await makeProvider(h.srv);
    const dockerDir = tempDir("py-docker");
    const docker = writeExecutable(dockerDir, "docker", "#!/bin/sh\nexit 0\n");
    await legacyDaemon(p.key, { SVC_DOCKER: docker });
    expect(await declared(p.id)).toEqual(["benchmark", "image_generation", "llm-inference", "llm_inference", "rendering", "training", "custom_container", "vllm_serve"]);
  });

  it("without docker declares the benchmark and its runners' types, never a vllm_serve runner", async () => {
    const p = await makeProvider(h.srv);
    await legacyDaemon(p.key, { SVC_RUNNERS: "training=/bin/true;vllm_serve=/bin/true" });
    expect(await declared(p.id)).toEqual(["benchmark", "training"]);
    // What plan_job runs, as the function itself says (the file as committed: no container programs in it).
    const out = python(
      "import json, svc_daemon as s\n" +
        "print(json.dumps([s.supported_job_types({}, None), s.supported_job_types({'llm-inference': ['x']}, '/usr/bin/docker'),\n" +
        "                  s.supported_job_types({'rendering': ['x'], 'vllm_serve': ['y']}, None)]))",
    );
    expect(JSON.parse(out)).toEqual([["benchmark"], ["benchmark", "llm-inference", "custom_container", "vllm_serve"], ["benchmark", "rendering"]]);
  });
});

describe("svc-daemon (TypeScript)", { timeout: 90_000 }, () => {
  it("declares over its stream what its executors run here: the benchmark and its runners' types without docker", async () => {
    const p = await makeProvider(h.srv);
    const d = h.startDaemon(p.key, ["--runner", "training=/bin/true", "--runner", "vllm_serve=/bin/true"]);
    expect(await declared(p.id), d.output()).toEqual(["benchmark", "training"]);
    const renter = await makeRenter(h.srv, 1_000);
    const refused = await h.api().post("/api/jobs/submit", { job_type: "llm-inference", duration_minutes: 1 }, renter.headers);
    expect(refused.status, refused.text).toBe(503);
    expect(refused.body.error).toMatch(/runs llm-inference jobs/);
  });

  it("declares every container type with docker", () => {
    const runners = { rendering: ["render"] };
    expect(supportedJobTypes({ runners, workRoot: "/tmp", docker: undefined })).toEqual(["benchmark", "rendering"]);
    expect(supportedJobTypes({ runners, workRoot: "/tmp", docker: { docker: "docker", gpus: true, scriptsDir: "/tmp" } }).sort()).toEqual(
      ["benchmark", "custom_container", "image_generation", "llm-inference", "llm_inference", "rendering", "training", "vllm_serve"].sort(),
    );
  });
});
