// The error values every layer throws. A ServiceError carries the documented
// HTTP status (the interface's vocabulary for what went wrong), the message
// the caller sees and optional headers (Retry-After). It knows nothing of a
// wire: src/http/errors.ts maps it to Connect codes and REST answers, once.
import type { Logger } from "./log.js";

export class ServiceError extends Error {
  override readonly name = "ServiceError";
  constructor(
    readonly status: number,
    message: string,
    readonly headers: Readonly<Record<string, string>> = {},
  ) {
    super(message);
  }
}

/** An error with a documented HTTP status; `headers` travel on both wires (e.g. Retry-After). */
export function apiError(status: number, message: string, headers?: Record<string, string>): ServiceError {
  return new ServiceError(status, message, headers);
}

export const badRequest = (m: string) => apiError(400, m);
export const unauthorized = (m: string) => apiError(401, m);
export const paymentRequired = (m: string) => apiError(402, m);
export const forbidden = (m: string) => apiError(403, m);
export const notFound = (m: string) => apiError(404, m);
export const conflict = (m: string) => apiError(409, m);
export const unavailable = (m: string) => apiError(503, m);
/** What this server does not offer as configured: definitive (a client must not retry it as a 5xx). */
export const notImplemented = (m: string) => apiError(501, m);

/** Seconds a client waits before trying again while the database cannot be reached. */
export const DATABASE_RETRY_AFTER_SECONDS = 2;

/**
 * Errors of a database that cannot be reached, or is restarting: the
 * connection was refused, reset or closed (postgres.js and socket codes), or
 * PostgreSQL is shutting down, starting up or out of connections (SQLSTATE).
 * The statement did not run, or ran in a transaction that rolled back: the
 * client may send the request again.
 */
const DATABASE_UNAVAILABLE_CODES = new Set([
  // postgres.js
  "CONNECTION_CLOSED",
  "CONNECTION_ENDED",
  "CONNECTION_DESTROYED",
  "CONNECT_TIMEOUT",
  // the socket
  "ECONNREFUSED",
  "ECONNRESET",
  "EPIPE",
  "ETIMEDOUT",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "EAI_AGAIN",
  // PostgreSQL: admin_shutdown, crash_shutdown, cannot_connect_now, too_many_connections
  "57P01",
  "57P02",
  "57P03",
  "53300",
]);

/** Whether `err` says the database cannot be reached now (see DATABASE_UNAVAILABLE_CODES; SQLSTATE class 08 too). */
export function isDatabaseUnavailable(err: unknown): boolean {
  const code = (err as { code?: unknown } | null)?.code;
  if (typeof code !== "string") return false;
  // Class 08, connection exception, but for 08P01 (protocol_violation: a defect, not an outage).
  return DATABASE_UNAVAILABLE_CODES.has(code) || (code.startsWith("08") && code.length === 5 && code !== "08P01");
}

/** The level a background failure is logged at: a warning while the database cannot be reached (it retries by itself), else an error. */
export const failureLevel = (err: unknown): "warn" | "error" => (isDatabaseUnavailable(err) ? "warn" : "error");

/** The answer to a request that failed because the database cannot be reached: 503, try again shortly. */
export function databaseUnavailable(): ServiceError {
  return apiError(503, "service temporarily unavailable (database unreachable); try again shortly", {
    "retry-after": String(DATABASE_RETRY_AFTER_SECONDS),
  });
}

/** An error already meant for the caller: ours, or one a wire library made (a ConnectError). */
export function isDocumented(err: unknown): boolean {
  return err instanceof ServiceError || (err instanceof Error && err.name === "ConnectError");
}

/**
 * Runs `fn`; a failure that is not already a documented error (the database is
 * down, ...) becomes the route's documented 500 answer, its cause only logged.
 * When the database cannot be reached the answer stays the documented 500 (the
 * spec's text for these routes' failure) and carries Retry-After, like the 503
 * of every other route.
 */
export async function or500<T>(log: Logger, message: string, context: Record<string, unknown>, fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (err) {
    if (isDocumented(err)) throw err;
    if (isDatabaseUnavailable(err)) {
      log.warn({ err, ...context }, `${message}: database unreachable`);
      throw apiError(500, message, { "retry-after": String(DATABASE_RETRY_AFTER_SECONDS) });
    }
    log.error({ err, ...context }, message);
    throw apiError(500, message);
  }
}

/** Whether `err` is a PostgreSQL unique violation (on `constraint` when given). */
export function isUniqueViolation(err: unknown, constraint?: string): boolean {
  const e = err as { code?: string; constraint_name?: string };
  return e?.code === "23505" && (!constraint || e.constraint_name === constraint);
}
