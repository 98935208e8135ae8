// The top of one or more V8 CPU profiles (.cpuprofile, as `node --cpu-prof`
// writes them; BENCH_CPU_PROF=dir on a bench): self time by function, by
// file (node_modules grouped by package) and by what the process was doing.
//
//   npx tsx bench/cpuprofile-top.ts [--top 25] [--callers regex] file.cpuprofile|dir ...
//
// --callers: for the functions whose name matches, the call paths (4 frames
// up) their self time came from. --inclusive: total time (self and callees)
// of the functions whose name matches, each counted once per sample.
import fs from "node:fs";
import path from "node:path";
import { parseArgs } from "node:util";

interface ProfileNode {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number };
  children?: number[];
}
interface Profile {
  nodes: ProfileNode[];
  samples: number[];
  timeDeltas: number[];
}

const { values: args, positionals } = parseArgs({ options: { top: { type: "string", default: "25" }, callers: { type: "string" }, inclusive: { type: "string" } }, allowPositionals: true });
const TOP = Number(args.top);
const files = positionals.flatMap((p) =>
  fs.statSync(p).isDirectory() ? fs.readdirSync(p).filter((f) => f.endsWith(".cpuprofile")).map((f) => path.join(p, f)) : [p],
);
if (files.length === 0) {
  console.error("usage: tsx bench/cpuprofile-top.ts [--top N] file.cpuprofile|dir ...");
  process.exit(2);
}

/** Where a frame's code lives: a package under node_modules, a project file, node's own, or V8's. */
function fileOf(url: string): string {
  if (!url) return "(native)";
  const u = url.replace(/^file:\/\//, "");
  const nm = u.lastIndexOf("/node_modules/");
  if (nm >= 0) {
    const rest = u.slice(nm + "/node_modules/".length).split("/");
    return `npm:${rest[0].startsWith("@") ? `${rest[0]}/${rest[1]}` : rest[0]}`;
  }
  const src = u.search(/\/(src|bench|gen)\//);
  return src >= 0 ? u.slice(src + 1) : u;
}

const byFunction = new Map<string, number>();
const byFile = new Map<string, number>();
const byCallers = new Map<string, number>();
const byInclusive = new Map<string, number>();
const inclusiveOf = args.inclusive ? new RegExp(args.inclusive) : undefined;
const DEPTH = Number(process.env.CALLER_DEPTH ?? 4);
const callersOf = args.callers ? new RegExp(args.callers) : undefined;
const frameName = (n: ProfileNode) => `${n.callFrame.functionName || "(anonymous)"} ${fileOf(n.callFrame.url)}`;
let total = 0;
let idle = 0;
for (const file of files) {
  const prof = JSON.parse(fs.readFileSync(file, "utf8")) as Profile;
  const nodes = new Map(prof.nodes.map((n) => [n.id, n]));
  const parent = new Map<number, number>();
  for (const n of prof.nodes) for (const c of n.children ?? []) parent.set(c, n.id);
  // A sample's time is the delta to the next sample (the last one's is unknown and dropped).
  for (let i = 0; i < prof.samples.length - 1; i++) {
    const n = nodes.get(prof.samples[i])!;
    const us = Math.max(0, prof.timeDeltas[i + 1]);
    const { functionName, url, lineNumber } = n.callFrame;
    if (functionName === "(idle)") {
      idle += us;
      continue;
    }
    const f = fileOf(url);
    const key = `${functionName || "(anonymous)"}  ${f}${url ? `:${lineNumber + 1}` : ""}`;
    byFunction.set(key, (byFunction.get(key) ?? 0) + us);
    byFile.set(f, (byFile.get(f) ?? 0) + us);
    if (inclusiveOf) {
      const seen = new Set<string>();
      for (let id: number | undefined = n.id; id !== undefined; id = parent.get(id)) {
        const fn = nodes.get(id)!;
        if (inclusiveOf.test(fn.callFrame.functionName)) seen.add(frameName(fn));
      }
      for (const k of seen) byInclusive.set(k, (byInclusive.get(k) ?? 0) + us);
    }
    if (callersOf?.test(functionName)) {
      const chain: string[] = [];
      for (let id = parent.get(n.id); id !== undefined && chain.length < DEPTH; id = parent.get(id)) chain.push(frameName(nodes.get(id)!));
      const k = `${functionName} <- ${chain.join(" <- ")}`;
      byCallers.set(k, (byCallers.get(k) ?? 0) + us);
    }
    total += us;
  }
}

const print = (title: string, m: Map<string, number>) => {
  console.log(`${title}: share of ${(total / 1e6).toFixed(2)} s busy (${(idle / 1e6).toFixed(2)} s idle) in ${files.length} profile(s)`);
  for (const [k, us] of [...m].sort((a, b) => b[1] - a[1]).slice(0, TOP)) {
    console.log(`${((100 * us) / total).toFixed(1).padStart(5)}%  ${(us / 1000).toFixed(0).padStart(7)} ms  ${k}`);
  }
  console.log();
};
print("self time by function", byFunction);
print("self time by file", byFile);
if (inclusiveOf) print(`inclusive time of /${args.inclusive}/`, byInclusive);
if (callersOf) print(`callers of /${args.callers}/`, byCallers);
