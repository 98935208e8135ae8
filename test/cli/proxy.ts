// A TCP proxy in front of the test server, to play a network that fails under
// svc: cut its connections (closed, or reset with an RST), or be down for a
// while (connections refused), as a server restarting is.
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
