// Connect's node adapter (connectNodeAdapter, rebuilt from the pieces
// @connectrpc/connect-node exports), but for two things. An answer is written
// by connect-response.ts, whose writes stop waiting for room when the client
// goes away. And a unary call's body is read only once its per-IP rate-limit
// row let it through. Connect reads a unary body before any interceptor
// runs, so a call the row refuses is answered at once (resource_exhausted)
// instead of once its body is in, which a client could stall. A stream's
// interceptors run before its body is read: the interceptor refuses it
// (src/http/rate-limits.ts). And a unary call's JSON
// body is measured as it arrives, as REST's is (src/http/json-depth.ts): one
// nested deeper than MAX_JSON_DEPTH is refused (invalid_argument) before
// Connect parses it, which for millions of levels held the process seconds
// (a compressed one is inflated to be measured). A message in the binary codec
// is read as deep as that depth needs (protobuf-es's recursion limit raised,
// and bounded) and held to the depth its JSON form would nest (binaryDepth);
// one nested past what protobuf-es reads, a unary call's or a stream's, is
// refused, naming the field, before Connect reads it (binaryBodyCheck), as the
// gRPC stream path refuses it (readBinaryRequest). And the lists of a request whose
// type holds one are counted before Connect reads it, in either codec, a JSON
// text in the same walk as its depth (src/shared/list-bounds.ts).
import type { Http2ServerRequest, ServerHttp2Stream } from "node:http2";
import { promisify } from "node:util";
import zlib from "node:zlib";
import { Code, ConnectError, createConnectRouter, type ContextValues, type Interceptor } from "@connectrpc/connect";
import { compressionBrotli, compressionGzip, universalRequestFromNodeRequest } from "@connectrpc/connect-node";
import type { DescMessage, DescMethod, Message } from "@bufbuild/protobuf";
import { checkBinaryRequest, checkMessageDepth, NestedTooDeep } from "../shared/json-nesting.js";
import { jsonListTree, ListTooLong, MalformedMessage, type JsonListNode } from "../shared/list-bounds.js";
import type { Logger } from "../log.js";
import type { Metrics } from "../metrics/metrics.js";
import { credentialsKey } from "./credentials.js";
import { MAX_JSON_DEPTH, PROTO_RECURSION_LIMIT, tooDeepMessage } from "./json-depth.js";
import { Envelopes, type EnvelopeReading, type Refusal } from "./envelopes.js";
import { JsonScanner } from "./json-scan.js";
import { EnvelopedKinds, type KindBounds } from "./kind-bounds.js";
import { callFailure } from "./call-log.js";
import { writeResponse } from "./connect-response.js";
import { countCall, wireOf } from "./metrics.js";
import { ipRowCountKey } from "./rate-limits.js";
import { sendJson, type NodeRequest, type NodeResponse } from "./rest.js";

export interface ConnectRoute {
  method: DescMethod;
  impl: never;
  readMaxBytes: number;
  /** A stream's smaller bounds for each kind of its messages (kind-bounds.ts). */
  bounds?: KindBounds;
}

export interface ConnectHandlerOptions {
  routes: ConnectRoute[];
  interceptors: Interceptor[];
  shutdownSignal: AbortSignal;
  /** A call's context: its credentials, and its IP row's count started (ipRowCountKey). */
  contextValues(req: NodeRequest): ContextValues;
  /** Whatever is not a procedure (REST, /v1, the console, …). */
  fallback(req: NodeRequest, res: NodeResponse): void;
  metrics: Metrics;
  log: Logger;
}

export function createConnectHandler(o: ConnectHandlerOptions): (req: NodeRequest, res: NodeResponse) => void {
  const { metrics, log } = o;
  const router = createConnectRouter({
    interceptors: [...o.interceptors, binaryDepth],
    shutdownSignal: o.shutdownSignal,
    acceptCompression: [compressionGzip, compressionBrotli],
    // A JSON message is measured as it arrives (below): its free-form JSON may nest as deep as that allows.
    jsonOptions: { recursionLimit: PROTO_RECURSION_LIMIT },
    // A binary message cannot be measured before it is parsed: it is parsed as deep as its free-form JSON may nest, and measured then.
    binaryOptions: { recursionLimit: PROTO_RECURSION_LIMIT },
  });
  for (const r of o.routes) router.rpc(r.method, r.impl, { readMaxBytes: r.readMaxBytes });
  const procedures = new Map(router.handlers.map((h) => [h.requestPath, h]));
  const limits = new Map(o.routes.map((r) => [`/${r.method.parent.typeName}/${r.method.name}`, r.readMaxBytes]));
  const kindBounds = new Map<string, KindBounds>(o.routes.flatMap((r) => (r.bounds ? [[`/${r.method.parent.typeName}/${r.method.name}`, r.bounds]] : [])));

  /** A call its IP row refused before its body was read: what the interceptors would have done for it (metrics, log line, request id). */
  const refusedBeforeBody = (req: NodeRequest, res: NodeResponse, procedure: string, started: number, requestId: string) => (err: unknown) => {
    // Its body is left unread: on HTTP/1.1 the connection cannot carry another request, and is closed.
    if (req.httpVersionMajor === 1 && !res.headersSent) res.setHeader("connection", "close");
    const e = callFailure(log, err, { requestId, procedure, started });
    countCall(metrics, wireOf(req.headers["content-type"]), procedure, e, started);
    throw e;
  };

  return (req, res) => {
    const uHandler = procedures.get((req.url ?? "").split("?", 1)[0]!);
    if (!uHandler) return void o.fallback(req, res);
    const started = performance.now();
    let uReq: ReturnType<typeof universalRequestFromNodeRequest>;
    let values: ContextValues;
    try {
      values = o.contextValues(req);
      uReq = universalRequestFromNodeRequest(req as never, res as never, undefined, values);
    } catch (err) {
      // No authority (an HTTP/1.0 request without Host): Connect cannot make the call's URL, and its own adapter threw.
      log.info({ err: (err as Error)?.message, path: uHandler.requestPath }, "call refused: unusable request");
      if (!res.headersSent) sendJson(res, 400, { error: "bad request" });
      return;
    }
    const counted = values.get(ipRowCountKey);
    const unary = uHandler.method.methodKind === "unary";
    const limit = limits.get(uHandler.requestPath) ?? 0;
    const bounds = unary ? undefined : kindBounds.get(uHandler.requestPath);
    const check = bothChecks(
      bounds && kindBodyCheck(req, limit, bounds),
      jsonBodyCheck(req, unary, limit, uHandler.method.input) ?? binaryBodyCheck(req, unary, limit, uHandler.method.input),
    );
    if (counted || check) {
      const body = uReq.body as AsyncIterable<Uint8Array>;
      const refused = refusedBeforeBody(req, res, `${uHandler.service.typeName}/${uHandler.method.name}`, started, values.get(credentialsKey).requestId);
      uReq.body = (async function* () {
        if (counted) await counted.catch(refused);
        for await (const piece of body) {
          const refusal = await check?.(piece);
          if (refusal && unary) refused(refusal);
          // A stream's messages are read by its implementation, after the interceptors: a refused one
          // fails that read, and the call's own ending logs and counts it.
          if (refusal) throw refusal;
          yield piece;
        }
        // A unary body is read by Connect once it has ended, and what needs it whole is checked now.
        const refusal = await check?.end?.();
        if (refusal && unary) refused(refusal);
        if (refusal) throw refusal;
      })();
    }
    if (!unary && req.httpVersionMajor === 2) closeClientHalfOnceAnswered((req as Http2ServerRequest).stream);
    uHandler(uReq)
      .then((uRes) => writeResponse(uRes, res))
      .catch((reason: unknown) => {
        if (ConnectError.from(reason).code === Code.Aborted) return;
        log.error({ err: reason, procedure: uHandler.requestPath }, "call handler failed");
      });
  };
}

const H2_NO_ERROR = 0x0;

/**
 * A stream call's client may go on sending after its answer ended (a daemon's stream has no deadline for its
 * request: edge.ts): once the answer is out, trailers included, its half is closed too (RST_STREAM NO_ERROR,
 * as gRPC servers do, and as http/grpc-streams.ts does on the gRPC path), so that it holds neither the stream
 * nor its connection. Node's compatibility layer sends the trailers from its own "wantTrailers" listener.
 */
function closeClientHalfOnceAnswered(stream: ServerHttp2Stream): void {
  stream.once("wantTrailers", () =>
    setImmediate(() => {
      if (!stream.closed && !stream.destroyed) stream.close(H2_NO_ERROR);
    }),
  );
}

/**
 * A request in the binary codec whose messages' JSON form would nest past MAX_JSON_DEPTH is refused
 * (invalid_argument) as the same message in JSON is. One too deep for protobuf-es's bounded reading of it
 * is refused before Connect reads it, naming the field (binaryBodyCheck); a stream's that is not (bytes
 * the walk leaves to protobuf-es) is refused here too, naming none.
 */
const binaryDepth: Interceptor = (next) => async (req) => {
  if (/[/+]json/i.test(req.header.get("content-type") ?? "")) return next(req);
  const check = (desc: DescMessage, m: Message) => {
    try {
      checkMessageDepth(desc, m);
    } catch (err) {
      throw err instanceof NestedTooDeep ? new ConnectError(err.message, Code.InvalidArgument) : err;
    }
  };
  if (!req.stream) {
    check(req.method.input, req.message);
    return next(req);
  }
  const messages = req.message;
  return next({
    ...req,
    message: (async function* () {
      try {
        for await (const m of messages) {
          check(req.method.input, m);
          yield m;
        }
      } catch (err) {
        if (err instanceof ConnectError && /maximum recursion depth/.test(err.rawMessage)) throw new ConnectError(tooDeepMessage("request body", undefined), Code.InvalidArgument);
        throw err;
      }
    })(),
  });
};

const tooDeep = (meter: JsonScanner) => new ConnectError(tooDeepMessage("request body", meter.member()), Code.InvalidArgument);
const tooMany = (meter: JsonScanner) => {
  const refusal = meter.listRefusal();
  return refusal === undefined ? undefined : new ConnectError(refusal, Code.InvalidArgument);
};
const compressedJson = () =>
  new ConnectError("a JSON request message is taken uncompressed in gRPC or Connect stream framing (compress the binary codec's instead)", Code.Unimplemented);

/** Looks at a body's pieces as they arrive, and at its end (`end`) when given. */
type BodyCheck = ((piece: Uint8Array) => Refusal) & { end?: () => Refusal };

/** Both checks on each piece, `a` first: the first refusal. */
function bothChecks(a: BodyCheck | undefined, b: BodyCheck | undefined): BodyCheck | undefined {
  if (!a || !b) return a ?? b;
  const check: BodyCheck = async (piece) => (await a(piece)) ?? b(piece);
  const end = async () => (await a.end?.()) ?? b.end?.();
  check.end = end;
  return check;
}

const CONNECT_UNARY_JSON = /^application\/json(?:; ?charset=utf-?8)?$/;
const ENVELOPED = /^application\/(?:(grpc|grpc-web)(?:\+(proto|json(?:; ?charset=utf-?8)?))?|connect\+(proto|json(?:; ?charset=utf-?8)?))$/;

/**
 * How a call's JSON body is measured as it arrives (undefined: not JSON), in one walk of its text
 * (JsonScanner): a piece that makes it nest past MAX_JSON_DEPTH answers the refusal, and else one
 * that makes a list of its request type hold more than its bound (naming the field). A unary call
 * in Connect's application/json is the text itself, or that text compressed (content-encoding): then
 * it is inflated beside Connect's own reading, no further than `limit` (the call's message limit,
 * which Connect enforces), and measured. gRPC and gRPC-Web with the JSON codec, and Connect's
 * streaming protocol (application/connect+json: a daemon's stream, 16 MiB a message), frame each
 * message (a flag byte and a 4-byte length before it), and the payloads are measured; a message
 * compressed in that framing is refused.
 */
function jsonBodyCheck(req: NodeRequest, unary: boolean, limit: number, desc: DescMessage): BodyCheck | undefined {
  const type = String(req.headers["content-type"] ?? "").toLowerCase();
  if (unary && type.startsWith("application/json")) {
    const meter = new JsonScanner(MAX_JSON_DEPTH, CONNECT_UNARY_JSON.test(type) ? jsonListTree(desc) : undefined);
    const encoding = String(req.headers["content-encoding"] ?? "identity").toLowerCase();
    if (encoding === "identity") return (piece) => (meter.exceeds(piece) ? tooDeep(meter) : tooMany(meter));
    return inflatedCheck(encoding, limit, meter);
  }
  if (!/^application\/(grpc(-web)?|connect)\+json/.test(type)) return undefined;
  const frames = new FramedJson(ENVELOPED.test(type) ? jsonListTree(desc) : undefined);
  return (piece) => frames.refusal(piece);
}

/** Measures a compressed JSON body as it inflates (Connect reads the same bytes and inflates them itself). */
function inflatedCheck(encoding: string, limit: number, meter: JsonScanner): BodyCheck | undefined {
  const inflater = encoding === "gzip" ? zlib.createGunzip() : encoding === "br" ? zlib.createBrotliDecompress() : undefined;
  // Another encoding is Connect's to refuse (unimplemented).
  if (!inflater) return undefined;
  let seen = 0;
  let over = false;
  inflater.on("data", (out: Buffer) => {
    if (over || seen > limit) return;
    seen += out.length;
    if (meter.exceeds(out)) {
      over = true;
      inflater.destroy();
    }
  });
  // A broken stream is Connect's to refuse as it reads it.
  inflater.on("error", () => {});
  return async (piece) => {
    if (!over && seen <= limit && !inflater.destroyed) await new Promise<void>((resolve) => inflater.write(piece, () => resolve()));
    return over ? tooDeep(meter) : tooMany(meter);
  };
}

/**
 * The JSON messages of an enveloped body (gRPC, gRPC-Web, Connect's streams), measured message by message
 * (their lists too, along `lists`). A piece's refusal is its first message nested too deep or compressed,
 * else its first list past its bound.
 */
class FramedJson implements EnvelopeReading<JsonScanner> {
  private readonly envelopes = new Envelopes(0, this);
  /** The first list past its bound in the piece being read. */
  private listed: ConnectError | undefined;

  constructor(private readonly lists: JsonListNode | undefined) {}

  async refusal(piece: Uint8Array): Promise<ConnectError | undefined> {
    this.listed = undefined;
    return (await this.envelopes.refusal(piece)) ?? this.listed;
  }

  start(compressed: boolean): JsonScanner | ConnectError {
    return compressed ? compressedJson() : new JsonScanner(MAX_JSON_DEPTH, this.lists);
  }

  piece(meter: JsonScanner, bytes: Buffer): ConnectError | undefined {
    if (meter.exceeds(bytes)) return tooDeep(meter);
    this.listed ??= tooMany(meter);
    return undefined;
  }
}

const inflaters: Record<string, (bytes: Buffer, options: zlib.ZlibOptions & zlib.BrotliOptions) => Promise<Buffer>> = {
  gzip: promisify(zlib.gunzip),
  br: promisify(zlib.brotliDecompress),
};

/** A message's bytes as Connect reads them: inflated when `encoding` says so; undefined where Connect refuses them itself. */
async function inflated(bytes: Buffer, encoding: string | undefined, limit: number): Promise<Buffer | undefined> {
  if (!encoding || encoding === "identity") return bytes;
  const inflate = inflaters[encoding];
  if (!inflate) return undefined;
  try {
    return await inflate(bytes, { maxOutputLength: Math.max(limit, 1) });
  } catch {
    return undefined; // broken, or larger than the method takes
  }
}

/**
 * The refusal of a request message in the binary codec with a list past its bound, or with a field past its end,
 * or nested past what protobuf-es reads, naming the top-level field (checkBinaryRequest, one walk of its bytes):
 * Connect would read it saying only that protobuf-es's recursion limit was reached, for a unary call before any
 * interceptor.
 */
function binaryRefusal(desc: DescMessage, bytes: Buffer): ConnectError | undefined {
  try {
    checkBinaryRequest(desc, bytes);
    return undefined;
  } catch (err) {
    if (err instanceof ListTooLong || err instanceof NestedTooDeep) return new ConnectError(err.message, Code.InvalidArgument);
    if (err instanceof MalformedMessage) return new ConnectError(`parse binary: ${err.message}`, Code.InvalidArgument);
    throw err;
  }
}

/**
 * How a call's binary messages are looked at before Connect reads them (undefined: not binary): a unary call's
 * body once it is whole, a stream's messages (and gRPC's and gRPC-Web's unary ones) each as its envelope
 * completes, inflated when compressed (binaryRefusal).
 */
function binaryBodyCheck(req: NodeRequest, unary: boolean, limit: number, desc: DescMessage): BodyCheck | undefined {
  const header = (name: string) => String(req.headers[name] ?? "identity").toLowerCase();
  const type = String(req.headers["content-type"] ?? "").toLowerCase();
  if (unary && type === "application/proto") {
    const parts: Buffer[] = [];
    let size = 0;
    const check: BodyCheck = (piece) => {
      size += piece.length;
      // Past the limit Connect refuses the body itself.
      if (size <= limit) parts.push(Buffer.from(piece.buffer, piece.byteOffset, piece.byteLength));
      return undefined;
    };
    const end = async () => {
      if (size > limit) return undefined;
      const bytes = await inflated(Buffer.concat(parts, size), header("content-encoding"), limit);
      return bytes && binaryRefusal(desc, bytes);
    };
    check.end = end;
    return check;
  }
  const m = ENVELOPED.exec(type);
  if (!m || (m[2] ?? m[3] ?? "").startsWith("json")) return undefined;
  const encoding = header(m[1] ? "grpc-encoding" : "connect-content-encoding");
  const frames = new Envelopes<boolean>(limit, {
    start: (compressed) => compressed,
    whole: () => true,
    end: async (compressed, bytes) => {
      const message = bytes && (await inflated(bytes, compressed ? encoding : undefined, limit));
      return message && binaryRefusal(desc, message);
    },
  });
  return (piece) => frames.refusal(piece);
}

/**
 * How a stream's messages are held to their kind's bound (kind-bounds.ts) as they arrive, before Connect
 * reads them (undefined: not enveloped): in either codec, from a message's first bytes; a compressed binary
 * one once it is whole, inflated.
 */
function kindBodyCheck(req: NodeRequest, limit: number, bounds: KindBounds): BodyCheck | undefined {
  const m = ENVELOPED.exec(String(req.headers["content-type"] ?? "").toLowerCase());
  if (!m) return undefined;
  const json = (m[2] ?? m[3] ?? "").startsWith("json");
  const encoding = String(req.headers[m[1] ? "grpc-encoding" : "connect-content-encoding"] ?? "identity").toLowerCase();
  const frames = new Envelopes(limit, new EnvelopedKinds(bounds, json, (bytes) => inflated(bytes, encoding, limit)));
  return (piece) => frames.refusal(piece);
}
