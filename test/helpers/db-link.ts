// A TCP link to PostgreSQL that a test can cut: a server under test reaches its
// database through it, and while the link is down every connection through it
// is closed and new ones are refused, as when the database restarts.
import net from "node:net";

export interface DbLink {
  /** The database URL through the link. */
  url: string;
  down(): void;
  up(): void;
  close(): Promise<void>;
}

export async function dbLink(databaseUrl: string): Promise<DbLink> {
  const target = new URL(databaseUrl);
  const sockets = new Set<net.Socket>();
  let isDown = false;
  const track = (s: net.Socket) => {
    sockets.add(s);
    s.on("error", () => {});
    s.on("close", () => sockets.delete(s));
  };
  const server = net.createServer((client) => {
    track(client);
    if (isDown) return void client.destroy();
    const upstream = net.connect(Number(target.port || 5432), target.hostname);
    track(upstream);
    client.pipe(upstream).on("close", () => client.destroy());
    upstream.pipe(client).on("close", () => upstream.destroy());
    upstream.on("close", () => client.destroy());
    client.on("close", () => upstream.destroy());
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const via = new URL(databaseUrl);
  via.hostname = "127.0.0.1";
  via.port = String((server.address() as net.AddressInfo).port);
  return {
    url: via.toString(),
    down() {
      isDown = true;
      for (const s of sockets) s.destroy();
    },
    up() {
      isDown = false;
    },
    async close() {
      const closed = new Promise((resolve) => server.close(resolve));
      for (const s of sockets) s.destroy();
      await closed;
    },
  };
}
