// CORS for every HTTP answer (REST, /v1, Connect): a built-in allowlist plus
// CORS_ORIGINS. Preflights from an allowed origin are answered here with 204;
// from any other origin with 403. Credentials travel in headers, never
// cookies, so no Access-Control-Allow-Credentials is sent.
import { ConfigError, type Config } from "../config.js";
import type { NodeRequest, NodeResponse } from "./rest.js";
import { sendJson } from "./rest.js";

/** Local development front ends, allowed outside production only. */
const DEV_ORIGINS = ["http://localhost:3000", "http://localhost:5173", "http://127.0.0.1:3000", "http://127.0.0.1:5173"];

export const ALLOWED_METHODS = "GET, POST, PUT, PATCH, DELETE, OPTIONS";
export const ALLOWED_HEADERS = [
  "authorization", "content-type", "x-admin-token", "x-renter-key", "x-provider-key", "idempotency-key", "x-request-id",
  "connect-protocol-version", "connect-timeout-ms", "grpc-timeout", "x-grpc-web", "x-user-agent",
].join(", ");
export const EXPOSED_HEADERS = "retry-after, x-request-id, content-disposition, grpc-status, grpc-message";
const MAX_AGE_SECONDS = "600";

function originOf(value: string, source: string): string {
  if (value === "*") return value;
  try {
    const u = new URL(value);
    if (u.protocol !== "http:" && u.protocol !== "https:") throw new Error();
    return u.origin;
  } catch {
    throw new ConfigError(`${source} entries must be origins like https://app.example.com (got "${value}")`);
  }
}

/** The origins a browser page may call the API from. */
export function allowedOrigins(config: Config): Set<string> {
  const builtin = [config.frontendUrl, ...(config.production ? [] : DEV_ORIGINS)].map((o) => originOf(o, "FRONTEND_URL"));
  return new Set([...builtin, ...config.corsOrigins.map((o) => originOf(o, "CORS_ORIGINS"))]);
}

/** Returns a function that sets the CORS headers and answers preflights (true when it answered). */
export function createCors(config: Config) {
  const origins = allowedOrigins(config);
  const any = origins.has("*");
  return function cors(req: NodeRequest, res: NodeResponse): boolean {
    const origin = req.headers.origin;
    const preflight = req.method === "OPTIONS" && origin !== undefined && req.headers["access-control-request-method"] !== undefined;
    if (!origin) return false;
    res.setHeader("vary", "Origin");
    const allowed = any || origins.has(origin);
    if (allowed) {
      res.setHeader("access-control-allow-origin", any ? "*" : origin);
      res.setHeader("access-control-expose-headers", EXPOSED_HEADERS);
    }
    if (!preflight) return false;
    if (!allowed) {
      sendJson(res, 403, { error: `origin ${origin.slice(0, 200)} is not allowed` });
      return true;
    }
    res.writeHead(204, {
      "access-control-allow-methods": ALLOWED_METHODS,
      "access-control-allow-headers": ALLOWED_HEADERS,
      "access-control-max-age": MAX_AGE_SECONDS,
      "content-length": 0,
    });
    res.end();
    return true;
  };
}
