// Configuration is validated once; production demands its secrets; the local
// default generates secrets once and keeps them (0600) so signatures survive restarts.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { spawnSync } from "node:child_process";
import { describe, expect, it } from "vitest";
import { ConfigError, loadConfig } from "../../src/config.js";

const tmp = () => fs.mkdtempSync(path.join(os.tmpdir(), "svc-cfg-"));

describe("config", () => {
  it("generates local secrets once, mode 0600, and reuses them", () => {
    const dir = tmp();
    const a = loadConfig({ SVC_DATA_DIR: dir });
    const b = loadConfig({ SVC_DATA_DIR: dir });
    expect(a.hmacSecret).toBe(b.hmacSecret);
    expect(a.adminToken).toBe(b.adminToken);
    expect(a.secretsFile).toBe(path.join(dir, "secrets.json"));
    expect(fs.statSync(a.secretsFile!).mode & 0o777).toBe(0o600);
    expect(a.port).toBe(8080);
    expect(a.rateLimits).toBe(true);
  });

  it("names every missing production variable", () => {
    expect(() => loadConfig({ NODE_ENV: "production" })).toThrow(ConfigError);
    expect(() => loadConfig({ NODE_ENV: "production", SVC_ADMIN_TOKEN: "x".repeat(20) })).toThrow(/SVC_HMAC_SECRET, DATABASE_URL$/);
  });

  it("BACKEND_URL and FRONTEND_URL: optional (the interface's defaults, named for a warning at start) in production; the server's own address (filled at listen) outside it", () => {
    const prod = { NODE_ENV: "production", SVC_ADMIN_TOKEN: "x".repeat(20), SVC_HMAC_SECRET: "y".repeat(20), DATABASE_URL: "postgres://x@h/db" };
    expect(loadConfig(prod)).toMatchObject({
      backendUrl: "https://api.svc.example.com", frontendUrl: "https://svc.example.com", defaultedOrigins: ["FRONTEND_URL", "BACKEND_URL"],
    });
    expect(loadConfig({ ...prod, FRONTEND_URL: "https://example.org" }).defaultedOrigins).toEqual(["BACKEND_URL"]);
    expect(loadConfig({ ...prod, FRONTEND_URL: "https://example.org", BACKEND_URL: "https://api.example.org" })).toMatchObject({
      backendUrl: "https://api.example.org", defaultedOrigins: [],
    });
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "svc-cfg-"));
    expect(loadConfig({ SVC_DATA_DIR: dir }).backendUrl).toBe(""); // server.ts sets it to http://host:port once listening
    expect(loadConfig({ SVC_DATA_DIR: dir, BACKEND_URL: "http://10.0.0.5:8080" }).backendUrl).toBe("http://10.0.0.5:8080");
  });

  it("rejects malformed values with the variable's name", () => {
    const dir = tmp();
    expect(() => loadConfig({ SVC_DATA_DIR: dir, PORT: "http" })).toThrow(/PORT/);
    expect(() => loadConfig({ SVC_DATA_DIR: dir, SVC_RATE_LIMITS: "maybe" })).toThrow(/SVC_RATE_LIMITS/);
    expect(() => loadConfig({ SVC_DATA_DIR: dir, FRONTEND_URL: "not a url" })).toThrow(/FRONTEND_URL/);
    expect(() => loadConfig({ SVC_DATA_DIR: dir, SVC_ADMIN_TOKEN: "short" })).toThrow(/SVC_ADMIN_TOKEN must be at least 16/);
    expect(() => loadConfig({ SVC_DATA_DIR: dir, SVC_HEAP_GROWTH_PERCENT: "-5" })).toThrow(/SVC_HEAP_GROWTH_PERCENT must be an integer between 0 and 1000/);
    expect(() => loadConfig({ SVC_DATA_DIR: dir, SVC_HEAP_GROWTH_PERCENT: "twice" })).toThrow(/SVC_HEAP_GROWTH_PERCENT/);
    // A refused configuration leaves nothing behind: secrets are generated only for a valid one.
    expect(fs.existsSync(path.join(dir, "secrets.json"))).toBe(false);
    expect(loadConfig({ SVC_DATA_DIR: dir, SVC_RATE_LIMITS: "off" }).rateLimits).toBe(false);
    expect(fs.existsSync(path.join(dir, "secrets.json"))).toBe(true);
  });

  it("exits at start with a message naming the missing variables (real process)", () => {
    const r = spawnSync(process.execPath, ["--import", "tsx", "src/main.ts"], {
      env: { PATH: process.env.PATH, NODE_ENV: "production" },
      encoding: "utf8",
      timeout: 20_000,
    });
    expect(r.status).toBe(1);
    expect(r.stderr).toMatch(/SVC_ADMIN_TOKEN, SVC_HMAC_SECRET, DATABASE_URL$/m);
  });
});
