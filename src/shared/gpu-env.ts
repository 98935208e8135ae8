// Environment names a job may not set: they choose which GPUs its container
// sees and what the NVIDIA container runtime mounts into it, which the
// provider's daemon decides (one GPU per running job). The runtime reads more
// NVIDIA_* names than are listed here (and may read new ones), so the whole
// prefix is reserved. The server refuses them at submit
// (domain/jobs/job-schemas.ts) and the stream daemon leaves them out
// (daemon/ts/executors/docker.ts); svc_daemon.py keeps its own copy of these.
export const RESERVED_ENV_PREFIX = "NVIDIA_";

/** The reserved names listed one by one: CUDA_VISIBLE_DEVICES and the NVIDIA_* names known to matter. */
export const RESERVED_ENV_NAMES: readonly string[] = [
  "NVIDIA_VISIBLE_DEVICES",
  "CUDA_VISIBLE_DEVICES",
  "NVIDIA_DRIVER_CAPABILITIES",
  "NVIDIA_MIG_CONFIG_DEVICES",
  "NVIDIA_MIG_MONITOR_DEVICES",
  "NVIDIA_IMEX_CHANNELS",
  "NVIDIA_GDS",
  "NVIDIA_MOFED",
  "NVIDIA_NVSWITCH",
  "NVIDIA_GDRCOPY",
];

/** Whether a job's env may not set `name`. */
export function isReservedEnvName(name: string): boolean {
  return name.startsWith(RESERVED_ENV_PREFIX) || RESERVED_ENV_NAMES.includes(name);
}

/**
 * Runtime features that mount more host devices (GPUDirect Storage, InfiniBand, NVSwitch, GDRCopy)
 * into a container whose environment sets them to "enabled". A job's image could set them in its
 * own ENV, so the daemons set each to "disabled" on every job container.
 */
export const DEVICE_FEATURE_ENV_NAMES: readonly string[] = ["NVIDIA_GDS", "NVIDIA_MOFED", "NVIDIA_NVSWITCH", "NVIDIA_GDRCOPY"];
