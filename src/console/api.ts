// The generated Connect clients over the Connect protocol (HTTP/1.1, same
// origin). The signed-in role's secret is added as its header by one
// interceptor; nothing else in the console touches credentials.
import { Code, ConnectError, createClient, type Interceptor } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-web";
import { AdminService } from "../../gen/svc/v1/admin_pb.js";
import { JobService } from "../../gen/svc/v1/jobs_pb.js";
import { JobTypeService } from "../../gen/svc/v1/job_types_pb.js";
import { PaymentService } from "../../gen/svc/v1/payments_pb.js";
import { ProviderService } from "../../gen/svc/v1/providers_pb.js";
import { ReceiptService } from "../../gen/svc/v1/receipts_pb.js";
import { RenterService } from "../../gen/svc/v1/renters_pb.js";
import { ReportService } from "../../gen/svc/v1/reports_pb.js";
import { RegistryService, TemplateService } from "../../gen/svc/v1/templates_pb.js";
import { inSar } from "./format.js";
import { session, signOutRefused } from "./session.js";

const HEADER = { renter: "x-renter-key", provider: "x-provider-key", admin: "x-admin-token" } as const;

/** The secret a failed call carried (undefined: none), by its error: see signOutIfRefused. */
const sentWith = new WeakMap<ConnectError, string | undefined>();

function noteSecret(err: unknown, secret: string | undefined): unknown {
  if (err instanceof ConnectError) sentWith.set(err, secret);
  return err;
}

const credentials: Interceptor = (next) => async (req) => {
  const s = session();
  if (s) req.header.set(HEADER[s.role], s.secret);
  const secret = s?.secret;
  let res;
  try {
    res = await next(req);
  } catch (err) {
    throw noteSecret(err, secret);
  }
  if (!res.stream) return res;
  // A stream's error comes while it is read.
  const message = res.message;
  return {
    ...res,
    message: {
      [Symbol.asyncIterator]() {
        const it = message[Symbol.asyncIterator]();
        return { next: () => it.next().catch((err: unknown) => Promise.reject(noteSecret(err, secret))) };
      },
    },
  };
};

const transport = createConnectTransport({ baseUrl: location.origin, interceptors: [credentials] });

export const api = {
  renters: createClient(RenterService, transport),
  providers: createClient(ProviderService, transport),
  jobs: createClient(JobService, transport),
  jobTypes: createClient(JobTypeService, transport),
  payments: createClient(PaymentService, transport),
  receipts: createClient(ReceiptService, transport),
  admin: createClient(AdminService, transport),
  reports: createClient(ReportService, transport),
  templates: createClient(TemplateService, transport),
  registry: createClient(RegistryService, transport),
};

/**
 * True when the call never got an answer from the service (network down,
 * server restarting): shown as a lost connection and retried. A 503 the
 * service itself answered carries its own message and is not one of these.
 */
export function isConnectionLost(err: unknown): boolean {
  if (!(err instanceof ConnectError)) return err instanceof TypeError;
  if (err.cause instanceof TypeError) return true;
  return err.code === Code.Unavailable && /fetch|network|connection|HTTP 50[234]/i.test(err.rawMessage) && !err.metadata.has("content-type");
}

/** How long the service asked to wait before trying again (its Retry-After, in ms); 0 when it did not say. */
export function retryAfterMs(err: unknown): number {
  if (!(err instanceof ConnectError)) return 0;
  // A value sent in both the headers and the end of a stream arrives as both, joined by ", ".
  const s = Number(err.metadata.get("retry-after")?.split(",")[0]);
  return Number.isFinite(s) && s > 0 ? s * 1000 : 0;
}

/** The service's own message for an error, for showing in place. */
export function messageOf(err: unknown): string {
  if (isConnectionLost(err)) return "Lost connection to the service.";
  // Amounts in SAR, as the console shows them everywhere else.
  if (err instanceof ConnectError) return inSar(err.rawMessage) || Code[err.code];
  return err instanceof Error ? err.message : String(err);
}

export function isUnauthenticated(err: unknown): boolean {
  return err instanceof ConnectError && (err.code === Code.Unauthenticated || err.code === Code.NotFound && /no account has this API key/.test(err.rawMessage));
}

/**
 * Signs the tab out when `err` is the service refusing the secret its call carried and that is still
 * the session's: a call sent before the key was rotated in this tab is refused for the old key, and
 * leaves the new session be.
 */
export function signOutIfRefused(err: unknown): void {
  if (isUnauthenticated(err)) signOutRefused(sentWith.get(err as ConnectError));
}
