// gRPC streaming calls served straight off their HTTP/2 stream.
//
// Connect's Node handler carries every message of a stream through about ten
// async iterables each way (the adapter's reader, envelope split, decompress,
// parse; serialize, compress, join, catch, the adapter's writer). On a
// daemon's stream of heartbeats that chain cost more server CPU per message
// than a whole JSON heartbeat, and tens of KB of heap per open stream. Here the
// 5-byte gRPC envelopes are split and parsed as the frames arrive and the
// answers written as they come; the messages reach the same implementation
// through the same interceptors and the same handler context that Connect
// builds (createHandlerContext, transformInvokeImplementation), so a call
// behaves alike on either path.
//
// Taken here: POST over HTTP/2, `application/grpc` or `application/grpc+proto`,
// messages not compressed. Everything else (compressed messages, the JSON
// codec, gRPC-Web, Connect's own protocol, HTTP/1.1) is left to Connect.
import type http2 from "node:http2";
import { create, isMessage, toBinary, type DescMethod, type DescMethodStreaming, type DescMessage, type Message } from "@bufbuild/protobuf";
import { Code, ConnectError, createHandlerContext, type ContextValues, type HandlerContext, type Interceptor, type StreamRequest, type StreamResponse } from "@connectrpc/connect";
import type { Logger } from "../log.js";
import { drained } from "./drained.js";
import { deferred } from "../shared/iterables.js";
import { grpcStatusOk, parseTimeout, setTrailerStatus } from "@connectrpc/connect/protocol-grpc";
import { NestedTooDeep, readBinaryRequest } from "../shared/json-nesting.js";
import { ListTooLong } from "../shared/list-bounds.js";
import type { KindBounds } from "./kind-bounds.js";

export interface StreamRoute {
  method: DescMethod;
  /** The method's implementation, as given to Connect's router. */
  impl: unknown;
  /** Largest message accepted, in bytes. */
  readMaxBytes: number;
  /** Smaller bounds for each kind of message, when its type is a oneof of kinds (http/kind-bounds.ts). */
  bounds?: KindBounds;
  /** Reads a request message; readBinaryRequest (protobuf-es, as deep as MAX_JSON_DEPTH allows) when not given. */
  decode?: (bytes: Uint8Array) => Message;
  /** Writes an answer, a message or its init shape (as Connect accepts either); protobuf-es's toBinary when not given. */
  encode?: (answer: unknown) => Uint8Array;
}

export interface GrpcStreamOptions {
  routes: StreamRoute[];
  interceptors: Interceptor[];
  contextValues: (req: http2.Http2ServerRequest) => ContextValues;
  shutdownSignal: AbortSignal;
  log: Logger;
}

/** Returns true when it took the request; false leaves it to Connect. */
export type GrpcStreamHandler = (req: http2.Http2ServerRequest | { httpVersionMajor: number }, res: unknown) => boolean;

type HandlerContextController = HandlerContext & { abort(reason?: unknown): void };

const CONTENT_TYPE = /^application\/grpc(?:\+proto)?$/i;
const PROTO = "application/grpc+proto";
/** Messages read ahead of the implementation before the stream is paused (HTTP/2 flow control takes over). */
const READ_AHEAD = 32;
const NO_ERROR = 0x0;
/** The bytes of a message that hold its first field's tag and length (two varints) at most. */
const KIND_HEAD_BYTES = 10;
const INTERNAL_ERROR = 0x2;
const H2_CANCEL = 0x8;
const H2_STREAM_CLOSED = 0x5;

export function createGrpcStreamHandler(opts: GrpcStreamOptions): GrpcStreamHandler {
  // Shutdown reaches the open calls through one listener: Node's EventTarget scans its listeners
  // on each add and remove, so one per stream made opening 10,000 streams quadratic.
  const calls = new Set<HandlerContextController>();
  opts.shutdownSignal.addEventListener("abort", () => {
    for (const ctx of calls) ctx.abort(opts.shutdownSignal.reason);
  }, { once: true });
  const byPath = new Map<string, StreamRoute>();
  for (const r of opts.routes) {
    if (r.method.methodKind === "unary") throw new Error(`${r.method.name} is unary: Connect serves it`);
    byPath.set(`/${r.method.parent.typeName}/${r.method.name}`, r);
  }
  return (anyReq, res) => {
    if (anyReq.httpVersionMajor !== 2) return false;
    const req = anyReq as http2.Http2ServerRequest;
    const route = byPath.get(req.url);
    if (!route || req.method !== "POST") return false;
    const headers = req.headers;
    if (!CONTENT_TYPE.test(headers["content-type"] ?? "")) return false;
    const encoding = headers["grpc-encoding"];
    if (encoding !== undefined && encoding !== "identity") return false;
    serve(route, req, res as http2.Http2ServerResponse, opts, calls).catch((err) => {
      // Only a fault of this module gets here: the implementation's errors end in the status.
      opts.log.error({ err, procedure: req.url }, "stream call failed");
      if (!req.stream.closed) req.stream.close(INTERNAL_ERROR);
    });
    return true;
  };
}

function webHeaders(node: http2.IncomingHttpHeaders): Headers {
  const h = new Headers();
  for (const [k, v] of Object.entries(node)) {
    if (k.startsWith(":") || v === undefined) continue;
    if (Array.isArray(v)) for (const e of v) h.append(k, e);
    else h.append(k, String(v));
  }
  return h;
}

function nodeHeaders(web: Headers, into: http2.OutgoingHttpHeaders): http2.OutgoingHttpHeaders {
  web.forEach((value, key) => {
    const had = into[key];
    into[key] = had === undefined ? value : Array.isArray(had) ? [...had, value] : [String(had), value];
  });
  return into;
}

/** Why a stream closed, as Connect reports it to the implementation (a client's cancel is Canceled). */
function closeReason(rstCode: number): ConnectError | undefined {
  if (rstCode === 0 || rstCode === H2_STREAM_CLOSED) return undefined;
  const code = rstCode === H2_CANCEL ? Code.Canceled : Code.Internal;
  return new ConnectError(`http/2 stream closed with error code 0x${rstCode.toString(16)}`, code);
}

function premature(): Error {
  return Object.assign(new Error("the stream closed before the call ended"), { code: "ERR_STREAM_PREMATURE_CLOSE" });
}

function frame(bytes: Uint8Array): Buffer {
  const out = Buffer.allocUnsafe(5 + bytes.length);
  out[0] = 0;
  out.writeUInt32BE(bytes.length, 1);
  out.set(bytes, 5);
  return out;
}

async function serve(
  route: StreamRoute,
  req: http2.Http2ServerRequest,
  res: http2.Http2ServerResponse,
  opts: GrpcStreamOptions,
  calls: Set<HandlerContextController>,
): Promise<void> {
  const stream = req.stream;
  const { method } = route;
  const requestAbort = new AbortController();
  const timeout = parseTimeout(typeof req.headers["grpc-timeout"] === "string" ? req.headers["grpc-timeout"] : null, Number.MAX_SAFE_INTEGER);
  const context = createHandlerContext({
    service: method.parent,
    method,
    protocolName: "grpc",
    requestMethod: "POST",
    url: `http://${req.authority}${req.url}`,
    timeoutMs: timeout.timeoutMs,
    requestSignal: requestAbort.signal,
    requestHeader: webHeaders(req.headers),
    responseHeader: { "content-type": PROTO },
    responseTrailer: { "grpc-status": grpcStatusOk },
    contextValues: opts.contextValues(req),
  });
  if (opts.shutdownSignal.aborted) context.abort(opts.shutdownSignal.reason);
  calls.add(context);
  const inbox = new Inbox<Message>(stream);
  const reader = new EnvelopeReader(method.input, route.readMaxBytes, route.decode, route.bounds);
  const encode = route.encode ?? ((answer: unknown) => toBinary(method.output, normalize(method.output, answer)));
  // Stream errors end in "close"; this listener only keeps them from being thrown.
  stream.on("error", () => {});
  stream.on("data", (chunk: Buffer) => {
    try {
      reader.push(chunk, (m) => inbox.push(m));
    } catch (err) {
      inbox.fail(err);
      stream.pause();
    }
  });
  stream.on("end", () => {
    if (reader.pending > 0) inbox.fail(new ConnectError("protocol error: the stream ended inside a message", Code.InvalidArgument));
    else inbox.end();
  });
  stream.once("close", () => {
    const reason = closeReason(stream.rstCode ?? 0);
    requestAbort.abort(reason);
    inbox.fail(reason ?? new ConnectError("the client went away", Code.Canceled));
  });

  const call = invoke(route, context, opts.interceptors, inbox);
  const it = call.messages;
  const trailer = context.responseTrailer;
  let headersSent = false;
  let gone = false;
  const open = () => !stream.destroyed && !stream.closed;
  try {
    if (timeout.error) throw timeout.error;
    for (let r = await it.next(); !r.done; r = await it.next()) {
      if (!open()) {
        gone = true;
        break;
      }
      if (!headersSent) {
        // Sent with the first answer: the implementation and interceptors may still add headers until then.
        res.writeHead(200, nodeHeaders(context.responseHeader, {}));
        headersSent = true;
      }
      if (!res.write(frame(encode(r.value)))) await drained(res);
    }
    if (!gone) call.finished();
    // A message the client sent that could not be read ends the call with that error.
    if (inbox.failure instanceof ConnectError && inbox.failure.code !== Code.Canceled) setTrailerStatus(trailer, inbox.failure);
  } catch (err) {
    context.abort(err);
    setTrailerStatus(trailer, err instanceof ConnectError ? err : new ConnectError("internal error", Code.Internal, undefined, undefined, err));
  } finally {
    calls.delete(context);
    context.abort();
    // A stream closed under the call is a write that failed, as on Connect's path: the
    // interceptors see it (logged as the client gone away) and the implementation's finally runs.
    if (gone) it.throw?.(premature()).catch(() => {});
    else it.return?.().catch(() => {});
  }
  if (!open()) return;
  // The status travels in trailers, also after no message at all (as Connect answers: grpc-js
  // reads a status in headers only when they end the stream).
  if (!headersSent) res.writeHead(200, nodeHeaders(context.responseHeader, {}));
  res.addTrailers(nodeHeaders(trailer, {}));
  // A client still sending after the status is told to stop (RST_STREAM NO_ERROR, as gRPC
  // servers do), so its half of the stream is not held open.
  // Node's compatibility layer sends the trailers from its own "wantTrailers" listener, the first.
  stream.once("wantTrailers", () =>
    setImmediate(() => {
      if (!stream.closed) stream.close(NO_ERROR);
    }),
  );
  res.end();
}


/**
 * The implementation's answers, called through the interceptors with the handler context, as
 * Connect's transformInvokeImplementation calls a streaming method; without its generator around
 * the answers, and their headers and trailers copied into the context as it copies them.
 */
function invoke(route: StreamRoute, context: HandlerContext, interceptors: Interceptor[], input: AsyncIterable<Message>): Invocation {
  const method = route.method as DescMethodStreaming;
  const impl = route.impl as (req: unknown, ctx: HandlerContext) => AsyncIterable<Message>;
  const call: StreamingFn = async (req) => {
    const ctx = { ...context, service: req.service, requestHeader: req.header, signal: req.signal, values: req.contextValues };
    const message = impl(method.methodKind === "server_streaming" ? await single(req.message) : req.message, ctx);
    return { stream: true, service: method.parent, method, header: context.responseHeader, trailer: context.responseTrailer, message };
  };
  const next = interceptors.reduceRight<StreamingFn>((n, i) => i(n as never) as unknown as StreamingFn, call);
  let trailer: Headers | undefined;
  const messages = deferred(async () => {
    const res = await next({
      stream: true, service: method.parent, method, requestMethod: context.requestMethod, url: context.url,
      signal: context.signal, header: context.requestHeader, contextValues: context.values, message: input,
    });
    copyHeaders(res.header, context.responseHeader);
    trailer = res.trailer;
    return res.message[Symbol.asyncIterator]();
  });
  return { messages, finished: () => trailer && copyHeaders(trailer, context.responseTrailer) };
}

interface Invocation {
  messages: AsyncIterator<Message>;
  /** The answers ran out: the trailers the interceptors left join the context's. */
  finished(): void;
}

type StreamingFn = (req: StreamRequest<DescMessage, DescMessage>) => Promise<StreamResponse<DescMessage, DescMessage>>;

/** A server-streaming method's one request (Connect's rule: exactly one message). */
async function single(messages: AsyncIterable<Message>): Promise<Message> {
  const it = messages[Symbol.asyncIterator]();
  const first = await it.next();
  if (first.done) throw new ConnectError("protocol error: missing input message for server-streaming method", Code.Unimplemented);
  const second = await it.next();
  if (!second.done) throw new ConnectError("protocol error: received extra input message for server-streaming method", Code.Unimplemented);
  return first.value;
}

function copyHeaders(from: Headers, to: Headers): void {
  if (from === to) return;
  for (const key of [...to.keys()]) to.delete(key);
  from.forEach((value, key) => to.set(key, value));
}

/** An answer as the implementation gave it: a message, or the init shape of one (as Connect accepts). */
const normalize = (schema: DescMessage, value: unknown): Message => (isMessage(value, schema) ? value : create(schema, value as never));

/**
 * Splits the gRPC envelopes (flag byte, 4-byte length, message) out of a stream's chunks and parses them.
 * The chunks of a message are kept as they came and joined once, when the message is whole: each byte is
 * copied at most twice however many frames a message spans (joining the partial message with every frame
 * made a 16 MiB message cost seconds of CPU). With `bounds`, a message is held to its kind's bound: from
 * its first bytes when they tell its kind, else once it is whole; either way before it is decoded.
 */
export class EnvelopeReader {
  private parts: Buffer[] = [];
  private length = 0;
  /** The kind of the message being read was told by its first bytes, and it is within its bound. */
  private kindKnown = false;

  private readonly decode: (bytes: Uint8Array) => Message;

  constructor(
    private readonly schema: DescMessage,
    private readonly maxBytes: number,
    decode?: (bytes: Uint8Array) => Message,
    private readonly bounds?: KindBounds,
  ) {
    this.decode = decode ?? ((bytes) => readBinaryRequest(schema, bytes));
  }

  get pending(): number {
    return this.length;
  }

  push(chunk: Buffer, deliver: (message: Message) => void): void {
    if (chunk.length === 0) return;
    this.parts.push(chunk);
    this.length += chunk.length;
    while (this.length >= 5) {
      const head = this.parts[0]!.length >= 5 ? this.parts[0]! : this.take(5, false);
      const flags = head[0]!;
      const size = head.readUInt32BE(1);
      if (size > this.maxBytes) {
        throw new ConnectError(`message is ${size} bytes, more than the ${this.maxBytes} this method accepts`, Code.ResourceExhausted);
      }
      if (flags !== 0) {
        throw new ConnectError(
          flags === 1 ? "protocol error: a compressed message on a stream that declared no compression" : `protocol error: envelope flags ${flags}`,
          Code.InvalidArgument,
        );
      }
      if (this.bounds && !this.kindKnown) {
        // The first field's tag and length: at most ten bytes, copied when the frames cut them.
        const scan = this.bounds.scan(size);
        const refusal = scan.push(this.take(Math.min(this.length, 5 + size, 5 + KIND_HEAD_BYTES), false).subarray(5));
        if (refusal) throw refusal;
        this.kindKnown = scan.known;
      }
      if (this.length < 5 + size) break;
      const envelope = this.take(5 + size, true);
      const known = this.kindKnown;
      this.kindKnown = false;
      if (this.bounds && !known) {
        const scan = this.bounds.scan(size);
        const refusal = scan.push(envelope.subarray(5)) ?? scan.end();
        if (refusal) throw refusal;
      }
      let message: Message;
      try {
        message = this.decode(envelope.subarray(5));
      } catch (err) {
        if (err instanceof NestedTooDeep || err instanceof ListTooLong) throw new ConnectError(err.message, Code.InvalidArgument);
        throw new ConnectError(`invalid ${this.schema.typeName}: ${(err as Error).message}`, Code.InvalidArgument);
      }
      deliver(message);
    }
    // A partial message left in a chunk that held more: a copy, as a view would pin the whole chunk.
    const last = this.parts.length === 1 ? this.parts[0]! : undefined;
    if (last && last.length < last.buffer.byteLength / 2) this.parts[0] = Buffer.from(last);
  }

  /** The first `n` bytes (n <= length): a view when one chunk holds them, else joined; removed when `consume`. */
  private take(n: number, consume: boolean): Buffer {
    const first = this.parts[0]!;
    if (first.length >= n) {
      if (consume) {
        if (first.length === n) this.parts.shift();
        else this.parts[0] = first.subarray(n);
        this.length -= n;
      }
      return first.subarray(0, n);
    }
    const out = Buffer.allocUnsafe(n);
    let copied = 0;
    for (let i = 0; copied < n; i++) {
      const part = consume ? this.parts[0]! : this.parts[i]!;
      const k = Math.min(part.length, n - copied);
      part.copy(out, copied, 0, k);
      copied += k;
      if (!consume) continue;
      if (k === part.length) this.parts.shift();
      else this.parts[0] = part.subarray(k);
    }
    if (consume) this.length -= n;
    return out;
  }
}

/**
 * The requests as the implementation reads them: an async iterator without
 * generators. The HTTP/2 stream is paused while READ_AHEAD messages wait.
 */
class Inbox<T> implements AsyncIterableIterator<T> {
  private items: T[] = [];
  private waiter: { resolve: (r: IteratorResult<T>) => void; reject: (e: unknown) => void } | undefined;
  private done = false;
  failure: unknown;

  constructor(private readonly stream: http2.ServerHttp2Stream) {}

  push(item: T): void {
    if (this.done) return;
    const w = this.waiter;
    if (w) {
      this.waiter = undefined;
      w.resolve({ value: item, done: false });
      return;
    }
    this.items.push(item);
    if (this.items.length >= READ_AHEAD) this.stream.pause();
  }

  end(): void {
    this.finish(undefined);
  }

  fail(err: unknown): void {
    this.finish(err);
  }

  private finish(err: unknown): void {
    if (this.done) return;
    this.done = true;
    this.failure = err;
    const w = this.waiter;
    this.waiter = undefined;
    if (!w) return;
    if (err === undefined) w.resolve({ value: undefined, done: true });
    else w.reject(err);
  }

  next(): Promise<IteratorResult<T>> {
    if (this.items.length > 0) {
      const value = this.items.shift()!;
      if (this.items.length === READ_AHEAD / 2 && !this.done) this.stream.resume();
      return Promise.resolve({ value, done: false });
    }
    if (this.done) return this.failure === undefined ? Promise.resolve({ value: undefined, done: true }) : Promise.reject(this.failure);
    return new Promise((resolve, reject) => (this.waiter = { resolve, reject }));
  }

  return(): Promise<IteratorResult<T>> {
    this.items = [];
    this.finish(undefined);
    return Promise.resolve({ value: undefined, done: true });
  }

  [Symbol.asyncIterator](): this {
    return this;
  }
}
