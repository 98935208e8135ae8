// The generated Connect clients over gRPC (HTTP/2, the service's core wire),
// with the profile's credential in metadata the documented way per role.
import { createClient, type Client, type Interceptor } from "@connectrpc/connect";
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

export function clientsFor(p: Pick<Profile, "url" | "role" | "secret">): Clients {
  const auth: Interceptor = (next) => (req) => {
    if (p.secret) req.header.set(HEADER[p.role], p.secret);
    return next(req);
  };
  // HTTP/2 pings notice a connection that died silently (no FIN, no RST): a followed job's
  // stream then fails and is resumed (follow.ts) instead of waiting forever.
  const transport = createGrpcTransport({ baseUrl: p.url, interceptors: [auth], pingIntervalMs: 30_000, pingTimeoutMs: 15_000 });
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
