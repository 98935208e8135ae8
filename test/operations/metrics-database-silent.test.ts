// GET /metrics while PostgreSQL stops answering (connections open, nothing
// coming back): the scrape is still answered, with the process's own series and
// the last database figures read, instead of waiting on the database for ever.
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { expect, it } from "vitest";
import pino from "pino";
import { loadConfig } from "../../src/config.js";
import { startApp } from "../../src/server.js";
import { ADMIN_TOKEN, HMAC_SECRET, freshDatabase } from "../helpers/server.js";

it("a scrape while the database does not answer is served with the last figures read", async () => {
  const db = await freshDatabase();
  const target = new URL(db.url);
  let silent = false;
  const sockets = new Set<net.Socket>();
  const proxy = net.createServer((c) => {
    sockets.add(c);
    c.on("error", () => {});
    c.on("close", () => sockets.delete(c));
    if (silent) return;
    const u = net.connect(Number(target.port || 5432), target.hostname);
    sockets.add(u);
    u.on("error", () => c.destroy());
    u.on("close", () => sockets.delete(u));
    c.on("data", (d) => !silent && u.write(d));
    u.on("data", (d) => !silent && c.write(d));
  });
  await new Promise<void>((r) => proxy.listen(0, "127.0.0.1", r));
  const via = new URL(db.url);
  via.hostname = "127.0.0.1";
  via.port = String((proxy.address() as net.AddressInfo).port);
  const config = loadConfig({
    SVC_ADMIN_TOKEN: ADMIN_TOKEN, SVC_HMAC_SECRET: HMAC_SECRET, DATABASE_URL: via.toString(), PORT: "0", HOST: "127.0.0.1",
    SVC_DATA_DIR: path.join(os.tmpdir(), "svc-test-data"), SVC_RATE_LIMITS: "off", LOG_LEVEL: "silent", SVC_METRICS_DB_SECONDS: "1",
  });
  const app = await startApp(config, { log: pino({ level: "silent" }) });
  const scrape = () => fetch(`${app.url}/metrics`, { headers: { "x-admin-token": ADMIN_TOKEN }, signal: AbortSignal.timeout(20_000) });
  try {
    const first = await scrape();
    expect(first.status).toBe(200);
    expect(await first.text()).toContain('svc_providers{state="online",gpu_model="any"} 0');
    await new Promise((r) => setTimeout(r, 1100)); // the figures are due to be read again
    silent = true;
    const r = await scrape();
    expect(r.status).toBe(200);
    const text = await r.text();
    expect(text).toContain('svc_providers{state="online",gpu_model="any"} 0');
    expect(text).toContain("svc_webhook_outbox_pending 0");
    expect(text).toMatch(/^svc_db_pool_max \d+$/m);
    expect(text).toContain("# TYPE nodejs_eventloop_lag_seconds gauge");
  } finally {
    await app.close();
    const closed = new Promise((r) => proxy.close(r));
    for (const s of sockets) s.destroy();
    await closed;
    await db.drop();
  }
}, 60_000);
