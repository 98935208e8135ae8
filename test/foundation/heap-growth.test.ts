// SVC_HEAP_GROWTH_PERCENT: the same allocation pattern, in real Node
// processes, with and without the growing factor set the way main.ts sets it.
import { spawn } from "node:child_process";
import { describe, expect, it } from "vitest";
import { applyHeapGrowth } from "../../src/heap-growth.js";

/** A live set of a few tens of MB replaced slowly, beside fast garbage (about 2.5 s); prints the largest heap V8 sized. */
const WORKLOAD = `
  const live = new Map();
  for (let i = 0; i < 200000; i++) live.set(i, { a: i, b: "x" + i, c: [i, i + 1] });
  let peak = 0;
  const ring = new Array(100000);
  let k = 0;
  // A set number of rounds, not a time: on a busy machine a timed loop allocates less and V8 sizes for that.
  for (let round = 0; round < 800; round++) {
    for (let i = 0; i < 2000; i++) ring[k++ % ring.length] = { s: "y" + k, arr: new Array(30).fill(k) };
    live.set(k % 200000, { a: k, b: "z" + k, c: [k] });
    peak = Math.max(peak, v8.getHeapStatistics().total_heap_size);
  }
  console.log(JSON.stringify({ peakMb: peak / 1048576 }));
`;

function peakHeapMb(growthPercent: number): Promise<number> {
  // The child applies the flag through the same function as main.ts.
  const module = new URL("../../src/heap-growth.ts", import.meta.url).href;
  const script = `import v8 from "node:v8"; import { applyHeapGrowth } from ${JSON.stringify(module)}; applyHeapGrowth(${growthPercent});` + WORKLOAD;
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ["--import", "tsx", "--input-type=module", "-e", script], { stdio: ["ignore", "pipe", "inherit"] });
    let out = "";
    child.stdout.on("data", (d) => (out += d));
    child.on("error", reject);
    child.on("exit", (code) => (code === 0 ? resolve(JSON.parse(out).peakMb) : reject(new Error(`workload exited ${code}`))));
  });
}

describe("heap growth", () => {
  it("keeps the heap nearer its live set than V8's own factor does", async () => {
    const [own, capped] = await Promise.all([peakHeapMb(0), peakHeapMb(30)]);
    expect(capped).toBeLessThan(own * 0.7);
  }, 90_000); // two workloads of about 2.5 s each, which took 25 s beside a loaded suite

  it("leaves a --heap-growing-percent given to node alone, and 0 to V8", () => {
    expect(applyHeapGrowth(0, [])).toBe(false);
    expect(applyHeapGrowth(100, ["--heap-growing-percent=50"])).toBe(false);
  });
});
