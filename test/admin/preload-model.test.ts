// An operator's preload request over real HTTP: a body without model_name (a
// misspelt field, an empty form) is refused naming the field, and the request
// already made stays; "" is the one way to clear it.
import { describe, expect, it } from "vitest";
import { client } from "../helpers/http.js";
import { useTestServer } from "../helpers/server.js";
import { ADMIN, heartbeat, newProvider } from "../providers/helpers.js";

const srv = useTestServer({ SVC_LIVENESS_SWEEP_SECONDS: "0" });
const api = client(srv);

describe("preload-model", () => {
  it("refuses a body without model_name, leaving the request in place and unaudited", async () => {
    const p = await newProvider(srv);
    await heartbeat(srv, p.key);
    expect((await api.post(`/api/admin/providers/${p.id}/preload-model`, { model_name: "sdxl-turbo" }, ADMIN)).status).toBe(200);
    for (const body of [{}, { model: "llama-3-8b" }, { model_name: null }]) {
      const r = await api.post(`/api/admin/providers/${p.id}/preload-model`, body, ADMIN);
      expect(r.status, JSON.stringify(body)).toBe(400);
      expect(r.body.error, JSON.stringify(body)).toMatch(/model_name/);
    }
    const [row] = await srv.sql`SELECT preload_model FROM providers WHERE id = ${p.id}`;
    expect(row.preload_model).toBe("sdxl-turbo");
    expect((await heartbeat(srv, p.key)).body.preload_model).toEqual({ model_name: "sdxl-turbo", status: "downloading" });
    const audit = await srv.sql`SELECT action FROM audit_log WHERE target_type = 'provider' AND target_id = ${String(p.id)} AND action LIKE 'provider.preload%'`;
    expect(audit.map((a) => a.action)).toEqual(["provider.preload_model"]);
    // "" still clears it.
    expect((await api.post(`/api/admin/providers/${p.id}/preload-model`, { model_name: "" }, ADMIN)).status).toBe(200);
    expect((await heartbeat(srv, p.key)).body.preload_model).toBeNull();
  });
});
