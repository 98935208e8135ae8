// Environment names a job may not set: they choose which GPUs its container
// sees and what the NVIDIA container runtime mounts into it, which the
// provider's daemon decides (one GPU per running job). The server refuses them
// at submit (domain/jobs/job-schemas.ts) and the stream daemon leaves them out
// (daemon/ts/executors/docker.ts); svc_daemon.py keeps its own copy of the list.
export const RESERVED_ENV_NAMES: readonly string[] = [
  "NVIDIA_VISIBLE_DEVICES",
  "CUDA_VISIBLE_DEVICES",
  "NVIDIA_DRIVER_CAPABILITIES",
  "NVIDIA_MIG_CONFIG_DEVICES",
  "NVIDIA_MIG_MONITOR_DEVICES",
  "NVIDIA_IMEX_CHANNELS",
];
