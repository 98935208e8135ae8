// CORS for every HTTP answer (REST, /v1, Connect): a built-in allowlist plus
// CORS_ORIGINS. Preflights from an allowed origin are answered here with 204;
// from any other origin with 403. Credentials travel in headers, never
// cookies, so no Access-Control-Allow-Credentials is sent.
import { webOrigin, type Config } from "../config.js";
import type { NodeRequest, NodeResponse } from "./rest.js";
import { sendJson } from "./rest.js";

/** Local development front ends, allowed outside production only. */
const DEV_ORIGINS = ["http://localhost:3000", "http://localhost:5173", "http://127.0.0.1:3000", "http://127.0.0.1:5173"];

export const ALLOWED_METHODS = "GET, POST, PUT, PATCH, DELETE, OPTIONS";
export const ALLOWED_HEADERS = [
  "authorization", "content-type", "x-admin-token", "x-renter-key", "x-provider-key", "idempotency-key", "x-request-id",
  "connect-protocol-version", "connect-timeout-ms", "grpc-timeout", "x-grpc-web", "x-user-agent",
].join(", ");
/**
 * Headers the official OpenAI SDKs send with every request (x-stainless-os, -lang, -package-version,
 * -runtime, -runtime-version, -arch, -retry-count, -timeout, -helper-method...): a /v1 preflight
 * allows those it asks for, whichever a version of the SDK adds.
 */
const SDK_HEADER = /^x-stainless-[a-z0-9-]{1,64}$/;
const MAX_SDK_HEADERS = 32;
/** Headers the OpenAI SDKs send when a client sets an organization or project, or asks for a beta feature: allowed on /v1. */
const V1_HEADERS = ["openai-organization", "openai-project", "openai-beta"];

/** A request to the /v1 gateway (the OpenAI SDKs' headers). */
function isV1(req: NodeRequest): boolean {
  const path = (req.url ?? "").split("?")[0];
  return path === "/v1" || path.startsWith("/v1/");
}

/** The headers a preflight allows: the list above, and on /v1 the OpenAI SDKs' (V1_HEADERS and the x-stainless-* it asks for). */
function allowedHeaders(req: NodeRequest): string {
  if (!isV1(req)) return ALLOWED_HEADERS;
  const asked = String(req.headers["access-control-request-headers"] ?? "")
    .split(",")
    .map((h) => h.trim().toLowerCase())
    .filter((h) => SDK_HEADER.test(h));
  return [ALLOWED_HEADERS, ...V1_HEADERS, ...new Set(asked.slice(0, MAX_SDK_HEADERS))].join(", ");
}

export const EXPOSED_HEADERS = "retry-after, x-request-id, content-disposition, grpc-status, grpc-message";
/**
 * What a /v1 answer says in headers that a page's OpenAI SDK reads, or the docs tell it to: whether to retry
 * (x-should-retry, which the SDK obeys over the status, and retry-after-ms), the per-key rate limit, and what a
 * request was charged. A browser hides from the page every response header not exposed.
 */
const V1_EXPOSED_HEADERS = [
  "x-should-retry", "retry-after-ms", "x-ratelimit-limit-requests", "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests",
  "x-svc-cost-halala", "x-svc-cost-micro-halala", "x-svc-truncated",
].join(", ");

/** The headers an answer exposes to a page: the list above, and on /v1 the gateway's (V1_EXPOSED_HEADERS). */
function exposedHeaders(req: NodeRequest): string {
  return isV1(req) ? `${EXPOSED_HEADERS}, ${V1_EXPOSED_HEADERS}` : EXPOSED_HEADERS;
}
const MAX_AGE_SECONDS = "600";

/** The origins a browser page may call the API from (loadConfig checked FRONTEND_URL and CORS_ORIGINS as origins). */
export function allowedOrigins(config: Config): Set<string> {
  const frontend = webOrigin(config.frontendUrl);
  return new Set([...(frontend ? [frontend] : []), ...(config.production ? [] : DEV_ORIGINS), ...config.corsOrigins]);
}

/** Returns a function that sets the CORS headers and answers preflights (true when it answered). */
export function createCors(config: Config) {
  const origins = allowedOrigins(config);
  const any = origins.has("*");
  return function cors(req: NodeRequest, res: NodeResponse): boolean {
    const origin = req.headers.origin;
    const preflight = req.method === "OPTIONS" && origin !== undefined && req.headers["access-control-request-method"] !== undefined;
    // On every answer, with an Origin or without: the allow header depends on it, and a cache that kept an
    // answer without one (a public marketplace answer) would otherwise hand it to an allowed origin's page.
    res.setHeader("vary", "Origin");
    if (!origin) return false;
    const allowed = any || origins.has(origin);
    if (allowed) {
      res.setHeader("access-control-allow-origin", any ? "*" : origin);
      res.setHeader("access-control-expose-headers", exposedHeaders(req));
    }
    if (!preflight) return false;
    if (!allowed) {
      sendJson(res, 403, { error: `origin ${origin.slice(0, 200)} is not allowed` });
      return true;
    }
    res.setHeader("vary", "Origin, Access-Control-Request-Headers");
    res.writeHead(204, {
      "access-control-allow-methods": ALLOWED_METHODS,
      "access-control-allow-headers": allowedHeaders(req),
      "access-control-max-age": MAX_AGE_SECONDS,
      "content-length": 0,
    });
    res.end();
    return true;
  };
}
