// Processes started for a job, found by the SVC_JOB_ID in their environment
// (Linux /proc), to prove a stopped job leaves nothing running.
import fs from "node:fs";

export function jobProcesses(jobId: string): number[] {
  const needle = `SVC_JOB_ID=${jobId}\0`;
  const pids: number[] = [];
  for (const entry of fs.readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const env = fs.readFileSync(`/proc/${entry}/environ`, "latin1");
      const stat = fs.readFileSync(`/proc/${entry}/stat`, "latin1");
      // Zombies (state Z) have exited already.
      if (env.includes(needle) && !/^\d+ \(.*\) Z /.test(stat)) pids.push(Number(entry));
    } catch {
      // Gone meanwhile, or not ours to read.
    }
  }
  return pids;
}

/** Live (not zombie) processes of a process group. */
export function groupProcesses(pgid: number): number[] {
  const pids: number[] = [];
  for (const entry of fs.readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      // Fields after the command name: state, ppid, pgrp, ...
      const stat = fs.readFileSync(`/proc/${entry}/stat`, "latin1");
      const [state, , pgrp] = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
      if (state !== "Z" && Number(pgrp) === pgid) pids.push(Number(entry));
    } catch {
      // Gone meanwhile.
    }
  }
  return pids;
}

/** A process's argv as `ps` shows it to every user of the host (its arguments joined by spaces); "" once gone. */
export function cmdline(pid: number): string {
  try {
    return fs.readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0").join(" ");
  } catch {
    return "";
  }
}

/** pid -> argv of every live descendant of `root` (root included). */
export function descendants(root: number): Map<number, string> {
  const parent = new Map<number, number>();
  for (const entry of fs.readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = fs.readFileSync(`/proc/${entry}/stat`, "latin1");
      parent.set(Number(entry), Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]));
    } catch {
      // Gone meanwhile.
    }
  }
  const out = new Map<number, string>();
  for (const pid of parent.keys()) {
    for (let p: number | undefined = pid; p && p > 1; p = parent.get(p)) {
      if (p === root) {
        out.set(pid, cmdline(pid));
        break;
      }
    }
  }
  return out;
}
