// /v1 answers never echo a key typed into the path: the 405 (answered before any authentication)
// and the 400 for a model id that is not valid percent-encoding mask it (log.ts maskSecrets).
import { describe, expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";

const srv = useTestServer({ SVC_LIVENESS_SWEEP_SECONDS: "0" });

describe("/v1 answers never echo a key typed into the path", () => {
  it("405 for POST /v1/models/{key}: no authentication needed", async () => {
    const p = await makeProvider(srv);
    const r = await fetch(`${srv.url}/v1/models/${p.key}`, { method: "POST" });
    const body = await r.text();
    expect(r.status).toBe(405);
    expect(body).not.toContain(p.key.slice(-16));
  });

  it("400 for a model id that is not valid percent-encoding", async () => {
    const p = await makeProvider(srv);
    const renter = await makeRenter(srv, 1000);
    const r = await fetch(`${srv.url}/v1/models/${p.key}%ZZ`, { headers: { authorization: `Bearer ${renter.key}` } });
    const body = await r.text();
    expect(r.status, body).toBe(400);
    expect(body).not.toContain(p.key.slice(-16));
  });
});
