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
