// The GPUs the operator lets the daemon use: CUDA_VISIBLE_DEVICES in the
// daemon's own environment. The daemon then reports, and hands its jobs, only
// those (the server gives a provider one job per GPU it reports).

export interface GpuId {
  index: number | null;
  uuid: string | null;
}

/**
 * The GPUs among `gpus` that `visible` (CUDA_VISIBLE_DEVICES) names, in their own order. Its
 * comma-separated entries are nvidia-smi indices or GPU UUIDs (`GPU-...`, or a prefix naming one
 * GPU); unset: every GPU; empty: none. As CUDA reads it, an entry that names no GPU ends the list
 * (so `-1` hides them all): `ignored` holds it and the entries after it.
 */
export function visibleGpus<G extends GpuId>(gpus: readonly G[], visible: string | undefined): { gpus: G[]; ignored: string[] } {
  if (visible === undefined) return { gpus: [...gpus], ignored: [] };
  const entries = visible.trim() === "" ? [] : visible.split(",").map((e) => e.trim());
  const chosen = new Set<G>();
  for (const [at, entry] of entries.entries()) {
    const gpu = named(gpus, entry);
    if (!gpu) return { gpus: gpus.filter((g) => chosen.has(g)), ignored: entries.slice(at) };
    chosen.add(gpu);
  }
  return { gpus: gpus.filter((g) => chosen.has(g)), ignored: [] };
}

function named<G extends GpuId>(gpus: readonly G[], entry: string): G | undefined {
  if (/^\d+$/.test(entry)) return gpus.find((g) => g.index === Number(entry));
  if (!/^GPU-[0-9a-f-]+$/i.test(entry)) return undefined;
  const matches = gpus.filter((g) => g.uuid?.toLowerCase().startsWith(entry.toLowerCase()));
  return matches.length === 1 ? matches[0] : undefined;
}
