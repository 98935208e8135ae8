// The generic REST transcoder. The route table is built once from the route
// options declared on the RPCs in proto/; each request is turned into the
// RPC's request message, handed to the same (secured) implementation the
// Connect router serves, and the answer written as the documented JSON.
import { setMaxListeners } from "node:events";
import type { FileHandle } from "node:fs/promises";
import type { IncomingMessage, ServerResponse } from "node:http";
import type { Http2ServerRequest, Http2ServerResponse } from "node:http2";
import { create, getOption, type DescMethod, type DescService, type JsonValue, type Message } from "@bufbuild/protobuf";
import { Code, ConnectError, createContextKey, createContextValues, type ContextValues, type HandlerContext, type ServiceImpl } from "@connectrpc/connect";
import { RawBodySchema, Role, route, type RawBody } from "../../gen/svc/v1/options_pb.js";
import type { Logger } from "../log.js";
import { maskSecrets } from "../log.js";
import { bodyLimitBytesOf, readBody } from "./body.js";
import { requestIdOf } from "./call-log.js";
import { credentialsFromRest, credentialsKey } from "./credentials.js";
import { apiError } from "../errors.js";
import { answeredLogLevel, toHttpError } from "./errors.js";
import { messageToJson, requestFromRest, responseStatus } from "./json.js";
import { writeEventStream } from "./event-stream.js";
import { closed, drained } from "./drained.js";
import { JsonDepthMeter, MAX_JSON_DEPTH, tooDeepMessage } from "./json-depth.js";
import { RATE_LIMITS, type RateLimitName } from "./rate-limit-table.js";

export type NodeRequest = IncomingMessage | Http2ServerRequest;
export type NodeResponse = ServerResponse | Http2ServerResponse;

export interface RegisteredService {
  service: DescService;
  impl: ServiceImpl<DescService>;
  /** Refuses (throws) a call of `method` that brings no credential, as its authentication would, without its request. */
  refuseWithoutCredential?: (method: DescMethod, ctx: HandlerContext) => Promise<void>;
}

export interface RestRoute {
  httpMethod: string;
  template: string;
  pattern: RegExp;
  params: string[];
  literalSegments: number;
  method: DescMethod;
  service: DescService;
  impl: (req: unknown, ctx: unknown) => unknown;
  status: number;
  rateLimit: string;
  bodyLimitBytes: number;
  /** HEAD is answered as this GET, which has no effect (route option get_has_effects unset). */
  headable: boolean;
  /** Takes a credential (a role other than public): its answers depend on who asks. */
  credentialed: boolean;
  /**
   * Set where a request without a credential in its headers or query is refused before its body is read:
   * a route counted per renter key (counted once authenticated, so after the body) whose credential cannot
   * be in the body (renter and admin credentials come in headers or the query).
   */
  refuseWithoutCredential?: (ctx: HandlerContext) => Promise<void>;
}

/** Checks a request before its body is read (the per-IP rate-limit rows); may throw an apiError (429). */
export type RouteGuard = (route: RestRoute, clientIp: string) => Promise<void>;
/** The same for a request that nothing answers (an /api path no route answers, an unknown procedure, any other path), before its 404 or 405. */
export type UnroutedGuard = (httpMethod: string, path: string, clientIp: string) => Promise<void>;

/** The paths the REST API answers, a route or not (the API document and its viewer are served ahead of it). */
export const isApiPath = (path: string): boolean => path === "/api" || path.startsWith("/api/");

function compileTemplate(template: string): { pattern: RegExp; params: string[]; literalSegments: number } {
  const params: string[] = [];
  let literalSegments = 0;
  const source = template
    .split("/")
    .map((seg) => {
      const m = /^\{(\w+)\}$/.exec(seg);
      if (m) {
        params.push(m[1]);
        return "([^/]+)";
      }
      if (seg) literalSegments++;
      return seg.replace(/[.*+?^${}()|[\]\\-]/g, "\\$&");
    })
    .join("/");
  return { pattern: new RegExp(`^${source}/?$`), params, literalSegments };
}

export function buildRouteTable(services: RegisteredService[]): RestRoute[] {
  const routes: RestRoute[] = [];
  for (const { service, impl, refuseWithoutCredential } of services) {
    for (const method of service.methods) {
      const opts = getOption(method, route);
      const headerCredentials = opts.roles.length > 0 && opts.roles.every((role) => role === Role.RENTER || role === Role.ADMIN);
      const keyRow = RATE_LIMITS[(opts.rateLimit || "default") as RateLimitName]?.per === "renter_key";
      for (const binding of opts.http) {
        const { pattern, params, literalSegments } = compileTemplate(binding.path);
        routes.push({
          httpMethod: binding.method.toUpperCase(),
          template: binding.path,
          pattern,
          params,
          literalSegments,
          method,
          service,
          impl: (impl as unknown as Record<string, (req: unknown, ctx: unknown) => unknown>)[method.localName],
          status: opts.status || 200,
          rateLimit: opts.rateLimit,
          bodyLimitBytes: bodyLimitBytesOf(method),
          headable: binding.method.toUpperCase() === "GET" && !opts.getHasEffects && method.methodKind !== "server_streaming",
          credentialed: opts.roles.some((role) => role !== Role.PUBLIC),
          refuseWithoutCredential: refuseWithoutCredential && headerCredentials && keyRow ? (ctx) => refuseWithoutCredential(method, ctx) : undefined,
        });
      }
    }
  }
  // Literal segments win over {variables}: /api/providers/me before /api/providers/{api_key}/jobs.
  routes.sort((a, b) => b.literalSegments - a.literalSegments || b.params.length - a.params.length);
  return routes;
}

/** A malformed escape (a lone "%") is kept as sent rather than thrown. */
function safeDecode(segment: string): string {
  try {
    return decodeURIComponent(segment);
  } catch {
    return segment;
  }
}

/** Path parameters that carry a credential (credentials.ts takes a key from them). */
const CREDENTIAL_PARAMS = new Set(["api_key", "key"]);

/**
 * A matched request's path as logged: a credential parameter is `***` whatever form it came in
 * (the router decodes escapes, so `svc%2Dprovider%2D…` is a working key), and any key elsewhere
 * in the path, as sent or percent-encoded, is masked (maskSecrets).
 */
function pathForLog(r: RestRoute, pathname: string): string {
  const m = r.params.some((p) => CREDENTIAL_PARAMS.has(p)) ? r.pattern.exec(pathname) : null;
  if (!m) return maskSecrets(pathname);
  let i = 0;
  const path = r.template
    .split("/")
    .map((seg) => {
      const param = /^\{(\w+)\}$/.exec(seg)?.[1];
      if (param === undefined) return seg;
      const raw = m[++i];
      return CREDENTIAL_PARAMS.has(param) ? "***" : raw;
    })
    .join("/");
  return maskSecrets(path);
}

const literalTables = new WeakMap<RestRoute[], Map<string, RestRoute>>();

/** "METHOD /path" -> route for templates without {variables} (they win over any template with one). */
function literalTable(routes: RestRoute[]): Map<string, RestRoute> {
  let t = literalTables.get(routes);
  if (!t) {
    t = new Map();
    for (const r of routes) if (r.params.length === 0 && !t.has(`${r.httpMethod} ${r.template}`)) t.set(`${r.httpMethod} ${r.template}`, r);
    literalTables.set(routes, t);
  }
  return t;
}

export function matchRoute(routes: RestRoute[], httpMethod: string, path: string) {
  const literal = literalTable(routes).get(`${httpMethod} ${path.length > 1 && path.endsWith("/") ? path.slice(0, -1) : path}`);
  if (literal) return { route: literal, pathParams: {} as Record<string, string>, pathMatched: true };
  let pathMatched = false;
  for (const r of routes) {
    const m = r.pattern.exec(path);
    if (!m) continue;
    pathMatched = true;
    if (r.httpMethod !== httpMethod) continue;
    const pathParams: Record<string, string> = {};
    r.params.forEach((p, i) => {
      pathParams[p] = safeDecode(m[i + 1]);
    });
    return { route: r, pathParams, pathMatched };
  }
  return { route: undefined, pathParams: {}, pathMatched };
}

/** The methods a path answers (HEAD wherever GET is), for a 405's Allow header. */
export function allowedMethods(routes: RestRoute[], path: string): string[] {
  const methods = new Set<string>();
  for (const r of routes) {
    if (!r.pattern.test(path)) continue;
    methods.add(r.httpMethod);
    if (r.headable) methods.add("HEAD");
  }
  return [...methods].sort();
}

export function sendJson(res: NodeResponse, status: number, body: unknown, headers: Record<string, string> = {}) {
  const data = JSON.stringify(body);
  res.writeHead(status, { "content-type": "application/json; charset=utf-8", "content-length": Buffer.byteLength(data), ...headers });
  res.end(data);
}

/**
 * Runs a rate-limit step of a handler outside the transcoder (its 429, or any
 * failure, answered as `{"error"}`); false when it answered.
 */
export async function passesLimit(res: NodeResponse, step: () => Promise<void>): Promise<boolean> {
  try {
    await step();
    return true;
  } catch (err) {
    const e = toHttpError(err);
    sendJson(res, e.status, { error: e.message }, e.headers);
    return false;
  }
}

/**
 * The client address: the socket's, unless `trustedHops` proxies stand in
 * front of the service (SVC_TRUST_PROXY). Each proxy appends the address it
 * saw to X-Forwarded-For, so the client controls every entry left of those:
 * the client is the `trustedHops`-th entry from the right (what the outermost
 * trusted proxy saw), or the socket when the header has fewer entries.
 */
export function clientIpOf(req: NodeRequest, trustedHops: number): string {
  if (trustedHops > 0) {
    const fwd = req.headers["x-forwarded-for"];
    if (fwd) {
      const entries = (Array.isArray(fwd) ? fwd.join(",") : fwd).split(",").map((e) => e.trim());
      if (entries.length >= trustedHops) {
        const ip = entries[entries.length - trustedHops];
        if (ip) return ip;
      }
    }
  }
  return req.socket?.remoteAddress ?? "";
}

export interface RestHandlerOptions {
  routes: RestRoute[];
  log: Logger;
  /** Trusted proxy hops (config.trustProxy). */
  trustProxy: number;
  guard?: RouteGuard;
  unroutedGuard?: UnroutedGuard;
  shutdownSignal?: AbortSignal;
  /** Told of every answered route request (metrics): its status and seconds taken (a stream: until it ended). */
  onAnswered?: (route: RestRoute, status: number, seconds: number) => void;
}

/** A file a raw-body handler answers with, open, and its size (sent as content-length). */
export interface RawFile {
  handle: FileHandle;
  size: number;
}
export interface RawFileSlot {
  file?: RawFile;
}

/**
 * Present on REST calls of raw-body routes only: a handler that puts an open
 * file here is answered with that file, streamed (a read buffer per download,
 * however large the file), instead of with the message's `data`.
 */
export const rawFileSlotKey = createContextKey<RawFileSlot | undefined>(undefined);

/** A file download whose client accepts nothing for this long is ended (a setting so tests can shorten it). */
export const rawFileTimeouts = { idleMs: 60_000 };

const gone = (res: NodeResponse) => closed(res) || res.writableEnded;

/**
 * Writes a file as the body (headers already sent), waiting for the client
 * between chunks: a slow reader holds back its download, and one that reads
 * nothing for rawFileTimeouts.idleMs loses the connection. Closes the file.
 */
async function writeFile(res: NodeResponse, file: RawFile): Promise<void> {
  if (file.size === 0) {
    await file.handle.close();
    res.end();
    return;
  }
  // Never past the size announced, should the file grow meanwhile.
  const input = file.handle.createReadStream({ start: 0, end: file.size - 1 });
  const idle = setTimeout(() => res.destroy(), rawFileTimeouts.idleMs);
  let sent = 0;
  try {
    for await (const chunk of input as AsyncIterable<Buffer>) {
      if (gone(res)) break;
      sent += chunk.length;
      if (!(res as ServerResponse).write(chunk)) await drained(res);
      idle.refresh();
    }
  } catch (err) {
    res.destroy(); // a body cut short, never one ended as if complete
    throw err;
  } finally {
    clearTimeout(idle);
    input.destroy();
  }
  if (gone(res)) return;
  // A file that shrank after its size was sent: a cut connection tells the client the download failed.
  if (sent < file.size) res.destroy();
  else res.end();
}

const CLIENT_GONE = new ConnectError("the client closed the connection", Code.Canceled);
const SHUTTING_DOWN = new ConnectError("the server is shutting down", Code.Unavailable);
const STREAM_ENDED = new ConnectError("the stream ended", Code.Canceled);

/**
 * A request's cancellation signal, made only if a handler asks for it (few
 * do; an AbortController per request is measurable on small calls). It aborts
 * when the client leaves before the answer or the server shuts down, and when
 * a server stream's call ends for any reason.
 */
class LazyAbort {
  private controller: AbortController | undefined;
  private reason: unknown;
  private listening = false;

  constructor(private readonly shutdown: AbortSignal | undefined) {}

  private onShutdown: (() => void) | undefined;

  get signal(): AbortSignal {
    if (!this.controller) {
      this.controller = new AbortController();
      if (this.reason !== undefined) this.controller.abort(this.reason);
      else if (this.shutdown?.aborted) this.controller.abort(SHUTTING_DOWN);
      else if (this.shutdown) {
        const onShutdown = () => this.abort(SHUTTING_DOWN);
        this.onShutdown = onShutdown;
        this.shutdown.addEventListener("abort", onShutdown);
        this.listening = true;
      }
    }
    return this.controller.signal;
  }

  /** Preallocated reasons only: a default DOMException captures a stack. */
  abort(reason: unknown): void {
    if (this.controller) this.controller.abort(reason);
    else this.reason ??= reason;
  }

  /** Unlinks from the shared shutdown signal once the request is answered. */
  release(): void {
    if (this.listening) this.shutdown!.removeEventListener("abort", this.onShutdown!);
    this.listening = false;
  }
}

/**
 * The HandlerContext of a REST call. Lighter than connect's
 * createHandlerContext (no deadline timer, no linked controllers): the
 * headers objects, slow to build, are made only when a handler uses them.
 */
class RestContext implements HandlerContext {
  readonly protocolName = "rest";
  readonly service: DescService;
  readonly method: DescMethod;
  private reqHeader: Headers | undefined;
  private resHeader: Headers | undefined;
  private resTrailer: Headers | undefined;

  constructor(
    r: RestRoute,
    readonly requestMethod: string,
    private readonly parsedUrl: URL,
    private readonly cancel: LazyAbort,
    private readonly requestId: string,
    readonly values: ContextValues,
  ) {
    this.service = r.service;
    this.method = r.method;
  }

  timeoutMs(): number | undefined {
    return undefined;
  }

  get signal(): AbortSignal {
    return this.cancel.signal;
  }

  get url(): string {
    return this.parsedUrl.toString();
  }

  get requestHeader(): Headers {
    return (this.reqHeader ??= new Headers({ "x-request-id": this.requestId }));
  }

  get responseHeader(): Headers {
    return (this.resHeader ??= new Headers());
  }

  get responseTrailer(): Headers {
    return (this.resTrailer ??= new Headers());
  }

  /** Response headers a handler set (the transcoder copies them to the answer). */
  responseHeaderRecord(): Record<string, string> {
    const out: Record<string, string> = {};
    this.resHeader?.forEach((v, k) => {
      out[k] = v;
    });
    return out;
  }
}

/** Returns a handler that answers when the path is a REST route or under /api (404 when no route has it), or false. */
export function createRestHandler(opts: RestHandlerOptions) {
  // Each request in flight whose handler reads its signal listens on it: no leak warning at 11.
  if (opts.shutdownSignal) setMaxListeners(0, opts.shutdownSignal);
  return async function handleRest(req: NodeRequest, res: NodeResponse): Promise<boolean> {
    const started = performance.now();
    const url = new URL(req.url ?? "/", "http://localhost");
    const httpMethod = (req.method ?? "GET").toUpperCase();
    // HEAD is answered as GET (Node's response leaves out the body of an answer to HEAD), where that
    // GET has no effect: not an event stream (no headers to give without opening it), not the poll.
    const head = httpMethod === "HEAD";
    const { route: found, pathParams, pathMatched } = matchRoute(opts.routes, head ? "GET" : httpMethod, url.pathname);
    const r = head && !found?.headable ? undefined : found;
    if (!r) {
      if (!pathMatched && !isApiPath(url.pathname)) return false;
      // Counted as a route's request is: an unknown path or method is no way around the per-IP limit.
      const unrouted = opts.unroutedGuard;
      if (unrouted && !(await passesLimit(res, () => unrouted(httpMethod, url.pathname, clientIpOf(req, opts.trustProxy))))) return true;
      if (!pathMatched) {
        sendJson(res, 404, { error: `not found: ${httpMethod} ${maskSecrets(url.pathname)}` });
        return true;
      }
      const allow = allowedMethods(opts.routes, url.pathname);
      sendJson(res, 405, { error: `method ${httpMethod} not allowed on ${maskSecrets(url.pathname)}` }, { allow: allow.join(", ") });
      return true;
    }
    const requestId = requestIdOf(req.headers);
    res.setHeader("x-request-id", requestId);
    // What a credential is answered (an account's data, an installer holding the caller's key) is kept by no
    // cache: a shared one keys on the URL, and a key sent in a header would be handed to the next caller.
    if (r.credentialed) res.setHeader("cache-control", "no-store");
    const clientIp = clientIpOf(req, opts.trustProxy);
    let status = 500;
    let fileSlot: RawFileSlot | undefined;
    // A client gone before the answer, or shutdown, cancels the handler (and the end of a stream, below).
    const cancel = new LazyAbort(opts.shutdownSignal);
    res.on("close", () => {
      if (!res.writableFinished) cancel.abort(CLIENT_GONE);
    });
    try {
      // Counted before the body is read: a malformed or oversized request still counts, and costs no read.
      if (opts.guard) await opts.guard(r, clientIp);
      if (r.refuseWithoutCredential && httpMethod !== "GET" && httpMethod !== "HEAD") {
        const given = credentialsFromRest(req.headers, pathParams, url.searchParams, undefined, clientIp, requestId);
        if (given.keys.length === 0 && given.adminTokens.length === 0) {
          try {
            await r.refuseWithoutCredential(new RestContext(r, httpMethod, url, cancel, requestId, createContextValues().set(credentialsKey, given)));
          } catch (err) {
            // Its body left unread, an HTTP/1.1 connection cannot carry another request.
            if (req.httpVersionMajor === 1) res.setHeader("connection", "close");
            throw err;
          }
        }
      }
      let rawBody: Buffer = Buffer.alloc(0);
      let body: JsonValue | undefined;
      if (httpMethod !== "GET" && httpMethod !== "HEAD") {
        rawBody = await readBody(req, r.bodyLimitBytes);
        // Before it is parsed (and before the credentials some routes take from it are looked at): json-depth.ts.
        const depth = new JsonDepthMeter(MAX_JSON_DEPTH);
        if (depth.exceeds(rawBody)) throw apiError(400, tooDeepMessage("JSON body", depth.member()));
        if (rawBody.length > 0) {
          try {
            body = JSON.parse(rawBody.toString("utf8"));
          } catch {
            throw apiError(400, "malformed JSON body");
          }
        }
      }
      const creds = credentialsFromRest(req.headers, pathParams, url.searchParams, body, clientIp, requestId);
      const input = requestFromRest(r.method.input, { pathParams, query: url.searchParams, headers: req.headers, body, rawBody });
      const values = createContextValues().set(credentialsKey, creds);
      if (r.method.output.typeName === RawBodySchema.typeName) values.set(rawFileSlotKey, (fileSlot = {}));
      const ctx = new RestContext(r, httpMethod, url, cancel, requestId, values);
      if (r.method.methodKind === "server_streaming") {
        status = 200;
        await writeEventStream(res, r.method.output, r.impl(input, ctx) as AsyncIterable<unknown>, ctx.responseHeaderRecord());
        return true;
      }
      const init = await r.impl(input, ctx);
      const output = create(r.method.output, init as never) as Message;
      const extra = ctx.responseHeaderRecord();
      if (r.method.output.typeName === RawBodySchema.typeName) {
        const raw = output as unknown as RawBody;
        status = r.status;
        // Bytes others may have made (a job's output, from its provider): never a document of this origin,
        // should a browser open one (no script, no sniffing: nosniff is on every answer, server.ts).
        const headers: Record<string, string> = {
          "content-type": raw.contentType || "application/octet-stream",
          "content-security-policy": "sandbox; default-src 'none'",
          ...extra,
        };
        if (raw.filename) headers["content-disposition"] = `attachment; filename="${raw.filename}"`;
        const file = fileSlot?.file;
        if (file && head) {
          res.writeHead(status, { ...headers, "content-length": file.size });
          res.end();
        } else if (file) {
          fileSlot!.file = undefined;
          res.writeHead(status, { ...headers, "content-length": file.size });
          await writeFile(res, file);
        } else {
          res.writeHead(status, { ...headers, "content-length": raw.data.length });
          // A view of the message's bytes, not a copy.
          res.end(Buffer.from(raw.data.buffer, raw.data.byteOffset, raw.data.byteLength));
        }
      } else {
        status = responseStatus(r.method.output, output) ?? r.status;
        sendJson(res, status, messageToJson(r.method.output, output), extra);
      }
    } catch (err) {
      const e = toHttpError(err);
      status = e.status;
      if (status >= 500) opts.log[answeredLogLevel(err, e)]({ err, requestId, route: r.template }, "request failed");
      if (!res.headersSent) sendJson(res, status, { error: e.message }, e.headers);
      else res.end();
    } finally {
      // A file handed over by a handler whose answer was not written (it failed afterwards).
      if (fileSlot?.file) void fileSlot.file.handle.close().catch(() => {});
      // A stream may end while its handler still waits on its signal (a wrapper that ended it, as
      // on revocation, can only queue its return() behind that wait): as on gRPC and Connect, the
      // handler's signal aborts once the call ends, so what it holds is let go at once.
      if (r.method.methodKind === "server_streaming") cancel.abort(STREAM_ENDED);
      cancel.release();
      opts.onAnswered?.(r, status, (performance.now() - started) / 1000);
      if (opts.log.isLevelEnabled("info")) {
        opts.log.info(
          { requestId, method: httpMethod, path: pathForLog(r, url.pathname), route: r.template, status, ms: Math.round(performance.now() - started) },
          "request",
        );
      }
    }
    return true;
  };
}
