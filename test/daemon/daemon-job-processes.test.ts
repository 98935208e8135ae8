// A job that runs on the host (a runner) has a process group of its own,
// which a daemon killed without cleaning up (SIGKILL) leaves running: its next
// start (same work folder) kills that group before it takes a job, from the
// record it keeps under <work>/.svc-procs/ while the job runs, and removes the
// job's folder (SVC_WORKSPACE). A record whose
// pid another process holds now (another start time, another boot) kills
// nothing. Both daemons, against the real server; the runner is a shell
// script with a child of its own, and tells whether an earlier runner still
// ran when it started.
import fs from "node:fs";
import path from "node:path";
import { describe, expect, it } from "vitest";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { client } from "../helpers/http.js";
import { killLeftoverProcesses } from "../../src/daemon/ts/job-processes.js";
import { python, realPython, runLegacyDaemon, start, tempDir, waitFor, writeExecutable, type Spawned } from "./helpers.js";
import { groupProcesses } from "./procs.js";
import { useTsDaemonServer } from "./ts-harness.js";

const h = useTsDaemonServer();

/**
 * An llm-inference runner that sleeps (in a child of its own) until killed. Each run writes its pid
 * to pids/<pid>; one that finds an earlier run still alive when it starts writes its pid to `overlap`.
 */
function sleepingRunner() {
  const dir = tempDir("orphan-runner");
  const pids = path.join(dir, "pids");
  fs.mkdirSync(pids);
  const overlap = path.join(dir, "overlap");
  const script = writeExecutable(
    dir,
    "runner.sh",
    [
      "#!/bin/sh",
      `for f in '${pids}'/*; do`,
      '  [ -f "$f" ] || continue',
      '  p=$(cat "$f")',
      `  if [ -r "/proc/$p/stat" ] && ! grep -q ') Z ' "/proc/$p/stat"; then echo "$p" >> '${overlap}'; fi`,
      "done",
      // What a job leaves in its folder midway (a killed daemon's next start removes it).
      'echo partial > "$SVC_WORKSPACE/partial.bin"',
      "sleep 1000 &",
      `echo $$ > "${pids}/.$$" && mv "${pids}/.$$" "${pids}/$$"`,
      "wait",
      "",
    ].join("\n"),
  );
  const runs = () => fs.readdirSync(pids).filter((n) => /^\d+$/.test(n)).map(Number);
  return {
    spec: `llm-inference=${script}`,
    runs,
    overlap: () => (fs.existsSync(overlap) ? fs.readFileSync(overlap, "utf8") : ""),
    /** Kills every run's process group (what the test leaves). */
    cleanUp() {
      for (const pid of runs()) {
        try {
          process.kill(-pid, "SIGKILL");
        } catch {
          // Gone.
        }
      }
    },
  };
}

/** A process's start time (/proc/<pid>/stat field 22). */
function startTime(pid: number): number {
  const stat = fs.readFileSync(`/proc/${pid}/stat`, "latin1");
  return Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[22 - 3]);
}

const bootId = () => fs.readFileSync("/proc/sys/kernel/random/boot_id", "utf8").trim();

/**
 * Records that name an unrelated live process of the test's (its own process group) as if it were a
 * job's whose pid was recycled: a wrong start time, and the right one of another boot. Returns the
 * process; neither record may get it killed.
 */
function plantRecycledRecords(work: string): Spawned {
  const decoy = start("sleep", ["1000"], { detached: true });
  const records = path.join(work, ".svc-procs");
  fs.mkdirSync(records, { recursive: true, mode: 0o700 });
  const real = startTime(decoy.pid);
  const record = (job: string, start_time: number, boot_id: string) =>
    fs.writeFileSync(path.join(records, `${job}.${decoy.pid}.json`), JSON.stringify({ job_id: job, pgid: decoy.pid, start_time, boot_id, argv: ["sleep", "1000"] }), { mode: 0o600 });
  record("job-recycled", real + 1, bootId());
  record("job-other-boot", real, "00000000-0000-0000-0000-000000000000");
  return decoy;
}

/** While the job runs: its runner's group recorded, private to the daemon's user. */
function expectRecorded(work: string, jobId: string, pgid: number) {
  const records = path.join(work, ".svc-procs");
  expect(fs.statSync(records).mode & 0o777).toBe(0o700);
  const file = path.join(records, `${jobId}.${pgid}.json`);
  expect(fs.statSync(file).mode & 0o777).toBe(0o600);
  expect(JSON.parse(fs.readFileSync(file, "utf8"))).toMatchObject({ job_id: jobId, pgid, start_time: startTime(pgid), boot_id: bootId() });
}

/**
 * After the second start: the orphan's group gone before the next job started (`next`, given to the
 * provider while no daemon ran: its runner found no earlier one alive), the decoy alive, the records
 * of both gone.
 */
async function expectOrphanKilled(second: Spawned, work: string, jobId: string, pgid: number, decoy: Spawned, runner: ReturnType<typeof sleepingRunner>, next: string) {
  const run = await waitFor(() => runner.runs().find((pid) => pid !== pgid), 45_000, `job ${next} started`);
  expect(runner.overlap(), `an earlier run was still alive when job ${next} started:\n${second.output()}`).toBe("");
  expect(groupProcesses(pgid)).toEqual([]);
  expectRecorded(work, next, run);
  expect(second.output()).toContain(`killed job ${jobId}'s process group ${pgid} (`);
  expect(groupProcesses(decoy.pid)).toEqual([decoy.pid]);
  expect(second.output()).not.toMatch(/killed job job-(recycled|other-boot)/);
  const left = fs.readdirSync(path.join(work, ".svc-procs"));
  expect(left.filter((n) => n.includes(`.${pgid}.`) || n.startsWith("job-recycled") || n.startsWith("job-other-boot"))).toEqual([]);
}

/** A job pinned to the provider, submitted while its daemon is down (assigned, or queued until it is back): the next start takes it. */
async function nextJob(providerId: number, renter: { headers: Record<string, string> }) {
  const job = await h.submit(renter, { job_type: "llm-inference", params: { prompt: "next", max_tokens: 32 }, provider_id: providerId });
  expect([providerId, null]).toContain(job.provider_id);
  return job.job_id;
}

/**
 * The scenario both daemons go through: a daemon (`start()`, in work folder `work`) runs a job's
 * sleeping runner, is SIGKILLed with the runner left alive, records of a recycled pid are planted,
 * another job waits for the provider, and a second start must kill the orphan before it takes that
 * job (expectOrphanKilled). Returns the second daemon and the orphan's job id; `decoy` is set for cleanup.
 */
async function orphanScenario(providerId: number, renter: { headers: Record<string, string> }, runner: ReturnType<typeof sleepingRunner>, work: string, start: () => Spawned, planted: { decoy?: Spawned }) {
  const first = start();
  await waitFor(async () => (await h.srv.sql`SELECT readiness_status FROM providers WHERE id = ${providerId}`)[0].readiness_status, 45_000, `daemon up (${first.output()})`);
  const job = await h.submit(renter, { job_type: "llm-inference", params: { prompt: "hi", max_tokens: 32 } });
  expect(job.provider_id).toBe(providerId);
  const pgid = await waitFor(() => runner.runs()[0], 45_000, `runner started (${first.output()})`);
  await waitFor(() => groupProcesses(pgid).length === 2, 5_000, `runner and its child up (${JSON.stringify(groupProcesses(pgid))} ${pgid})`);
  expectRecorded(work, job.job_id, pgid);

  first.kill("SIGKILL");
  await first.exited;
  expect(groupProcesses(pgid).length).toBe(2);
  planted.decoy = plantRecycledRecords(work);
  const next = await nextJob(providerId, renter);

  expect(fs.readFileSync(path.join(work, job.job_id, "partial.bin"), "utf8")).toBe("partial\n");
  const second = start();
  await expectOrphanKilled(second, work, job.job_id, pgid, planted.decoy, runner, next);
  return { second, jobId: job.job_id, next };
}

describe("a job's host process left by a killed daemon", { timeout: 120_000 }, () => {
  it("svc-daemon (TypeScript): its next start kills the runner's process group before it connects; a recycled pid is left alone", async () => {
    const p = await makeProvider(h.srv);
    const renter = await makeRenter(h.srv, 1_000);
    const runner = sleepingRunner();
    const state = path.join(tempDir("orphan-ts"), "state");
    const planted: { decoy?: Spawned } = {};
    try {
      const work = path.join(state, "work");
      const { second, jobId, next } = await orphanScenario(p.id, renter, runner, work, () => h.startDaemon(p.key, ["--runner", runner.spec], {}, { stateDir: state }), planted);
      // Killed before it connected: the server hands it no job before then.
      expect(second.output().indexOf(`killed job ${jobId}'s`)).toBeLessThan(second.output().indexOf("connected as provider"));
      // The orphan's folder went with it; the job running now keeps its own.
      expect(fs.existsSync(path.join(work, jobId))).toBe(false);
      expect(second.output()).toContain(`removed job ${jobId}'s folder, left by an earlier run of this daemon`);
      expect(fs.readFileSync(path.join(work, next, "partial.bin"), "utf8")).toBe("partial\n");
    } finally {
      await h.killDaemons();
      runner.cleanUp();
      planted.decoy?.kill("SIGKILL");
    }
  });

  it("svc_daemon.py: its next start kills the runner's process group before it polls; a recycled pid is left alone", async () => {
    const p = await makeProvider(h.srv);
    const renter = await makeRenter(h.srv, 1_000);
    const served = await client(h.srv.url).get(`/api/providers/download/daemon?key=${p.key}`);
    expect(served.status).toBe(200);
    const dir = tempDir("orphan-py");
    const file = path.join(dir, "svc_daemon.py");
    fs.writeFileSync(file, served.text);
    const runner = sleepingRunner();
    const daemons: Spawned[] = [];
    // The interpreter itself: SIGKILL must reach the daemon, not a version manager's shim.
    const daemon = () => daemons[daemons.push(runLegacyDaemon(file, dir, { SVC_RUNNERS: runner.spec }, realPython())) - 1];
    const planted: { decoy?: Spawned } = {};
    try {
      const work = path.join(dir, "work");
      const { second, jobId, next } = await orphanScenario(p.id, renter, runner, work, daemon, planted);
      // The orphan's folder went with it; the job running now keeps its own.
      expect(fs.existsSync(path.join(work, jobId))).toBe(false);
      expect(second.output()).toContain(`removed job ${jobId}'s folder, left by an earlier run of this daemon`);
      expect(fs.readFileSync(path.join(work, next, "partial.bin"), "utf8")).toBe("partial\n");
    } finally {
      for (const d of daemons) {
        d.kill("SIGKILL");
        await d.exited;
      }
      runner.cleanUp();
      planted.decoy?.kill("SIGKILL");
    }
  });

  it("both: with the group's leader gone, only its members that carry the job's SVC_JOB_ID are killed", async () => {
    for (const daemon of ["ts", "legacy"] as const) {
      const work = tempDir(`orphan-members-${daemon}`);
      // A leader that exits at once, leaving two members in its group: one with the job's environment, one without.
      const group = start("sh", ["-c", "sleep 1000 & env -u SVC_JOB_ID sleep 1000 & sleep 0.3"], { env: { SVC_JOB_ID: "job-members" }, detached: true });
      const pgid = group.pid;
      const records = path.join(work, ".svc-procs");
      fs.mkdirSync(records, { mode: 0o700 });
      const record = { job_id: "job-members", pgid, start_time: startTime(pgid), boot_id: bootId(), argv: ["sh"] };
      fs.writeFileSync(path.join(records, `job-members.${pgid}.json`), JSON.stringify(record), { mode: 0o600 });
      await group.exited;
      const members = await waitFor(() => groupProcesses(pgid).length === 2 && groupProcesses(pgid), 5_000, "two members left");
      const carrying = members.filter((pid) => fs.readFileSync(`/proc/${pid}/environ`, "latin1").includes("SVC_JOB_ID=job-members\0"));
      expect(carrying).toHaveLength(1);
      try {
        const lines: string[] = [];
        if (daemon === "ts") await killLeftoverProcesses(work, (l) => lines.push(l), 1000);
        else lines.push(python(`import svc_daemon\nsvc_daemon.kill_leftover_processes(${JSON.stringify(work)}, print, 1.0)`));
        expect(lines.join("\n"), daemon).toContain(`killed job job-members's process group ${pgid} (sh)`);
        expect(groupProcesses(pgid), daemon).toEqual(members.filter((pid) => !carrying.includes(pid)));
        expect(fs.readdirSync(records), daemon).toEqual([]);
      } finally {
        for (const pid of members) {
          try {
            process.kill(pid, "SIGKILL");
          } catch {
            // Gone.
          }
        }
      }
    }
  });

  it("both: at start, remove the folders of the recorded jobs, never a link's target nor a folder no record names", async () => {
    for (const daemon of ["ts", "legacy"] as const) await expectLeftFoldersRemoved(daemon);
  });

  async function expectLeftFoldersRemoved(daemon: "ts" | "legacy") {
    const root = tempDir(`left-workspaces-${daemon}`);
    const work = path.join(root, "work");
    const outside = path.join(root, "outside");
    fs.mkdirSync(outside);
    fs.writeFileSync(path.join(outside, "keep.txt"), "the provider's");
    const records = path.join(work, ".svc-procs");
    fs.mkdirSync(records, { recursive: true, mode: 0o700 });
    // A job whose process ended with its boot, and one still running (killed now): both folders go.
    const running = start("sleep", ["1000"], { env: { SVC_JOB_ID: "job-left-running" }, detached: true });
    const record = (job: string, pgid: number, start_time: number, boot_id: string) =>
      fs.writeFileSync(path.join(records, `${job}.${pgid}.json`), JSON.stringify({ job_id: job, pgid, start_time, boot_id, argv: ["runner"] }), { mode: 0o600 });
    record("job-left-ended", 4_000_000, 1, "00000000-0000-0000-0000-000000000000");
    record("job-left-running", running.pid, startTime(running.pid), bootId());
    // A record naming no job: never the work folder itself.
    record("", 4_000_001, 1, "00000000-0000-0000-0000-000000000000");
    for (const job of ["job-left-ended", "job-left-running"]) {
      fs.mkdirSync(path.join(work, job, "out"), { recursive: true });
      fs.writeFileSync(path.join(work, job, "out", "weights.bin"), "x".repeat(1000));
      fs.symlinkSync(outside, path.join(work, job, "link-dir"));
    }
    // A folder no record names (not known to be a job's), and a file of the provider's.
    fs.mkdirSync(path.join(work, "job-unrecorded"));
    fs.writeFileSync(path.join(work, "job-unrecorded", "checkpoint.bin"), "kept");
    fs.writeFileSync(path.join(work, "notes.txt"), "the provider's");
    try {
      const lines: string[] = [];
      if (daemon === "ts") await killLeftoverProcesses(work, (l) => lines.push(l), 1000);
      else lines.push(python(`import svc_daemon\nsvc_daemon.kill_leftover_processes(${JSON.stringify(work)}, print, 1.0)`));
      expect(lines.join("\n"), daemon).toContain("killed job job-left-running's process group");
      for (const job of ["job-left-ended", "job-left-running"]) {
        expect(fs.existsSync(path.join(work, job)), `${daemon} ${job}`).toBe(false);
        expect(lines.join("\n"), daemon).toContain(`removed job ${job}'s folder, left by an earlier run of this daemon`);
      }
      expect(fs.readdirSync(work).sort(), daemon).toEqual([".svc-procs", "job-unrecorded", "notes.txt"]);
      expect(fs.readdirSync(records), daemon).toEqual([]);
      expect(fs.readFileSync(path.join(work, "job-unrecorded", "checkpoint.bin"), "utf8")).toBe("kept");
      expect(fs.readFileSync(path.join(outside, "keep.txt"), "utf8")).toBe("the provider's");
    } finally {
      running.kill("SIGKILL");
      await running.exited;
    }
  }

  it("svc_daemon.py: a job's process that exits leaving a child in its group takes the child with it", async () => {
    const dir = tempDir("left-child");
    const out = python(
      [
        "import os, svc_daemon",
        `d = ${JSON.stringify(dir)}`,
        "run = svc_daemon.JobRun(['sh', '-c', 'sleep 1000 & echo $! > ' + d + '/child; exit 0'], '', dict(os.environ), d)",
        "print(run.wait(), run.proc.pid)",
      ].join("\n"),
    );
    const [code, pgid] = out.trim().split(" ").map(Number);
    expect(code).toBe(0);
    const child = Number(fs.readFileSync(path.join(dir, "child"), "utf8"));
    expect(child).toBeGreaterThan(0);
    await waitFor(() => groupProcesses(pgid).length === 0, 5_000, `the group of ${pgid} (its child ${child}) gone`);
  });
});
