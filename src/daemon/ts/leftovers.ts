// What a daemon that died without cleaning up (SIGKILL, a crash, a power cut)
// left behind. A job's container runs without --rm and is removed by the
// daemon once the job ended, and with it the job's workspace volume and host
// folder (docker.ts removeJobData): a dead daemon's container may still be
// running on the GPU the next job is given, and its jobs' volumes and folders
// would stay on the provider's disk for good. Every container and workspace
// volume the daemon creates carries DAEMON_LABEL naming this daemon and
// JOB_LABEL naming the job, and the next start removes those containers
// before it takes a job, then what the jobs they name left: the same data a
// job's end removes, nothing else of the work folder (a host job's folder is
// job-processes.ts's to remove, by its record). The label's value names the daemon by its server
// and work folder, never its key (labels show in `docker ps`): two daemons on
// one host keep their job folders apart, and so each other's containers and
// volumes.
import crypto from "node:crypto";
import path from "node:path";
import { runCommand } from "./exec.js";
import { DAEMON_LABEL, JOB_LABEL, jobFiles, removeJobData } from "./executors/docker.js";

export { DAEMON_LABEL, JOB_LABEL };

/** DAEMON_LABEL's value for a daemon serving `url` from the work folder `workRoot`. */
export function daemonLabel(url: string, workRoot: string): string {
  const scope = ["svc-daemon", new URL(url).origin, path.resolve(workRoot)].join("\n");
  return crypto.createHash("sha256").update(scope).digest("hex").slice(0, 16);
}

export interface LeftoverScope {
  /** The docker CLI. */
  docker: string;
  /** This daemon's DAEMON_LABEL value. */
  label: string;
  /** Its work folder, where its jobs' folders are. */
  workRoot: string;
}

/**
 * Forcibly removes every container labelled for this daemon (running or stopped), then its
 * labelled workspace volumes and the folders of the jobs either names, and logs what went and
 * whose jobs. A docker that is missing or fails is logged; the daemon starts anyway.
 */
export async function removeLeftovers(scope: LeftoverScope, log: (line: string) => void, signal?: AbortSignal): Promise<void> {
  const { docker } = scope;
  const filter = `label=${DAEMON_LABEL}=${scope.label}`;
  const ps = await runCommand(docker, ["ps", "-a", "--no-trunc", "--filter", filter, "--format", `{{.ID}}\t{{.Label "${JOB_LABEL}"}}`], { timeoutMs: 30_000, signal });
  if (ps.code !== 0) return log(`could not list containers left by an earlier run (docker ps: ${firstLine(ps.stderr) || `exit ${ps.code}`})`);
  const containers = rows(ps.stdout);
  if (containers.length > 0) {
    const ids = containers.map(([id]) => id);
    const jobs = containers.map(([, job]) => job || "unknown job").join(", ");
    const rm = await runCommand(docker, ["rm", "--force", "--volumes", ...ids], { timeoutMs: 60_000, signal });
    // A container still there may still use its job's volume and folder: those wait for the next start.
    if (rm.code !== 0) return log(`removing ${ids.length} container(s) left by an earlier run (jobs ${jobs}) failed: ${firstLine(rm.stderr) || `exit ${rm.code}`}`);
    log(`removed ${ids.length} container(s) left by an earlier run of this daemon (jobs ${jobs})`);
  }
  const ls = await runCommand(docker, ["volume", "ls", "--filter", filter, "--format", `{{.Name}}\t{{.Label "${JOB_LABEL}"}}`], { timeoutMs: 30_000, signal });
  if (ls.code !== 0) log(`could not list workspace volumes left by an earlier run (docker volume ls: ${firstLine(ls.stderr) || `exit ${ls.code}`})`);
  // Each job's volumes. A volume is removed after its job's folder (removeJobData), so a job whose
  // clean-up was cut short is still named by one; a container names its job too (an older version
  // of the daemon left its volume unlabelled: that one stays).
  const jobs = new Map<string, string[]>();
  for (const [, job] of containers) if (job) jobs.set(job, []);
  for (const [volume, job = ""] of ls.code === 0 ? rows(ls.stdout) : []) jobs.set(job, [...(jobs.get(job) ?? []), volume]);
  if (signal?.aborted) return;
  const gone = { volumes: 0, folders: 0 };
  for (const [job, volumes] of jobs) {
    // No folder for a volume that names no job: the work folder itself is no job's.
    const removed = await removeJobData(docker, { ...(job ? jobFiles(scope.workRoot, job) : {}), volumes }, log);
    gone.volumes += removed.volumes;
    gone.folders += Number(removed.folder);
  }
  if (gone.volumes + gone.folders > 0) {
    log(`removed ${gone.volumes} workspace volume(s) and ${gone.folders} job folder(s) left by an earlier run of this daemon (jobs ${[...jobs.keys()].map((j) => j || "unknown job").join(", ")})`);
  }
}

const rows = (stdout: string) =>
  stdout
    .split("\n")
    .map((l) => l.trim())
    .filter(Boolean)
    .map((l) => l.split("\t"));

const firstLine = (s: string) => s.trim().split("\n")[0];
