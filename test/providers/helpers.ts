// Provider-side test helpers: accounts made over real HTTP, approval through
// the admin API, and clock edits for liveness edges.
import { client, uniqueEmail } from "../helpers/http.js";
import { ADMIN_TOKEN, type TestServer } from "../helpers/server.js";
import { heartbeatPipeline } from "../../src/domain/providers/heartbeat.js";

export const ADMIN = { "x-admin-token": ADMIN_TOKEN };

export interface TestProvider {
  id: number;
  key: string;
  email: string;
}

/** Registers a provider over HTTP; approved through the admin API unless `approve` is false. */
export async function newProvider(srv: TestServer, opts: { approve?: boolean; gpuModel?: string; name?: string } = {}): Promise<TestProvider> {
  const api = client(srv.url);
  const email = uniqueEmail("prov");
  const r = await api.post("/api/providers/register", { name: opts.name ?? "Rig", email, gpu_model: opts.gpuModel ?? "NVIDIA GeForce RTX 4090", os: "linux" });
  if (r.status !== 200) throw new Error(`register failed: ${r.status} ${r.text}`);
  const p = { id: r.body.provider_id as number, key: r.body.api_key as string, email };
  if (opts.approve !== false) {
    const a = await api.post(`/api/admin/providers/${p.id}/approve`, {}, ADMIN);
    if (a.status !== 200) throw new Error(`approve failed: ${a.status} ${a.text}`);
  }
  return p;
}

export function gpuStatus(vramMib = 24564, extra: Record<string, unknown> = {}) {
  return {
    gpu_name: "NVIDIA GeForce RTX 4090",
    gpu_vram_mib: vramMib,
    driver_version: "550.54.14",
    gpu_util_pct: 37.5,
    temp_c: 61,
    power_w: 210.5,
    free_vram_mib: 20000,
    daemon_version: "5.0.0",
    python_version: "3.11.8",
    os_info: "Ubuntu 22.04",
    compute_capability: "8.9",
    cuda_version: "12.4",
    gpu_count: 1,
    all_gpus: [{ index: 0, name: "NVIDIA GeForce RTX 4090", vram_mib: vramMib }],
    ...extra,
  };
}

export function heartbeat(srv: TestServer, key: string, body: Record<string, unknown> = {}) {
  return client(srv.url).post("/api/providers/heartbeat", { api_key: key, gpu_status: gpuStatus(), ...body });
}

/** Writes buffered heartbeat telemetry now (the flusher would within 250 ms). */
export function flushHeartbeats(srv: TestServer) {
  return heartbeatPipeline(srv.app.deps).flush();
}

/** Sets a provider's last heartbeat `seconds` ago (and forgets it in the caches, like another process would not). */
export async function heardSecondsAgo(srv: TestServer, id: number, seconds: number) {
  await flushHeartbeats(srv);
  await srv.sql`UPDATE providers SET last_heartbeat = now() - make_interval(secs => ${seconds}) WHERE id = ${id}`;
}
