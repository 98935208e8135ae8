// Answers that depend on the credential sent (an account's data, an installer with the caller's key
// in it) are never kept by a cache: a shared cache keys on the URL, and the key often travels in a
// header (x-provider-key, x-renter-key), so the next caller of the same URL would get them.
import { describe, expect, it } from "vitest";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { ADMIN_TOKEN, useTestServer } from "../helpers/server.js";

const srv = useTestServer();

describe("caching of answers", () => {
  it("answers to a credential carry Cache-Control: no-store, on success and on failure", async () => {
    const api = client(srv);
    const provider = await makeProvider(srv);
    const renter = await makeRenter(srv);

    const setup = await api.get("/api/providers/setup", provider.headers);
    expect(setup.status).toBe(200);
    expect(setup.text).toContain(provider.key);
    expect(setup.headers.get("cache-control")).toBe("no-store");

    const head = await fetch(srv.url + "/api/providers/setup-windows", { method: "HEAD", headers: provider.headers });
    expect(head.status).toBe(200);
    expect(head.headers.get("cache-control")).toBe("no-store");

    for (const [path, headers] of [
      ["/api/renters/me", renter.headers],
      [`/api/providers/status/${provider.key}`, {}],
      ["/api/jobs", { "x-admin-token": ADMIN_TOKEN }],
      ["/api/admin/dashboard", { authorization: `Bearer ${ADMIN_TOKEN}` }],
    ] as const) {
      const r = await api.get(path, headers);
      expect(r.status, `${path}: ${r.text}`).toBe(200);
      expect(r.headers.get("cache-control"), path).toBe("no-store");
    }
    const refused = await api.get("/api/renters/me", { "x-renter-key": "svc-renter-nobody" });
    expect(refused.status).toBe(404);
    expect(refused.headers.get("cache-control")).toBe("no-store");
  });

  it("leaves public answers to their own caching", async () => {
    const api = client(srv);
    expect((await api.get("/api/providers/marketplace")).headers.get("cache-control")).toBe("public, max-age=30");
    expect((await api.get("/api/templates")).headers.get("cache-control")).toBeNull();
  });
});
