// Configuration is validated once; production demands its secrets; the local
// default generates secrets once and keeps them (0600) so signatures survive restarts,
// only those the environment does not set.
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
    expect(a.localSecrets).toEqual({ file: path.join(dir, "secrets.json"), names: ["adminToken", "hmacSecret"] });
    expect(fs.statSync(a.localSecrets!.file).mode & 0o777).toBe(0o600);
    expect(a.port).toBe(8080);
    expect(a.rateLimits).toBe(true);
  });

  it("generates and keeps only the secrets the environment does not set, each the same at every start", () => {
    const dir = tmp();
    const file = path.join(dir, "secrets.json");
    const saved = () => JSON.parse(fs.readFileSync(file, "utf8"));
    const adminToken = "operator-chosen-admin-token-0123";
    // The admin token set: the file holds the HMAC secret alone, what the README's `require(...).adminToken` reads is no dead token.
    const a = loadConfig({ SVC_DATA_DIR: dir, SVC_ADMIN_TOKEN: adminToken });
    expect(a.adminToken).toBe(adminToken);
    expect(a.localSecrets).toEqual({ file, names: ["hmacSecret"] });
    expect(saved()).toEqual({ hmacSecret: a.hmacSecret });
    expect(loadConfig({ SVC_DATA_DIR: dir, SVC_ADMIN_TOKEN: adminToken }).hmacSecret).toBe(a.hmacSecret);
    // Unset later: an admin token is generated beside the same HMAC secret.
    const b = loadConfig({ SVC_DATA_DIR: dir });
    expect(b.hmacSecret).toBe(a.hmacSecret);
    expect(saved()).toEqual({ adminToken: b.adminToken, hmacSecret: a.hmacSecret });
    expect(loadConfig({ SVC_DATA_DIR: dir }).adminToken).toBe(b.adminToken);
    // A secret the environment sets again is no longer kept there.
    const c = loadConfig({ SVC_DATA_DIR: dir, SVC_ADMIN_TOKEN: adminToken });
    expect(c.hmacSecret).toBe(a.hmacSecret);
    expect(saved()).toEqual({ hmacSecret: a.hmacSecret });
    // Both set: nothing generated, the file untouched.
    const both = loadConfig({ SVC_DATA_DIR: dir, SVC_ADMIN_TOKEN: adminToken, SVC_HMAC_SECRET: "h".repeat(32) });
    expect(both.localSecrets).toBeUndefined();
    expect(saved()).toEqual({ hmacSecret: a.hmacSecret });
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
    // Rows of the rate table (src/http/rate-limit-table.ts) only, before anything runs.
    expect(() => loadConfig({ SVC_DATA_DIR: dir, SVC_RATE_LIMIT_OVERRIDES: "heartbeats=1000/60" })).toThrow(
      /^SVC_RATE_LIMIT_OVERRIDES names "heartbeats"; rows are provider_register, heartbeat, .*, default$/,
    );
    expect(() => loadConfig({ SVC_DATA_DIR: dir, SVC_RATE_LIMIT_OVERRIDES: "constructor=1/60" })).toThrow(/names "constructor"/);
    for (const entry of ["app.example.com", "ftp://files.example.com"]) {
      expect(() => loadConfig({ SVC_DATA_DIR: dir, CORS_ORIGINS: `https://ok.example.com, ${entry}` })).toThrow(
        `CORS_ORIGINS entries must be origins like https://app.example.com (got "${entry}")`,
      );
    }
    expect(() => loadConfig({ SVC_DATA_DIR: dir, FRONTEND_URL: "ftp://files.example.com" })).toThrow(/FRONTEND_URL must be an http\(s\) URL/);
    // DATABASE_URL: a postgres URL (several hosts as postgres.js takes them); a refused one is not repeated, it may hold a password.
    for (const bad of ["postgres://svc:s3cret-pw@db.example.com:port/svc", "mysql://svc:s3cret-pw@db.example.com/svc", "s3cret-pw"]) {
      expect(() => loadConfig({ SVC_DATA_DIR: dir, DATABASE_URL: bad })).toThrow(/^DATABASE_URL must be a URL such as postgres:\/\/user:password@host:5432\/database/);
      expect(() => loadConfig({ SVC_DATA_DIR: dir, DATABASE_URL: bad })).not.toThrow(/s3cret/);
    }
    // A refused configuration leaves nothing behind: secrets are generated only for a valid one.
    expect(fs.existsSync(path.join(dir, "secrets.json"))).toBe(false);
    const valid = loadConfig({ SVC_DATA_DIR: dir, SVC_RATE_LIMITS: "off", CORS_ORIGINS: "https://ops.example.net/, *" });
    expect(valid.rateLimits).toBe(false);
    expect(valid.corsOrigins).toEqual(["https://ops.example.net", "*"]);
    expect(fs.existsSync(path.join(dir, "secrets.json"))).toBe(true);
    expect(loadConfig({ SVC_DATA_DIR: dir, DATABASE_URL: "postgresql://svc@db1:5432,db2:5432/svc" }).databaseUrl).toBe("postgresql://svc@db1:5432,db2:5432/svc");
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
