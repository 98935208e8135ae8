// The generated Connect clients over gRPC (HTTP/2, the service's core wire),
// with the profile's credential in metadata the documented way per role, a
// deadline on every call that is not a stream (SVC_TIMEOUT_SECONDS), and a URL
// answered without HTTP/2 (an HTTP/1.1-only proxy) named as such (isNoHttp2).
import { Code, ConnectError, createClient, type Client, type Interceptor, type Transport } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { AdminService } from "../../gen/svc/v1/admin_pb.js";
import { JobTypeService } from "../../gen/svc/v1/job_types_pb.js";
import { JobService } from "../../gen/svc/v1/jobs_pb.js";
import { PaymentService } from "../../gen/svc/v1/payments_pb.js";
import { ProviderService } from "../../gen/svc/v1/providers_pb.js";
import { RenterService } from "../../gen/svc/v1/renters_pb.js";
import { ReceiptService } from "../../gen/svc/v1/receipts_pb.js";
import { ReportService } from "../../gen/svc/v1/reports_pb.js";
import type { Profile } from "./profiles.js";

const HEADER = { renter: "x-renter-key", provider: "x-provider-key", admin: "x-admin-token" } as const;

export interface Clients {
  jobs: Client<typeof JobService>;
  jobTypes: Client<typeof JobTypeService>;
  renters: Client<typeof RenterService>;
  payments: Client<typeof PaymentService>;
  providers: Client<typeof ProviderService>;
  admin: Client<typeof AdminService>;
  receipts: Client<typeof ReceiptService>;
  reports: Client<typeof ReportService>;
}

/** The default of SVC_TIMEOUT_SECONDS. */
const DEFAULT_TIMEOUT_SECONDS = 60;

/**
 * How long svc waits for the answer of a call that is not a stream: SVC_TIMEOUT_SECONDS (seconds,
 * default 60; 0 waits as long as it takes). A server that took the request and never answers (a
 * wedged process, a proxy that holds it, a lock it waits on) answers HTTP/2 pings all the while:
 * only a deadline ends the wait. The server is told it (grpc-timeout) and stops there too.
 */
export function callTimeoutMs(env = process.env): number {
  const s = env.SVC_TIMEOUT_SECONDS?.trim() ? Number(env.SVC_TIMEOUT_SECONDS) : NaN;
  return Number.isFinite(s) && s >= 0 ? s * 1000 : DEFAULT_TIMEOUT_SECONDS * 1000;
}

/** `base` with the deadline `timeoutMs` (0: none) on each unary call that sets none of its own; streams as they are. */
function withCallDeadline(base: Transport, timeoutMs: number): Transport {
  if (timeoutMs <= 0) return base;
  const unary: Transport["unary"] = (method, signal, callTimeoutMs, header, input, contextValues) =>
    base.unary(method, signal, callTimeoutMs ?? timeoutMs, header, input, contextValues);
  const stream: Transport["stream"] = (method, signal, callTimeoutMs, header, input, contextValues) =>
    base.stream(method, signal, callTimeoutMs, header, input, contextValues);
  return { unary, stream };
}

/** The failures namingNoHttp2 made (ConnectError's instanceof takes any ConnectError for a subclass's). */
const noHttp2Errors = new WeakSet<ConnectError>();

/**
 * Whether a call got no answer because what answers at the URL does not speak HTTP/2, which gRPC
 * needs: an HTTP/1.1 server or a proxy that passes only HTTP/1.1 (its answer to the HTTP/2 preface
 * is no HTTP/2: nghttp2's "Protocol error"), TLS that offers no h2 (ALPN), or a server that asks for
 * HTTP/1.1 (HTTP_1_1_REQUIRED). Nothing was taken there, and the same URL answers the same way
 * again: it is not sent again nor resumed, and svc exits 4 (output.ts reportError) with its message.
 */
export const isNoHttp2 = (err: unknown): boolean => err instanceof ConnectError && noHttp2Errors.has(err);

/** nghttp2's NGHTTP2_ERR_PROTO: bytes that are not HTTP/2 where HTTP/2 was expected. */
const NGHTTP2_ERR_PROTO = -505;

/** Why a call's failure says that the peer does not speak HTTP/2 (see isNoHttp2); undefined when it does not. */
function notHttp2(err: unknown): string | undefined {
  if (err instanceof ConnectError && (err.metadata.has("grpc-status") || err.metadata.has("x-svc-http-status"))) return undefined;
  for (let e = err, depth = 0; e instanceof Error && depth < 8; e = e.cause, depth++) {
    const { code, errno } = e as NodeJS.ErrnoException;
    if (code === "ERR_HTTP2_ERROR" && errno === NGHTTP2_ERR_PROTO) return "Protocol error";
    if (code === "ERR_SSL_TLSV1_ALERT_NO_APPLICATION_PROTOCOL") return "its TLS offers no h2";
    if (/HTTP_1_1_REQUIRED/.test(e.message)) return "it asks for HTTP/1.1: HTTP_1_1_REQUIRED";
  }
  return undefined;
}

/** `base`, with a call that fails because the server at `url` does not speak HTTP/2 failing with a message that says so (isNoHttp2). */
function namingNoHttp2(base: Transport, url: string): Transport {
  const named = (err: unknown): never => {
    const why = notHttp2(err);
    if (why === undefined) throw err;
    const e = new ConnectError(
      `the server at ${url} did not answer over HTTP/2 (${why}): svc calls the service over gRPC, which needs HTTP/2; ` +
        "this is not the service, or a proxy in front of it passes only HTTP/1.1 (it must pass HTTP/2: h2c, or h2 over TLS)",
      Code.Unavailable,
      undefined,
      undefined,
      err,
    );
    noHttp2Errors.add(e);
    throw e;
  };
  return {
    unary: (...args) => base.unary(...args).catch(named),
    // A stream fails so before its first answer: when it opens.
    stream: (...args) => base.stream(...args).catch(named),
  };
}

export function clientsFor(p: Pick<Profile, "url" | "role" | "secret">): Clients {
  const auth: Interceptor = (next) => (req) => {
    if (p.secret) req.header.set(HEADER[p.role], p.secret);
    return next(req);
  };
  // HTTP/2 pings notice a connection that died silently (no FIN, no RST): a followed job's
  // stream then fails and is resumed (follow.ts) instead of waiting forever.
  const grpc = createGrpcTransport({ baseUrl: p.url, interceptors: [auth], pingIntervalMs: 30_000, pingTimeoutMs: 15_000 });
  const transport = namingNoHttp2(withCallDeadline(grpc, callTimeoutMs()), p.url);
  return {
    jobs: createClient(JobService, transport),
    jobTypes: createClient(JobTypeService, transport),
    renters: createClient(RenterService, transport),
    payments: createClient(PaymentService, transport),
    providers: createClient(ProviderService, transport),
    admin: createClient(AdminService, transport),
    receipts: createClient(ReceiptService, transport),
    reports: createClient(ReportService, transport),
  };
}
