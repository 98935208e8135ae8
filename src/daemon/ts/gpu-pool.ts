// The host's GPUs (those the daemon's CUDA_VISIBLE_DEVICES leaves it: the
// probe lists no others), handed out one per running job. The server sends a
// provider at most as many jobs at once as it has GPUs (one slot each), so
// each job gets a GPU of its own (docker `--gpus device=N`, or
// CUDA_VISIBLE_DEVICES=N for a plain process): taken when the job starts,
// given back when it has ended.
import type { Gpu } from "./nvidia-smi.js";

export class GpuPool {
  private readonly busy = new Set<number>();

  /**
   * Takes a free GPU among those probed and answers its nvidia-smi index: the first with at least
   * `minTotalMib` of memory in all when one has, else the first free one. Undefined when every GPU
   * is taken. A GPU is judged by its total memory, as placement judges the provider: one no job of
   * this daemon holds has it all for the job (the memory free at the moment is not asked).
   */
  take(gpus: readonly Pick<Gpu, "index" | "vram_mib">[], minTotalMib = 0): number | undefined {
    const free = gpus.filter((g): g is typeof g & { index: number } => g.index !== null && !this.busy.has(g.index));
    const pick = free.find((g) => (g.vram_mib ?? 0) >= minTotalMib) ?? free[0];
    if (!pick) return undefined;
    this.busy.add(pick.index);
    return pick.index;
  }

  /** Gives a GPU back (nothing for undefined). */
  release(index: number | undefined): void {
    if (index !== undefined) this.busy.delete(index);
  }

  /** The GPUs taken now, by index. */
  taken(): number[] {
    return [...this.busy].sort((a, b) => a - b);
  }
}
