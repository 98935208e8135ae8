// A daemon killed while its jobs run (SIGKILL, a crash) leaves their
// containers, workspace volumes and folders behind: each daemon labels its
// containers and volumes, and its next start (same server, same work folder)
// removes them, running or stopped, and the folders of the jobs they name,
// before it takes a job. Another daemon's containers and volumes on the same
// host, a user's volumes (even one named as ours are), a folder no container,
// volume or job record names and anything else of the work folder are left alone. Both daemons, against the
// real server and the fake docker engine (helpers.ts). A docker that fails
// does not keep a daemon from starting.
import fs from "node:fs";
import path from "node:path";
import { describe, expect, it } from "vitest";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { client } from "../helpers/http.js";
import { jobFiles, safeName } from "../../src/daemon/ts/executors/docker.js";
import { DAEMON_LABEL, JOB_LABEL, daemonLabel, removeLeftovers } from "../../src/daemon/ts/leftovers.js";
import { alive, fakeDocker, python, realPython, run, runLegacyDaemon, start, tempDir, waitFor, writeExecutable, type FakeDocker, type Spawned } from "./helpers.js";
import { useTsDaemonServer } from "./ts-harness.js";

const h = useTsDaemonServer();

const waitJob = { job_type: "custom_container", duration_minutes: 2, params: { command: ["wait"] } };

/** The running container of a job, once it is up. */
const containerOf = (docker: FakeDocker, jobId: string, what: string) =>
  waitFor(() => docker.containers().find((c) => c.labels[JOB_LABEL] === jobId && c.running), 45_000, what);

/** A container another daemon of this host (its own label) runs meanwhile, on a volume of its own. */
function otherDaemonsContainer(docker: FakeDocker, label: string): Spawned {
  const dir = tempDir("other-daemon");
  return start(docker.path, [
    "run", "--name", "svc-job-other", "--label", `${JOB_LABEL}=job-other`, "--label", `${DAEMON_LABEL}=${label}`,
    "--cidfile", path.join(dir, "job-other.cid"), "-v", "svc-ws-job-other:/workspace", "-v", `${dir}:/svc-output`,
    "nvidia/cuda:12.4.1-runtime-ubuntu22.04", "wait",
  ], { detached: true });
}

/** Kills the daemon as SIGKILL does: no clean-up of its own. */
async function killHard(d: Spawned) {
  d.kill("SIGKILL");
  await d.exited;
}

/**
 * Beside what the killed daemon's jobs left, in the fake engine and the work folder: what a run
 * of this daemon killed in the middle of a job's clean-up left (the job's folder, its container id
 * file and its labelled volume; the container gone already), and what is not this daemon's to
 * remove: a volume another daemon labelled (and the folder its job would have here), a user's
 * volumes (one unlabelled under our prefix), a folder nothing names as a job's, a file of the
 * provider's.
 */
async function plantLeftovers(docker: FakeDocker, work: string, label: string) {
  const volume = (...args: string[]) => run(docker.path, ["volume", "create", ...args]);
  await volume("--label", `${DAEMON_LABEL}=${label}`, "--label", `${JOB_LABEL}=job-cut-short`, "svc-ws-job-cut-short");
  fs.mkdirSync(path.join(work, "job-cut-short"), { recursive: true });
  fs.writeFileSync(path.join(work, "job-cut-short", "result.json"), "{}");
  fs.writeFileSync(path.join(work, "job-cut-short.cid"), "f".repeat(64));
  await volume("--label", `${DAEMON_LABEL}=fedcba9876543210`, "--label", `${JOB_LABEL}=job-theirs`, "svc-ws-job-theirs");
  fs.mkdirSync(path.join(work, "job-theirs"), { recursive: true });
  await volume("pgdata");
  await volume("svc-ws-job-users-own");
  fs.mkdirSync(path.join(work, "job-runner"), { recursive: true });
  fs.writeFileSync(path.join(work, "job-runner", "checkpoint.bin"), "kept");
  fs.writeFileSync(path.join(work, "notes.txt"), "the provider's");
}

/** What plantLeftovers put there that must still be there. */
function expectUnrelatedKept(docker: FakeDocker, work: string) {
  const volumes = docker.volumes().map((v) => v.name);
  expect(volumes).toEqual(expect.arrayContaining(["pgdata", "svc-ws-job-users-own", "svc-ws-job-other", "svc-ws-job-theirs"]));
  expect(fs.existsSync(path.join(work, "job-theirs"))).toBe(true);
  expect(fs.readFileSync(path.join(work, "job-runner", "checkpoint.bin"), "utf8")).toBe("kept");
  expect(fs.readFileSync(path.join(work, "notes.txt"), "utf8")).toBe("the provider's");
}

describe("what a killed daemon left", { timeout: 120_000 }, () => {
  it("labels a daemon by its server and work folder, never its key; a docker that fails is logged, not fatal", async () => {
    const label = daemonLabel("http://127.0.0.1:8080/", "/srv/a/work");
    expect(label).toMatch(/^[0-9a-f]{16}$/);
    expect(daemonLabel("http://127.0.0.1:8080", "/srv/a/work/")).toBe(label);
    expect(daemonLabel("http://127.0.0.1:8080", "/srv/b/work")).not.toBe(label);
    expect(daemonLabel("https://api.example.com", "/srv/a/work")).not.toBe(label);
    const legacy = JSON.parse(
      python(`import json, svc_daemon
print(json.dumps([svc_daemon.daemon_label("/srv/a/work"), svc_daemon.daemon_label("/srv/a/work/"), svc_daemon.daemon_label("/srv/b/work")]))`),
    ) as string[];
    expect(legacy[0]).toMatch(/^[0-9a-f]{16}$/);
    expect(legacy[1]).toBe(legacy[0]);
    expect(legacy[2]).not.toBe(legacy[0]);

    // A job's folder is a child of the work folder, never the work folder itself, its parent or a hidden one (.svc-results).
    expect(["..", ".", ".svc-results", "job-1"].map(safeName)).toEqual(["-.", "-", "-svc-results", "job-1"]);
    expect(jobFiles("/srv/a/work", "..")).toEqual({ outDir: "/srv/a/work/-.", cidFile: "/srv/a/work/-..cid", envFile: "/srv/a/work/-..env" });
    expect(JSON.parse(python(`import json, svc_daemon
print(json.dumps([svc_daemon.job_folder("/srv/a/work", n) for n in ["..", ".", ".svc-results", "job-1"]]))`))).toEqual(
      ["/srv/a/work/-.", "/srv/a/work/-", "/srv/a/work/-svc-results", "/srv/a/work/job-1"],
    );

    const dir = tempDir("broken-docker");
    const broken = writeExecutable(dir, "docker", "#!/bin/sh\necho 'Cannot connect to the Docker daemon at unix:///var/run/docker.sock.' >&2\nexit 1\n");
    for (const docker of [broken, path.join(dir, "missing")]) {
      const lines: string[] = [];
      await removeLeftovers({ docker, label, workRoot: "/srv/a/work" }, (l) => lines.push(l));
      expect(lines, docker).toEqual([expect.stringMatching(/^could not list containers left by an earlier run/)]);
      const out = python(`import svc_daemon
svc_daemon.remove_leftovers(${JSON.stringify(docker)}, "/srv/a/work", print)`);
      expect(out, docker).toMatch(/^could not (list|remove) containers left by an earlier run/);
    }
  });

  it("svc-daemon (TypeScript): its next start removes its containers, running or stopped, their volumes and folders; nothing else", async () => {
    const p = await makeProvider(h.srv);
    const renter = await makeRenter(h.srv, 1_000);
    const docker = fakeDocker(tempDir("leftover-docker"));
    const state = path.join(tempDir("leftover-ts"), "state");
    const work = path.join(state, "work");
    const url = `http://127.0.0.1:${h.port}`;
    const label = daemonLabel(url, work);
    const other = otherDaemonsContainer(docker, daemonLabel(url, path.join(tempDir("elsewhere"), "work")));
    const jobs: string[] = [];
    try {
      const first = h.startDaemon(p.key, ["--docker", docker.path], {}, { stateDir: state });
      await waitFor(async () => {
        const [r] = await h.srv.sql`SELECT gpu_count, readiness_status FROM providers WHERE id = ${p.id}`;
        return r.gpu_count === 2 && r.readiness_status;
      }, 45_000, `daemon up (${first.output()})`);
      // Two jobs on its two GPUs: one container keeps running, the other stops while no daemon is there.
      const running = await h.submit(renter, waitJob);
      const stopped = await h.submit(renter, waitJob);
      jobs.push(running.job_id, stopped.job_id);
      const a = await containerOf(docker, running.job_id, `first container up (${first.output()})`);
      const b = await containerOf(docker, stopped.job_id, `second container up (${first.output()})`);
      expect(a.labels).toMatchObject({ [DAEMON_LABEL]: label, [JOB_LABEL]: running.job_id });
      expect(JSON.stringify(docker.runs())).not.toContain(p.key);
      // Each job's volume carries the daemon's labels, and its folder is in the work folder.
      for (const id of jobs) {
        expect(docker.volumes().find((v) => v.name === `svc-ws-${id}`)?.labels).toEqual({ [DAEMON_LABEL]: label, [JOB_LABEL]: id });
        expect(fs.existsSync(path.join(work, id, "task.json"))).toBe(true);
      }

      await killHard(first);
      docker.release(stopped.job_id);
      await waitFor(() => docker.containers().find((c) => c.id === b.id && !c.running), 10_000, "second container stopped");
      expect(alive(a.pid)).toBe(true);
      const theirs = await waitFor(() => docker.containers().find((c) => c.name === "svc-job-other" && c.running), 10_000, "other daemon's container up");
      await plantLeftovers(docker, work, label);

      const second = h.startDaemon(p.key, ["--docker", docker.path], {}, { stateDir: state });
      await waitFor(() => /workspace volume\(s\)/.test(second.output()), 30_000, `leftovers removed (${second.output()})`);
      expect(docker.containers().filter((c) => c.id === a.id || c.id === b.id)).toEqual([]);
      await waitFor(() => !alive(a.pid), 5_000, "the leftover container's process gone");
      expect(second.output()).toMatch(/removed 2 container\(s\) left by an earlier run of this daemon \(jobs job-\S+, job-\S+\)/);
      expect(second.output()).toMatch(/removed 3 workspace volume\(s\) and 3 job folder\(s\) left by an earlier run of this daemon \(jobs job-\S+, job-\S+, job-cut-short\)/);
      for (const id of [...jobs, "job-cut-short"]) {
        expect(second.output()).toContain(id);
        expect(docker.volumes().map((v) => v.name)).not.toContain(`svc-ws-${id}`);
        expect(fs.existsSync(path.join(work, id)), id).toBe(false);
        expect(fs.existsSync(path.join(work, `${id}.cid`)), id).toBe(false);
      }
      expect(second.output()).not.toContain(p.key);
      // Another daemon's container (another work folder) and volume, and what is not a daemon's, stay.
      expect(docker.containers().find((c) => c.id === theirs.id)?.running).toBe(true);
      expect(alive(theirs.pid)).toBe(true);
      expectUnrelatedKept(docker, work);
    } finally {
      for (const id of [...jobs, "job-other"]) docker.release(id);
      await other.exited;
    }
  });

  it("svc_daemon.py: its next start removes its containers, their volumes and folders; nothing else", async () => {
    const p = await makeProvider(h.srv);
    const renter = await makeRenter(h.srv, 1_000);
    const served = await client(h.srv.url).get(`/api/providers/download/daemon?key=${p.key}`);
    expect(served.status).toBe(200);
    const dir = tempDir("leftover-py");
    const work = path.join(dir, "work");
    const file = path.join(dir, "svc_daemon.py");
    fs.writeFileSync(file, served.text);
    const docker = fakeDocker(dir);
    const label = python(`import svc_daemon; print(svc_daemon.daemon_label(${JSON.stringify(work)}))`).trim();
    const other = otherDaemonsContainer(docker, "0123456789abcdef");
    const daemons: Spawned[] = [];
    const jobs: string[] = [];
    // The interpreter itself: SIGKILL must reach the daemon, not a version manager's shim.
    const daemon = () => daemons[daemons.push(runLegacyDaemon(file, dir, { SVC_DOCKER: docker.path }, realPython())) - 1];
    try {
      const first = daemon();
      await waitFor(async () => (await h.srv.sql`SELECT readiness_status FROM providers WHERE id = ${p.id}`)[0].readiness_status, 45_000, `daemon up (${first.output()})`);
      const job = await h.submit(renter, waitJob);
      jobs.push(job.job_id);
      const a = await containerOf(docker, job.job_id, `container up (${first.output()})`);
      expect(a.labels[DAEMON_LABEL]).toBe(label);
      expect(docker.volumes().find((v) => v.name === `svc-ws-${job.job_id}`)?.labels).toEqual({ [DAEMON_LABEL]: label, [JOB_LABEL]: job.job_id });
      expect(fs.existsSync(path.join(work, job.job_id, "task.json"))).toBe(true);
      expect(JSON.stringify(docker.runs())).not.toContain(p.key);
      const theirs = await waitFor(() => docker.containers().find((c) => c.name === "svc-job-other" && c.running), 10_000, "other daemon's container up");

      await killHard(first);
      expect(alive(a.pid)).toBe(true);
      await plantLeftovers(docker, work, label);
      const second = daemon();
      await waitFor(() => /workspace volume\(s\)/.test(second.output()), 30_000, `leftovers removed (${second.output()})`);
      expect(docker.containers().filter((c) => c.id === a.id)).toEqual([]);
      await waitFor(() => !alive(a.pid), 5_000, "the leftover container's process gone");
      expect(second.output()).toContain(`removed 1 container(s) left by an earlier run of this daemon (jobs ${job.job_id})`);
      expect(second.output()).toContain(`removed 2 workspace volume(s) and 2 job folder(s) left by an earlier run of this daemon (jobs ${job.job_id}, job-cut-short)`);
      for (const id of [job.job_id, "job-cut-short"]) {
        expect(docker.volumes().map((v) => v.name)).not.toContain(`svc-ws-${id}`);
        expect(fs.existsSync(path.join(work, id)), id).toBe(false);
        expect(fs.readdirSync(work).filter((f) => f.startsWith(id) && f.endsWith(".cid")), id).toEqual([]);
      }
      expect(second.output()).not.toContain(p.key);
      expect(docker.containers().find((c) => c.id === theirs.id)?.running).toBe(true);
      expect(alive(theirs.pid)).toBe(true);
      expectUnrelatedKept(docker, work);
    } finally {
      for (const d of daemons) await killHard(d);
      for (const id of [...jobs, "job-other"]) docker.release(id);
      await other.exited;
    }
  });
});
