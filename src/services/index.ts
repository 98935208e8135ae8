// Every service the process serves, secured by the roles declared in proto.
import type { DescMethod, DescService, Message } from "@bufbuild/protobuf";
import type { ServiceImpl } from "@connectrpc/connect";
import { AdminService } from "../../gen/svc/v1/admin_pb.js";
import { DaemonService, type ServerMessage } from "../../gen/svc/v1/daemon_pb.js";
import { JobService } from "../../gen/svc/v1/jobs_pb.js";
import { PaymentService } from "../../gen/svc/v1/payments_pb.js";
import { ProviderDownloadService, ProviderService } from "../../gen/svc/v1/providers_pb.js";
import { RenterService } from "../../gen/svc/v1/renters_pb.js";
import { RegistryService, TemplateService } from "../../gen/svc/v1/templates_pb.js";
import { JobTypeService } from "../../gen/svc/v1/job_types_pb.js";
import { ReportService } from "../../gen/svc/v1/reports_pb.js";
import { ReceiptService } from "../../gen/svc/v1/receipts_pb.js";
import type { RegisteredService } from "../http/rest.js";
import type { KindBounds } from "../http/kind-bounds.js";
import type { Deps } from "./deps.js";
import { providerService } from "./providers.js";
import { renterService } from "./renters.js";
import { paymentService } from "./payments.js";
import { daemonService } from "./daemon.js";
import { DAEMON_MESSAGE_BOUNDS, decodeDaemonMessage, encodeServerMessage } from "./daemon-wire.js";
import { downloadService } from "./downloads.js";
import { adminService } from "./admin.js";
import { adminProviderService } from "./admin-providers.js";
import { registryService } from "./registry.js";
import { templateService } from "./templates.js";
import { jobService } from "./jobs.js";
import { jobTypeService } from "./job-types.js";
import { reportService } from "./reports.js";
import { receiptService } from "./receipts.js";
import { refuseWithoutCredential, secure } from "./secure.js";

type Impl = Partial<Record<string, (...args: never[]) => unknown>>;

/** Every RPC declared in proto must have an implementation: refuse to start otherwise. */
function complete<S extends DescService>(service: S, impl: Impl): ServiceImpl<S> {
  const missing = service.methods.filter((m) => typeof impl[m.localName] !== "function").map((m) => m.name);
  if (missing.length > 0) throw new Error(`${service.typeName} has no implementation of ${missing.join(", ")}`);
  return impl as unknown as ServiceImpl<S>;
}

/** Every service the process serves, with the function that implements it. */
const SERVICES: [DescService, (deps: Deps) => Impl][] = [
  [ProviderService, (d) => providerService(d) as Impl],
  [ProviderDownloadService, (d) => downloadService(d) as Impl],
  [RenterService, (d) => renterService(d) as Impl],
  [JobService, (d) => jobService(d) as Impl],
  [PaymentService, (d) => paymentService(d) as Impl],
  [AdminService, (d) => ({ ...adminProviderService(d), ...adminService(d) }) as Impl],
  [TemplateService, (d) => templateService(d) as Impl],
  [RegistryService, (d) => registryService(d) as Impl],
  [DaemonService, (d) => daemonService(d) as Impl],
  [JobTypeService, (d) => jobTypeService(d) as Impl],
  [ReportService, (d) => reportService(d) as Impl],
  [ReceiptService, (d) => receiptService(d) as Impl],
];

/** Stream methods whose messages have a reader and writer faster than protobuf-es's reflection (a daemon's heartbeats and acks). */
export const STREAM_CODECS: ReadonlyMap<DescMethod, { decode: (bytes: Uint8Array) => Message; encode: (answer: unknown) => Uint8Array }> = new Map([
  [DaemonService.method.connect, { decode: decodeDaemonMessage, encode: (answer: unknown) => encodeServerMessage(answer as Parameters<typeof encodeServerMessage>[0]) }],
]);

/** Stream methods whose messages are held to a byte bound per kind, below the method's limit, on every wire. */
export const STREAM_KIND_BOUNDS: ReadonlyMap<DescMethod, KindBounds> = new Map([[DaemonService.method.connect, DAEMON_MESSAGE_BOUNDS]]);

/** The descriptors of every served service (the OpenAPI document is made from them). */
export const SERVED_SERVICES: readonly DescService[] = SERVICES.map(([s]) => s);

export function buildServices(deps: Deps): RegisteredService[] {
  return SERVICES.map(([service, make]) => ({
    service,
    impl: secure(deps, service, complete(service, make(deps))) as ServiceImpl<DescService>,
    refuseWithoutCredential: (method, ctx) => refuseWithoutCredential(deps, method, ctx),
  }));
}
