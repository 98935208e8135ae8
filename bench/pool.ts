// The database pool under steady load: independent statements kept in flight
// on the service's pool (src/db), as concurrent reads of many requests are.
// Each is a primary-key read of a small table. It shows what one statement
// costs the process at the pool, the layer every request goes through.
//
//   npm run bench:pool [-- --in-flight 64 --pool 20 --seconds 8 --rounds 2]
//   npm run bench:pool -- --socket   (alternates rounds over loopback TCP and the database's Unix socket)
//
// A fresh database on DATABASE_URL (dropped afterwards), otherwise an
// embedded PostgreSQL. The last line is one JSON object: statements per
// second, CPU per statement of this process and of the database's backends
// in each round, and with --socket which way each round went.
import { parseArgs } from "node:util";
import { connect, type Sql } from "../src/db/index.js";
import { benchDatabase, databaseCpuMeter, machine, noter } from "./lib.js";

const { values: args } = parseArgs({
  options: {
    "in-flight": { type: "string", default: "64" },
    pool: { type: "string", default: "20" },
    seconds: { type: "string", default: "8" },
    rounds: { type: "string", default: "2" },
    socket: { type: "boolean", default: false },
  },
});
const IN_FLIGHT = Number(args["in-flight"]);
const POOL = Number(args.pool);
const SECONDS = Number(args.seconds);
const note = noter("bench:pool");

async function main() {
  const db = await benchDatabase("svc_bench_pool", note);
  const tcp = connect(db.url, POOL);
  let socket: Sql | undefined;
  const datname = new URL(db.url).pathname.slice(1);
  try {
    await tcp`CREATE TABLE t (id int PRIMARY KEY, v text)`;
    await tcp`INSERT INTO t SELECT g, 'row ' || g FROM generate_series(1, 1000) g`;
    if (args.socket) {
      const [{ dirs }] = await tcp<{ dirs: string }[]>`SELECT current_setting('unix_socket_directories') AS dirs`;
      const dir = dirs.split(",").map((d) => d.trim()).find((d) => d.startsWith("/"));
      if (!dir) throw new Error(`the database keeps no Unix socket (unix_socket_directories = ${JSON.stringify(dirs)})`);
      const u = new URL(db.url);
      u.searchParams.set("host", dir);
      socket = connect(u.toString(), POOL);
    }
    const rounds: { via: string; statements_per_s: number; cpu_us_per_statement: number; database_cpu_us_per_statement: number }[] = [];
    const total = Number(args.rounds) * (socket ? 2 : 1);
    for (let r = 0; r < total; r++) {
      // With --socket, TCP and the socket alternate ABBA so that a drift of the machine falls on both.
      const viaSocket = socket !== undefined && (r % 4 === 1 || r % 4 === 2);
      const sql = viaSocket ? socket! : tcp;
      await Promise.all(Array.from({ length: POOL }, () => sql`SELECT 1`));
      const dbCpu = await databaseCpuMeter(tcp, datname);
      let n = 0;
      const started = performance.now();
      const cpu = process.cpuUsage();
      await Promise.all(
        Array.from({ length: IN_FLIGHT }, async (_, k) => {
          while (performance.now() - started < SECONDS * 1000) {
            await sql`SELECT v FROM t WHERE id = ${1 + ((n + k) % 1000)}`;
            n++;
          }
        }),
      );
      const used = process.cpuUsage(cpu);
      const db = await dbCpu();
      rounds.push({
        via: viaSocket ? "unix socket" : "tcp",
        statements_per_s: Math.round(n / ((performance.now() - started) / 1000)),
        cpu_us_per_statement: Math.round(((used.user + used.system) / n) * 10) / 10,
        database_cpu_us_per_statement: Math.round((db.own / n) * 1e7) / 10,
      });
      note(`round ${r + 1}: ${JSON.stringify(rounds[r])}`);
    }
    console.log(JSON.stringify({ benchmark: "pool", in_flight: IN_FLIGHT, pool: POOL, seconds: SECONDS, rounds, machine: machine(), database: db.kind }));
  } finally {
    await tcp.end();
    await socket?.end();
    await db.close();
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
