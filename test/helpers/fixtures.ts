// Ready-made accounts for tests: registered over real HTTP, then brought to
// the state a test needs (funded, approved and online) through the domain.
import { credit } from "../../src/domain/money/ledger.js";
import type { TestServer } from "./server.js";
import { client, uniqueEmail } from "./http.js";

export async function makeRenter(srv: TestServer, fundsHalala = 0) {
  const api = client(srv.url);
  const r = await api.post("/api/renters/register", { name: "Renter", email: uniqueEmail("renter") });
  if (r.status !== 201) throw new Error(`renter register failed: ${r.status} ${r.text}`);
  const id: number = r.body.renter_id;
  if (fundsHalala > 0) {
    await srv.sql.begin((tx) => credit(tx, id, fundsHalala, `test-fund:${id}:${Date.now()}:${Math.random()}`));
  }
  return { id, key: r.body.api_key as string, headers: { "x-renter-key": r.body.api_key as string } };
}

export interface ProviderOptions {
  gpuModel?: string;
  vramMib?: number;
  approved?: boolean;
  online?: boolean;
}

export async function makeProvider(srv: TestServer, opts: ProviderOptions = {}) {
  const api = client(srv.url);
  const gpuModel = opts.gpuModel ?? "NVIDIA GeForce RTX 4090";
  const r = await api.post("/api/providers/register", { name: "Rig", email: uniqueEmail("provider"), gpu_model: gpuModel, os: "linux" });
  if (r.status !== 200) throw new Error(`provider register failed: ${r.status} ${r.text}`);
  const id: number = r.body.provider_id;
  const approved = opts.approved ?? true;
  const online = opts.online ?? true;
  await srv.sql`
    UPDATE providers SET
      approval_status = ${approved ? "approved" : "pending"},
      status = ${online ? "online" : "registered"},
      last_heartbeat = ${online ? new Date() : null},
      gpu_vram_mib = ${opts.vramMib ?? 24576},
      gpu_count = 1
    WHERE id = ${id}`;
  return { id, key: r.body.api_key as string, headers: { "x-provider-key": r.body.api_key as string } };
}
