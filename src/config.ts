// Every environment variable the service reads, validated once at start.
import crypto from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { parseVersion } from "./domain/providers/versions.js";
import { parseTokenRates, type TokenRates } from "./domain/money/token-pricing.js";
import { ENDPOINT_PROBE_MAX_SECONDS } from "./domain/shared/job-end.js";
import { DAEMON_MIN_RELEASE, DAEMON_RELEASE } from "./shared/daemon-release.js";
import { RATE_LIMITS, type RateLimitName } from "./http/rate-limit-table.js";

export interface Config {
  production: boolean;
  port: number;
  host: string;
  databaseUrl: string | undefined;
  dataDir: string;
  logLevel: string;
  /**
   * How far V8 may grow the heap past what the last full GC left live, in
   * percent (SVC_HEAP_GROWTH_PERCENT; 0 = V8's own factor, up to 4x on a large
   * machine). Applied at start by main.ts; see docs/operations.md, Memory.
   */
  heapGrowthPercent: number;
  rateLimits: boolean;
  adminToken: string;
  /**
   * More admin tokens, each with the name the audit log records for what is done with it
   * (SVC_OPERATOR_TOKENS=name:token,...); SVC_ADMIN_TOKEN's calls are recorded as "admin".
   */
  operatorTokens: OperatorToken[];
  hmacSecret: string;
  paymentGatewaySecretKey: string | undefined;
  paymentGatewayWebhookSecret: string | undefined;
  paymentGatewayUrl: string;
  emailApiKey: string | undefined;
  emailApiUrl: string;
  frontendUrl: string;
  /** Baked into installers and the daemon; outside production it defaults to this server's own address. */
  backendUrl: string;
  /** In production, the public-origin variables left unset (FRONTEND_URL, BACKEND_URL): their defaults are used, and the start warns. */
  defaultedOrigins: string[];
  /** CORS_ORIGINS: origins (scheme, host, port; "*" for any), checked by webOrigin. */
  corsOrigins: string[];
  /**
   * Trusted proxy hops in front of the service (SVC_TRUST_PROXY: off = 0,
   * on = 1, or a number): the client IP is the N-th X-Forwarded-For entry
   * from the right; 0 takes the socket address and ignores the header.
   */
  trustProxy: number;
  /** Redis for the shared rate-limit store (REDIS_URL); PostgreSQL when unset. */
  redisUrl: string | undefined;
  /** Rate-limit rows replaced (benchmarks): SVC_RATE_LIMIT_OVERRIDES="heartbeat=1000/60,default=10000/60". */
  rateLimitOverrides: Partial<Record<RateLimitName, { points: number; durationSec: number }>>;
  allowTopup: boolean;
  signupCreditHalala: number;
  daemonMinVersion: string;
  daemonLatestVersion: string;
  /** Seconds between liveness sweeps (silent providers -> offline); 0 disables the sweep. */
  livenessSweepSeconds: number;
  /** Seconds between deletions of the uptime hours and attempt days reputation no longer reads; 0 disables them. */
  retentionSweepSeconds: number;
  /** Days a daemon event is kept (0: for ever). */
  daemonEventsKeptDays: number;
  /** Days a webhook delivery is kept once it ended, delivered or given up (0: for ever). */
  webhooksKeptDays: number;
  /** Seconds between sweeps that finish re-signing the receipts of revoked receipt keys; 0 disables them. */
  receiptResignSeconds: number;
  /** The Windows installer binary served by /api/providers/download-windows-exe, when one is built. */
  windowsExePath: string | undefined;
  /** Attempts a job gets (first run plus re-queues after a provider goes silent) before it fails. */
  jobMaxAttempts: number;
  /** How often the job worker looks for timeouts, silent providers and dispatchable queued jobs. */
  jobSweepMs: number;
  /** Seconds between health probes of each running serving job's endpoint (src/workers/endpoint-health.ts); 0 disables them. */
  endpointProbeSeconds: number;
  /** How much of a serving job's run before its endpoint was reported is billed (job-end.ts servingPolicy). */
  servingLoadGraceSeconds: number;
  /** OpenAI-compatible /v1 gateway (src/http/v1). */
  v1: {
    /** Requests per renter key per minute (0: no limit; SVC_RATE_LIMITS=off turns it off too). */
    rateLimitPerMinute: number;
    /** Per-model token rates replacing or extending the built-in table (src/domain/money/token-pricing.ts). */
    tokenRates: TokenRates;
    /** Models always listed by GET /v1/models, served right now or not. */
    models: string[];
    /** Longest wait for an upstream's response headers, and between two streamed chunks. */
    upstreamTimeoutMs: number;
    /** Hard limit on one /v1 request, streaming included. */
    maxRequestSeconds: number;
    /** Proxy to endpoints on private/loopback addresses (off in production: provider-supplied URLs must not reach internal hosts). */
    allowPrivateUpstreams: boolean;
    /** Emails (lower case) of the renter accounts that may submit public vllm_serve jobs: the platform's managed endpoints. */
    managedRenters: string[];
  };
  /** Prometheus metrics (GET /metrics, src/http/metrics.ts). */
  metrics: {
    /**
     * /metrics on the service's port: "token" (the admin token, or `token`
     * when set), "open" (no credential; refused in production) or "off".
     */
    access: "token" | "open" | "off";
    /** A bearer token that reads /metrics and nothing else (SVC_METRICS_TOKEN). */
    token: string | undefined;
    /** A separate listener serving only /metrics, without credentials (SVC_METRICS_LISTEN=host:port). */
    listen: { host: string; port: number } | undefined;
    /** Least seconds between two reads of the database figures (fleet, queue, outbox, audit) per process. */
    dbFiguresSeconds: number;
  };
  /** Seconds between ledger audits, run by one process at a time (0: only on demand). */
  ledgerAuditSeconds: number;
  /** Seconds between full ledger audits; the periodic runs between them are incremental (0: every run full). */
  ledgerAuditFullSeconds: number;
  /** The secrets generated because the environment does not set them, and the file that keeps them (local default only). */
  localSecrets: { file: string; names: LocalSecret[] } | undefined;
}

/** A secret generated for the local default when its variable is unset, by its name in secrets.json. */
export type LocalSecret = "adminToken" | "hmacSecret";

export class ConfigError extends Error {}

const DEFAULT_FRONTEND_URL = "https://svc.example.com";
/**
 * The heap may grow to twice what the last full GC left live. V8's own factor
 * (up to 4x here) held a process of 100,000 heartbeating providers at 570-595
 * MB resident; 100 held it at about 400 MB with no more CPU per heartbeat
 * (bench:heartbeat --outage, docs/benchmarks.md).
 */
const DEFAULT_HEAP_GROWTH_PERCENT = 100;
const DEFAULT_BACKEND_URL = "https://api.svc.example.com";

function int(env: NodeJS.ProcessEnv, name: string, fallback: number, min: number, max: number): number {
  const raw = env[name];
  if (raw === undefined || raw === "") return fallback;
  const n = Number(raw);
  if (!Number.isInteger(n) || n < min || n > max) {
    throw new ConfigError(`${name} must be an integer between ${min} and ${max} (got "${raw}")`);
  }
  return n;
}

function bool(env: NodeJS.ProcessEnv, name: string, fallback: boolean): boolean {
  const raw = env[name];
  if (raw === undefined || raw === "") return fallback;
  if (["1", "true", "on", "yes"].includes(raw.toLowerCase())) return true;
  if (["0", "false", "off", "no"].includes(raw.toLowerCase())) return false;
  throw new ConfigError(`${name} must be on/off or true/false (got "${raw}")`);
}

/** SVC_TRUST_PROXY: off (default), on (one trusted hop) or the number of trusted proxy hops. */
function trustProxyHops(env: NodeJS.ProcessEnv): number {
  const raw = (env.SVC_TRUST_PROXY ?? "").trim().toLowerCase();
  if (raw === "" || ["off", "false", "no"].includes(raw)) return 0;
  if (["on", "true", "yes"].includes(raw)) return 1;
  const n = Number(raw);
  if (/^\d+$/.test(raw) && n <= 32) return n;
  throw new ConfigError(`SVC_TRUST_PROXY must be off, on or a number of trusted proxy hops 0-32 (got "${env.SVC_TRUST_PROXY}")`);
}

function url(env: NodeJS.ProcessEnv, name: string, fallback: string): string {
  const raw = env[name] || fallback;
  try {
    new URL(raw);
  } catch {
    throw new ConfigError(`${name} must be an absolute URL (got "${raw}")`);
  }
  return raw.replace(/\/+$/, "");
}

/** A daemon version compared by semantic-version precedence (src/domain/providers/versions.ts). */
function version(env: NodeJS.ProcessEnv, name: string, fallback: string): string {
  const raw = env[name] || fallback;
  if (!parseVersion(raw)) throw new ConfigError(`${name} must be a semantic version such as 3.2.0 (got "${raw}")`);
  return raw;
}

/** Each local secret: the variable that sets it, and how it is generated when that is unset. */
const LOCAL_SECRETS: Record<LocalSecret, { variable: string; generate(): string }> = {
  adminToken: { variable: "SVC_ADMIN_TOKEN", generate: () => crypto.randomBytes(24).toString("base64url") },
  hmacSecret: { variable: "SVC_HMAC_SECRET", generate: () => crypto.randomBytes(32).toString("hex") },
};

/**
 * The local default's secrets that the environment leaves unset (`names`), generated once and kept
 * (0600) in the data folder, so that each stays the same from one start to the next. The file holds
 * only those: one the environment sets is neither written nor kept there, where it would be a dead value.
 */
function localSecrets(dataDir: string, names: LocalSecret[]): { values: Partial<Record<LocalSecret, string>>; file: string } {
  const file = path.join(dataDir, "secrets.json");
  fs.mkdirSync(dataDir, { recursive: true });
  const saved: Partial<Record<string, unknown>> = fs.existsSync(file) ? JSON.parse(fs.readFileSync(file, "utf8")) : {};
  const values = Object.fromEntries(names.map((n) => [n, typeof saved[n] === "string" ? saved[n] : LOCAL_SECRETS[n].generate()]));
  if (JSON.stringify(values) !== JSON.stringify(saved)) fs.writeFileSync(file, JSON.stringify(values, null, 2), { mode: 0o600 });
  return { values, file };
}

/** "row=points/seconds,..." -> { row: { points, durationSec } }, each row one of the rate table's (rate-limit-table.ts). */
function rateLimitOverrides(raw: string | undefined): Config["rateLimitOverrides"] {
  const out: Config["rateLimitOverrides"] = {};
  for (const item of (raw || "").split(",").map((s) => s.trim()).filter(Boolean)) {
    const m = /^([a-z_]+)=(\d{1,9})\/(\d{1,7})$/.exec(item);
    if (!m || Number(m[2]) < 1 || Number(m[3]) < 1) {
      throw new ConfigError(`SVC_RATE_LIMIT_OVERRIDES items look like heartbeat=1000/60 (row=points/seconds), got "${item}"`);
    }
    if (!Object.hasOwn(RATE_LIMITS, m[1])) {
      throw new ConfigError(`SVC_RATE_LIMIT_OVERRIDES names "${m[1]}"; rows are ${Object.keys(RATE_LIMITS).join(", ")}`);
    }
    out[m[1] as RateLimitName] = { points: Number(m[2]), durationSec: Number(m[3]) };
  }
  return out;
}

/**
 * The origin (scheme, host, port) of an http(s) URL; undefined for anything else. The one check of
 * CORS_ORIGINS and FRONTEND_URL as origins a browser calls from (src/http/cors.ts).
 */
export function webOrigin(value: string): string | undefined {
  try {
    const u = new URL(value);
    return u.protocol === "http:" || u.protocol === "https:" ? u.origin : undefined;
  } catch {
    return undefined;
  }
}

/** CORS_ORIGINS: comma-separated origins, or "*" for any. */
function corsOrigins(raw: string | undefined): string[] {
  return (raw || "").split(",").map((s) => s.trim()).filter(Boolean).map((entry) => {
    const origin = entry === "*" ? entry : webOrigin(entry);
    if (!origin) throw new ConfigError(`CORS_ORIGINS entries must be origins like https://app.example.com (got "${entry}")`);
    return origin;
  });
}

/**
 * DATABASE_URL as postgres.js reads it: a postgres:// (or postgresql://) URL; of several hosts
 * (h1,h2) the first is parsed. Its value is never repeated: it may hold a password.
 */
function databaseUrl(raw: string | undefined): string | undefined {
  if (!raw) return undefined;
  const m = /^(postgres(?:ql)?:\/\/)([^/?#]*)(.*)$/i.exec(raw);
  let parsed = false;
  if (m) {
    const hostsAt = m[2].lastIndexOf("@") + 1;
    try {
      new URL(m[1] + m[2].slice(0, hostsAt) + m[2].slice(hostsAt).split(",")[0] + m[3]);
      parsed = true;
    } catch {}
  }
  if (!parsed) throw new ConfigError("DATABASE_URL must be a URL such as postgres://user:password@host:5432/database (its value is not shown here)");
  return raw;
}

/** SVC_METRICS_LISTEN: "host:port" or ":port" (all interfaces), "[v6]:port" for an IPv6 address. */
function listenAddress(env: NodeJS.ProcessEnv): { host: string; port: number } | undefined {
  const raw = (env.SVC_METRICS_LISTEN ?? "").trim();
  if (!raw) return undefined;
  const m = /^(?:\[([0-9a-fA-F:.]+)\]|([^:\s]*)):(\d{1,5})$/.exec(raw);
  const port = m ? Number(m[3]) : NaN;
  if (!m || port > 65535) throw new ConfigError(`SVC_METRICS_LISTEN must be host:port, e.g. 127.0.0.1:9464 (got "${raw}")`);
  return { host: m[1] ?? (m[2] || "0.0.0.0"), port };
}

function metricsConfig(env: NodeJS.ProcessEnv, production: boolean): Config["metrics"] {
  const access = (env.SVC_METRICS || "token").toLowerCase();
  if (access !== "token" && access !== "open" && access !== "off") throw new ConfigError(`SVC_METRICS must be token, open or off (got "${env.SVC_METRICS}")`);
  // Never readable by anyone on the service's public port in production: a token, or a listener the operator placed.
  if (access === "open" && production) {
    throw new ConfigError("SVC_METRICS=open is refused in production: use SVC_METRICS_TOKEN or SVC_METRICS_LISTEN on an internal address");
  }
  const token = env.SVC_METRICS_TOKEN || undefined;
  if (token !== undefined && token.length < 16) throw new ConfigError("SVC_METRICS_TOKEN must be at least 16 characters");
  return { access, token, listen: listenAddress(env), dbFiguresSeconds: int(env, "SVC_METRICS_DB_SECONDS", 5, 1, 3600) };
}

export interface OperatorToken {
  name: string;
  token: string;
}

/** The name SVC_ADMIN_TOKEN's calls are recorded under. */
export const ADMIN_ACTOR = "admin";

/** Every token that acts as the admin's (SVC_ADMIN_TOKEN, then SVC_OPERATOR_TOKENS), with whose it is. */
export const adminTokensOf = (config: Pick<Config, "adminToken" | "operatorTokens">): OperatorToken[] => [
  { name: ADMIN_ACTOR, token: config.adminToken },
  ...config.operatorTokens,
];

/** SVC_OPERATOR_TOKENS: comma-separated name:token pairs, names and tokens each unique. */
function operatorTokens(env: NodeJS.ProcessEnv): OperatorToken[] {
  const raw = env.SVC_OPERATOR_TOKENS?.trim();
  if (!raw) return [];
  const out: OperatorToken[] = [];
  for (const entry of raw.split(",")) {
    const at = entry.indexOf(":");
    const name = entry.slice(0, at).trim();
    const token = entry.slice(at + 1).trim();
    if (at < 0 || !/^[A-Za-z0-9._-]{1,64}$/.test(name)) {
      throw new ConfigError("SVC_OPERATOR_TOKENS must be name:token pairs separated by commas, each name 1 to 64 letters, digits, '.', '_' or '-'");
    }
    if (name === ADMIN_ACTOR) throw new ConfigError(`SVC_OPERATOR_TOKENS: the name "${ADMIN_ACTOR}" is SVC_ADMIN_TOKEN's`);
    if (token.length < 16) throw new ConfigError(`SVC_OPERATOR_TOKENS: the token of ${name} must be at least 16 characters`);
    if (out.some((o) => o.name === name)) throw new ConfigError(`SVC_OPERATOR_TOKENS names ${name} twice`);
    if (out.some((o) => o.token === token) || token === env.SVC_ADMIN_TOKEN) throw new ConfigError(`SVC_OPERATOR_TOKENS: the token of ${name} is another operator's`);
    out.push({ name, token });
  }
  return out;
}

export function loadConfig(env: NodeJS.ProcessEnv = process.env): Config {
  const production = env.NODE_ENV === "production";
  const dataDir = path.resolve(env.SVC_DATA_DIR || "./.data");

  if (production) {
    // The public origins (FRONTEND_URL, BACKEND_URL) are optional by the interface: their defaults, with a warning at start.
    const missing = ["SVC_ADMIN_TOKEN", "SVC_HMAC_SECRET", "DATABASE_URL"].filter((n) => !env[n]);
    if (missing.length > 0) {
      throw new ConfigError(`missing required environment variables for production: ${missing.join(", ")}`);
    }
  }
  if (env.SVC_ADMIN_TOKEN && env.SVC_ADMIN_TOKEN.length < 16) throw new ConfigError("SVC_ADMIN_TOKEN must be at least 16 characters");
  if (env.SVC_HMAC_SECRET && env.SVC_HMAC_SECRET.length < 16) throw new ConfigError("SVC_HMAC_SECRET must be at least 16 characters");

  const logLevel = env.LOG_LEVEL || (env.VITEST ? "silent" : "info");
  if (!["fatal", "error", "warn", "info", "debug", "trace", "silent"].includes(logLevel)) {
    throw new ConfigError(`LOG_LEVEL must be one of fatal, error, warn, info, debug, trace, silent (got "${logLevel}")`);
  }
  const rateLimitsRaw = (env.SVC_RATE_LIMITS || "on").toLowerCase();
  if (!["on", "off"].includes(rateLimitsRaw)) throw new ConfigError(`SVC_RATE_LIMITS must be on or off (got "${env.SVC_RATE_LIMITS}")`);
  const gatewayKey = env.PAYMENT_GATEWAY_SECRET_KEY || undefined;

  const config: Omit<Config, "adminToken" | "hmacSecret" | "localSecrets"> = {
    production,
    port: int(env, "PORT", 8080, 0, 65535),
    host: env.HOST || "0.0.0.0",
    databaseUrl: databaseUrl(env.DATABASE_URL),
    dataDir,
    logLevel,
    heapGrowthPercent: int(env, "SVC_HEAP_GROWTH_PERCENT", DEFAULT_HEAP_GROWTH_PERCENT, 0, 1000),
    rateLimits: rateLimitsRaw === "on",
    operatorTokens: operatorTokens(env),
    paymentGatewaySecretKey: gatewayKey,
    paymentGatewayWebhookSecret: env.PAYMENT_GATEWAY_WEBHOOK_SECRET || gatewayKey,
    paymentGatewayUrl: url(env, "PAYMENT_GATEWAY_URL", "https://api.moyasar.com"),
    emailApiKey: env.EMAIL_API_KEY || undefined,
    emailApiUrl: url(env, "EMAIL_API_URL", "https://api.resend.com"),
    frontendUrl: url(env, "FRONTEND_URL", DEFAULT_FRONTEND_URL),
    // Outside production an unset BACKEND_URL becomes this server's own address once it listens (server.ts).
    backendUrl: env.BACKEND_URL || production ? url(env, "BACKEND_URL", DEFAULT_BACKEND_URL) : "",
    defaultedOrigins: production ? ["FRONTEND_URL", "BACKEND_URL"].filter((n) => !env[n]) : [],
    corsOrigins: corsOrigins(env.CORS_ORIGINS),
    trustProxy: trustProxyHops(env),
    redisUrl: env.REDIS_URL || undefined,
    rateLimitOverrides: rateLimitOverrides(env.SVC_RATE_LIMIT_OVERRIDES),
    allowTopup: bool(env, "SVC_ALLOW_TOPUP", !production),
    signupCreditHalala: int(env, "SVC_SIGNUP_CREDIT_HALALA", 0, 0, 10_000_000),
    daemonMinVersion: version(env, "SVC_DAEMON_MIN_VERSION", DAEMON_MIN_RELEASE),
    daemonLatestVersion: version(env, "SVC_DAEMON_LATEST_VERSION", DAEMON_RELEASE),
    livenessSweepSeconds: int(env, "SVC_LIVENESS_SWEEP_SECONDS", 15, 0, 3600),
    retentionSweepSeconds: int(env, "SVC_RETENTION_SWEEP_SECONDS", 3600, 0, 86400),
    daemonEventsKeptDays: int(env, "SVC_DAEMON_EVENTS_KEPT_DAYS", 90, 0, 36_500),
    webhooksKeptDays: int(env, "SVC_WEBHOOKS_KEPT_DAYS", 30, 0, 36_500),
    receiptResignSeconds: int(env, "SVC_RECEIPT_RESIGN_SECONDS", 60, 0, 86400),
    windowsExePath: env.SVC_WINDOWS_EXE_PATH ? path.resolve(env.SVC_WINDOWS_EXE_PATH) : undefined,
    jobMaxAttempts: int(env, "SVC_JOB_MAX_ATTEMPTS", 3, 1, 20),
    jobSweepMs: int(env, "SVC_JOB_SWEEP_MS", 1000, 50, 60_000),
    endpointProbeSeconds: int(env, "SVC_ENDPOINT_PROBE_SECONDS", 30, 0, ENDPOINT_PROBE_MAX_SECONDS),
    servingLoadGraceSeconds: int(env, "SVC_SERVING_LOAD_GRACE_SECONDS", 600, 0, 86_400),
    metrics: metricsConfig(env, production),
    ledgerAuditSeconds: int(env, "SVC_LEDGER_AUDIT_SECONDS", 900, 0, 604_800),
    ledgerAuditFullSeconds: int(env, "SVC_LEDGER_AUDIT_FULL_SECONDS", 86_400, 0, 2_592_000),
    v1: {
      rateLimitPerMinute: int(env, "SVC_V1_RATE_LIMIT_PER_MINUTE", 60, 0, 1_000_000),
      tokenRates: v1TokenRates(env.SVC_V1_TOKEN_RATES),
      models: (env.SVC_V1_MODELS || "").split(",").map((s) => s.trim()).filter(Boolean),
      upstreamTimeoutMs: int(env, "SVC_V1_UPSTREAM_TIMEOUT_MS", 120_000, 100, 3_600_000),
      maxRequestSeconds: int(env, "SVC_V1_MAX_REQUEST_SECONDS", 900, 1, 86_400),
      allowPrivateUpstreams: bool(env, "SVC_V1_PRIVATE_UPSTREAMS", !production),
      managedRenters: (env.SVC_V1_MANAGED_RENTERS || "").split(",").map((s) => s.trim().toLowerCase()).filter(Boolean),
    },
  };
  if (!webOrigin(config.frontendUrl)) throw new ConfigError(`FRONTEND_URL must be an http(s) URL (got "${config.frontendUrl}")`);
  // Local secrets are generated (and written) only once every other variable passed its checks.
  const unset = (Object.keys(LOCAL_SECRETS) as LocalSecret[]).filter((n) => !env[LOCAL_SECRETS[n].variable]);
  if (unset.length === 0) {
    return { ...config, adminToken: env.SVC_ADMIN_TOKEN!, hmacSecret: env.SVC_HMAC_SECRET!, localSecrets: undefined };
  }
  const local = localSecrets(dataDir, unset);
  return {
    ...config,
    adminToken: env.SVC_ADMIN_TOKEN || local.values.adminToken!,
    hmacSecret: env.SVC_HMAC_SECRET || local.values.hmacSecret!,
    localSecrets: { file: local.file, names: unset },
  };
}

function v1TokenRates(raw: string | undefined): TokenRates {
  try {
    return parseTokenRates(raw);
  } catch (err) {
    throw new ConfigError((err as Error).message);
  }
}
