// What the TypeScript daemon does with secrets, its own and a renter's: a
// custom_container's env reaches the container without appearing on any
// docker command line (which `ps` shows to every user of the host), by name
// from the docker CLI's environment, or, for a name the CLI reads itself
// (DOCKER_HOST, PATH, a proxy), from an env file only its owner can read,
// removed with the job; the task it hands the container (task.json, the env
// included) is readable by the daemon's user only, in folders only that user
// may enter; and no program the daemon starts for a job inherits the provider
// key or the HMAC secret it was given in its environment.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { describe, expect, it } from "vitest";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { HMAC_SECRET } from "../helpers/server.js";
import { endedJob, optionOf, realPython, tempDir, waitFor, writeExecutable } from "./helpers.js";
import { dockerDaemon, useTsDaemonServer } from "./ts-harness.js";

const h = useTsDaemonServer();

describe("svc-daemon (TypeScript): secrets", { timeout: 120_000 }, () => {
  it("passes a renter's env to the container, never on docker's command line, and leaves docker's own environment alone", async () => {
    const { p, docker, d } = await dockerDaemon(h);
    const renter = await makeRenter(h.srv, 10_000);
    const secret = "hf_renterSecretTOKEN1234567890";
    const env = {
      HF_TOKEN: secret,
      // Names the docker CLI reads itself: the container gets them, docker must not.
      DOCKER_HOST: "tcp://renter-engine.example:2375",
      PATH: "/renter/bin",
      https_proxy: "http://renter-proxy.example:3128",
    };
    const job = await h.submit(renter, { job_type: "custom_container", duration_minutes: 2, params: { command: ["wait"], env } });
    expect(job.provider_id).toBe(p.id);
    const container = await waitFor(() => docker.containers().find((c) => c.labels["svc.job_id"] === job.job_id && c.running), 45_000, `container running (${d.output()})`);
    // No argument of any docker invocation carries a value, and the daemon's log does not either.
    const calls = JSON.stringify(docker.calls());
    for (const value of Object.values(env)) expect(calls).not.toContain(value);
    expect(d.output()).not.toContain(secret);
    expect(container.env).toMatchObject(env);
    // docker itself ran as configured: its engine, and its PATH (it started at all).
    expect(container.cliEnv.DOCKER_HOST).toBe(process.env.DOCKER_HOST ?? null);
    // The names docker reads went by a file only the daemon's user can read, outside the container's folder.
    expect(container.envFile).toBeTruthy();
    expect(container.envFileMode).toBe(0o600);
    const run = docker.runs().find((argv) => argv.includes(`svc.job_id=${job.job_id}`))!;
    const hostMounts = run.filter((_, i) => run[i - 1] === "-v").map((v) => v.split(":")[0]).filter((m) => m.startsWith("/"));
    expect(hostMounts.length).toBeGreaterThan(0);
    for (const dir of hostMounts) expect(container.envFile!.startsWith(dir + path.sep), `${container.envFile} in ${dir}`).toBe(false);
    expect(optionOf(run, "--env-file")).toBe(container.envFile);
    expect(run[run.indexOf("HF_TOKEN") - 1]).toBe("-e");

    docker.release(job.job_id);
    const done = await endedJob(h.srv.sql, job.job_id, `job end (${d.output()})`);
    expect(done.status, done.error).toBe("completed");
    await waitFor(() => !docker.containers().some((c) => c.labels["svc.job_id"] === job.job_id), 30_000, `container removed (${d.output()})`);
    expect(fs.existsSync(container.envFile!), "the env file outlived its job").toBe(false);
  });

  it("writes task.json, which holds the renter's env, readable by the daemon's user only, in private folders", async () => {
    // The usual umask of a login shell or a service: what the daemon inherits in the field.
    const old = process.umask(0o022);
    try {
      // Its own work folder (--work-dir / SVC_WORK_DIR) in an ordinary 0755 place, made 0755 by an earlier
      // version: the daemon tightens it. (The default, <state-dir>/work, sits in the daemon's 0700 state folder.)
      const base = fs.mkdtempSync(path.join(os.tmpdir(), "svc-work-modes-"));
      fs.chmodSync(base, 0o755);
      fs.mkdirSync(path.join(base, "work"), { mode: 0o755 });
      const { docker, d } = await dockerDaemon(h, { env: { SVC_WORK_DIR: path.join(base, "work") } });
      const renter = await makeRenter(h.srv, 10_000);
      const secret = "hf_renterSecretTOKEN_in_task_json_42";
      const job = await h.submit(renter, { job_type: "custom_container", duration_minutes: 2, params: { command: ["wait"], env: { HF_TOKEN: secret } } });
      await waitFor(() => docker.containers().find((c) => c.labels["svc.job_id"] === job.job_id && c.running), 45_000, `container running (${d.output()})`);
      const run = docker.runs().find((argv) => argv.includes(`svc.job_id=${job.job_id}`))!;
      const outDir = run.find((a) => a.endsWith(":/svc-output"))!.split(":")[0];
      expect(path.dirname(outDir)).toBe(path.join(base, "work"));
      const taskFile = path.join(outDir, "task.json");
      // The file holds the secret the daemon kept off docker's command line.
      expect(fs.readFileSync(taskFile, "utf8")).toContain(secret);
      const modes = {
        task: (fs.statSync(taskFile).mode & 0o777).toString(8),
        job: (fs.statSync(outDir).mode & 0o777).toString(8),
        work: (fs.statSync(path.dirname(outDir)).mode & 0o777).toString(8),
      };
      docker.release(job.job_id);
      const done = await endedJob(h.srv.sql, job.job_id, `job end (${d.output()})`);
      expect(done.status, done.error).toBe("completed");
      // No other user of the host can read it, nor enter the folders it lies in (as the legacy daemon writes them).
      expect(modes).toEqual({ task: "600", job: "700", work: "700" });
    } finally {
      process.umask(old);
    }
  });

  it("gives a job's program none of the daemon's own secrets from its environment", async () => {
    const p = await makeProvider(h.srv);
    const dir = tempDir("tsd-secrets");
    // Writes the names and values of its environment as its result.
    const runner = writeExecutable(
      dir,
      "env-runner.py",
      `import json, os, sys\nsys.stdin.read()\njson.dump(dict(os.environ), open(os.environ["SVC_RESULT_FILE"], "w"))\n`,
    );
    // The secret the server signs task_spec_hmac with: the daemon checks each task with it.
    const hmac = HMAC_SECRET;
    // Where key files are kept is not a job's business either.
    const keyFile = path.join(dir, "key");
    fs.writeFileSync(keyFile, p.key, { mode: 0o600 });
    const hmacFile = path.join(dir, "hmac");
    fs.writeFileSync(hmacFile, hmac, { mode: 0o600 });
    const d = h.startDaemon(p.key, ["--runner", `llm-inference=${realPython()} ${runner}`], {
      SVC_API_KEY: p.key, SVC_HMAC_SECRET: hmac, SVC_PROVIDER_KEY: p.key, SVC_KEY_FILE: keyFile, SVC_HMAC_SECRET_FILE: hmacFile,
      // A service's own copies under names of its own (an Environment= line, a wrapper script's export).
      PROVIDER_KEY_COPY: p.key, MY_HMAC: `hmac=${hmac}`,
    });
    await waitFor(async () => (await h.srv.sql`SELECT readiness_status FROM providers WHERE id = ${p.id}`)[0].readiness_status, 45_000, `daemon up (${d.output()})`);
    const renter = await makeRenter(h.srv, 10_000);
    const job = await h.submit(renter, { job_type: "llm-inference", params: { prompt: "hi", max_tokens: 32 } });
    expect(job.provider_id).toBe(p.id);
    const done = await endedJob(h.srv.sql, job.job_id, `job end (${d.output()})`);
    // It ran (so the HMAC secret was the daemon's and checked its task), and saw neither secret.
    expect(done.status, done.error).toBe("completed");
    const seen = done.result as Record<string, string>;
    expect(seen.SVC_JOB_ID).toBe(job.job_id);
    expect(Object.keys(seen)).not.toContain("SVC_API_KEY");
    expect(Object.keys(seen)).not.toContain("SVC_PROVIDER_KEY");
    expect(Object.keys(seen)).not.toContain("SVC_HMAC_SECRET");
    expect(Object.keys(seen)).not.toContain("SVC_KEY_FILE");
    expect(Object.keys(seen)).not.toContain("SVC_HMAC_SECRET_FILE");
    expect(Object.keys(seen)).not.toContain("PROVIDER_KEY_COPY");
    expect(Object.keys(seen)).not.toContain("MY_HMAC");
    expect(JSON.stringify(seen)).not.toContain(p.key);
    expect(JSON.stringify(seen)).not.toContain(hmac);
  });
});
