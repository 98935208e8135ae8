// Connect's node adapter (connectNodeAdapter, rebuilt from the pieces
// @connectrpc/connect-node exports), but for one thing: a unary call's body is
// read only once its per-IP rate-limit row let it through. Connect reads a
// unary body before any interceptor runs, so a call the row refuses is
// answered at once (resource_exhausted) instead of once its body is in, which
// a client could stall. A stream's interceptors run before its body is read:
// the interceptor refuses it (src/http/rate-limits.ts). And a unary call's JSON
// body is measured as it arrives, as REST's is (src/http/json-depth.ts): one
// nested deeper than MAX_JSON_DEPTH is refused (invalid_argument) before
// Connect parses it, which for millions of levels held the process seconds
// (a compressed one is inflated to be measured). A message in the binary codec
// is read as deep as that depth needs (protobuf-es's recursion limit raised,
// and bounded) and held to the depth its JSON form would nest (binaryDepth).
// And the lists of a request whose type holds one are counted before Connect
// reads it, in either codec (listBodyCheck; src/shared/list-bounds.ts).
import type { Http2ServerRequest, ServerHttp2Stream } from "node:http2";
import { promisify } from "node:util";
import zlib from "node:zlib";
import { Code, ConnectError, createConnectRouter, type ContextValues, type Interceptor } from "@connectrpc/connect";
import { compressionBrotli, compressionGzip, universalRequestFromNodeRequest, universalResponseToNodeResponse } from "@connectrpc/connect-node";
import type { DescMessage, DescMethod, Message } from "@bufbuild/protobuf";
import { checkMessageDepth, NestedTooDeep } from "../shared/json-nesting.js";
import { checkBinaryLists, jsonListTree, ListTooLong, MalformedMessage } from "../shared/list-bounds.js";
import type { Logger } from "../log.js";
import type { Metrics } from "../metrics/metrics.js";
import { credentialsKey } from "./credentials.js";
import { JsonDepthMeter, MAX_JSON_DEPTH, PROTO_RECURSION_LIMIT, tooDeepMessage } from "./json-depth.js";
import { JsonListMeter } from "./json-lists.js";
import { callFailure } from "./call-log.js";
import { countCall, wireOf } from "./metrics.js";
import { ipRowCountKey } from "./rate-limits.js";
import { sendJson, type NodeRequest, type NodeResponse } from "./rest.js";

export interface ConnectRoute {
  method: DescMethod;
  impl: never;
  readMaxBytes: number;
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
    const check = bothChecks(jsonBodyCheck(req, unary, limit), listBodyCheck(req, unary, limit, uHandler.method.input));
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
      .then((uRes) => universalResponseToNodeResponse(uRes, res as never))
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
 * (invalid_argument) as the same message in JSON is; so is a stream's message too deep for protobuf-es's
 * bounded reading of it (a unary one is refused by Connect, saying that the recursion limit was reached).
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

const tooDeep = (meter: JsonDepthMeter) => new ConnectError(tooDeepMessage("request body", meter.member()), Code.InvalidArgument);
const compressedJson = () =>
  new ConnectError("a JSON request message is taken uncompressed in gRPC or Connect stream framing (compress the binary codec's instead)", Code.Unimplemented);

type Refusal = ConnectError | undefined | Promise<ConnectError | undefined>;
/** Looks at a body's pieces as they arrive, and at its end (`end`) when given. */
type BodyCheck = ((piece: Uint8Array) => Refusal) & { end?: () => Refusal };

function bothChecks(a: BodyCheck | undefined, b: BodyCheck | undefined): BodyCheck | undefined {
  if (!a || !b) return a ?? b;
  const check: BodyCheck = async (piece) => (await a(piece)) ?? b(piece);
  const end = async () => (await a.end?.()) ?? b.end?.();
  check.end = end;
  return check;
}

/**
 * How a call's JSON body is measured as it arrives (undefined: not JSON): a piece that makes it
 * nest past MAX_JSON_DEPTH answers the refusal. A unary call in Connect's application/json is the text
 * itself, or that text compressed (content-encoding): then it is inflated beside Connect's own reading,
 * no further than `limit` (the call's message limit, which Connect enforces), and measured. gRPC and
 * gRPC-Web with the JSON codec, and Connect's streaming protocol (application/connect+json: a daemon's
 * stream, 16 MiB a message), frame each message (a flag byte and a 4-byte length before it), and the
 * payloads are measured; a message compressed in that framing is refused.
 */
function jsonBodyCheck(req: NodeRequest, unary: boolean, limit: number): BodyCheck | undefined {
  const type = String(req.headers["content-type"] ?? "").toLowerCase();
  if (unary && type.startsWith("application/json")) {
    const meter = new JsonDepthMeter(MAX_JSON_DEPTH);
    const encoding = String(req.headers["content-encoding"] ?? "identity").toLowerCase();
    if (encoding === "identity") return (piece) => (meter.exceeds(piece) ? tooDeep(meter) : undefined);
    return inflatedCheck(encoding, limit, (out) => meter.exceeds(out), () => tooDeep(meter));
  }
  if (!/^application\/(grpc(-web)?|connect)\+json/.test(type)) return undefined;
  const frames = new FramedJson();
  return (piece) => frames.refusal(piece);
}

/** Measures a compressed JSON body as it inflates (Connect reads the same bytes and inflates them itself). */
function inflatedCheck(encoding: string, limit: number, exceeds: (out: Buffer) => boolean, refusal: () => ConnectError): BodyCheck | undefined {
  const inflater = encoding === "gzip" ? zlib.createGunzip() : encoding === "br" ? zlib.createBrotliDecompress() : undefined;
  // Another encoding is Connect's to refuse (unimplemented).
  if (!inflater) return undefined;
  let seen = 0;
  let over = false;
  inflater.on("data", (out: Buffer) => {
    if (over || seen > limit) return;
    seen += out.length;
    if (exceeds(out)) {
      over = true;
      inflater.destroy();
    }
  });
  // A broken stream is Connect's to refuse as it reads it.
  inflater.on("error", () => {});
  return async (piece) => {
    if (!over && seen <= limit && !inflater.destroyed) await new Promise<void>((resolve) => inflater.write(piece, () => resolve()));
    return over ? refusal() : undefined;
  };
}

/** The JSON messages of an enveloped body (gRPC, gRPC-Web), measured message by message. */
class FramedJson {
  private readonly head = Buffer.alloc(5);
  private headHave = 0;
  private left = 0;
  /** The frame being read is not a message (gRPC-Web's trailers): skipped. */
  private skipping = false;
  private meter = new JsonDepthMeter(MAX_JSON_DEPTH);

  refusal(piece: Uint8Array): ConnectError | undefined {
    let i = 0;
    while (i < piece.length) {
      if (this.left === 0) {
        const take = Math.min(5 - this.headHave, piece.length - i);
        this.head.set(piece.subarray(i, i + take), this.headHave);
        this.headHave += take;
        i += take;
        if (this.headHave < 5) return undefined;
        this.headHave = 0;
        const flags = this.head[0];
        if (flags & 0x01) return compressedJson();
        this.left = this.head.readUInt32BE(1);
        this.skipping = (flags & 0x80) !== 0;
        this.meter = new JsonDepthMeter(MAX_JSON_DEPTH);
        continue;
      }
      const take = Math.min(this.left, piece.length - i);
      if (!this.skipping && this.meter.exceeds(piece.subarray(i, i + take))) return tooDeep(this.meter);
      this.left -= take;
      i += take;
    }
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

/** The refusal of a request message in the binary codec with a list past its bound, or with a field past its end. */
function binaryListsRefusal(desc: DescMessage, bytes: Buffer): ConnectError | undefined {
  try {
    checkBinaryLists(desc, bytes, PROTO_RECURSION_LIMIT);
    return undefined;
  } catch (err) {
    if (err instanceof ListTooLong) return new ConnectError(err.message, Code.InvalidArgument);
    if (err instanceof MalformedMessage) return new ConnectError(`parse binary: ${err.message}`, Code.InvalidArgument);
    throw err;
  }
}

const CONNECT_UNARY_JSON = /^application\/json(?:; ?charset=utf-?8)?$/;
const ENVELOPED = /^application\/(?:(grpc|grpc-web)(?:\+(proto|json(?:; ?charset=utf-?8)?))?|connect\+(proto|json(?:; ?charset=utf-?8)?))$/;

/**
 * How a call's lists are counted before Connect reads it (undefined: its request type has none with a bound):
 * a unary call's JSON text as it arrives (inflated when compressed), its binary message once it is whole;
 * a stream's messages (and gRPC's and gRPC-Web's unary ones), each as its envelope completes, the binary
 * ones inflated when compressed. A list past its bound answers invalid_argument naming the field.
 */
function listBodyCheck(req: NodeRequest, unary: boolean, limit: number, desc: DescMessage): BodyCheck | undefined {
  const tree = jsonListTree(desc);
  if (!tree) return undefined;
  const header = (name: string) => String(req.headers[name] ?? "identity").toLowerCase();
  const type = String(req.headers["content-type"] ?? "").toLowerCase();
  const tooMany = (meter: JsonListMeter) => new ConnectError(meter.refusal()!, Code.InvalidArgument);
  if (unary && CONNECT_UNARY_JSON.test(type)) {
    const meter = new JsonListMeter(tree);
    const encoding = header("content-encoding");
    if (encoding === "identity") return (piece) => (meter.exceeds(piece) ? tooMany(meter) : undefined);
    return inflatedCheck(encoding, limit, (out) => meter.exceeds(out), () => tooMany(meter));
  }
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
      return bytes && binaryListsRefusal(desc, bytes);
    };
    check.end = end;
    return check;
  }
  const m = ENVELOPED.exec(type);
  if (!m) return undefined;
  const json = (m[2] ?? m[3] ?? "").startsWith("json");
  const encoding = header(m[1] ? "grpc-encoding" : "connect-content-encoding");
  const frames = new Envelopes(json ? 0 : limit, {
    // A compressed JSON message is refused as such (jsonBodyCheck).
    start: (compressed) => (json && !compressed ? new JsonListMeter(tree) : undefined),
    piece: (meter, piece) => (meter && meter.exceeds(piece) ? tooMany(meter) : undefined),
    end: async (_, bytes, compressed) => {
      if (json) return undefined;
      const message = await inflated(bytes, compressed ? encoding : undefined, limit);
      return message && binaryListsRefusal(desc, message);
    },
  });
  return (piece) => frames.refusal(piece);
}

interface EnvelopeReading<T> {
  /** A message's envelope was read: what its pieces are given to. */
  start(compressed: boolean): T;
  piece(state: T, piece: Buffer): ConnectError | undefined;
  /** The message ended: its bytes whole (when no larger than the limit; none are kept with a limit of 0). */
  end(state: T, bytes: Buffer, compressed: boolean): Refusal;
}

/** The messages of an enveloped body (gRPC, gRPC-Web, Connect's streams), each looked at as it arrives and once it ended. */
class Envelopes<T> {
  private readonly head = Buffer.alloc(5);
  private headHave = 0;
  private left = 0;
  private message: { state: T; compressed: boolean; parts: Buffer[] | undefined; size: number } | undefined;

  constructor(
    private readonly limit: number,
    private readonly reading: EnvelopeReading<T>,
  ) {}

  async refusal(piece: Uint8Array): Promise<ConnectError | undefined> {
    const b = Buffer.from(piece.buffer, piece.byteOffset, piece.byteLength);
    let i = 0;
    while (i < b.length || (this.message && this.left === 0)) {
      if (this.message && this.left === 0) {
        const { state, compressed, parts, size } = this.message;
        this.message = undefined;
        if (parts) {
          const refusal = await this.reading.end(state, Buffer.concat(parts, size), compressed);
          if (refusal) return refusal;
        }
        continue;
      }
      if (!this.message && this.left === 0) {
        const take = Math.min(5 - this.headHave, b.length - i);
        b.copy(this.head, this.headHave, i, i + take);
        this.headHave += take;
        i += take;
        if (this.headHave < 5) return undefined;
        this.headHave = 0;
        const flags = this.head[0]!;
        this.left = this.head.readUInt32BE(1);
        const trailer = (flags & 0x80) !== 0;
        // Connect refuses a message past the limit at its envelope: nothing of it is kept.
        if (!trailer) {
          const compressed = (flags & 0x01) !== 0;
          this.message = { state: this.reading.start(compressed), compressed, parts: this.left <= this.limit && this.limit > 0 ? [] : undefined, size: this.left };
        }
        continue;
      }
      const take = Math.min(this.left, b.length - i);
      const part = b.subarray(i, i + take);
      this.left -= take;
      i += take;
      if (!this.message) continue; // a trailer frame
      this.message.parts?.push(part);
      const refusal = this.reading.piece(this.message.state, part);
      if (refusal) return refusal;
    }
    return undefined;
  }
}
