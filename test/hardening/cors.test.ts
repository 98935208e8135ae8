// CORS: the built-in allowlist plus CORS_ORIGINS, preflights answered for
// every path (REST and Connect alike), other origins refused.
import { describe, expect, it } from "vitest";
import { loadConfig } from "../../src/config.js";
import { allowedOrigins } from "../../src/http/cors.js";
import { useTestServer, ADMIN_TOKEN } from "../helpers/server.js";

const EXTRA = "https://partner.example.org";

const srv = useTestServer({ CORS_ORIGINS: `${EXTRA}, https://ops.example.net/`, FRONTEND_URL: "https://app.example.com/dashboard" });

const preflight = (path: string, origin: string, method = "POST", headers = "content-type, x-renter-key") =>
  fetch(srv.url + path, {
    method: "OPTIONS",
    headers: { origin, "access-control-request-method": method, "access-control-request-headers": headers },
  });

describe("CORS", () => {
  it("answers a preflight from the built-in allowlist and from CORS_ORIGINS with 204", async () => {
    for (const origin of ["https://app.example.com", EXTRA, "https://ops.example.net", "http://localhost:5173"]) {
      const r = await preflight("/api/jobs/submit", origin);
      expect(r.status, origin).toBe(204);
      expect(r.headers.get("access-control-allow-origin")).toBe(origin);
      expect(r.headers.get("access-control-allow-methods")).toContain("POST");
      const allowed = r.headers.get("access-control-allow-headers")!;
      for (const h of ["content-type", "x-renter-key", "x-provider-key", "x-admin-token", "authorization", "idempotency-key"]) {
        expect(allowed).toContain(h);
      }
      expect(Number(r.headers.get("access-control-max-age"))).toBeGreaterThan(0);
      expect(r.headers.get("vary")).toMatch(/origin/i);
      expect(await r.text()).toBe("");
    }
  });

  it("refuses a preflight from any other origin with 403 and no allow headers", async () => {
    const r = await preflight("/api/renters/me", "https://evil.example.com", "GET");
    expect(r.status).toBe(403);
    expect(r.headers.get("access-control-allow-origin")).toBeNull();
    expect(await r.json()).toEqual({ error: expect.stringContaining("not allowed") });
  });

  it("handles Connect paths the same way, generically", async () => {
    const r = await preflight("/svc.v1.TemplateService/List", EXTRA);
    expect(r.status).toBe(204);
    expect(r.headers.get("access-control-allow-headers")).toContain("connect-protocol-version");
  });

  it("marks actual answers for allowed origins only, exposing Retry-After", async () => {
    const ok = await fetch(srv.url + "/api/admin/dashboard", { headers: { origin: EXTRA, "x-admin-token": ADMIN_TOKEN } });
    expect(ok.status).toBe(200);
    expect(ok.headers.get("access-control-allow-origin")).toBe(EXTRA);
    expect(ok.headers.get("access-control-expose-headers")).toContain("retry-after");
    expect(ok.headers.get("access-control-allow-credentials")).toBeNull();
    const err = await fetch(srv.url + "/api/admin/dashboard", { headers: { origin: EXTRA } });
    expect(err.status).toBe(401);
    expect(err.headers.get("access-control-allow-origin")).toBe(EXTRA);
    const other = await fetch(srv.url + "/api/templates", { headers: { origin: "https://evil.example.com" } });
    expect(other.status).toBe(200);
    expect(other.headers.get("access-control-allow-origin")).toBeNull();
    const none = await fetch(srv.url + "/api/templates");
    expect(none.headers.get("access-control-allow-origin")).toBeNull();
  });

  it("says Vary: Origin on answers to requests without an Origin too, so a cache never hands one to a page of an allowed origin", async () => {
    // The marketplace answer may be kept by shared caches (public, max-age=30): one kept from a request
    // without Origin has no Access-Control-Allow-Origin, and served to the front end's page it fails there.
    const plain = await fetch(srv.url + "/api/providers/marketplace");
    expect(plain.status).toBe(200);
    expect(plain.headers.get("cache-control")).toContain("public");
    expect(plain.headers.get("access-control-allow-origin")).toBeNull();
    expect(plain.headers.get("vary")).toMatch(/\borigin\b/i);
    const cross = await fetch(srv.url + "/api/providers/marketplace", { headers: { origin: "https://app.example.com" } });
    expect(cross.headers.get("access-control-allow-origin")).toBe("https://app.example.com");
    expect(cross.headers.get("vary")).toMatch(/\borigin\b/i);
  });

  it("leaves a plain OPTIONS (no preflight headers) to the routes", async () => {
    const r = await fetch(srv.url + "/api/templates", { method: "OPTIONS" });
    expect(r.status).toBe(405);
    expect(await r.json()).toEqual({ error: expect.any(String) });
  });

  it("drops the local development origins in production and rejects malformed CORS_ORIGINS", () => {
    const base = { SVC_ADMIN_TOKEN: ADMIN_TOKEN, SVC_HMAC_SECRET: "x".repeat(32), DATABASE_URL: "postgres://x/y" };
    const prod = allowedOrigins(loadConfig({ ...base, NODE_ENV: "production", BACKEND_URL: "https://api.svc.example.com", FRONTEND_URL: "https://svc.example.com" }));
    expect(prod.has("http://localhost:5173")).toBe(false);
    expect(prod.has("https://svc.example.com")).toBe(true);
    expect(() => allowedOrigins(loadConfig({ ...base, CORS_ORIGINS: "not an origin" }))).toThrow(/CORS_ORIGINS/);
    expect(() => allowedOrigins(loadConfig({ ...base, CORS_ORIGINS: "ftp://files.example.com" }))).toThrow(/CORS_ORIGINS/);
  });
});
