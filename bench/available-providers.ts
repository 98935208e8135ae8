// GET /api/renters/available-providers on a fleet: `--providers` approved
// providers, `--online` percent of them online and heard within the live
// window (the rest offline), over real HTTP against a server process. Timed,
// one call at a time: the first page of 100, the default page (1,000), and a
// page deep in the list; then the count of available providers alone, as
// the service runs it (src/domain/providers/marketplace.ts).
//
//   npm run bench:available [-- --providers 100000 --online 100 --calls 100]
//
// BENCH_SERVER_DIR=<another checkout> runs that checkout's server (an A/B on
// the same seeded data is two runs). A fresh database on DATABASE_URL
// (dropped afterwards), otherwise an embedded PostgreSQL. The last line is
// one JSON object.
import { parseArgs } from "node:util";
import { migrate } from "../src/db/migrate.js";
import { availableCount } from "../src/domain/providers/marketplace.js";
import { benchDatabase, machine, noter, percentile, startServers } from "./lib.js";

const { values: args } = parseArgs({
  options: {
    providers: { type: "string", default: "100000" },
    online: { type: "string", default: "100" },
    calls: { type: "string", default: "100" },
  },
});
const PROVIDERS = Number(args.providers);
const ONLINE_PERCENT = Number(args.online);
const CALLS = Number(args.calls);
const note = noter("bench:available");

async function timedCalls(label: string, calls: number, call: () => Promise<unknown>) {
  for (let i = 0; i < 5; i++) await call();
  const ms: number[] = [];
  for (let i = 0; i < calls; i++) {
    const t = performance.now();
    await call();
    ms.push(performance.now() - t);
  }
  const figures = { p50_ms: percentile(ms, 50), p99_ms: percentile(ms, 99) };
  note(`${label}: ${JSON.stringify(figures)}`);
  return figures;
}

async function main() {
  const db = await benchDatabase("svc_bench_available", note);
  try {
    await migrate(db.sql);
    const t0 = performance.now();
    // VRAM in ten sizes (some unknown), scores in a hundred (some unknown), heartbeats within the last minute.
    await db.sql`
      INSERT INTO providers (name, email, gpu_model, os, status, approval_status, last_heartbeat, gpu_vram_mib, gpu_count, reliability_score)
      SELECT 'rig ' || g, 'rig' || g || '@example.com', 'NVIDIA RTX 4090', 'linux',
             CASE WHEN g % 100 < ${ONLINE_PERCENT} THEN 'online' ELSE 'offline' END, 'approved',
             CASE WHEN g % 100 < ${ONLINE_PERCENT} THEN now() - (g % 60) * interval '1 second' ELSE now() - interval '2 days' END,
             CASE WHEN g % 50 = 0 THEN NULL ELSE 8192 * (1 + g % 10) END, 1,
             CASE WHEN g % 13 = 0 THEN NULL ELSE (g % 100)::float8 END
      FROM generate_series(1, ${PROVIDERS}) g`;
    await db.sql`VACUUM ANALYZE providers`;
    const available = await availableCount(db.sql);
    note(`seeded ${PROVIDERS} providers, ${available} available, in ${((performance.now() - t0) / 1000).toFixed(1)} s`);

    const servers = await startServers(1, db.url, {});
    try {
      const base = `http://127.0.0.1:${servers.ports[0]}/api/renters/available-providers`;
      const get = (query: string) => async () => {
        const r = await fetch(`${base}${query}`);
        if (r.status !== 200) throw new Error(`available-providers${query}: ${r.status}`);
        const body = (await r.json()) as { total: number };
        if (body.total !== available) throw new Error(`available-providers${query}: total ${body.total}, expected ${available}`);
      };
      const deep = Math.max(0, Math.floor(available / 2));
      const result = {
        benchmark: "available-providers",
        providers: PROVIDERS,
        available,
        calls: CALLS,
        first_page_100: await timedCalls("first page of 100", CALLS, get("?limit=100")),
        default_page_1000: await timedCalls("default page (1,000)", CALLS, get("")),
        deep_page_100: await timedCalls(`page of 100 at offset ${deep}`, CALLS, get(`?limit=100&offset=${deep}`)),
        count_alone: await timedCalls("the count alone", Math.min(CALLS, 30), () => availableCount(db.sql)),
        server: process.env.BENCH_SERVER_DIR ?? "this checkout",
        machine: machine(),
        database: db.kind,
      };
      console.log(JSON.stringify(result));
    } finally {
      await servers.stop();
    }
  } finally {
    await db.close();
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
