// A job that runs on the host (a runner, the benchmark) runs in a process
// group of its own, which outlives a daemon killed without cleaning up
// (SIGKILL, an OOM kill, a crash): the server hands the job back or re-queues
// it, and the orphan would keep its GPU busy while the same job runs again.
// So each such group is recorded in the work folder (<work>/.svc-procs/, 0700;
// one file per run, 0600) from its start until it has ended, and the next
// start kills what is recorded before it takes a job. A pid is recycled once
// its process is gone: a record names the group leader's start time (field 22
// of /proc/<pid>/stat, clock ticks since boot) and the boot it ran in, and
// nothing that does not match is signalled. The record layout is the legacy
// daemon's too (svc_daemon.py). A record outlives its group until the job's
// folder (SVC_WORKSPACE) is removed too, so the next start also removes the
// folder of a job whose end was cut short.
import fs from "node:fs";
import path from "node:path";
import { jobFiles, safeName } from "./executors/docker.js";

/** The folder of a work folder's records (hidden: no job folder is, safeName). */
export const PROCESS_RECORDS_DIR = ".svc-procs";

export const processRecordsDir = (workRoot: string) => path.join(workRoot, PROCESS_RECORDS_DIR);

interface ProcessRecord {
  job_id: string;
  /** The process group's id: its leader's pid. */
  pgid: number;
  /** The leader's start time (/proc/<pid>/stat field 22). */
  start_time: number;
  /** /proc/sys/kernel/random/boot_id when it started: no process outlives a reboot. */
  boot_id: string;
  /** What was started (for the log only: a program may exec another). */
  argv: string[];
}

interface ProcStat {
  state: string;
  pgrp: number;
  startTime: number;
}

/** A process's state, group and start time from /proc/<pid>/stat; undefined when it is gone (or there is no /proc). */
function procStat(pid: number): ProcStat | undefined {
  let text: string;
  try {
    text = fs.readFileSync(`/proc/${pid}/stat`, "latin1");
  } catch {
    return undefined;
  }
  // The command name (field 2) may hold spaces and parentheses: fields 3 on follow its last ")".
  const rest = text.slice(text.lastIndexOf(")") + 2).split(" ");
  const [state, , pgrp] = rest;
  const startTime = Number(rest[22 - 3]);
  if (!state || !Number.isFinite(startTime)) return undefined;
  return { state, pgrp: Number(pgrp), startTime };
}

const hasProc = () => fs.existsSync("/proc/self/stat");

function bootId(): string {
  try {
    return fs.readFileSync("/proc/sys/kernel/random/boot_id", "utf8").trim();
  } catch {
    return "";
  }
}

/** Removes a file; one that cannot be removed (not the daemon's to remove) stays, and is met again at the next start. */
function remove(file: string): void {
  try {
    fs.rmSync(file, { force: true });
  } catch {
    // Left as it is.
  }
}

/**
 * Removes a host job's folder (SVC_WORKSPACE: `<work>/<safe job id>`, never the work folder nor
 * anything beside it) and all in it; a symbolic link in it, or in its place, is removed itself,
 * never followed. What cannot be removed is logged and stays. Whether there was a folder that went.
 */
export function removeJobFolder(workRoot: string, jobId: string, log?: (line: string) => void): boolean {
  const dir = path.resolve(jobFiles(workRoot, jobId).outDir);
  // An empty job id (a record's) would name the work folder itself.
  if (path.dirname(dir) !== path.resolve(workRoot)) return false;
  try {
    fs.lstatSync(dir);
  } catch {
    return false;
  }
  try {
    fs.rmSync(dir, { recursive: true, force: true });
    return true;
  } catch (err) {
    log?.(`could not remove job ${jobId}'s folder ${dir}: ${(err as Error).message}`);
    return false;
  }
}

/** A live (not zombie) process's stat. */
function live(pid: number): ProcStat | undefined {
  const st = procStat(pid);
  return st && st.state !== "Z" && st.state !== "X" ? st : undefined;
}

/**
 * Records the process group `pid` leads, started for `jobId`; returns what removes the record once
 * the group has ended (idempotent). Without /proc (not Linux) nothing is recorded: the next start
 * could not tell the process from another one that got its pid, and kills nothing unverified.
 */
export function recordJobProcess(workRoot: string, jobId: string, pid: number, argv: string[], log?: (line: string) => void): () => void {
  const st = hasProc() ? procStat(pid) : undefined;
  if (!st) return () => {};
  const dir = processRecordsDir(workRoot);
  const file = path.join(dir, `${safeName(jobId)}.${pid}.json`);
  const record: ProcessRecord = { job_id: jobId, pgid: pid, start_time: st.startTime, boot_id: bootId(), argv };
  try {
    fs.mkdirSync(dir, { recursive: true, mode: 0o700 });
    fs.chmodSync(dir, 0o700);
    const tmp = `${file}.tmp`;
    fs.rmSync(tmp, { force: true });
    fs.writeFileSync(tmp, JSON.stringify(record), { mode: 0o600, flag: "wx" });
    fs.renameSync(tmp, file);
  } catch (err) {
    log?.(`could not record job ${jobId}'s process group ${pid} (${(err as Error).message}): a killed daemon would leave it running`);
    return () => {};
  }
  let removed = false;
  return () => {
    if (removed) return;
    removed = true;
    remove(file);
  };
}

/**
 * The processes of a record's group that are still the job's: the whole group while its leader is
 * the recorded process (same start time); with the leader gone, the group's members that started
 * after it and carry the job's SVC_JOB_ID (the kernel gives no process the pid of a group that still
 * has members, but a later group of that pid could be left leaderless too). None once the leader's
 * pid belongs to another process.
 */
function recordedProcesses(rec: ProcessRecord): { group: boolean; pids: number[] } {
  const leader = live(rec.pgid);
  if (leader) return leader.startTime === rec.start_time ? { group: true, pids: [rec.pgid] } : { group: false, pids: [] };
  const needle = `\0SVC_JOB_ID=${rec.job_id}\0`;
  const pids: number[] = [];
  for (const entry of fs.readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    const pid = Number(entry);
    const st = live(pid);
    if (!st || st.pgrp !== rec.pgid || st.startTime < rec.start_time) continue;
    try {
      if (`\0${fs.readFileSync(`/proc/${pid}/environ`, "latin1")}`.includes(needle)) pids.push(pid);
    } catch {
      // Gone meanwhile, or not ours to read: not verified.
    }
  }
  return { group: false, pids };
}

/** Signals what of a record's group is verified still to be the job's; how many processes that was. */
function signalRecorded(rec: ProcessRecord, signal: NodeJS.Signals): number {
  const { group, pids } = recordedProcesses(rec);
  // The verified leader's group (it may have left it: the leader too), or each verified member.
  for (const pid of group ? [-rec.pgid, rec.pgid] : pids) {
    try {
      process.kill(pid, signal);
    } catch {
      // Gone meanwhile.
    }
  }
  return pids.length;
}

const stillThere = (recs: ProcessRecord[]) => recs.some((rec) => recordedProcesses(rec).pids.length > 0);

async function waitGone(recs: ProcessRecord[], ms: number): Promise<void> {
  const end = Date.now() + ms;
  while (Date.now() < end && stillThere(recs)) await new Promise((r) => setTimeout(r, 100));
}

function readRecord(file: string): ProcessRecord | undefined {
  try {
    const r = JSON.parse(fs.readFileSync(file, "utf8")) as ProcessRecord;
    if (typeof r.job_id !== "string" || !Number.isInteger(r.pgid) || r.pgid <= 1 || !Number.isInteger(r.start_time)) return undefined;
    return { ...r, argv: Array.isArray(r.argv) ? r.argv.map(String) : [] };
  } catch {
    return undefined;
  }
}

/**
 * At start, before any job: kills (SIGTERM, then SIGKILL after `graceMs`) every recorded job process
 * group that an earlier run of this daemon left and that is still the same process, logs which,
 * removes the folders of the recorded jobs (no job of this run has one yet), and then the records.
 * A record of a process that has ended, or whose pid another process holds now, kills nothing. A
 * group that could not be killed keeps its record and its job's folder, for the next start.
 */
export async function killLeftoverProcesses(workRoot: string, log: (line: string) => void, graceMs = 5000): Promise<void> {
  const dir = processRecordsDir(workRoot);
  let names: string[];
  try {
    names = fs.readdirSync(dir);
  } catch {
    return; // No record: no earlier run left a job's process.
  }
  const files = names.filter((n) => n.endsWith(".json")).map((n) => path.join(dir, n));
  for (const n of names) if (n.endsWith(".tmp")) remove(path.join(dir, n));
  if (files.length === 0) return;
  if (!hasProc()) {
    // Without /proc a recorded pid cannot be told from a process that got it since: nothing is killed,
    // and a folder is left to a process that may still use it.
    log(`${files.length} job process record(s) left by an earlier run, not checked: this host has no /proc to verify a process by (any still running is left alone)`);
    for (const f of files) remove(f);
    return;
  }
  const boot = bootId();
  const found: { rec: ProcessRecord; file: string }[] = [];
  const running: ProcessRecord[] = [];
  for (const file of files) {
    const rec = readRecord(file);
    if (!rec) {
      log(`removed an unreadable job process record ${path.basename(file)}`);
      remove(file);
      continue;
    }
    found.push({ rec, file });
    // Of another boot: the process ended with it, and its pid is another process's now.
    if (!(rec.boot_id && boot && rec.boot_id !== boot) && signalRecorded(rec, "SIGTERM") > 0) running.push(rec);
  }
  const left = running.length > 0 ? await killRecorded(running, graceMs, log) : [];
  const jobs = new Set(found.map(({ rec }) => rec.job_id));
  for (const rec of left) jobs.delete(rec.job_id);
  for (const job of jobs) {
    if (removeJobFolder(workRoot, job, log)) log(`removed job ${job}'s folder, left by an earlier run of this daemon`);
  }
  for (const { rec, file } of found) if (!left.includes(rec)) remove(file);
}

/** Kills what of the recorded groups (sent SIGTERM already) is still there after `graceMs`, and logs each; returns those it could not kill. */
async function killRecorded(recs: ProcessRecord[], graceMs: number, log: (line: string) => void): Promise<ProcessRecord[]> {
  await waitGone(recs, graceMs);
  const killed = recs.filter((rec) => signalRecorded(rec, "SIGKILL") > 0);
  if (killed.length > 0) await waitGone(killed, 2000);
  const left: ProcessRecord[] = [];
  for (const rec of recs) {
    const how = `job ${rec.job_id}'s process group ${rec.pgid} (${rec.argv.join(" ").slice(0, 200)}), left running by an earlier run of this daemon`;
    // One that is still there is tried again at the next start.
    if (recordedProcesses(rec).pids.length > 0) {
      log(`could not kill ${how}`);
      left.push(rec);
    } else log(`killed ${how}${killed.includes(rec) ? " (SIGKILL: it outlasted SIGTERM)" : ""}`);
  }
  return left;
}
