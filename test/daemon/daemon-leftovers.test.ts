// A daemon killed while its jobs' containers run (SIGKILL, a crash) leaves
// them behind: each daemon labels its containers, and its next start (same
// server, same work folder) removes them, running or stopped, before it takes
// a job; another daemon's containers on the same host are left alone. Both
// daemons, against the real server and the fake docker engine (helpers.ts).
// A docker that fails does not keep a daemon from starting.
import fs from "node:fs";
import path from "node:path";
import { describe, expect, it } from "vitest";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { client } from "../helpers/http.js";
import { DAEMON_LABEL, daemonLabel, removeLeftoverContainers } from "../../src/daemon/ts/leftover-containers.js";
import { alive, fakeDocker, python, realPython, runLegacyDaemon, start, tempDir, waitFor, writeExecutable, type FakeDocker, type Spawned } from "./helpers.js";
import { useTsDaemonServer } from "./ts-harness.js";

const h = useTsDaemonServer();

const waitJob = { job_type: "custom_container", duration_minutes: 2, params: { command: ["wait"] } };

/** The running container of a job, once it is up. */
const containerOf = (docker: FakeDocker, jobId: string, what: string) =>
  waitFor(() => docker.containers().find((c) => c.labels["svc.job_id"] === jobId && c.running), 45_000, what);

/** A container another daemon of this host (its own label) runs meanwhile. */
function otherDaemonsContainer(docker: FakeDocker, label: string): Spawned {
  const dir = tempDir("other-daemon");
  return start(docker.path, [
    "run", "--name", "svc-job-other", "--label", "svc.job_id=job-other", "--label", `${DAEMON_LABEL}=${label}`,
    "--cidfile", path.join(dir, "job-other.cid"), "-v", `${dir}:/svc-output`, "nvidia/cuda:12.4.1-runtime-ubuntu22.04", "wait",
  ], { detached: true });
}

/** Kills the daemon as SIGKILL does: no clean-up of its own. */
async function killHard(d: Spawned) {
  d.kill("SIGKILL");
  await d.exited;
}

describe("leftover containers of a killed daemon", { timeout: 120_000 }, () => {
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

    const dir = tempDir("broken-docker");
    const broken = writeExecutable(dir, "docker", "#!/bin/sh\necho 'Cannot connect to the Docker daemon at unix:///var/run/docker.sock.' >&2\nexit 1\n");
    for (const docker of [broken, path.join(dir, "missing")]) {
      const lines: string[] = [];
      await removeLeftoverContainers(docker, label, (l) => lines.push(l));
      expect(lines, docker).toEqual([expect.stringMatching(/^could not list containers left by an earlier run/)]);
      const out = python(`import svc_daemon
svc_daemon.remove_leftover_containers(${JSON.stringify(docker)}, "/srv/a/work", print)`);
      expect(out, docker).toMatch(/^could not (list|remove) containers left by an earlier run/);
    }
  });

  it("svc-daemon (TypeScript): its next start removes them, running or stopped; another daemon's are kept", async () => {
    const p = await makeProvider(h.srv);
    const renter = await makeRenter(h.srv, 1_000);
    const docker = fakeDocker(tempDir("leftover-docker"));
    const state = path.join(tempDir("leftover-ts"), "state");
    const url = `http://127.0.0.1:${h.port}`;
    const label = daemonLabel(url, path.join(state, "work"));
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
      expect(a.labels).toMatchObject({ [DAEMON_LABEL]: label, "svc.job_id": running.job_id });
      expect(JSON.stringify(docker.runs())).not.toContain(p.key);

      await killHard(first);
      docker.release(stopped.job_id);
      await waitFor(() => docker.containers().find((c) => c.id === b.id && !c.running), 10_000, "second container stopped");
      expect(alive(a.pid)).toBe(true);
      const theirs = await waitFor(() => docker.containers().find((c) => c.name === "svc-job-other" && c.running), 10_000, "other daemon's container up");

      const second = h.startDaemon(p.key, ["--docker", docker.path], {}, { stateDir: state });
      await waitFor(() => !docker.containers().some((c) => c.id === a.id || c.id === b.id), 30_000, `leftovers removed (${second.output()})`);
      await waitFor(() => !alive(a.pid), 5_000, "the leftover container's process gone");
      expect(second.output()).toMatch(/removed 2 container\(s\) left by an earlier run of this daemon \(jobs job-\S+, job-\S+\)/);
      for (const id of jobs) expect(second.output()).toContain(id);
      expect(second.output()).not.toContain(p.key);
      // Another daemon's container (another work folder) is not this daemon's to remove.
      expect(docker.containers().find((c) => c.id === theirs.id)?.running).toBe(true);
      expect(alive(theirs.pid)).toBe(true);
    } finally {
      for (const id of [...jobs, "job-other"]) docker.release(id);
      await other.exited;
    }
  });

  it("svc_daemon.py: its next start removes them; another daemon's are kept", async () => {
    const p = await makeProvider(h.srv);
    const renter = await makeRenter(h.srv, 1_000);
    const served = await client(h.srv.url).get(`/api/providers/download/daemon?key=${p.key}`);
    expect(served.status).toBe(200);
    const dir = tempDir("leftover-py");
    const file = path.join(dir, "svc_daemon.py");
    fs.writeFileSync(file, served.text);
    const docker = fakeDocker(dir);
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
      expect(a.labels[DAEMON_LABEL]).toMatch(/^[0-9a-f]{16}$/);
      expect(JSON.stringify(docker.runs())).not.toContain(p.key);
      const theirs = await waitFor(() => docker.containers().find((c) => c.name === "svc-job-other" && c.running), 10_000, "other daemon's container up");

      await killHard(first);
      expect(alive(a.pid)).toBe(true);
      const second = daemon();
      await waitFor(() => !docker.containers().some((c) => c.id === a.id), 30_000, `leftover removed (${second.output()})`);
      await waitFor(() => !alive(a.pid), 5_000, "the leftover container's process gone");
      expect(second.output()).toContain(`removed 1 container(s) left by an earlier run of this daemon (jobs ${job.job_id})`);
      expect(second.output()).not.toContain(p.key);
      expect(docker.containers().find((c) => c.id === theirs.id)?.running).toBe(true);
      expect(alive(theirs.pid)).toBe(true);
    } finally {
      for (const d of daemons) await killHard(d);
      for (const id of [...jobs, "job-other"]) docker.release(id);
      await other.exited;
    }
  });
});
