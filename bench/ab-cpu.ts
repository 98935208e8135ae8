// A/B of CPU per submit: bench:jobs run alternately with the servers of two
// checkouts (BENCH_SERVER_DIR), the load generator and the measurement always
// this checkout's, so both sides are measured by one harness. Rounds
// alternate the order (AB, BA, AB, ...) so that a drift in the machine's load
// falls on both. Prints each run, the medians and the ratios B/A as JSON.
// --phase open takes the figures of the open-loop phase instead (give
// bench:jobs --open-loop RATE): both sides then carry the same submits/s, so
// their batches are alike and CPU per submit compares at equal load.
//
//   npx tsx bench/ab-cpu.ts --a ../base-checkout [--b .] [--runs 3] -- --connections 32 --seconds 15
//   npx tsx bench/ab-cpu.ts --a ../base-checkout --phase open -- --seconds 3 --open-loop 300 --open-seconds 15
import { spawnSync } from "node:child_process";
import os from "node:os";
import path from "node:path";
import { parseArgs } from "node:util";

const { values: args, positionals: benchArgs } = parseArgs({
  options: { a: { type: "string" }, b: { type: "string", default: "." }, runs: { type: "string", default: "3" }, phase: { type: "string", default: "closed" } },
  allowPositionals: true,
});
if (!args.a) {
  console.error("usage: tsx bench/ab-cpu.ts --a <checkout> [--b <checkout>] [--runs N] -- <bench:jobs flags>");
  process.exit(2);
}
const sides = { A: path.resolve(args.a), B: path.resolve(args.b!) };
const FIGURES = [
  "server_cpu_ms_per_submit", "database_cpu_ms_per_submit", "database_shared_cpu_ms_per_submit", "load_generator_cpu_ms_per_submit",
  "submits_per_s", "submit_p50_ms", "submit_p99_ms", "young_gc_ms",
] as const;
type Row = Record<(typeof FIGURES)[number] | "load_average_1m", number>;

function runOnce(side: "A" | "B"): Row {
  const load = os.loadavg()[0];
  const r = spawnSync(process.execPath, ["--import", "tsx", "bench/jobs.ts", ...benchArgs], {
    env: { ...process.env, BENCH_SERVER_DIR: sides[side] },
    stdio: ["ignore", "pipe", "inherit"],
    encoding: "utf8",
    maxBuffer: 64 << 20,
  });
  const last = r.stdout.trim().split("\n").at(-1) ?? "";
  if (r.status !== 0 || !last.startsWith("{")) throw new Error(`bench:jobs (${side}) failed with ${r.status}: ${last}`);
  const whole = JSON.parse(last) as Record<string, unknown>;
  const out = args.phase === "open" ? (whole.open_loop as Record<string, unknown> | undefined) : whole;
  if (!out) throw new Error("no open_loop figures: give bench:jobs --open-loop RATE");
  const verified = whole.verified as { one_job_per_201: boolean; held_equals_estimates: boolean; ledger_problems: number };
  if (!verified.one_job_per_201 || !verified.held_equals_estimates || verified.ledger_problems !== 0) {
    throw new Error(`bench:jobs (${side}) did not verify: ${JSON.stringify(verified)}`);
  }
  // The server's young-generation collections, in all (the open-loop phase reports them).
  const stalls = out.server_stalls as { gc?: { minor?: { total_ms: number } } } | undefined;
  const figures: Record<string, unknown> = { ...out, young_gc_ms: stalls?.gc?.minor?.total_ms ?? NaN };
  const row = Object.fromEntries(FIGURES.map((f) => [f, Number(figures[f])])) as Row;
  row.load_average_1m = Math.round(load * 100) / 100;
  return row;
}

const median = (xs: number[]) => {
  const s = [...xs].sort((x, y) => x - y);
  return Math.round(1000 * (s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2)) / 1000;
};

const runs: { side: "A" | "B"; row: Row }[] = [];
for (let round = 0; round < Number(args.runs); round++) {
  for (const side of round % 2 === 0 ? (["A", "B"] as const) : (["B", "A"] as const)) {
    process.stderr.write(`[ab-cpu] round ${round + 1}, ${side} (${sides[side]})\n`);
    const row = runOnce(side);
    runs.push({ side, row });
    console.log(JSON.stringify({ side, ...row }));
  }
}
const medians = (side: "A" | "B") =>
  Object.fromEntries(FIGURES.map((f) => [f, median(runs.filter((r) => r.side === side).map((r) => r.row[f]))])) as Record<(typeof FIGURES)[number], number>;
const [a, b] = [medians("A"), medians("B")];
const ratio = Object.fromEntries(FIGURES.map((f) => [f, Math.round((100 * b[f]) / a[f]) / 100]));
console.log(JSON.stringify({ a: sides.A, b: sides.B, phase: args.phase, runs_each: Number(args.runs), median_a: a, median_b: b, ratio_b_over_a: ratio, load_average_1m_end: Math.round(os.loadavg()[0] * 100) / 100 }));
