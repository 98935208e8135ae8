// GET /metrics: the process's Prometheus metrics (src/metrics) in the text
// format. Who may read them is the operator's choice (config.metrics):
// - on the service's port, by default, the admin token or a metrics token
//   (SVC_METRICS_TOKEN, reads /metrics and nothing else);
// - on a separate listener (SVC_METRICS_LISTEN), without credentials: the
//   address it is bound to is the guard;
// - SVC_METRICS=open serves the service's port without credentials (refused in
//   production), SVC_METRICS=off not at all.
// A token check that fails counts against the client IP on the admin row of
// the rate-limit table (where guesses at the admin routes count): over it,
// every answer is 429 (a right token too), so /metrics is no way around that
// row's bound on guessing the admin token.
import crypto from "node:crypto";
import http from "node:http";
import type net from "node:net";
import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import { adminTokensOf, type Config } from "../config.js";
import type { Logger } from "../log.js";
import type { Metrics, Wire } from "../metrics/metrics.js";
import type { RateLimits } from "./rate-limits.js";
import type { NodeRequest, NodeResponse } from "./rest.js";
import { clientIpOf, passesLimit, sendJson } from "./rest.js";
import { observed } from "../shared/iterables.js";

function sameSecret(a: string, b: string): boolean {
  // Hashes first: timingSafeEqual needs equal lengths, and the length must not leak either.
  const h = (s: string) => crypto.createHash("sha256").update(s).digest();
  return crypto.timingSafeEqual(h(a), h(b));
}

/**
 * Tokens the request carries: `Authorization: Bearer`, or the admin token's own header, read as the
 * API reads them (credentials.ts): trimmed, and an empty one is none.
 */
function tokensOf(req: NodeRequest): string[] {
  const out: string[] = [];
  const auth = req.headers.authorization;
  if (typeof auth === "string" && /^bearer\s+/i.test(auth)) out.push(auth.replace(/^bearer\s+/i, "").trim());
  const admin = req.headers["x-admin-token"];
  if (typeof admin === "string" && admin.trim()) out.push(admin.trim());
  return out;
}

async function writeMetrics(res: NodeResponse, metrics: Metrics): Promise<void> {
  const body = await metrics.registry.metrics();
  res.writeHead(200, { "content-type": metrics.registry.contentType, "content-length": Buffer.byteLength(body), "cache-control": "no-store" });
  res.end(body);
}

/**
 * The /metrics handler of the service's port; false when the path is another or metrics are off here.
 * `limits` (when rate limits are on) counts failed token checks per client IP on the admin row.
 */
export function createMetricsHandler(config: Config, metrics: Metrics, log: Logger, limits?: Pick<RateLimits, "check" | "refuseIfOver">) {
  return async (req: NodeRequest, res: NodeResponse, url: URL): Promise<boolean> => {
    if (url.pathname !== "/metrics" || config.metrics.access === "off") return false;
    if (req.method !== "GET" && req.method !== "HEAD") {
      sendJson(res, 405, { error: `method ${req.method} not allowed on /metrics` }, { allow: "GET" });
      return true;
    }
    if (config.metrics.access === "token") {
      const accepted = [...adminTokensOf(config).map((o) => o.token), ...(config.metrics.token ? [config.metrics.token] : [])];
      const given = tokensOf(req);
      if (given.length === 0) {
        sendJson(res, 401, { error: "metrics token required (Authorization: Bearer <SVC_METRICS_TOKEN or the admin token>)" }, { "www-authenticate": "Bearer" });
        return true;
      }
      const ip = clientIpOf(req, config.trustProxy);
      if (!given.some((t) => accepted.some((a) => sameSecret(t, a)))) {
        if (limits && !(await passesLimit(res, () => limits.check("admin", ip)))) return true;
        sendJson(res, 401, { error: "invalid metrics token" }, { "www-authenticate": "Bearer" });
        return true;
      }
      // A right token from an address over the row is refused too: otherwise 429 against 200 still tells.
      if (limits && !(await passesLimit(res, () => limits.refuseIfOver("admin", ip)))) return true;
    }
    try {
      await writeMetrics(res, metrics);
    } catch (err) {
      log.error({ err }, "metrics scrape failed");
      if (!res.headersSent) sendJson(res, 500, { error: "internal error" });
    }
    return true;
  };
}

export interface MetricsListener {
  port: number;
  close(): Promise<void>;
}

/** The separate metrics listener (SVC_METRICS_LISTEN): GET /metrics only, no credentials. */
export async function startMetricsListener(address: { host: string; port: number }, metrics: Metrics, log: Logger): Promise<MetricsListener> {
  const server = http.createServer((req, res) => {
    const path = new URL(req.url ?? "/", "http://localhost").pathname;
    if (path !== "/metrics") return sendJson(res, 404, { error: "not found: this listener serves GET /metrics only" });
    if (req.method !== "GET" && req.method !== "HEAD") return sendJson(res, 405, { error: `method ${req.method} not allowed on /metrics` }, { allow: "GET" });
    writeMetrics(res, metrics).catch((err) => {
      log.error({ err }, "metrics scrape failed");
      if (!res.headersSent) sendJson(res, 500, { error: "internal error" });
    });
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(address.port, address.host, () => resolve());
  });
  const port = (server.address() as net.AddressInfo).port;
  log.info({ host: address.host, port }, "metrics listening (GET /metrics, no credentials)");
  return {
    port,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

/** The wire of a gRPC-family call, from its content type. */
export function wireOf(contentType: string | null | undefined): Wire {
  const t = (contentType ?? "").toLowerCase();
  if (t.startsWith("application/grpc-web")) return "grpc_web";
  if (t.startsWith("application/grpc")) return "grpc";
  return "connect";
}

/** "InvalidArgument" -> "invalid_argument": the status label of a gRPC-family call. */
function codeLabel(code: Code): string {
  return (Code[code] ?? "unknown").replace(/[A-Z]/g, (c, i: number) => (i > 0 ? "_" : "") + c.toLowerCase());
}

/** Counts one gRPC / Connect call that ended (`err` undefined: ok) on its wire, by RPC and code, with its seconds. */
export function countCall(metrics: Metrics, wire: Wire, route: string, err: unknown, started: number): void {
  metrics.request(wire, route, err === undefined ? "ok" : codeLabel(ConnectError.from(err).code), (performance.now() - started) / 1000);
}

/**
 * Counts each gRPC / Connect call (REST requests are counted by the
 * transcoder, /v1 by its router): wire, RPC, code and seconds; a stream when
 * it ends. Placed outside the call-log interceptor, so failures arrive as
 * their ConnectError codes.
 */
export function metricsInterceptor(metrics: Metrics): Interceptor {
  return (next) => async (req) => {
    const started = performance.now();
    const wire = wireOf(req.header.get("content-type"));
    const route = `${req.service.typeName}/${req.method.name}`;
    const done = (err: unknown) => countCall(metrics, wire, route, err, started);
    let res;
    try {
      res = await next(req);
    } catch (err) {
      done(err);
      throw err;
    }
    if (!res.stream) {
      done(undefined);
      return res;
    }
    return { ...res, message: observed(res.message, { onEnd: done }) };
  };
}
