// A TCP proxy in front of PostgreSQL, for tests of a database that goes away:
// cut() resets every connection (the server process reads ECONNRESET, as when
// PostgreSQL restarts under load), `refusing` resets new connections at once,
// `resetOnTypesQuery` resets a connection when it sends postgres.js's
// array-types query, the first statement of every new connection,
// cutListeners() resets only the connections that sent a LISTEN, and
// holdListeners() holds back what PostgreSQL sends to the connections that
// sent a LISTEN (a connection gone silent, with no error) until releaseAnswers().
import net from "node:net";

export class DbProxy {
  port = 0;
  refusing = false;
  resetOnTypesQuery = false;
  /** Connections reset because they sent the array-types query. */
  typesQueriesReset = 0;
  private readonly server = net.createServer((client) => this.accept(client));
  private readonly pairs = new Set<[net.Socket, net.Socket]>();
  private holding = false;
  /** Connections that sent a LISTEN. */
  private readonly listeners = new Set<[net.Socket, net.Socket]>();
  private readonly held = new Set<[net.Socket, net.Socket]>();

  constructor(private readonly target: { host: string; port: number }) {}

  /** `url` with its host and port replaced by this proxy's. */
  static async inFrontOf(url: string): Promise<{ proxy: DbProxy; url: string }> {
    const u = new URL(url);
    const proxy = new DbProxy({ host: u.hostname, port: Number(u.port || 5432) });
    await new Promise<void>((resolve) => proxy.server.listen(0, "127.0.0.1", resolve));
    proxy.port = (proxy.server.address() as net.AddressInfo).port;
    u.hostname = "127.0.0.1";
    u.port = String(proxy.port);
    return { proxy, url: u.toString() };
  }

  private accept(client: net.Socket): void {
    client.on("error", () => {});
    if (this.refusing) {
      client.resetAndDestroy();
      return;
    }
    const upstream = net.connect(this.target.port, this.target.host);
    upstream.on("error", () => {});
    const pair: [net.Socket, net.Socket] = [client, upstream];
    this.pairs.add(pair);
    const close = () => {
      this.pairs.delete(pair);
      this.listeners.delete(pair);
      this.held.delete(pair);
      client.destroy();
      upstream.destroy();
    };
    client.on("close", close);
    upstream.on("close", close);
    client.on("data", (chunk: Buffer) => {
      if (chunk.includes('listen "')) {
        this.listeners.add(pair);
        if (this.holding) this.hold(pair);
      }
      if (this.resetOnTypesQuery && chunk.includes("typarray")) {
        this.typesQueriesReset++;
        this.pairs.delete(pair);
        client.resetAndDestroy();
        upstream.destroy();
        return;
      }
      upstream.write(chunk);
    });
    upstream.pipe(client);
  }

  /**
   * From now on, what PostgreSQL sends to a connection that sent a LISTEN is held back, neither
   * delivered nor dropped, until releaseAnswers(): its client sees a silent connection.
   */
  holdListeners(): void {
    this.holding = true;
    for (const pair of this.listeners) this.hold(pair);
  }

  releaseAnswers(): void {
    this.holding = false;
    for (const [client, upstream] of this.held) {
      upstream.pipe(client);
      upstream.resume();
    }
    this.held.clear();
  }

  private hold(pair: [net.Socket, net.Socket]): void {
    if (this.held.has(pair)) return;
    const [client, upstream] = pair;
    upstream.unpipe(client);
    upstream.pause();
    this.held.add(pair);
  }

  /** Resets every open connection; returns how many there were. */
  cut(): number {
    const n = this.pairs.size;
    for (const [client, upstream] of this.pairs) {
      client.resetAndDestroy();
      upstream.destroy();
    }
    this.pairs.clear();
    return n;
  }

  /** Resets the connections that sent a LISTEN (the others stay open); returns how many there were. */
  cutListeners(): number {
    const n = this.listeners.size;
    for (const pair of this.listeners) {
      pair[0].resetAndDestroy();
      pair[1].destroy();
      this.pairs.delete(pair);
      this.held.delete(pair);
    }
    this.listeners.clear();
    return n;
  }

  close(): Promise<void> {
    this.cut();
    return new Promise((resolve) => this.server.close(() => resolve()));
  }
}
