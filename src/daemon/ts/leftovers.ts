// Containers a daemon that died without cleaning up (SIGKILL, a crash, a power
// cut) left behind: a job's container runs without --rm and is removed by the
// daemon once the job ended, so a dead daemon's container may still be running
// on the GPU the next job is given. Every container the daemon starts carries
// DAEMON_LABEL naming this daemon, and the next start removes those before it
// takes a job. The label's value names the daemon by its server and work
// folder, never its key (labels show in `docker ps`): two daemons on one host
// keep their job folders apart, and so each other's containers.
import crypto from "node:crypto";
import path from "node:path";
import { runCommand } from "./exec.js";

export const DAEMON_LABEL = "svc.daemon";
export const JOB_LABEL = "svc.job_id";

/** DAEMON_LABEL's value for a daemon serving `url` from the work folder `workRoot`. */
export function daemonLabel(url: string, workRoot: string): string {
  const scope = ["svc-daemon", new URL(url).origin, path.resolve(workRoot)].join("\n");
  return crypto.createHash("sha256").update(scope).digest("hex").slice(0, 16);
}

/**
 * Forcibly removes every container labelled for this daemon (running or stopped) and logs how
 * many, and whose jobs. A docker that is missing or fails is logged; the daemon starts anyway.
 */
export async function removeLeftoverContainers(docker: string, label: string, log: (line: string) => void, signal?: AbortSignal): Promise<void> {
  const ps = await runCommand(
    docker,
    ["ps", "-a", "--no-trunc", "--filter", `label=${DAEMON_LABEL}=${label}`, "--format", `{{.ID}}\t{{.Label "${JOB_LABEL}"}}`],
    { timeoutMs: 30_000, signal },
  );
  if (ps.code !== 0) return log(`could not list containers left by an earlier run (docker ps: ${firstLine(ps.stderr) || `exit ${ps.code}`})`);
  const rows = ps.stdout.split("\n").map((l) => l.trim()).filter(Boolean).map((l) => l.split("\t"));
  if (rows.length === 0) return;
  const ids = rows.map(([id]) => id);
  const jobs = rows.map(([, job]) => job || "unknown job").join(", ");
  const rm = await runCommand(docker, ["rm", "--force", "--volumes", ...ids], { timeoutMs: 60_000, signal });
  if (rm.code !== 0) return log(`removing ${ids.length} container(s) left by an earlier run (jobs ${jobs}) failed: ${firstLine(rm.stderr) || `exit ${rm.code}`}`);
  log(`removed ${ids.length} container(s) left by an earlier run of this daemon (jobs ${jobs})`);
}

const firstLine = (s: string) => s.trim().split("\n")[0];
