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

const PREFACE = Buffer.from("PRI * HTTP/2.0");
/** How long a new connection may take to send enough bytes to tell its protocol. */
const SNIFF_TIMEOUT_MS = 10_000;

export const edgeTimeouts = {
  /**
   * An HTTP/2 connection with no stream open and no frame either way for this long is closed, as an
   * idle HTTP/1.1 keep-alive connection is (keepAliveTimeout); one with a stream open (a request
   * being answered, however slowly; a daemon's stream) is left to it.
   */
  h2IdleMs: 120_000,
};

export function createEdge(handler: Handler): Edge {
  const h1 = http.createServer({ keepAliveTimeout: 65_000, headersTimeout: 66_000, requestTimeout: 0 }, handler as http.RequestListener);
  const h2 = http2.createServer({ settings: { maxConcurrentStreams: 1000 } }, handler as (req: http2.Http2ServerRequest, res: http2.Http2ServerResponse) => void);
  // Streams open per session: a session quiet for h2IdleMs is closed only when none is (with a
  // 'timeout' listener the server leaves the choice here; without one it destroys any quiet session).
  const openStreams = new WeakMap<http2.Http2Session, number>();
  h2.on("stream", (stream) => {
    const s = stream.session;
    if (!s) return;
    openStreams.set(s, (openStreams.get(s) ?? 0) + 1);
    stream.once("close", () => openStreams.set(s, (openStreams.get(s) ?? 1) - 1));
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
