// Which executor runs a job: a runner the provider configured for the job
// type (process), the built-in benchmark (process), vllm_serve and every
// other type in its container (docker).
import { fileURLToPath } from "node:url";
import { containerTaskProblem, DockerExecutor, type DockerOptions } from "./docker.js";
import { ProcessExecutor } from "./process.js";
import type { Executor, JobSpec } from "./types.js";

export const BENCHMARK_PROGRAM = fileURLToPath(new URL("../bench.mjs", import.meta.url));
export const CONTAINER_SCRIPTS = fileURLToPath(new URL("../container-scripts", import.meta.url));

export interface ExecutorConfig {
  /** job_type -> argv of a local program (process executor). */
  runners: Record<string, string[]>;
  workRoot: string;
  docker: Omit<DockerOptions, "workRoot"> | undefined;
  /** The daemon's log (what the executors report that is not a job's). */
  log?: (line: string) => void;
}

/** The job types the docker executor runs: the built-in ones with our program, custom_container, vllm_serve. */
const CONTAINER_JOB_TYPES = ["llm-inference", "llm_inference", "image_generation", "rendering", "training", "custom_container", "vllm_serve"];

/**
 * The job types executorFor runs on this host, declared in every heartbeat so that the server
 * offers no other (refusing one is the provider's fault): the benchmark, each configured runner's
 * type, and with docker every container type. A runner cannot serve vllm_serve: only the docker
 * executor reports its endpoint, and a serving job that reports none is failed as the provider's.
 */
export function supportedJobTypes(cfg: ExecutorConfig): string[] {
  const types = new Set(["benchmark"]);
  for (const [jobType, argv] of Object.entries(cfg.runners)) if (argv.length > 0 && jobType !== "vllm_serve") types.add(jobType);
  if (cfg.docker) for (const t of CONTAINER_JOB_TYPES) types.add(t);
  return [...types];
}

export function executorFor(job: JobSpec, cfg: ExecutorConfig): Executor {
  // Only the docker executor reports a served endpoint, so a vllm_serve runner is never used (nor declared).
  const runner = job.jobType === "vllm_serve" ? undefined : cfg.runners[job.jobType];
  if (runner?.length) return new ProcessExecutor(runner, cfg.workRoot, cfg.log);
  if (job.jobType === "benchmark") return new ProcessExecutor([process.execPath, BENCHMARK_PROGRAM], cfg.workRoot, cfg.log);
  if (!cfg.docker) {
    throw new Error(`job type ${job.jobType} runs in a container and docker is not available on this host (or configure --runner ${job.jobType}=COMMAND)`);
  }
  // A task whose image or workspace docker would take for an option or a host path is refused before anything runs.
  const problem = containerTaskProblem(job);
  if (problem) throw new Error(`the daemon does not run this task: ${problem}`);
  return new DockerExecutor({ ...cfg.docker, workRoot: cfg.workRoot });
}
