// The /v1 error envelope (spec "Errors" 3-5):
//   {"error": {"message", "type", "code", "status", "retryable"}}
// and on 429 also `retry_after_seconds` / `retry_after_ms`, inside `error`
// and at the top level, with a Retry-After header. Every /v1 failure goes
// through here; codes name the cause, types follow OpenAI's vocabulary.
import { toHttpError } from "../errors.js";
import type { NodeResponse } from "../rest.js";

interface Kind {
  status: number;
  type: string;
  retryable: boolean;
}

const KINDS = {
  invalid_request: { status: 400, type: "invalid_request_error", retryable: false },
  missing_api_key: { status: 401, type: "authentication_error", retryable: false },
  invalid_api_key: { status: 401, type: "authentication_error", retryable: false },
  insufficient_quota: { status: 402, type: "insufficient_quota", retryable: false },
  account_suspended: { status: 403, type: "permission_error", retryable: false },
  model_not_found: { status: 404, type: "invalid_request_error", retryable: false },
  unknown_url: { status: 404, type: "invalid_request_error", retryable: false },
  method_not_allowed: { status: 405, type: "invalid_request_error", retryable: false },
  request_too_large: { status: 413, type: "invalid_request_error", retryable: false },
  rate_limit_exceeded: { status: 429, type: "rate_limit_error", retryable: true },
  /** The renter's monthly_spend_limit_halala: a billing refusal until the next UTC month. */
  spend_limit_exceeded: { status: 429, type: "insufficient_quota", retryable: false },
  internal_error: { status: 500, type: "server_error", retryable: true },
  provider_unavailable: { status: 502, type: "server_error", retryable: true },
  no_capacity_available: { status: 503, type: "server_error", retryable: true },
  upstream_timeout: { status: 504, type: "timeout_error", retryable: true },
} satisfies Record<string, Kind>;

export type V1Code = keyof typeof KINDS;

export class V1Error extends Error {
  readonly status: number;
  readonly type: string;
  readonly retryable: boolean;
  readonly retryAfterMs: number | undefined;
  /** Response headers the cause asked for (`connection: close` after a 413 body). */
  readonly headers: Record<string, string>;
  constructor(
    readonly code: V1Code | string,
    message: string,
    opts: { retryAfterMs?: number; status?: number; type?: string; headers?: Record<string, string> } = {},
  ) {
    super(message);
    const kind: Kind = KINDS[code as V1Code] ?? KINDS.invalid_request;
    this.status = opts.status ?? kind.status;
    this.type = opts.type ?? kind.type;
    this.retryable = kind.retryable;
    this.retryAfterMs = opts.retryAfterMs;
    this.headers = opts.headers ?? {};
  }
}

export const v1Error = (code: V1Code, message: string, retryAfterMs?: number) => new V1Error(code, message, { retryAfterMs });

/** The envelope object (also sent as an SSE `data:` event when a stream breaks). */
export function envelope(e: V1Error): Record<string, unknown> {
  const error: Record<string, unknown> = { message: e.message, type: e.type, code: e.code, status: e.status, retryable: e.retryable };
  if (e.retryAfterMs === undefined) return { error };
  const retry = { retry_after_seconds: Math.max(1, Math.ceil(e.retryAfterMs / 1000)), retry_after_ms: Math.max(0, Math.round(e.retryAfterMs)) };
  return { error: { ...error, ...retry }, ...retry };
}

/** Maps anything thrown while serving /v1 (domain apiErrors included) to a V1Error. */
export function toV1Error(err: unknown): V1Error {
  if (err instanceof V1Error) return err;
  const e = toHttpError(err);
  const code: Partial<Record<number, V1Code>> = {
    400: "invalid_request",
    401: "invalid_api_key",
    402: "insufficient_quota",
    403: "account_suspended",
    404: "unknown_url",
    413: "request_too_large",
    429: "spend_limit_exceeded",
    503: "no_capacity_available",
    499: "invalid_request",
  };
  const headers = e.headers.connection ? { connection: e.headers.connection } : undefined;
  // A 429 always carries its retry-after (spec Errors 4); the domain gives it in seconds. A 503 that names one
  // (the database away) passes it on, as the other wires do.
  const retryAfter = Number(e.headers["retry-after"]);
  const named = Number.isFinite(retryAfter) && retryAfter > 0 ? retryAfter * 1000 : undefined;
  const retryAfterMs = e.status === 429 ? (named ?? 1000) : e.status === 503 ? named : undefined;
  return new V1Error(code[e.status] ?? "internal_error", e.message, { status: e.status >= 400 ? e.status : 500, headers, retryAfterMs });
}

export function sendV1Error(res: NodeResponse, err: V1Error, headers: Record<string, string> = {}): void {
  const body = envelope(err);
  // OpenAI's SDKs retry 408/409/429/5xx on their own, sleeping what retry-after-ms says however long; they obey
  // this header over the status. A refusal that retrying cannot change (a spend limit until next month) says so.
  const extra: Record<string, string> = { ...headers, ...err.headers, "x-should-retry": String(err.retryable) };
  if (err.retryAfterMs !== undefined) {
    const retry = body as { retry_after_seconds: number; retry_after_ms: number };
    extra["retry-after"] = String(retry.retry_after_seconds);
    extra["retry-after-ms"] = String(retry.retry_after_ms);
  }
  const data = JSON.stringify(body);
  res.writeHead(err.status, { "content-type": "application/json; charset=utf-8", "content-length": Buffer.byteLength(data), ...extra });
  res.end(data);
}
