// The one error mapping: HTTP status <-> Connect code, and the {"error"} body.
// Services throw `apiError(status, message)`; gRPC clients see the Connect
// code, REST clients the exact documented status.
import { Code, ConnectError } from "@connectrpc/connect";
import type { Logger } from "../log.js";

const STATUS_HEADER = "x-svc-http-status";

const CODE_FOR_STATUS: Record<number, Code> = {
  400: Code.InvalidArgument,
  401: Code.Unauthenticated,
  402: Code.FailedPrecondition,
  403: Code.PermissionDenied,
  404: Code.NotFound,
  405: Code.Unimplemented,
  409: Code.AlreadyExists,
  410: Code.FailedPrecondition,
  413: Code.ResourceExhausted,
  415: Code.InvalidArgument,
  429: Code.ResourceExhausted,
  500: Code.Internal,
  501: Code.Unimplemented,
  503: Code.Unavailable,
  504: Code.DeadlineExceeded,
};

const STATUS_FOR_CODE: Partial<Record<Code, number>> = {
  [Code.InvalidArgument]: 400,
  [Code.OutOfRange]: 400,
  [Code.Unauthenticated]: 401,
  [Code.PermissionDenied]: 403,
  [Code.NotFound]: 404,
  [Code.AlreadyExists]: 409,
  [Code.Aborted]: 409,
  [Code.FailedPrecondition]: 400,
  [Code.ResourceExhausted]: 429,
  [Code.Unimplemented]: 501,
  [Code.Unavailable]: 503,
  [Code.DeadlineExceeded]: 504,
  [Code.Canceled]: 499,
};

/** An error with a documented HTTP status; `headers` travel on both wires (e.g. Retry-After). */
export function apiError(status: number, message: string, headers?: Record<string, string>): ConnectError {
  const metadata = new Headers(headers);
  metadata.set(STATUS_HEADER, String(status));
  return new ConnectError(message, CODE_FOR_STATUS[status] ?? Code.Unknown, metadata);
}

/**
 * Runs `fn`; a failure that is not already a documented error (the database is
 * down, ...) becomes the route's documented 500 answer, its cause only logged.
 */
export async function or500<T>(log: Logger, message: string, context: Record<string, unknown>, fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (err) {
    if (err instanceof ConnectError) throw err;
    log.error({ err, ...context }, message);
    throw apiError(500, message);
  }
}

export const badRequest = (m: string) => apiError(400, m);
export const unauthorized = (m: string) => apiError(401, m);
export const paymentRequired = (m: string) => apiError(402, m);
export const forbidden = (m: string) => apiError(403, m);
export const notFound = (m: string) => apiError(404, m);
export const conflict = (m: string) => apiError(409, m);
export const unavailable = (m: string) => apiError(503, m);

export interface HttpError {
  status: number;
  message: string;
  headers: Record<string, string>;
}

/** Maps anything thrown by a handler to the REST answer. Unknown errors are 500 with a generic text. */
export function toHttpError(err: unknown): HttpError {
  if (err instanceof ConnectError) {
    const explicit = Number(err.metadata.get(STATUS_HEADER));
    const status = explicit || STATUS_FOR_CODE[err.code] || 500;
    const headers: Record<string, string> = {};
    err.metadata.forEach((v, k) => {
      if (k !== STATUS_HEADER) headers[k] = v;
    });
    const message = status >= 500 && !explicit ? "internal error" : err.rawMessage;
    return { status, message, headers };
  }
  return { status: 500, message: "internal error", headers: {} };
}

/** Postgres unique violations on the given constraint become a 409 with `message`. */
export function isUniqueViolation(err: unknown, constraint?: string): boolean {
  const e = err as { code?: string; constraint_name?: string };
  return e?.code === "23505" && (!constraint || e.constraint_name === constraint);
}
