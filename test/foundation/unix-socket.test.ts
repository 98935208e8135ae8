// DATABASE_URL may name a Unix-socket directory the way libpq does (`?host=/var/run/postgresql`):
// the service then reaches PostgreSQL through its socket, which postgres.js alone would not (it
// sends an unknown query parameter to the server as a setting, and the connection is refused).
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { freshDatabase, startTestServer, type TestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { connect, socketOf } from "../../src/db/index.js";

let drop: () => Promise<void>;
let tcpUrl: string;
let socketUrl: string;
let srv: TestServer | undefined;

beforeAll(async () => {
  const db = await freshDatabase();
  drop = db.drop;
  tcpUrl = db.url;
  const sql = connect(tcpUrl, 1);
  // Where this PostgreSQL keeps its sockets (every Linux build keeps at least one directory).
  const [{ dirs }] = await sql<{ dirs: string }[]>`SELECT current_setting('unix_socket_directories') AS dirs`;
  await sql.end();
  const dir = dirs.split(",").map((d) => d.trim()).find((d) => d.startsWith("/"));
  expect(dir, `unix_socket_directories is ${JSON.stringify(dirs)}`).toBeDefined();
  const u = new URL(tcpUrl);
  u.searchParams.set("host", dir!);
  socketUrl = u.toString();
});
afterAll(async () => {
  await srv?.close();
  await drop?.();
});

describe("DATABASE_URL with libpq's host parameter", () => {
  it("reads a socket directory as the socket's path and a host name as the host", () => {
    expect(socketOf("postgres://u@localhost:6543/db?host=/run/pg/")).toEqual({ url: "postgres://u@localhost:6543/db", path: "/run/pg/.s.PGSQL.6543" });
    expect(socketOf("postgres://u@localhost/db?host=%2Fvar%2Frun%2Fpostgresql&sslmode=disable")).toEqual({
      url: "postgres://u@localhost/db?sslmode=disable",
      path: "/var/run/postgresql/.s.PGSQL.5432",
    });
    expect(socketOf("postgres://u@localhost/db?host=db.internal")).toEqual({ url: "postgres://u@db.internal/db" });
    expect(socketOf("postgres://u@127.0.0.1:5432/db")).toEqual({ url: "postgres://u@127.0.0.1:5432/db" });
  });

  it("connects through the socket, and the service runs on it", async () => {
    const sql = connect(socketUrl, 1);
    try {
      // inet_server_addr() is NULL on a Unix-socket connection only.
      const [row] = await sql<{ addr: string | null; db: string }[]>`SELECT inet_server_addr()::text AS addr, current_database() AS db`;
      expect(row).toEqual({ addr: null, db: new URL(tcpUrl).pathname.slice(1) });
    } finally {
      await sql.end();
    }
    srv = await startTestServer({ SVC_LIVENESS_SWEEP_SECONDS: "0" }, socketUrl);
    const r = await client(srv.url).post("/api/renters/register", { name: "Socket", email: "socket@example.com" });
    expect(r.status, r.text).toBe(201);
    const over = await srv.sql<{ tcp: number; socket: number }[]>`
      SELECT count(*) FILTER (WHERE client_addr IS NOT NULL)::int AS tcp, count(*) FILTER (WHERE client_addr IS NULL)::int AS socket
      FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'`;
    expect(over[0]).toMatchObject({ tcp: 0 });
    expect(over[0].socket).toBeGreaterThan(0);
  });
});
