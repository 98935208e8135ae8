// The one mapping of ServiceError (src/errors.ts) to the wires: HTTP status
// <-> Connect code, and the REST {"error"} answer. gRPC and Connect clients
// see the Connect code (with the documented status in a header), REST
// clients the exact documented status. A database that cannot be reached
// (src/errors.ts isDatabaseUnavailable) is 503 with Retry-After on every wire.
// Also: how a failed call is logged (failureLogLevel).
import { Code, ConnectError } from "@connectrpc/connect";
import { ServiceError, databaseUnavailable, isDatabaseUnavailable } from "../errors.js";

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
  412: Code.FailedPrecondition,
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

/** The Connect form of a ServiceError (and of a database that cannot be reached); other errors pass through unchanged. */
export function toConnectError(err: unknown): unknown {
  if (isDatabaseUnavailable(err) && !(err instanceof ConnectError)) err = databaseUnavailable();
  if (!(err instanceof ServiceError)) return err;
  const metadata = new Headers(err.headers);
  metadata.set(STATUS_HEADER, String(err.status));
  return new ConnectError(err.message, CODE_FOR_STATUS[err.status] ?? Code.Unknown, metadata);
}

/** What a call that failed unexpectedly answers: no detail of the cause, the status header as every documented error carries it. */
export function internalError(requestId?: string): ConnectError {
  const metadata = new Headers({ [STATUS_HEADER]: "500" });
  if (requestId) metadata.set("x-request-id", requestId);
  return new ConnectError("internal error", Code.Internal, metadata);
}

export interface HttpError {
  status: number;
  message: string;
  headers: Record<string, string>;
}

/** Maps anything thrown by a handler to the REST answer. Unknown errors are 500 with a generic text. */
export function toHttpError(err: unknown): HttpError {
  if (isDatabaseUnavailable(err) && !(err instanceof ConnectError)) err = databaseUnavailable();
  if (err instanceof ServiceError) return { status: err.status, message: err.message, headers: { ...err.headers } };
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

/**
 * Node's codes for a write to, or a read from, an HTTP/2 stream or response the
 * peer has already closed or reset: the client went away mid-call.
 */
const DISCONNECT_CODES = new Set([
  "ERR_HTTP2_INVALID_STREAM",
  "ERR_HTTP2_STREAM_ERROR",
  "ERR_HTTP2_STREAM_CANCEL",
  "ERR_STREAM_DESTROYED",
  "ERR_STREAM_PREMATURE_CLOSE",
  "ERR_STREAM_WRITE_AFTER_END",
]);

/**
 * The level a failure that is not a documented error is logged at: "info" when
 * the client went away mid-call (its stream or connection was reset or closed:
 * a write to it failed), "warn" when the database cannot be reached (answered
 * 503, the client tries again), "error" for anything else.
 */
export function failureLogLevel(err: unknown): "info" | "warn" | "error" {
  for (let e = err, depth = 0; e && depth < 5; e = (e as { cause?: unknown }).cause, depth++) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === "string" && DISCONNECT_CODES.has(code)) return "info";
  }
  return isDatabaseUnavailable(err) ? "warn" : "error";
}

/** The level a failure answered with `answer` is logged at (5xx only): one the client is told to retry (503, Retry-After) is a warning. */
export function answeredLogLevel(err: unknown, answer: HttpError): "info" | "warn" | "error" {
  return answer.status === 503 || answer.headers["retry-after"] ? "warn" : failureLogLevel(err);
}
