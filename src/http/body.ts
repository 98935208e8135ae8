// Request body reading with a per-route size limit.
import type { IncomingMessage } from "node:http";
import type { Http2ServerRequest } from "node:http2";
import { getOption, type DescMethod } from "@bufbuild/protobuf";
import { route } from "../../gen/svc/v1/options_pb.js";
import { ProviderService } from "../../gen/svc/v1/providers_pb.js";
import { apiError } from "../errors.js";

export const DEFAULT_BODY_LIMIT_KB = 64;

/**
 * The request size limit of an RPC: its `body_limit_kb` route option, else
 * the default. The REST transcoder applies it to the body; the gRPC/Connect
 * router to each message (after decompression), so neither wire reads more.
 */
export function bodyLimitBytesOf(method: DescMethod): number {
  return (getOption(method, route).bodyLimitKb || DEFAULT_BODY_LIMIT_KB) * 1024;
}

/**
 * The heartbeat's body limit (POST /api/providers/heartbeat, its body_limit_kb): a daemon stream's
 * heartbeat messages are held to it too (services/daemon-wire.ts).
 */
export const HEARTBEAT_BODY_LIMIT_BYTES = bodyLimitBytesOf(ProviderService.method.heartbeat);

/**
 * 413 for a body over the limit. The rest of the body is discarded, not read
 * into memory; on HTTP/1.1 the connection closes after the answer so a
 * client streaming without end cannot keep it busy (HTTP/2 resets the stream).
 */
function tooLarge(req: IncomingMessage | Http2ServerRequest, limitBytes: number) {
  req.resume();
  const close: Record<string, string> | undefined = req.httpVersionMajor === 1 ? { connection: "close" } : undefined;
  return apiError(413, `request body too large (limit ${Math.floor(limitBytes / 1024)} KiB)`, close);
}

/** 499, nginx's "client closed request": what a request whose client left before its body was read is counted as. */
function clientGone(cause?: Error) {
  const e = apiError(499, "the client closed the connection before the request's body was read");
  if (cause) (e as Error & { cause?: unknown }).cause = cause;
  return e;
}

export async function readBody(req: IncomingMessage | Http2ServerRequest, limitBytes: number): Promise<Buffer> {
  const declared = Number(req.headers["content-length"]);
  if (Number.isFinite(declared) && declared > limitBytes) throw tooLarge(req, limitBytes);
  // The client left before the body was read (while the caller awaited something else): the request was
  // destroyed (HTTP/1.1) or its stream's close ended it unread (HTTP/2) before anyone listened, and no
  // data, end or close will follow to settle the read.
  if (req.destroyed || req.readableEnded) throw clientGone();
  // Events rather than `for await`: the async iterator costs several times
  // more per request, and most bodies arrive in one chunk.
  return new Promise<Buffer>((resolve, reject) => new BodyReader(req, limitBytes, resolve, reject).start());
}

/** One body read; methods bound once (no per-request closures). */
class BodyReader {
  private readonly chunks: Buffer[] = [];
  private size = 0;
  private readonly onData = this.data.bind(this);
  private readonly onEnd = this.end.bind(this);
  private readonly onError = this.error.bind(this);
  private readonly onClose = this.close.bind(this);

  constructor(
    private readonly req: IncomingMessage | Http2ServerRequest,
    private readonly limitBytes: number,
    private readonly resolve: (b: Buffer) => void,
    private readonly reject: (e: unknown) => void,
  ) {}

  start(): void {
    this.req.on("data", this.onData);
    this.req.on("end", this.onEnd);
    this.req.on("error", this.onError);
    this.req.on("close", this.onClose);
  }

  private cleanup(): void {
    this.req.off("data", this.onData);
    this.req.off("end", this.onEnd);
    this.req.off("error", this.onError);
    this.req.off("close", this.onClose);
  }

  private data(chunk: Buffer): void {
    this.size += chunk.length;
    if (this.size > this.limitBytes) {
      // Answer 413 (a destroyed request would leave the client with a reset, not an answer).
      this.cleanup();
      this.chunks.length = 0;
      this.reject(tooLarge(this.req, this.limitBytes));
      return;
    }
    this.chunks.push(chunk);
  }

  private end(): void {
    this.cleanup();
    this.resolve(this.chunks.length === 1 ? this.chunks[0] : Buffer.concat(this.chunks));
  }

  // The client went away mid-body (its connection reset or closed): a 499, not a failure of ours.
  private error(err: Error): void {
    this.cleanup();
    this.reject(clientGone(err));
  }

  private close(): void {
    this.cleanup();
    this.reject(clientGone());
  }
}
