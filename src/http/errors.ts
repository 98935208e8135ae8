// The one mapping of ServiceError (src/errors.ts) to the wires: HTTP status
// <-> Connect code, and the REST {"error"} answer. gRPC and Connect clients
// see the Connect code (with the documented status in a header), REST
// clients the exact documented status.
import { Code, ConnectError } from "@connectrpc/connect";
import { ServiceError } from "../errors.js";

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

/** The Connect form of a ServiceError; other errors pass through unchanged. */
export function toConnectError(err: unknown): unknown {
  if (!(err instanceof ServiceError)) return err;
  const metadata = new Headers(err.headers);
  metadata.set(STATUS_HEADER, String(err.status));
  return new ConnectError(err.message, CODE_FOR_STATUS[err.status] ?? Code.Unknown, metadata);
}

export interface HttpError {
  status: number;
  message: string;
  headers: Record<string, string>;
}

/** Maps anything thrown by a handler to the REST answer. Unknown errors are 500 with a generic text. */
export function toHttpError(err: unknown): HttpError {
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
