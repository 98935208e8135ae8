// Jobs that need no container: a program on the host (the built-in
// benchmark, or one the provider configured for a job type with --runner).
// It gets the job as JSON on stdin and SVC_JOB_ID, SVC_WORKSPACE,
// SVC_RESULT_FILE in its environment, and CUDA_VISIBLE_DEVICES naming the
// GPU the daemon handed the job (nvidia-smi's index, so CUDA_DEVICE_ORDER is
// PCI_BUS_ID: CUDA's own default order may differ). The workspace is the
// job's while it runs: once its result is read (or it failed, timed out or
// was stopped) the daemon removes it, and a killed daemon's next start
// removes what its jobs left (job-processes.ts). The result is read into
// memory first.
import path from "node:path";
import { childEnv } from "../exec.js";
import { startChildJob } from "./child.js";
import { jobFiles, privateFolder } from "./docker.js";
import { recordJobProcess, removeJobFolder } from "../job-processes.js";
import type { Executor, JobHooks, JobSpec, RunningJob } from "./types.js";

export class ProcessExecutor implements Executor {
  readonly name = "process";
  constructor(
    private readonly argv: string[],
    private readonly workRoot: string,
    private readonly log?: (line: string) => void,
  ) {}

  start(job: JobSpec, hooks: JobHooks): RunningJob {
    const workspace = jobFiles(this.workRoot, job.jobId).outDir;
    // Only the daemon's user (the program's) may enter it, nor the work folder it lies in.
    privateFolder(this.workRoot);
    privateFolder(workspace);
    const resultFile = path.join(workspace, "result.json");
    let ended: (() => void) | undefined;
    const running = startChildJob(
      {
        argv: this.argv,
        env: {
          // Never the daemon's own secrets (its provider key, the HMAC secret).
          ...childEnv(),
          SVC_JOB_ID: job.jobId,
          SVC_JOB_TYPE: job.jobType,
          SVC_WORKSPACE: workspace,
          SVC_RESULT_FILE: resultFile,
          SVC_MAX_DURATION_SECONDS: String(job.maxDurationSeconds),
          ...(job.gpus?.length ? { CUDA_VISIBLE_DEVICES: job.gpus.join(","), CUDA_DEVICE_ORDER: "PCI_BUS_ID" } : {}),
        },
        cwd: workspace,
        stdin: JSON.stringify({ job_id: job.jobId, job_type: job.jobType, task_spec: job.taskSpec }),
        resultFile,
        executor: "process",
        // Killed at the daemon's next start if the daemon dies while it runs. The record stays until
        // the workspace is gone: a daemon killed before then still finds it at its next start.
        onGroup: (pgid) => {
          ended = recordJobProcess(this.workRoot, job.jobId, pgid, this.argv, this.log);
          return () => {};
        },
      },
      hooks,
    );
    const removed = () => {
      removeJobFolder(this.workRoot, job.jobId, this.log);
      ended?.();
    };
    // Settles once its result is read (into memory) and its workspace removed.
    return { ...running, done: running.done.finally(removed) };
  }
}
