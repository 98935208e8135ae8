// The built-in benchmark job (process executor): measures this host with no
// container. Reads the job from stdin; suites quick, matmul, memory and full
// run here; llm and image need a model runtime and are refused. Prints
// "SVC_PROGRESS <pct> <phase>" lines and writes {scores, response} to
// $SVC_RESULT_FILE.
import fs from "node:fs";
import os from "node:os";

const job = JSON.parse(fs.readFileSync(0, "utf8") || "{}");
const inputs = job.task_spec?.inputs ?? {};
const suite = inputs.suite ?? "quick";
const iterations = Math.max(1, Math.min(1000, Number(inputs.iterations ?? 10)));
const suites = { quick: ["matmul"], matmul: ["matmul"], memory: ["memory"], full: ["matmul", "memory"] };
if (!suites[suite]) {
  console.error(`benchmark suite "${suite}" needs a model runtime; this daemon runs quick, matmul, memory and full natively`);
  process.exit(2);
}

function matmul(n) {
  const a = new Float64Array(n * n).map((_, i) => (i % 7) + 1);
  const b = new Float64Array(n * n).map((_, i) => (i % 5) + 1);
  const c = new Float64Array(n * n);
  const t = performance.now();
  for (let i = 0; i < n; i++)
    for (let k = 0; k < n; k++) {
      const aik = a[i * n + k];
      for (let j = 0; j < n; j++) c[i * n + j] += aik * b[k * n + j];
    }
  return (2 * n ** 3) / ((performance.now() - t) / 1000) / 1e9;
}

function memory(bytes) {
  const src = Buffer.alloc(bytes, 7);
  const dst = Buffer.alloc(bytes);
  const t = performance.now();
  src.copy(dst);
  return (2 * bytes) / ((performance.now() - t) / 1000) / 1e9;
}

const scores = {};
const tests = suites[suite];
let step = 0;
const total = tests.length * iterations;
for (const test of tests) {
  const samples = [];
  for (let i = 0; i < iterations; i++) {
    samples.push(test === "matmul" ? matmul(128) : memory(64 * 1024 * 1024));
    step++;
    console.log(`SVC_PROGRESS ${Math.floor((100 * step) / total)} ${test}`);
  }
  samples.sort((x, y) => x - y);
  const median = samples[Math.floor(samples.length / 2)];
  scores[test === "matmul" ? "cpu_matmul_gflops" : "memory_copy_gb_s"] = Math.round(median * 1000) / 1000;
  console.log(`${test}: median ${median.toFixed(3)} over ${iterations} runs`);
}
const summary = Object.entries(scores).map(([k, v]) => `${k}=${v}`).join(" ");
fs.writeFileSync(
  process.env.SVC_RESULT_FILE,
  JSON.stringify({ scores, suite, iterations, host: { cpus: os.cpus().length, cpu_model: os.cpus()[0]?.model ?? "", ram_gb: Math.round(os.totalmem() / 1e9) }, response: summary }),
);
