// The generated Connect clients over gRPC (HTTP/2, the service's core wire),
// with the profile's credential in metadata the documented way per role, and a
// deadline on every call that is not a stream (SVC_TIMEOUT_SECONDS).
import { createClient, type Client, type Interceptor, type Transport } from "@connectrpc/connect";
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

export function clientsFor(p: Pick<Profile, "url" | "role" | "secret">): Clients {
  const auth: Interceptor = (next) => (req) => {
    if (p.secret) req.header.set(HEADER[p.role], p.secret);
    return next(req);
  };
  // HTTP/2 pings notice a connection that died silently (no FIN, no RST): a followed job's
  // stream then fails and is resumed (follow.ts) instead of waiting forever.
  const grpc = createGrpcTransport({ baseUrl: p.url, interceptors: [auth], pingIntervalMs: 30_000, pingTimeoutMs: 15_000 });
  const transport = withCallDeadline(grpc, callTimeoutMs());
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
