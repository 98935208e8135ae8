// A daemon's settings over its stream (DaemonService.Connect): pushed when a
// notice says they changed (the providers trigger of migration 039), whoever
// changed them; read again on a heartbeat only when a notice may have been
// missed. The last test cuts the server's LISTEN connection, so it stays last.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { makeProvider } from "../helpers/fixtures.js";
import { clearMarketplace } from "../jobs/helpers.js";
import { openStream, type TestStream } from "./grpc-stream.js";
import { waitFor, whileNotListening } from "./helpers.js";
import { jobSignalHub } from "../../src/workers/job-signals.js";
import { streamRefresher } from "../../src/domain/jobs/stream-refresh.js";

const streams: TestStream[] = [];

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000" });
beforeAll(() => clearMarketplace(srv));
afterAll(() => {
  for (const s of streams) s.cancel();
});

function connect(key: string) {
  const s = openStream(srv.port, key);
  streams.push(s);
  s.send({ case: "hello", value: { daemonVersion: "5.0.0", runningJobIds: [], gpus: [{ name: "NVIDIA GeForce RTX 4090", vram_mib: 24564 }] } });
  return s;
}

describe("daemon settings over the stream", () => {
  const settingsPushed = (s: TestStream) => s.received.filter((m) => m.kind.case === "settings").length;

  it("pushes a change made by any writer at once, and reads the provider on no heartbeat while every notice is heard", async () => {
    const p = await makeProvider(srv);
    const s = connect(p.key);
    await s.next("welcome");
    const refresher = streamRefresher(srv.app.sql);
    const reads = refresher.reads;
    for (let i = 0; i < 3; i++) {
      s.send({ case: "heartbeat", value: {} });
      await s.next("heartbeatAck");
    }
    expect(refresher.reads).toBe(reads);

    // Written behind the routes' back (another process, an operator's SQL): the trigger's notice carries it.
    await srv.sql`UPDATE providers SET temp_limit_c = 66, gpu_usage_cap_pct = 55 WHERE id = ${p.id}`;
    expect(await s.next("settings")).toMatchObject({ tempLimitC: 66, gpuUsageCapPct: 55, paused: false });
    expect(refresher.reads).toBe(reads + 1);

    // Going offline and back is no settings change: no notice, no read, nothing pushed.
    await srv.sql`UPDATE providers SET status = 'offline' WHERE id = ${p.id}`;
    await srv.sql`UPDATE providers SET status = 'online' WHERE id = ${p.id}`;
    await new Promise((r) => setTimeout(r, 200));
    expect(refresher.reads).toBe(reads + 1);
    expect(settingsPushed(s)).toBe(1);

    // A status of 'paused' is a pause, as the settings say it.
    await srv.sql`UPDATE providers SET status = 'paused' WHERE id = ${p.id}`;
    expect((await s.next("settings")).paused).toBe(true);
    // An approval withdrawn reaches the daemon too.
    await srv.sql`UPDATE providers SET status = 'online', approval_status = 'rejected' WHERE id = ${p.id}`;
    expect(await s.next("settings")).toMatchObject({ paused: false, approvalStatus: "rejected" });
    s.end();
  });

  it("reads the provider at the next heartbeat after a change made while the process did not listen", async () => {
    const p = await makeProvider(srv);
    const s = connect(p.key);
    await s.next("welcome");
    await whileNotListening(srv.app, async () => {
      await srv.sql`UPDATE providers SET temp_limit_c = 70 WHERE id = ${p.id}`;
      await new Promise((r) => setTimeout(r, 200));
      expect(settingsPushed(s)).toBe(0);
      s.send({ case: "heartbeat", value: {} });
      await s.next("heartbeatAck");
      expect((await s.next("settings")).tempLimitC).toBe(70);
    });
    // Listening again: a beat reads once more (it may have missed notices until then), then no more.
    const refresher = streamRefresher(srv.app.sql);
    const before = refresher.reads;
    s.send({ case: "heartbeat", value: {} });
    await s.next("heartbeatAck");
    await waitFor(() => refresher.reads > before, 5_000, "the beat's read");
    const reads = refresher.reads;
    s.send({ case: "heartbeat", value: {} });
    await s.next("heartbeatAck");
    await new Promise((r) => setTimeout(r, 200));
    expect(refresher.reads).toBe(reads);
    s.end();
  });

  it("sends nothing ahead of the welcome while settings change as the stream opens, and ends on the last ones", async () => {
    const p = await makeProvider(srv);
    let writing = true;
    let last = 50;
    const writer = (async () => {
      while (writing) {
        last = last === 100 ? 50 : last + 1;
        await srv.sql`UPDATE providers SET temp_limit_c = ${last} WHERE id = ${p.id}`;
      }
    })();
    const opened = Array.from({ length: 4 }, () => connect(p.key));
    try {
      for (const s of opened) await s.next("welcome");
      await new Promise((r) => setTimeout(r, 100));
    } finally {
      writing = false;
      await writer;
    }
    for (const s of opened) {
      expect(s.received[0].kind.case).toBe("welcome");
      await waitFor(() => {
        const pushed = s.received.filter((m) => m.kind.case === "settings" || m.kind.case === "welcome").at(-1)!;
        const settings = pushed.kind.case === "welcome" ? pushed.kind.value.settings : pushed.kind.case === "settings" ? pushed.kind.value : undefined;
        return settings?.tempLimitC === last;
      }, 5_000, "the last settings");
      s.end();
    }
  });

  it("reads every stream's provider again when the LISTEN connection comes back, and pushes what it missed", async () => {
    const p = await makeProvider(srv);
    const s = connect(p.key);
    await s.next("welcome");
    const hub = jobSignalHub(srv.app.sql, srv.app.deps.log);
    const refresher = streamRefresher(srv.app.sql);
    const generation = hub.generation;
    const reads = refresher.reads;
    const [listener] = await srv.sql<{ pid: number }[]>`
      SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND query ILIKE 'listen %' AND pid <> pg_backend_pid()`;
    expect(listener).toBeDefined();
    await srv.sql`SELECT pg_terminate_backend(${listener.pid})`;
    // Written while the listener may be away: its notice may be lost, the resync's read is not.
    await srv.sql`UPDATE providers SET vram_reserve_gb = 3 WHERE id = ${p.id}`;
    await waitFor(async () => hub.heardAllSince(hub.generation) && hub.generation > generation, 10_000, "listening again");
    expect((await s.next("settings")).vramReserveGb).toBe(3);
    await waitFor(async () => refresher.reads > reads, 5_000, "the resync's read");
    s.end();
  });
});
