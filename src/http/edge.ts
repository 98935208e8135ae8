// One port for both wires: a connection that opens with the HTTP/2 preface
// ("PRI * HTTP/2.0") goes to the h2c server (gRPC, Connect, REST over h2);
// anything else to the HTTP/1.1 server (REST, /v1, Connect unary).
import http from "node:http";
import http2 from "node:http2";
import net from "node:net";

type Handler = (req: http.IncomingMessage | http2.Http2ServerRequest, res: http.ServerResponse | http2.Http2ServerResponse) => void;

export interface Edge {
  listen(port: number, host: string): Promise<number>;
  /** Stops accepting, lets in-flight requests finish (up to `graceMs`), then closes. */
  close(graceMs?: number): Promise<void>;
}

export interface EdgeOptions {
  /**
   * HTTP/2 requests (by `:path`) that may keep sending for as long as they are open, and so are not
   * held to edgeTimeouts.requestMs: bidirectional and client-streaming calls (a daemon's stream has
   * its own deadline for its first message, streamTimeouts.helloMs).
   */
  receivesWithoutDeadline?: (path: string) => boolean;
}

const PREFACE = Buffer.from("PRI * HTTP/2.0");
/** How long a new connection may take to send enough bytes to tell its protocol. */
const SNIFF_TIMEOUT_MS = 10_000;
const H2_NO_ERROR = 0x0;
const H2_CANCEL = 0x8;

export const edgeTimeouts = {
  /**
   * An HTTP/2 connection with no stream open and no frame either way for this long is closed, as an
   * idle HTTP/1.1 keep-alive connection is (keepAliveTimeout); one with a stream open (a request
   * being answered, however slowly; a daemon's stream) is left to it.
   */
  h2IdleMs: 120_000,
  /**
   * How long a request may take to arrive in whole (its headers and its body, to
   * the end), on either wire; the answer may take as long as it takes. Long enough for the largest
   * body (16 MiB) at about 140 KB/s. HTTP/1.1: Node's requestTimeout (408, the connection closed).
   * HTTP/2: a stream whose request has not ended by then is answered 408 (gRPC: DEADLINE_EXCEEDED)
   * and reset, but for the streams EdgeOptions.receivesWithoutDeadline names. Without it a request
   * whose body stalls would be held for ever, and an HTTP/2 connection with it.
   */
  requestMs: 120_000,
};

export function createEdge(handler: Handler, opts: EdgeOptions = {}): Edge {
  const requestMs = edgeTimeouts.requestMs;
  const h1 = http.createServer(
    {
      keepAliveTimeout: 65_000,
      headersTimeout: Math.min(66_000, requestMs),
      requestTimeout: requestMs,
      // How often Node looks for requests past those limits (its default, 30 s, or finer for a shorter limit).
      connectionsCheckingInterval: Math.min(30_000, Math.max(50, Math.ceil(requestMs / 4))),
    },
    handler as http.RequestListener,
  );
  // Node enforces headersTimeout and requestTimeout from a timer it starts when the server begins
  // listening; this one never listens (connections are handed to it below), so it is told it does.
  // Without this neither limit applied: a request's headers or body could stall for ever.
  h1.emit("listening");
  const h2 = http2.createServer({ settings: { maxConcurrentStreams: 1000 } }, handler as (req: http2.Http2ServerRequest, res: http2.Http2ServerResponse) => void);
  // Streams open per session: a session quiet for h2IdleMs is closed only when none is (with a
  // 'timeout' listener the server leaves the choice here; without one it destroys any quiet session).
  const openStreams = new WeakMap<http2.Http2Session, number>();
  h2.on("stream", (stream, headers) => {
    const s = stream.session;
    if (!s) return;
    openStreams.set(s, (openStreams.get(s) ?? 0) + 1);
    // A request that has not arrived in whole within requestMs is not waited for any longer.
    const path = String(headers[":path"] ?? "").split("?", 1)[0]!;
    const deadline = opts.receivesWithoutDeadline?.(path) ? undefined : setTimeout(() => receiveDeadline(stream, headers, requestMs), requestMs);
    stream.once("close", () => {
      openStreams.set(s, (openStreams.get(s) ?? 1) - 1);
      if (deadline) clearTimeout(deadline);
    });
  });
  h2.setTimeout(edgeTimeouts.h2IdleMs);
  h2.on("timeout", (session: http2.Http2Session) => {
    if (!openStreams.get(session)) session.destroy();
  });
  const sessions = new Set<http2.ServerHttp2Session>();
  h2.on("session", (s) => {
    sessions.add(s);
    s.on("close", () => sessions.delete(s));
  });
  const sockets = new Set<net.Socket>();
  const h2Sockets = new WeakSet<net.Socket>();
  const isHttp2Socket = (s: net.Socket) => h2Sockets.has(s);
  // HTTP/1.1 requests in flight per socket, so shutdown can close idle keep-alive sockets at once.
  const inflight = new WeakMap<net.Socket, number>();
  let closing = false;
  h1.on("request", (req: http.IncomingMessage, res: http.ServerResponse) => {
    const socket = req.socket;
    inflight.set(socket, (inflight.get(socket) ?? 0) + 1);
    res.on("close", () => {
      const n = (inflight.get(socket) ?? 1) - 1;
      inflight.set(socket, n);
      if (closing && n === 0) socket.destroySoon();
    });
  });

  const tcp = net.createServer((socket) => {
    sockets.add(socket);
    socket.on("close", () => sockets.delete(socket));
    // Wait until the first bytes either differ from the preface or hold all of it:
    // a client may send its first request in pieces ("P", then "OST / ...").
    let head: Buffer = Buffer.alloc(0);
    const onData = (chunk: Buffer) => {
      head = head.length === 0 ? chunk : Buffer.concat([head, chunk]);
      const n = Math.min(head.length, PREFACE.length);
      const isH2 = head.subarray(0, n).equals(PREFACE.subarray(0, n));
      if (isH2 && head.length < PREFACE.length) return;
      socket.off("data", onData);
      socket.setTimeout(0);
      socket.pause();
      socket.unshift(head);
      if (isH2) {
        // The h2 session reads the socket's buffered bytes itself; resuming here would drop them.
        h2Sockets.add(socket);
        h2.emit("connection", socket);
      } else {
        h1.emit("connection", socket);
        socket.resume();
      }
    };
    socket.on("data", onData);
    socket.setTimeout(SNIFF_TIMEOUT_MS, () => socket.destroy()); // silent connections do not stay open
    socket.on("error", () => socket.destroy());
  });

  return {
    listen(port, host) {
      return new Promise((resolve, reject) => {
        tcp.once("error", reject);
        tcp.listen(port, host, () => resolve((tcp.address() as net.AddressInfo).port));
      });
    },
    async close(graceMs = 10_000) {
      closing = true;
      const closed = new Promise<void>((resolve) => tcp.close(() => resolve()));
      h1.close(); // stops the timer of "listening" above (and closes idle keep-alive connections, as below)
      for (const s of sessions) s.close();
      for (const s of sockets) if (!inflight.get(s) && !isHttp2Socket(s)) s.destroySoon();
      const deadline = setTimeout(() => {
        h1.closeAllConnections();
        for (const s of sessions) s.destroy();
        for (const s of sockets) s.destroy();
      }, graceMs);
      deadline.unref();
      await closed;
      clearTimeout(deadline);
    },
  };
}

/**
 * A stream whose request is still arriving after `requestMs` (edgeTimeouts.requestMs) (no END_STREAM from the
 * client): answered, when nothing was yet, and reset, so that it holds neither its slot nor its
 * connection. One whose request arrived (answered slowly, or for as long as a watch lasts) is left be.
 */
function receiveDeadline(stream: http2.ServerHttp2Stream, headers: http2.IncomingHttpHeaders, requestMs: number): void {
  if (stream.closed || stream.destroyed || stream.state.remoteClose) return;
  if (stream.headersSent) {
    // Answered (or answering) before the request ended: the answer is cut only if it is still going.
    stream.close(stream.writableEnded ? H2_NO_ERROR : H2_CANCEL);
    return;
  }
  const seconds = Math.round(requestMs / 1000);
  const message = `the request did not arrive in whole within ${seconds} s`;
  try {
    if (/^application\/grpc/i.test(String(headers["content-type"] ?? ""))) {
      // gRPC (and gRPC-Web): a trailers-only answer, DEADLINE_EXCEEDED.
      stream.respond(
        { ":status": 200, "content-type": String(headers["content-type"]), "grpc-status": "4", "grpc-message": encodeURIComponent(message) },
        { endStream: true },
      );
    } else {
      const body = JSON.stringify({ error: message });
      stream.respond({ ":status": 408, "content-type": "application/json", "content-length": Buffer.byteLength(body) });
      stream.end(body);
    }
  } catch {
    // The stream closed meanwhile.
  }
  // The client's half is closed too (RST_STREAM NO_ERROR, as gRPC servers do), once the answer is out:
  // close() waits for the stream's writes to finish.
  if (!stream.closed) stream.close(H2_NO_ERROR);
}
