// A TCP proxy in front of the test server, to play a network that fails under
// svc: cut its connections (closed, or reset with an RST), or be down for a
// while (connections refused), as a server restarting is; or end a connection
// at one of the server's HTTP/2 frames (frameProxy).
import net from "node:net";

export interface Proxy {
  /** http://127.0.0.1:<port>: give this to svc instead of the server's URL. */
  url: string;
  port: number;
  /** Connections accepted so far. */
  accepted(): number;
  /** Connections open now. */
  open(): number;
  /** Closes every open connection (a FIN to both sides). */
  cut(): void;
  /** Resets every open connection (an RST to the client). */
  reset(): void;
  /** Drops every open connection and refuses new ones (nothing listens) for `ms`; resolves when it listens again. */
  down(ms: number): Promise<void>;
  close(): Promise<void>;
}

export async function startProxy(targetPort: number): Promise<Proxy> {
  const sockets = new Set<net.Socket>();
  const fromClients = new Set<net.Socket>();
  let accepted = 0;
  let server: net.Server;
  let port = 0;
  const onConnection = (client: net.Socket) => {
    accepted++;
    const upstream = net.connect(targetPort, "127.0.0.1");
    sockets.add(client);
    sockets.add(upstream);
    fromClients.add(client);
    const drop = () => {
      fromClients.delete(client);
      sockets.delete(client);
      sockets.delete(upstream);
      client.destroy();
      upstream.destroy();
    };
    client.on("error", drop).on("close", drop);
    upstream.on("error", drop).on("close", drop);
    client.pipe(upstream);
    upstream.pipe(client);
  };
  const listen = () =>
    new Promise<void>((resolve, reject) => {
      server = net.createServer(onConnection);
      server.once("error", reject);
      server.listen(port, "127.0.0.1", () => {
        port = (server.address() as net.AddressInfo).port;
        resolve();
      });
    });
  const stopListening = () => new Promise<void>((resolve) => server.close(() => resolve()));
  await listen();
  const clients = () => [...fromClients];
  return {
    get url() {
      return `http://127.0.0.1:${port}`;
    },
    get port() {
      return port;
    },
    accepted: () => accepted,
    open: () => clients().length,
    cut() {
      for (const s of sockets) s.destroy();
    },
    reset() {
      for (const s of clients()) s.resetAndDestroy();
      for (const s of sockets) s.destroy();
    },
    async down(ms) {
      const closed = stopListening();
      for (const s of sockets) s.destroy();
      await closed;
      await new Promise((r) => setTimeout(r, ms));
      await listen();
    },
    async close() {
      for (const s of sockets) s.destroy();
      await stopListening();
    },
  };
}

/** What becomes of one of the server's HTTP/2 frames (frameProxy). */
export type FrameVerdict =
  /** Passed on to the client. */
  | "pass"
  /** Not passed on: both sides of the connection are closed at once. */
  | "cut"
  /** Passed on, and the connection closed once it is written: nothing after it reaches the client. */
  | "last";

export interface FrameProxy {
  /** http://127.0.0.1:<port>: give this to svc instead of the server's URL. */
  url: string;
  /** Connections it ended at a frame ("cut" or "last"). */
  cuts(): number;
  close(): Promise<void>;
}

/**
 * A TCP proxy in front of the test server that passes the client's bytes through and the server's
 * HTTP/2 frames (a 9-byte header: length, type, flags, stream; then the payload) one by one, so that
 * a test ends a connection at the frame of its choosing. `judge(connection)` is called for each
 * connection (counted from 1) and gives what decides each of its frames; undefined passes that
 * connection through untouched.
 */
export async function frameProxy(targetPort: number, judge: (connection: number) => ((frame: Buffer) => FrameVerdict) | undefined): Promise<FrameProxy> {
  const sockets = new Set<net.Socket>();
  let connections = 0;
  let cuts = 0;
  const server = net.createServer((client) => {
    const upstream = net.connect(targetPort, "127.0.0.1");
    sockets.add(client).add(upstream);
    const drop = () => {
      client.destroy();
      upstream.destroy();
    };
    client.on("error", drop).on("close", drop);
    upstream.on("error", drop).on("close", drop);
    client.pipe(upstream);
    const verdict = judge(++connections);
    if (!verdict) {
      upstream.pipe(client);
      return;
    }
    let frames = Buffer.alloc(0);
    upstream.on("data", (chunk: Buffer) => {
      frames = Buffer.concat([frames, chunk]);
      while (frames.length >= 9 && frames.length >= 9 + frames.readUIntBE(0, 3)) {
        const frame = frames.subarray(0, 9 + frames.readUIntBE(0, 3));
        frames = frames.subarray(frame.length);
        const v = verdict(frame);
        if (v === "cut") {
          cuts++;
          drop();
          return;
        }
        client.write(frame);
        if (v === "last") {
          cuts++;
          upstream.removeAllListeners("data");
          client.end(() => drop());
          return;
        }
      }
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", () => resolve()));
  return {
    url: `http://127.0.0.1:${(server.address() as net.AddressInfo).port}`,
    cuts: () => cuts,
    async close() {
      for (const s of sockets) s.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
