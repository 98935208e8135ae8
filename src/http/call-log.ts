// Request ids and the log line of each gRPC / Connect call (REST requests are
// logged by the transcoder). A failure that is not a ConnectError is an
// internal error: logged with its cause, answered as "internal error" so
// database or code details never reach the caller.
import crypto from "node:crypto";
import type { IncomingHttpHeaders } from "node:http";
import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import type { Logger } from "../log.js";
import { credentialsKey } from "./credentials.js";

const CLIENT_REQUEST_ID = /^[\w.:-]{1,128}$/;

/** The caller's `x-request-id` when it is a sane token, else a new one. */
export function requestIdOf(headers: IncomingHttpHeaders): string {
  const given = headers["x-request-id"];
  return typeof given === "string" && CLIENT_REQUEST_ID.test(given) ? given : crypto.randomUUID();
}

export function callLogInterceptor(log: Logger): Interceptor {
  return (next) => async (req) => {
    const started = performance.now();
    const { requestId } = req.contextValues.get(credentialsKey);
    const procedure = `${req.service.typeName}/${req.method.name}`;
    try {
      const res = await next(req);
      res.header.set("x-request-id", requestId);
      if (log.isLevelEnabled("info")) {
        log.info({ requestId, procedure, stream: req.stream, code: "ok", ms: Math.round(performance.now() - started) }, req.stream ? "stream opened" : "call");
      }
      return res;
    } catch (err) {
      const ms = Math.round(performance.now() - started);
      if (err instanceof ConnectError) {
        // A documented error, 500s included ("heartbeat failed"); their causes were logged where they were made.
        err.metadata.set("x-request-id", requestId);
        if (log.isLevelEnabled("info")) log.info({ requestId, procedure, code: Code[err.code], ms }, "call");
        throw err;
      }
      log.error({ err, requestId, procedure, ms }, "call failed");
      throw new ConnectError("internal error", Code.Internal, { "x-request-id": requestId });
    }
  };
}
