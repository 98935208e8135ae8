// NVIDIA GPU detection through `nvidia-smi`: the CSV query of every GPU and
// the CUDA version from the banner. No driver (or no GPU) means an empty
// list: the daemon still runs CPU-only job types.
import { runCommand } from "./exec.js";
import { visibleGpus } from "./visible-gpus.js";

/** The fields asked of `nvidia-smi --query-gpu=... --format=csv,noheader,nounits`, in order. */
export const GPU_QUERY_FIELDS = [
  "index", "name", "uuid", "memory.total", "memory.used", "memory.free", "utilization.gpu",
  "utilization.memory", "temperature.gpu", "power.draw", "power.limit", "clocks.sm",
  "driver_version", "pci.bus_id", "compute_cap",
] as const;

export interface Gpu {
  index: number | null;
  name: string;
  uuid: string | null;
  vram_mib: number | null;
  vram_used_mib: number | null;
  vram_free_mib: number | null;
  utilization_pct: number | null;
  memory_utilization_pct: number | null;
  temperature_c: number | null;
  power_w: number | null;
  power_limit_w: number | null;
  sm_clock_mhz: number | null;
  driver_version: string | null;
  pci_bus_id: string | null;
  compute_capability: string | null;
}

/** "[N/A]", "[Not Supported]", "N/A" and empty cells are unknown. */
function cell(raw: string | undefined): string | null {
  const v = (raw ?? "").trim();
  if (v === "" || v.startsWith("[") || v === "N/A" || v === "Not Supported") return null;
  return v;
}

function num(raw: string | undefined, integer = false): number | null {
  const v = cell(raw);
  if (v === null) return null;
  const n = Number(v);
  if (!Number.isFinite(n)) return null;
  return integer ? Math.round(n) : n;
}

/** Parses the CSV rows (fields in the order given, default GPU_QUERY_FIELDS). */
export function parseGpuCsv(text: string, fields: readonly string[] = GPU_QUERY_FIELDS): Gpu[] {
  const gpus: Gpu[] = [];
  const nameAt = fields.indexOf("name");
  for (const line of text.split(/\r?\n/)) {
    if (!line.trim()) continue;
    let cells = line.split(",").map((c) => c.trim());
    if (cells.length < fields.length) continue;
    // A product name with a comma: fold the surplus cells back into the name.
    const surplus = cells.length - fields.length;
    if (surplus > 0 && nameAt >= 0) cells = [...cells.slice(0, nameAt), cells.slice(nameAt, nameAt + surplus + 1).join(", "), ...cells.slice(nameAt + surplus + 1)];
    const row = Object.fromEntries(fields.map((f, i) => [f, cells[i]]));
    gpus.push({
      index: num(row["index"], true),
      name: cell(row["name"]) ?? "unknown",
      uuid: cell(row["uuid"]),
      vram_mib: num(row["memory.total"], true),
      vram_used_mib: num(row["memory.used"], true),
      vram_free_mib: num(row["memory.free"], true),
      utilization_pct: num(row["utilization.gpu"]),
      memory_utilization_pct: num(row["utilization.memory"]),
      temperature_c: num(row["temperature.gpu"]),
      power_w: num(row["power.draw"]),
      power_limit_w: num(row["power.limit"]),
      sm_clock_mhz: num(row["clocks.sm"], true),
      driver_version: cell(row["driver_version"]),
      pci_bus_id: cell(row["pci.bus_id"]),
      compute_capability: cell(row["compute_cap"]),
    });
  }
  return gpus;
}

/** "CUDA Version: 12.4" from the plain `nvidia-smi` banner. */
export function parseCudaVersion(text: string): string | null {
  return /CUDA Version:\s*([0-9][0-9.]*)/.exec(text)?.[1] ?? null;
}

export interface GpuSnapshot {
  gpus: Gpu[];
  cudaVersion: string | null;
  driverVersion: string | null;
}

export class GpuProbe {
  private cuda: string | null | undefined;
  /**
   * `signal`: aborting it kills a running nvidia-smi (a wedged driver can hang it for the whole timeout).
   * `visible`: the daemon's CUDA_VISIBLE_DEVICES; a snapshot lists only the GPUs it names.
   */
  constructor(
    private readonly smi = "nvidia-smi",
    private readonly signal?: AbortSignal,
    private readonly visible?: string,
  ) {}

  async snapshot(): Promise<GpuSnapshot> {
    let fields: readonly string[] = GPU_QUERY_FIELDS;
    let out = await runCommand(this.smi, [`--query-gpu=${fields.join(",")}`, "--format=csv,noheader,nounits"], { timeoutMs: 15_000, signal: this.signal });
    if (out.code !== 0 && out.code !== null && !out.missing) {
      // Drivers before 510 do not know compute_cap.
      fields = GPU_QUERY_FIELDS.filter((f) => f !== "compute_cap");
      out = await runCommand(this.smi, [`--query-gpu=${fields.join(",")}`, "--format=csv,noheader,nounits"], { timeoutMs: 15_000, signal: this.signal });
    }
    if (out.code !== 0) return { gpus: [], cudaVersion: null, driverVersion: null };
    if (this.cuda === undefined) {
      const banner = await runCommand(this.smi, [], { timeoutMs: 15_000, signal: this.signal });
      this.cuda = banner.code === 0 ? parseCudaVersion(banner.stdout) : null;
    }
    const all = parseGpuCsv(out.stdout, fields);
    return { gpus: visibleGpus(all, this.visible).gpus, cudaVersion: this.cuda, driverVersion: all[0]?.driver_version ?? null };
  }
}

/** The heartbeat's documented gpu_status object, from a snapshot. */
export function gpuStatus(s: GpuSnapshot, daemonVersion: string, extra: { osInfo: string; runtimeVersion: string }): Record<string, unknown> {
  const g = s.gpus[0];
  return {
    gpu_name: g?.name ?? "none",
    gpu_vram_mib: g?.vram_mib ?? 0,
    driver_version: s.driverVersion ?? "",
    gpu_util_pct: g?.utilization_pct ?? 0,
    temp_c: g?.temperature_c ?? 0,
    power_w: g?.power_w ?? 0,
    free_vram_mib: g?.vram_free_mib ?? 0,
    daemon_version: daemonVersion,
    python_version: extra.runtimeVersion,
    os_info: extra.osInfo,
    compute_capability: g?.compute_capability ?? "",
    cuda_version: s.cudaVersion ?? "",
    gpu_count: s.gpus.length,
    all_gpus: s.gpus,
  };
}
