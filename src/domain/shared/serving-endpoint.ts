// A serving job's endpoint as its daemon reported it (endpoint-ready's
// endpoint_url): where its routes are, and whether the engine answers its
// health check. Read by the /v1 gateway (its chat completions route) and by
// the endpoint probe (src/domain/dispatch/endpoint-health.ts: the health
// route). The probe connects under the gateway's outbound-address rules
// (src/http/v1/upstream.ts, shared/address.ts): unless private upstreams are
// allowed (SVC_V1_PRIVATE_UPSTREAMS) only public addresses, literal hosts
// checked before connecting and names at the moment of connecting.
import http from "node:http";
import https from "node:https";
import { isIpLiteral, isPrivateAddress, publicOnlyLookup } from "./address.js";

/** The routes of a reported endpoint, which may be the server root, its /v1 base, or the full chat route. */
function endpointRoutes(endpointUrl: string): { root: string; chat: string } {
  const base = endpointUrl.trim().replace(/\/+$/, "");
  if (base.endsWith("/chat/completions")) {
    const above = base.slice(0, -"/chat/completions".length);
    return { root: above.endsWith("/v1") ? above.slice(0, -"/v1".length) : above, chat: base };
  }
  if (base.endsWith("/v1")) return { root: base.slice(0, -"/v1".length), chat: `${base}/chat/completions` };
  return { root: base, chat: `${base}/v1/chat/completions` };
}

/** The endpoint's chat completions URL (OpenAI's POST /v1/chat/completions). */
export function chatCompletionsUrl(endpointUrl: string): string {
  return endpointRoutes(endpointUrl).chat;
}

/** The engine's health route: vLLM's GET /health at the server root (200 once the engine serves). */
export function healthUrl(endpointUrl: string): string {
  return `${endpointRoutes(endpointUrl).root}/health`;
}

export interface ProbeOptions {
  /** The endpoint's own secret (endpoint-ready's endpoint_api_key): sent as `Authorization: Bearer`. */
  apiKey?: string;
  /** Connect to private/loopback addresses (SVC_V1_PRIVATE_UPSTREAMS). */
  allowPrivate: boolean;
  timeoutMs: number;
}

export type ProbeResult = { healthy: true } | { healthy: false; error: string };

const lookup = publicOnlyLookup("endpoint");

/**
 * GETs the endpoint's health route once, without keeping the connection.
 * Healthy: a 2xx answer within `timeoutMs` (headers). Anything else (another
 * status, redirects included; no connection; a refused address; the time
 * running out) is a failure, with its reason. Never throws.
 */
export function probeEndpointHealth(endpointUrl: string, opts: ProbeOptions): Promise<ProbeResult> {
  return new Promise((resolve) => {
    let u: URL;
    try {
      u = new URL(healthUrl(endpointUrl));
    } catch {
      return resolve({ healthy: false, error: "the endpoint URL is not a valid URL" });
    }
    if (u.protocol !== "http:" && u.protocol !== "https:") return resolve({ healthy: false, error: "the endpoint URL is not http(s)" });
    const host = u.hostname.replace(/^\[|\]$/g, "");
    if (!opts.allowPrivate && isIpLiteral(host) && isPrivateAddress(host)) {
      return resolve({ healthy: false, error: `endpoint host ${host} is a private address` });
    }
    const secure = u.protocol === "https:";
    const req = (secure ? https : http).request(u, {
      method: "GET",
      agent: false,
      headers: { accept: "*/*", ...(opts.apiKey ? { authorization: `Bearer ${opts.apiKey}` } : {}) },
      signal: AbortSignal.timeout(opts.timeoutMs),
      lookup: opts.allowPrivate ? undefined : lookup,
    });
    req.once("response", (res) => {
      const status = res.statusCode ?? 0;
      // The status says it: the body is not read, and the connection (never reused: agent false) is closed.
      res.destroy();
      resolve(status >= 200 && status < 300 ? { healthy: true } : { healthy: false, error: `GET /health answered HTTP ${status}` });
    });
    // `on`, not `once`: an error after the answer (the socket closed under it) must find a listener; it changes nothing.
    req.on("error", (err: Error & { code?: string }) => {
      const timedOut = err.name === "TimeoutError" || err.name === "AbortError";
      resolve({ healthy: false, error: timedOut ? `GET /health did not answer within ${opts.timeoutMs} ms` : `GET /health failed: ${err.code ?? err.message}` });
    });
    req.end();
  });
}
