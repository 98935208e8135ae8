// /v1 gateway overhead: the same chat completion sent straight to an
// OpenAI-compatible upstream and through the gateway, one command.
//
//   npx tsx bench/v1.ts [--connections 32 --seconds 10 --renters 8 --stream]
//
// - Database: a fresh database on DATABASE_URL when set (dropped afterwards),
//   otherwise a real embedded PostgreSQL in .data/bench-pg.
// - Server: the build (as `npm start` runs it) in a child process on a free loopback port with
//   SVC_RATE_LIMITS=off and LOG_LEVEL=warn.
// - Upstream: the tests' fake vLLM (test/v1/fake-vllm.ts) in this process,
//   answering at once, registered through vllm_serve submit + endpoint-ready.
// - Load: `connections` keep-alive connections, one request in flight each,
//   spread over `renters` renters. Every gateway request is billed (two short
//   transactions: reserve, charge); one renter's charges serialize on its
//   balance row, so per-renter throughput is bounded by the charge commit.
// The last line printed is one JSON object with the figures.
import crypto from "node:crypto";
import http from "node:http";
import os from "node:os";
import path from "node:path";
import { parseArgs } from "node:util";
import { startFakeVllm } from "../test/v1/fake-vllm.js";
import { DAEMON_RELEASE } from "../src/shared/daemon-release.js";
import { benchDatabase, noter, startServers } from "./lib.js";

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
const MANAGED_EMAIL = "managed-endpoints@bench.test";
const note = noter("bench:v1");

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
  const db = await benchDatabase("svc_bench_v1", note, 54900);
  const upstream = await startFakeVllm("bench");
  const servers = await startServers(1, db.url, {
    SVC_ADMIN_TOKEN: ADMIN_TOKEN,
    SVC_HMAC_SECRET: crypto.randomBytes(24).toString("hex"),
    SVC_DATA_DIR: path.join(os.tmpdir(), "svc-bench-v1"),
    SVC_V1_MANAGED_RENTERS: MANAGED_EMAIL,
  }).catch(async (err) => {
    await upstream.close();
    await db.close();
    throw err;
  });
  const base = `http://127.0.0.1:${servers.ports[0]}`;
  try {
    // The renters that send the requests (billed per token: a renter's own serving job would serve
    // it without a token charge).
    const renters: { api_key: string }[] = [];
    for (let i = 0; i < RENTERS; i++) {
      const renter = await json(base, "POST", "/api/renters/register", { name: "Bench", email: `bench.${Date.now()}.${i}@example.com` });
      await json(base, "POST", "/api/renters/topup", { amount_halala: 10_000_000 }, { "x-renter-key": renter.api_key });
      renters.push(renter);
    }
    // The managed-endpoint account runs the public serving job, once it proved its address (one step
    // without email delivery; the sign-in's key is the one that counts).
    await json(base, "POST", "/api/renters/register", { name: "Managed endpoints", email: MANAGED_EMAIL });
    const managed = (await json(base, "POST", "/api/renters/login-email", { email: MANAGED_EMAIL })).api_key as string;
    await json(base, "POST", "/api/renters/topup", { amount_halala: 10_000_000 }, { "x-renter-key": managed });
    const provider = await json(base, "POST", "/api/providers/register", { name: "Rig", email: `rig.${Date.now()}@example.com`, gpu_model: "NVIDIA H100 80GB HBM3", os: "linux" });
    await json(base, "POST", `/api/admin/providers/${provider.provider_id}/approve`, {}, { "x-admin-token": ADMIN_TOKEN });
    await json(base, "POST", "/api/providers/heartbeat", { api_key: provider.api_key, gpu_status: { gpu_name: "NVIDIA H100 80GB HBM3", gpu_vram_mib: 81559, gpu_count: 1, daemon_version: DAEMON_RELEASE } });
    const job = await json(base, "POST", "/api/jobs/submit", { job_type: "vllm_serve", params: { model: MODEL, public: true }, provider_id: provider.provider_id, duration_minutes: 60, max_duration_seconds: 3600 }, { "x-renter-key": managed });
    // The provider's daemon polls the job, then reports its endpoint.
    const polled = await json(base, "GET", `/api/providers/${provider.api_key}/jobs`);
    if (polled.job?.job_id !== job.job.job_id) throw new Error(`the provider polled ${JSON.stringify(polled.job?.job_id)}, not the serving job`);
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
    await servers.stop();
    await upstream.close();
    await db.close();
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
