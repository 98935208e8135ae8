// /v1 gateway overhead: the same chat completion sent straight to an
// OpenAI-compatible upstream and through the gateway, one command.
//
//   npx tsx bench/v1.ts [--connections 32 --seconds 10 --renters 8 --stream]
//
// - Database: a fresh database on DATABASE_URL when set (dropped afterwards),
//   otherwise a real embedded PostgreSQL in .data/bench-pg.
// - Server: `src/main.ts` in a child process on a free loopback port with
//   SVC_RATE_LIMITS=off and LOG_LEVEL=warn.
// - Upstream: the tests' fake vLLM (test/v1/fake-vllm.ts) in this process,
//   answering at once, registered through vllm_serve submit + endpoint-ready.
// - Load: `connections` keep-alive connections, one request in flight each,
//   spread over `renters` renters. Every gateway request is billed (two short
//   transactions: reserve, charge); one renter's charges serialize on its
//   balance row, so per-renter throughput is bounded by the charge commit.
// The last line printed is one JSON object with the figures.
import { spawn } from "node:child_process";
import crypto from "node:crypto";
import http from "node:http";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { parseArgs } from "node:util";
import { connect } from "../src/db/index.js";
import { startEmbedded, type EmbeddedServer } from "../src/db/embedded.js";
import { createLogger } from "../src/log.js";
import { startFakeVllm } from "../test/v1/fake-vllm.js";

const { values: args } = parseArgs({
  options: {
    connections: { type: "string", default: "32" },
    seconds: { type: "string", default: "10" },
    stream: { type: "boolean", default: false },
    renters: { type: "string", default: "8" },
  },
});
const CONNECTIONS = Number(args.connections);
const SECONDS = Number(args.seconds);
const RENTERS = Number(args.renters);
const MODEL = "TinyLlama/TinyLlama-1.1B-Chat-v1.0";
const ADMIN_TOKEN = `bench-admin-${crypto.randomBytes(12).toString("hex")}`;
const note = (msg: string) => process.stderr.write(`[bench] ${msg}\n`);

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const port = (s.address() as net.AddressInfo).port;
      s.close(() => resolve(port));
    });
  });
}

async function json(base: string, method: string, p: string, body?: unknown, headers: Record<string, string> = {}) {
  const r = await fetch(base + p, { method, headers: { "content-type": "application/json", ...headers }, body: body === undefined ? undefined : JSON.stringify(body) });
  const text = await r.text();
  if (r.status >= 300) throw new Error(`${method} ${p}: ${r.status} ${text}`);
  return JSON.parse(text);
}

interface Run {
  requests: number;
  errors: number;
  rps: number;
  p50_ms: number;
  p90_ms: number;
  p99_ms: number;
}

/** `CONNECTIONS` loops of one request at a time for `SECONDS`. */
async function load(url: string, headersOf: (connection: number) => Record<string, string>, body: string): Promise<Run> {
  const agent = new http.Agent({ keepAlive: true, maxSockets: CONNECTIONS });
  const u = new URL(url);
  const lat: number[] = [];
  let errors = 0;
  const started = performance.now();
  const deadline = started + SECONDS * 1000;
  const one = (headers: Record<string, string>) =>
    new Promise<number>((resolve) => {
      const req = http.request(
        { host: u.hostname, port: u.port, path: u.pathname, method: "POST", agent, headers: { "content-type": "application/json", "content-length": Buffer.byteLength(body), ...headers } },
        (res) => {
          res.resume();
          res.on("end", () => resolve(res.statusCode ?? 0));
        },
      );
      req.on("error", () => resolve(0));
      req.end(body);
    });
  await Promise.all(
    Array.from({ length: CONNECTIONS }, async (_, c) => {
      const headers = headersOf(c);
      while (performance.now() < deadline) {
        const t = performance.now();
        const status = await one(headers);
        if (status === 200) lat.push(performance.now() - t);
        else errors++;
      }
    }),
  );
  const elapsed = (performance.now() - started) / 1000;
  agent.destroy();
  lat.sort((a, b) => a - b);
  const q = (f: number) => Math.round((lat[Math.min(lat.length - 1, Math.floor(f * lat.length))] ?? 0) * 100) / 100;
  return { requests: lat.length, errors, rps: Math.round(lat.length / elapsed), p50_ms: q(0.5), p90_ms: q(0.9), p99_ms: q(0.99) };
}

async function main() {
  let embedded: EmbeddedServer | undefined;
  let baseUrl = process.env.DATABASE_URL;
  if (!baseUrl) {
    embedded = await startEmbedded(path.resolve(".data/bench-pg"), createLogger("warn"), 54900);
    baseUrl = embedded.url;
  }
  const dbName = `svc_bench_${crypto.randomBytes(4).toString("hex")}`;
  const admin = connect(baseUrl, 1);
  await admin.unsafe(`CREATE DATABASE ${dbName}`);
  const dbUrl = new URL(baseUrl);
  dbUrl.pathname = `/${dbName}`;
  const port = await freePort();
  const base = `http://127.0.0.1:${port}`;
  const upstream = await startFakeVllm("bench");
  const child = spawn(process.execPath, ["--import", "tsx", "src/main.ts"], {
    env: {
      ...process.env,
      DATABASE_URL: dbUrl.toString(),
      PORT: String(port),
      HOST: "127.0.0.1",
      SVC_ADMIN_TOKEN: ADMIN_TOKEN,
      SVC_HMAC_SECRET: crypto.randomBytes(24).toString("hex"),
      SVC_DATA_DIR: path.join(os.tmpdir(), "svc-bench-v1"),
      SVC_RATE_LIMITS: "off",
      LOG_LEVEL: "warn",
    },
    stdio: ["ignore", "inherit", "inherit"],
  });
  try {
    for (let i = 0; ; i++) {
      if (child.exitCode !== null) throw new Error(`server exited with ${child.exitCode}`);
      if (i > 300) throw new Error("server did not become ready within 60 s");
      const ok = await fetch(`${base}/readyz`).then((r) => r.status === 200, () => false);
      if (ok) break;
      await new Promise((r) => setTimeout(r, 200));
    }
    const renters: { api_key: string }[] = [];
    for (let i = 0; i < RENTERS; i++) {
      const renter = await json(base, "POST", "/api/renters/register", { name: "Bench", email: `bench.${Date.now()}.${i}@example.com` });
      await json(base, "POST", "/api/renters/topup", { amount_halala: 10_000_000 }, { "x-renter-key": renter.api_key });
      renters.push(renter);
    }
    const renter = renters[0];
    const provider = await json(base, "POST", "/api/providers/register", { name: "Rig", email: `rig.${Date.now()}@example.com`, gpu_model: "NVIDIA H100 80GB HBM3", os: "linux" });
    await json(base, "POST", `/api/admin/providers/${provider.provider_id}/approve`, {}, { "x-admin-token": ADMIN_TOKEN });
    await json(base, "POST", "/api/providers/heartbeat", { api_key: provider.api_key, gpu_status: { gpu_name: "NVIDIA H100 80GB HBM3", gpu_vram_mib: 81559, gpu_count: 1, daemon_version: "3.2.0" } });
    const job = await json(base, "POST", "/api/jobs/submit", { job_type: "vllm_serve", params: { model: MODEL }, provider_id: provider.provider_id, duration_minutes: 60, max_duration_seconds: 3600 }, { "x-renter-key": renter.api_key });
    await json(base, "POST", `/api/jobs/${job.job.job_id}/endpoint-ready`, { api_key: provider.api_key, endpoint_url: `${upstream.url}/v1` });

    const body = JSON.stringify({ model: MODEL, messages: [{ role: "user", content: "Say hello" }], max_tokens: 16, stream: args.stream });
    note(`direct to the upstream, ${CONNECTIONS} connections, ${SECONDS} s`);
    const direct = await load(`${upstream.url}/v1/chat/completions`, () => ({}), body);
    note(`through the gateway, ${CONNECTIONS} connections, ${SECONDS} s`);
    const gateway = await load(`${base}/v1/chat/completions`, (c) => ({ authorization: `Bearer ${renters[c % RENTERS].api_key}` }), body);
    let billed = 0;
    for (const r of renters) billed += (await json(base, "GET", "/v1/usage", undefined, { authorization: `Bearer ${r.api_key}` })).requests;
    if (billed < gateway.requests) throw new Error(`billed ${billed} of ${gateway.requests} requests`);
    console.log(JSON.stringify({ stream: args.stream, connections: CONNECTIONS, renters: RENTERS, seconds: SECONDS, direct, gateway, billed_requests: billed, cpus: os.cpus().length }));
  } finally {
    child.kill("SIGTERM");
    await new Promise((r) => child.once("exit", r));
    await upstream.close();
    await admin.unsafe(`DROP DATABASE IF EXISTS ${dbName} WITH (FORCE)`);
    await admin.end();
    await embedded?.stop();
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
