// Request ids and the log line of each gRPC / Connect call (REST requests are
// logged by the transcoder). A ServiceError becomes its ConnectError here
// (src/http/errors.ts), also when a streamed answer fails midway. A database
// that cannot be reached is answered 503 (Unavailable, Retry-After) and logged
// as a warning; a client gone mid-call (its stream cut or reset) is logged at
// info. Any other failure is an internal error: logged with its cause,
// answered as "internal error" so database or code details never reach the caller.
import crypto from "node:crypto";
import type { IncomingHttpHeaders } from "node:http";
import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import type { Logger } from "../log.js";
import { credentialsKey } from "./credentials.js";
import { isDatabaseUnavailable } from "../errors.js";
import { failureLogLevel, internalError, toConnectError } from "./errors.js";
import { observed } from "../shared/iterables.js";

const CLIENT_REQUEST_ID = /^[\w.:-]{1,128}$/;

/** The caller's `x-request-id` when it is a sane token, else a new one. */
export function requestIdOf(headers: IncomingHttpHeaders): string {
  const given = headers["x-request-id"];
  return typeof given === "string" && CLIENT_REQUEST_ID.test(given) ? given : crypto.randomUUID();
}

/**
 * What a failed call answers, logged once: a documented error as it is (with the request id), a client
 * gone as Canceled, anything else as the opaque internal error. Also for calls refused before the
 * interceptors ran (connect-adapter.ts).
 */
export function callFailure(log: Logger, thrown: unknown, call: { requestId: string; procedure: string; started: number }): ConnectError {
  const { requestId, procedure } = call;
  const err = toConnectError(thrown);
  const ms = Math.round(performance.now() - call.started);
  if (err instanceof ConnectError) {
    err.metadata.set("x-request-id", requestId);
    if (!(thrown instanceof ConnectError) && isDatabaseUnavailable(thrown)) {
      log.warn({ err: thrown, requestId, procedure, ms }, "call failed: database unreachable");
    } else if (log.isLevelEnabled("info")) {
      // A documented error, 500s included ("heartbeat failed"); their causes were logged where they were made.
      log.info({ requestId, procedure, code: Code[err.code], ms }, "call");
    }
    return err;
  }
  if (failureLogLevel(thrown) === "info") {
    // Expected: the client cancelled, or its stream or connection was cut; nobody is left to answer.
    log.info({ requestId, procedure, ms, reason: (thrown as Error)?.message ?? String(thrown) }, "call ended: the client went away");
    return new ConnectError("the client went away", Code.Canceled, { "x-request-id": requestId });
  }
  log.error({ err, requestId, procedure, ms }, "call failed");
  return internalError(requestId);
}

export function callLogInterceptor(log: Logger): Interceptor {
  return (next) => async (req) => {
    const started = performance.now();
    const { requestId } = req.contextValues.get(credentialsKey);
    const procedure = `${req.service.typeName}/${req.method.name}`;
    const failed = (thrown: unknown): ConnectError => callFailure(log, thrown, { requestId, procedure, started });
    try {
      const res = await next(req);
      res.header.set("x-request-id", requestId);
      if (log.isLevelEnabled("info")) {
        log.info({ requestId, procedure, stream: req.stream, code: "ok", ms: Math.round(performance.now() - started) }, req.stream ? "stream opened" : "call");
      }
      if (!res.stream) return res;
      return { ...res, message: observed(res.message, { mapError: failed }) };
    } catch (err) {
      throw failed(err);
    }
  };
}
