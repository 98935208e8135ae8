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

/** An error already meant for the caller: ours, or one a wire library made (a ConnectError). */
export function isDocumented(err: unknown): boolean {
  return err instanceof ServiceError || (err instanceof Error && err.name === "ConnectError");
}

/**
 * Runs `fn`; a failure that is not already a documented error (the database is
 * down, ...) becomes the route's documented 500 answer, its cause only logged.
 */
export async function or500<T>(log: Logger, message: string, context: Record<string, unknown>, fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (err) {
    if (isDocumented(err)) throw err;
    log.error({ err, ...context }, message);
    throw apiError(500, message);
  }
}

/** Whether `err` is a PostgreSQL unique violation (on `constraint` when given). */
export function isUniqueViolation(err: unknown, constraint?: string): boolean {
  const e = err as { code?: string; constraint_name?: string };
  return e?.code === "23505" && (!constraint || e.constraint_name === constraint);
}
