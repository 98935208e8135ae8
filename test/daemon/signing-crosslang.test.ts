// The Python daemon's canonical JSON and HMAC agree with the server's
// (src/shared/task-signature.ts) byte for byte, checked with the machine's
// python3 on hand-picked edge cases (integral floats, exponents, UTF-16 key
// order, escapes, lone surrogates) and on random values; and both daemons'
// nvidia-smi parsers read the captured-format output the same way.
import crypto from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { describe, expect, it } from "vitest";
import { canonicalJson, signTask } from "../../src/shared/task-signature.js";
import { parseCudaVersion, parseGpuCsv } from "../../src/daemon/ts/nvidia-smi.js";
import { verifyTaskSignature, taskSigner } from "../../src/shared/task-signature.js";
import { FIXTURES, python } from "./helpers.js";

const SECRET = "cross-language-secret-0123456789";

const EDGE_CASES = [
  "1.0", "-0.0", "0", "1e21", "1e20", "123456789012345678901", "1e-7", "0.000001", "0.1", "-1.5e-10", "5e-324", "1.7976931348623157e308",
  "9007199254740993", "2.5e+25", "100", "0.30000000000000004", "123.456", "1E3", "-0",
  '"plain"', '"quote \\" backslash \\\\ slash /"', '"\\u0000\\u0001\\u001f\\b\\f\\n\\r\\t"', '"\\u007f\\u0080\\u2028\\u2029"', '"emoji 😀 é 中文"',
  '"lone \\ud800 surrogate"', '"\\udfff"',
  '{"b":1,"a":2,"aa":3,"A":4,"":5}',
  '{"\\ud83d\\ude00":1,"\\uff61":2,"é":3,"z":4}',
  '{"nested":{"z":[1,2.0,{"y":null,"x":true}],"a":false},"list":[[],{}]}',
  '{"version":1,"job_id":"job-abc","inputs":{"prompt":"héllo\\nworld","temperature":0.7,"max_tokens":512.0},"limits":{"max_duration_seconds":1800}}',
];

function randomValue(depth: number, rnd: () => number): unknown {
  const r = rnd();
  if (depth > 3 || r < 0.35) {
    const k = Math.floor(rnd() * 7);
    if (k === 0) return Math.floor(rnd() * 2 ** 40) - 2 ** 39;
    if (k === 1) return (rnd() - 0.5) * 10 ** Math.floor(rnd() * 40 - 20);
    if (k === 2) return rnd() < 0.5;
    if (k === 3) return null;
    if (k === 4) return Math.round(rnd() * 1e6) / 1000;
    const chars = [..."abcXYZ09 _-\"\\/\n\té中😀\u0001\u2028"];
    return Array.from({ length: Math.floor(rnd() * 8) }, () => chars[Math.floor(rnd() * chars.length)]).join("");
  }
  if (r < 0.6) return Array.from({ length: Math.floor(rnd() * 4) }, () => randomValue(depth + 1, rnd));
  const o: Record<string, unknown> = {};
  const keys = ["a", "B", "b", "ab", "é", "中", "😀", "key_1", "Key", "", "z"];
  for (let i = 0; i < Math.floor(rnd() * 5); i++) o[keys[Math.floor(rnd() * keys.length)]] = randomValue(depth + 1, rnd);
  return o;
}

function seeded(seed: number) {
  return () => {
    seed = (seed * 1103515245 + 12345) % 2 ** 31;
    return seed / 2 ** 31;
  };
}

const PY_CANON = `
import json, sys, svc_daemon
out = []
for text in json.load(sys.stdin):
    value = json.loads(text)
    out.append([svc_daemon.canonical_json(value), svc_daemon.sign_task(${JSON.stringify(SECRET)}, value)])
sys.stdout.write(json.dumps(out))
`;

describe("canonical JSON and HMAC: Python daemon = server", () => {
  it("agree on the edge cases and on 500 random values", () => {
    const rnd = seeded(42);
    const texts = [...EDGE_CASES, ...Array.from({ length: 500 }, () => JSON.stringify(randomValue(0, rnd)))];
    const py: [string, string][] = JSON.parse(python(PY_CANON, JSON.stringify(texts)));
    expect(py).toHaveLength(texts.length);
    texts.forEach((text, i) => {
      const value = JSON.parse(text);
      expect(py[i][0], `canonical of ${text}`).toBe(canonicalJson(value));
      expect(py[i][1], `hmac of ${text}`).toBe(signTask(SECRET, value));
    });
    // The forms that naive json.dumps(sort_keys=True) gets wrong.
    expect(canonicalJson(JSON.parse("1.0"))).toBe("1");
    expect(py[EDGE_CASES.indexOf("1e21")][0]).toBe("1e+21");
    expect(py[EDGE_CASES.indexOf("1e-7")][0]).toBe("1e-7");
    expect(py[EDGE_CASES.indexOf('{"\\ud83d\\ude00":1,"\\uff61":2,"é":3,"z":4}')][0]).toBe('{"z":4,"é":3,"😀":1,"｡":2}');
  });

  it("verify_task refuses a changed task or a malformed signature", () => {
    const task = { job_id: "job-1", inputs: { n: 1 } };
    const sig = signTask(SECRET, task);
    const out = python(
      `import json, svc_daemon\nt = ${JSON.stringify(JSON.stringify(task))}\nv = json.loads(t)\nprint(svc_daemon.verify_task(${JSON.stringify(SECRET)}, v, ${JSON.stringify(sig)}), svc_daemon.verify_task(${JSON.stringify(SECRET)}, dict(v, inputs={"n": 2}), ${JSON.stringify(sig)}), svc_daemon.verify_task(${JSON.stringify(SECRET)}, v, "zz"), svc_daemon.verify_task("other-secret-0123456789", v, ${JSON.stringify(sig)}))`,
    );
    expect(out.trim()).toBe("True False False False");
  });
});

describe("stream task signature (Ed25519)", () => {
  it("verifies with the public key only, and fails for another job, task or key", () => {
    const seed = crypto.randomBytes(32);
    const signer = taskSigner(seed);
    const task = { inputs: { prompt: "x" }, n: 1.5 };
    const sig = signer.sign("job-1", task);
    expect(verifyTaskSignature(signer.publicKey, "job-1", task, sig)).toBe(true);
    expect(verifyTaskSignature(signer.publicKey, "job-2", task, sig)).toBe(false);
    expect(verifyTaskSignature(signer.publicKey, "job-1", { ...task, n: 2 }, sig)).toBe(false);
    expect(verifyTaskSignature(taskSigner(crypto.randomBytes(32)).publicKey, "job-1", task, sig)).toBe(false);
    expect(verifyTaskSignature(signer.publicKey, "job-1", task, "")).toBe(false);
    // Deterministic: every server process reading the same seed has the same key.
    expect(taskSigner(Buffer.from(seed)).publicKey).toBe(signer.publicKey);
  });
});

describe("nvidia-smi parsing (both daemons, captured-format output)", () => {
  const twoGpus = fs.readFileSync(path.join(FIXTURES, "nvidia-smi-query-2gpu.csv"), "utf8");
  const h100 = fs.readFileSync(path.join(FIXTURES, "nvidia-smi-query-h100.csv"), "utf8");
  const banner = fs.readFileSync(path.join(FIXTURES, "nvidia-smi.txt"), "utf8");

  it("reads every field, unknown cells as null, and the CUDA version from the banner", () => {
    const gpus = parseGpuCsv(twoGpus);
    expect(gpus).toHaveLength(2);
    expect(gpus[0]).toEqual({
      index: 0, name: "NVIDIA GeForce RTX 4090", uuid: "GPU-5c7e4b6a-2b8f-4d2a-9a53-0e1f7f2c9d11", vram_mib: 24564, vram_used_mib: 1187,
      vram_free_mib: 22936, utilization_pct: 7, memory_utilization_pct: 2, temperature_c: 43, power_w: 31.52, power_limit_w: 450,
      sm_clock_mhz: 2235, driver_version: "550.54.15", pci_bus_id: "00000000:01:00.0", compute_capability: "8.9",
    });
    expect(gpus[1].power_w).toBeNull(); // [N/A]
    expect(parseGpuCsv(h100)[0]).toMatchObject({ name: "NVIDIA H100 80GB HBM3", vram_mib: 81559, compute_capability: "9.0", power_w: 69.87 });
    expect(parseCudaVersion(banner)).toBe("12.4");
    expect(parseGpuCsv("")).toEqual([]);
    expect(parseCudaVersion("No devices were found")).toBeNull();
  });

  it("the Python daemon parses the same output to the same values", () => {
    const py = JSON.parse(
      python(`import json, sys, svc_daemon\ndata = json.load(sys.stdin)\nprint(json.dumps([svc_daemon.parse_gpu_csv(data[0]), svc_daemon.parse_gpu_csv(data[1]), svc_daemon.parse_cuda_version(data[2])]))`, JSON.stringify([twoGpus, h100, banner])),
    );
    expect(py[0]).toEqual(parseGpuCsv(twoGpus));
    expect(py[1]).toEqual(parseGpuCsv(h100));
    expect(py[2]).toBe("12.4");
  });
});
