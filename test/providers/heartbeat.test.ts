// POST /api/providers/heartbeat over real HTTP: every documented field and
// error code, tolerance of what real daemons send, version signals, preload,
// pause, and the coalesced write path (no state change is ever lost).
import { describe, expect, it, vi } from "vitest";
import { startTestServer, useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeRenter } from "../helpers/fixtures.js";
import type { Sql } from "../../src/db/index.js";
import { BEAT_TIME_SLACK_SECONDS, writeStateRows, writeTelemetryRows } from "../../src/domain/providers/heartbeat-write.js";
import { LIVE_WINDOW_SECONDS } from "../../src/domain/shared/liveness.js";
import { ADMIN, flushHeartbeats, gpuStatus, heartbeat, newProvider } from "./helpers.js";
import { restoreClockAfterEach, skewAppClock } from "../helpers/clock.js";

const srv = useTestServer({ SVC_DAEMON_MIN_VERSION: "3.0.0", SVC_DAEMON_LATEST_VERSION: "3.2.0", SVC_LIVENESS_SWEEP_SECONDS: "0" });
const api = client(srv);

async function row(id: number) {
  await flushHeartbeats(srv);
  const [r] = await srv.sql`SELECT * FROM providers WHERE id = ${id}`;
  return r;
}

describe("heartbeat: credentials and approval", () => {
  it("400 without a key, 401 with an unknown key", async () => {
    const none = await api.post("/api/providers/heartbeat", { gpu_status: gpuStatus() });
    expect(none.status).toBe(400);
    expect(none.body.error).toMatch(/API key required/);
    const bad = await api.post("/api/providers/heartbeat", { api_key: "svc-provider-not-a-real-key-000000000000" });
    expect(bad.status).toBe(401);
    expect(bad.body).toEqual({ error: "invalid API key" });
  });

  it("403 for a pending provider, naming its approval status, and records nothing", async () => {
    const p = await newProvider(srv, { approve: false });
    const r = await heartbeat(srv, p.key);
    expect(r.status).toBe(403);
    expect(r.body.error).toMatch(/not approved \(approval_status: pending\)/);
    const stored = await row(p.id);
    expect(stored.last_heartbeat).toBeNull();
    expect(stored.status).toBe("registered");
  });

  it("403 for a rejected provider (with the reason) and for a suspended one", async () => {
    const rejected = await newProvider(srv, { approve: false });
    expect((await api.post(`/api/admin/providers/${rejected.id}/reject`, { reason: "GPU not supported" }, ADMIN)).status).toBe(200);
    const r = await heartbeat(srv, rejected.key);
    expect(r.status).toBe(403);
    expect(r.body.error).toMatch(/approval_status: rejected: GPU not supported/);

    const suspended = await newProvider(srv);
    expect((await heartbeat(srv, suspended.key)).status).toBe(200);
    expect((await api.post(`/api/admin/providers/${suspended.id}/suspend`, { reason: "abuse report" }, ADMIN)).status).toBe(200);
    const s = await heartbeat(srv, suspended.key);
    expect(s.status).toBe(403);
    expect(s.body.error).toMatch(/suspended: abuse report/);
    expect((await row(suspended.id)).status).toBe("suspended");
  });
});

describe("heartbeat: accepted", () => {
  it("answers every documented field with its type and moves the provider online", async () => {
    const p = await newProvider(srv);
    const before = Date.now();
    const r = await heartbeat(srv, p.key, {
      uptime: 3600.5,
      provider_ip: "203.0.113.7",
      provider_hostname: "rig-01",
      cached_models: ["llama-3-8b", "sdxl"],
      resource_spec: { cpu_count: 16, ram_gb: 64 },
    });
    expect(r.status).toBe(200);
    expect(r.body).toEqual({
      success: true,
      message: expect.any(String),
      timestamp: expect.stringMatching(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/),
      update_available: false,
      needs_update: false,
      latest_version: "3.2.0",
      min_version: "3.0.0",
      approval_status: "approved",
      approved: true,
      preload_model: null,
      paused: false,
    });
    expect(Date.parse(r.body.timestamp)).toBeGreaterThanOrEqual(before - 1000);

    const stored = await row(p.id);
    expect(stored.status).toBe("online");
    expect(stored.last_heartbeat).not.toBeNull();
    expect(stored.first_heartbeat_at).not.toBeNull();
    expect(stored.gpu_vram_mib).toBe(24564);
    expect(stored.gpu_count).toBe(1);
    expect(stored.gpu_compute_capability).toBe("8.9");
    expect(stored.gpu_cuda_version).toBe("12.4");
    expect(stored.gpu_driver_version).toBe("550.54.14");
    expect(stored.daemon_version).toBe("5.0.0");
    expect(stored.cached_models).toEqual(["llama-3-8b", "sdxl"]);
    expect(stored.provider_ip).toBe("203.0.113.7");
    expect(stored.hostname).toBe("rig-01");
    expect(stored.resource_spec).toEqual({ cpu_count: 16, ram_gb: 64 });
    expect(stored.gpu_telemetry).toMatchObject({ gpu_util_pct: 37.5, temp_c: 61, daemon_uptime_s: 3600.5 });
    // Reputation recomputed on the heartbeat.
    expect(stored.reliability_score).toEqual(expect.any(Number));

    const me = await api.get(`/api/providers/me?key=${p.key}`);
    expect(me.body.provider.status).toBe("online");
    expect(me.body.provider.gpu_metrics).toEqual({ utilization_pct: 37.5, vram_used_mib: 4564, temperature_c: 61 });
    expect(me.body.provider.gpu_vram_mib).toBe(24564);

    // A beat without free VRAM: how much is used is unknown, not the whole card.
    const silent = await newProvider(srv);
    expect((await heartbeat(srv, silent.key, { gpu_status: { gpu_name: "RTX 4090", gpu_vram_mib: 24564 } })).status).toBe(200);
    await flushHeartbeats(srv);
    expect((await api.get(`/api/providers/me?key=${silent.key}`)).body.provider.gpu_metrics.vram_used_mib).toBe(0);
  });

  it("tolerates what real daemons send: strings for objects, extra fields, missing parts", async () => {
    const p = await newProvider(srv);
    const bodies: Record<string, unknown>[] = [
      { gpu_status: JSON.stringify(gpuStatus(49140)) },
      { gpu_status: "nvidia-smi failed: NVML not found" },
      { gpu_status: gpuStatus(24564, { fan_pct: 40, mig_devices: [{ id: 1 }], nested: { deep: [1, 2, 3] } }), surprise: { a: 1 } },
      { gpu_status: [{ gpu_name: "A100", gpu_vram_mib: "81920", gpu_util_pct: "12.5" }, { gpu_name: "A100" }] },
      { gpu_status: null, resource_spec: "{\"cpu_count\": 8}", cached_models: "llama-3-8b, mistral-7b", uptime: "42" },
      { resource_spec: "not json", cached_models: [{ name: "sdxl" }, 7, null], uptime: "forever", provider_ip: 12345 },
      {},
    ];
    for (const body of bodies) {
      const r = await api.post("/api/providers/heartbeat", { api_key: p.key, ...body });
      expect(r.status, JSON.stringify(body)).toBe(200);
      expect(r.body.success).toBe(true);
    }
    const stored = await row(p.id);
    expect(stored.status).toBe("online");
    // The list-shaped gpu_status gave the VRAM and count; later beats without them kept them.
    expect(stored.gpu_vram_mib).toBe(81920);
    expect(stored.gpu_count).toBe(2);
    expect(stored.cached_models).toEqual(["sdxl", "7"]);
    expect(stored.resource_spec).toEqual({ cpu_count: 8 });
  });


  it("GET /me answers 200 with vram_used_mib a whole number of MiB, whatever VRAM figures the daemon reported", async () => {
    const cases: [Record<string, unknown>, number][] = [
      // Out of every GPU's range: the stored card size (the heartbeat keeps none past 16 TiB) and no used figure.
      [{ gpu_vram_mib: 1e308, free_vram_mib: -1e308 }, 0],
      [{ gpu_vram_mib: 1e300, free_vram_mib: -1e300 }, 0],
      [{ gpu_vram_mib: 24000, free_vram_mib: -1e19 }, 0],
      [{ gpu_vram_mib: 24000, free_vram_mib: 1e19 }, 0],
      [{ gpu_vram_mib: 24000, free_vram_mib: 20000.4 }, 4000],
    ];
    for (const [gpu, used] of cases) {
      const p = await newProvider(srv);
      expect((await heartbeat(srv, p.key, { gpu_status: gpu })).status).toBe(200);
      await flushHeartbeats(srv);
      const me = await api.get(`/api/providers/me?key=${p.key}`);
      expect(me.status, JSON.stringify(gpu)).toBe(200);
      expect(me.body.provider.gpu_metrics.vram_used_mib, JSON.stringify(gpu)).toBe(used);
    }
  });
  it("answers 500 {error: \"heartbeat failed\"} when the database refuses the write", async () => {
    const p = await newProvider(srv);
    await srv.sql.unsafe(`
      CREATE FUNCTION test_refuse_${p.id}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'disk full'; END $$;
      CREATE TRIGGER test_refuse_${p.id} BEFORE UPDATE ON providers FOR EACH ROW WHEN (NEW.id = ${p.id}) EXECUTE FUNCTION test_refuse_${p.id}();`);
    try {
      const r = await heartbeat(srv, p.key);
      expect(r.status).toBe(500);
      expect(r.body).toEqual({ error: "heartbeat failed" });
    } finally {
      await srv.sql.unsafe(`DROP TRIGGER test_refuse_${p.id} ON providers; DROP FUNCTION test_refuse_${p.id}();`);
    }
    expect((await heartbeat(srv, p.key)).status).toBe(200);
  });

  it("stores telemetry with NUL characters removed (PostgreSQL cannot hold them) on the typed wire", async () => {
    const { create } = await import("@bufbuild/protobuf");
    const { HeartbeatRequestSchema } = await import("../../gen/svc/v1/providers_pb.js");
    const { recordHeartbeat } = await import("../../src/domain/providers/heartbeat.js");
    const p = await newProvider(srv);
    await heartbeat(srv, p.key);
    const req = create(HeartbeatRequestSchema, {
      gpuStatus: { kind: { case: "structValue", value: { fields: {
        gpu_name: { kind: { case: "stringValue", value: "RTX\u00004090" } },
        ["bad\u0000key"]: { kind: { case: "numberValue", value: 1 } },
      } } } },
      providerHostname: "rig\u0000-9",
    });
    const r = await recordHeartbeat(srv.app.deps, p.id, req);
    expect(r.success).toBe(true);
    await flushHeartbeats(srv);
    const [row] = await srv.sql`SELECT gpu_telemetry, hostname FROM providers WHERE id = ${p.id}`;
    expect(row.gpu_telemetry).toMatchObject({ gpu_name: "RTX4090", badkey: 1 });
    expect(row.hostname).toBe("rig-9");
  });

  it("refuses a body that is not JSON with 400, never 500", async () => {
    const p = await newProvider(srv);
    const r = await api.call("POST", "/api/providers/heartbeat", `{"api_key": "${p.key}", "gpu_status": {`, { "content-type": "application/json" });
    expect(r.status).toBe(400);
    expect(r.body.error).toMatch(/malformed JSON/);
  });

  it("signals updates by semantic-version comparison against min and latest", async () => {
    const p = await newProvider(srv);
    // [version, below the minimum (update_available and needs_update, as the interface defines them), below the latest]
    const cases: [string | undefined, boolean, boolean][] = [
      ["2.9.9", true, true],
      ["3.0.0-rc.1", true, true],
      ["3.0.0", false, true],
      ["3.1.7", false, true],
      ["3.2.0-beta.2", false, true],
      ["3.2.0", false, false],
      ["v3.2", false, false],
      ["3.10.0", false, false],
      ["not-a-version", false, false],
    ];
    for (const [version, belowMin, belowLatest] of cases) {
      const r = await heartbeat(srv, p.key, { gpu_status: gpuStatus(24564, { daemon_version: version }) });
      expect(r.status).toBe(200);
      expect([version, r.body.update_available, r.body.needs_update]).toEqual([version, belowMin, belowMin]);
      if (belowMin) expect(r.body.message).toMatch(/update required/);
      else if (belowLatest) expect(r.body.message).toMatch(/daemon 3\.2\.0 is available/);
      else expect(r.body.message).not.toMatch(/available|update/);
    }
    // A top-level daemon_version wins over the one inside gpu_status.
    const top = await heartbeat(srv, p.key, { daemon_version: "1.0.0" });
    expect(top.body.needs_update).toBe(true);
  });

  it("returns preload_model while requested, until the daemon reports the model cached", async () => {
    const p = await newProvider(srv);
    expect((await heartbeat(srv, p.key)).body.preload_model).toBeNull();
    const set = await api.post(`/api/admin/providers/${p.id}/preload-model`, { model_name: "meta-llama/Llama-3-8B" }, ADMIN);
    expect(set.status).toBe(200);
    for (let i = 0; i < 2; i++) {
      const r = await heartbeat(srv, p.key, { cached_models: ["sdxl"] });
      expect(r.body.preload_model).toEqual({ model_name: "meta-llama/Llama-3-8B", status: "downloading" });
    }
    const done = await heartbeat(srv, p.key, { cached_models: ["sdxl", "meta-llama/Llama-3-8B"] });
    expect(done.body.preload_model).toBeNull();
    expect((await row(p.id)).preload_model).toBeNull();
    expect((await heartbeat(srv, p.key, { cached_models: [] })).body.preload_model).toBeNull();
  });

  it("keeps a paused provider paused (and says so) while it heartbeats", async () => {
    const p = await newProvider(srv);
    await heartbeat(srv, p.key);
    expect((await api.post("/api/providers/pause", { key: p.key })).body).toEqual({ success: true, status: "paused" });
    for (let i = 0; i < 3; i++) {
      const r = await heartbeat(srv, p.key);
      expect(r.status).toBe(200);
      expect(r.body.paused).toBe(true);
      expect(r.body.message).toMatch(/paused/);
    }
    const stored = await row(p.id);
    expect(stored.status).toBe("paused");
    expect(stored.is_paused).toBe(true);
  });
});

describe("heartbeat: write path", () => {
  it("keeps daemon_version_rank the reported version's rank through inserts, beats and direct writes", async () => {
    const rankOf = async (id: number) => {
      await flushHeartbeats(srv);
      const [r] = await srv.sql<{ rank: string | null }[]>`SELECT daemon_version_rank::text AS rank FROM providers WHERE id = ${id}`;
      return r.rank === null ? null : Number(r.rank);
    };
    const p = await newProvider(srv);
    expect(await rankOf(p.id)).toBeNull();
    const steps: [string, number | null][] = [
      ["3.1.7", 3_000_001_000_007],
      ["3.1.7", 3_000_001_000_007], // a steady beat: the version is written unchanged
      ["v3.2", 3_000_002_000_000],
      ["10.0.0-rc.1", 10_000_000_000_000],
      ["not-a-version", null],
      ["3.0.0", 3_000_000_000_000],
    ];
    for (const [version, rank] of steps) {
      expect((await heartbeat(srv, p.key, { daemon_version: version })).status).toBe(200);
      expect([version, await rankOf(p.id)]).toEqual([version, rank]);
    }
    // The rank stays derived: a write of the rank alone is put back, an update of another column keeps it.
    await srv.sql`UPDATE providers SET daemon_version_rank = 1 WHERE id = ${p.id}`;
    expect(await rankOf(p.id)).toBe(3_000_000_000_000);
    await srv.sql`UPDATE providers SET hostname = 'rank-check' WHERE id = ${p.id}`;
    expect(await rankOf(p.id)).toBe(3_000_000_000_000);
    const [inserted] = await srv.sql<{ id: number }[]>`
      INSERT INTO providers (name, email, gpu_model, os, daemon_version, daemon_version_rank)
      VALUES ('rank', ${`rank-${Date.now()}@example.com`}, 'RTX 4090', 'linux', '2.5.1', 42) RETURNING id`;
    expect(await rankOf(Number(inserted.id))).toBe(2_000_005_000_001);
  });

  it("coalesces steady beats and writes the latest telemetry within the flush interval", async () => {
    const p = await newProvider(srv);
    await heartbeat(srv, p.key); // first beat: synchronous
    const first = (await row(p.id)).last_heartbeat as Date;
    await new Promise((r) => setTimeout(r, 20));
    const r = await heartbeat(srv, p.key, { gpu_status: gpuStatus(24564, { temp_c: 77 }) });
    expect(r.status).toBe(200);
    await vi.waitFor(async () => {
      const [x] = await srv.sql`SELECT last_heartbeat, gpu_telemetry FROM providers WHERE id = ${p.id}`;
      expect((x.last_heartbeat as Date).getTime()).toBeGreaterThan(first.getTime());
      expect(x.gpu_telemetry.temp_c).toBe(77);
    });
  });

  it("never loses the move back online: a provider marked offline behind the cache's back is healed by the batch", async () => {
    const p = await newProvider(srv);
    await heartbeat(srv, p.key);
    // Another process's sweep marked it offline, and its notification has not arrived.
    await srv.sql`UPDATE providers SET status = 'offline', last_heartbeat = now() - interval '5 minutes' WHERE id = ${p.id}`;
    expect((await heartbeat(srv, p.key)).status).toBe(200);
    const stored = await row(p.id);
    expect(stored.status).toBe("online");
    expect(Date.now() - (stored.last_heartbeat as Date).getTime()).toBeLessThan(10_000);
  });

  it("takes the synchronous path after a notified change: suspension in another process stops the next beat", async () => {
    const p = await newProvider(srv);
    await heartbeat(srv, p.key);
    expect((await heartbeat(srv, p.key)).status).toBe(200); // cached now
    const other = await startTestServer({ SVC_LIVENESS_SWEEP_SECONDS: "0" }, srv.databaseUrl);
    try {
      const s = await client(other.url).post(`/api/admin/providers/${p.id}/suspend`, {}, ADMIN);
      expect(s.status).toBe(200);
      await vi.waitFor(async () => expect((await heartbeat(srv, p.key)).status).toBe(403), { timeout: 3000 });
    } finally {
      await other.close();
    }
  });

  it("credits uptime coverage for steady beats", async () => {
    const p = await newProvider(srv);
    await heartbeat(srv, p.key);
    await srv.sql`UPDATE providers SET last_heartbeat = now() - interval '30 seconds' WHERE id = ${p.id}`;
    await heartbeat(srv, p.key);
    await flushHeartbeats(srv);
    // The current hour accumulates on the provider row (plus any hour filed since, at an hour boundary).
    const [u] = await srv.sql`
      SELECT p.uptime_hour_seconds + coalesce((SELECT sum(covered_seconds) FROM provider_uptime WHERE provider_id = p.id), 0)::int AS s
      FROM providers p WHERE p.id = ${p.id}`;
    expect(u.s).toBeGreaterThanOrEqual(29);
    expect(u.s).toBeLessThanOrEqual(32);
  });

  /** The seconds of heartbeat coverage credited to a provider: the current hour's and every hour filed. */
  const coveredSeconds = async (providerId: number) =>
    (await srv.sql<{ s: number }[]>`
      SELECT p.uptime_hour_seconds + coalesce((SELECT sum(covered_seconds) FROM provider_uptime WHERE provider_id = p.id), 0)::int AS s
      FROM providers p WHERE p.id = ${providerId}`)[0].s;

  it("credits no uptime while the provider is paused (heard, but taking no work), and credits again once resumed", async () => {
    const p = await newProvider(srv);
    await heartbeat(srv, p.key);
    await flushHeartbeats(srv);
    const covered = () => coveredSeconds(p.id);
    const before = await covered();
    expect((await client(srv).post("/api/providers/pause", { key: p.key })).status).toBe(200);
    await srv.sql`UPDATE providers SET last_heartbeat = now() - interval '30 seconds' WHERE id = ${p.id}`;
    await heartbeat(srv, p.key);
    await flushHeartbeats(srv);
    expect(await covered()).toBe(before);
    expect((await client(srv).post("/api/providers/resume", { key: p.key })).status).toBe(200);
    await srv.sql`UPDATE providers SET last_heartbeat = now() - interval '30 seconds' WHERE id = ${p.id}`;
    await heartbeat(srv, p.key);
    await flushHeartbeats(srv);
    expect(await covered()).toBeGreaterThanOrEqual(before + 29);
  });

  it("credits no uptime outside a scheduled provider's run window, and credits within it", async () => {
    const p = await newProvider(srv);
    await heartbeat(srv, p.key);
    await flushHeartbeats(srv);
    const covered = () => coveredSeconds(p.id);
    const hhmm = (d: Date) => d.toISOString().slice(11, 16);
    const inHours = (h: number) => new Date(Date.now() + h * 3_600_000);
    const before = await covered();
    // A window that starts an hour from now and ends two hours from now: outside it.
    await srv.sql`UPDATE providers SET run_mode = 'scheduled', scheduled_start = ${hhmm(inHours(1))}, scheduled_end = ${hhmm(inHours(2))}, last_heartbeat = now() - interval '30 seconds' WHERE id = ${p.id}`;
    await heartbeat(srv, p.key);
    await flushHeartbeats(srv);
    expect(await covered()).toBe(before);
    // A window from an hour ago to an hour from now: within it.
    await srv.sql`UPDATE providers SET scheduled_start = ${hhmm(inHours(-1))}, scheduled_end = ${hhmm(inHours(1))}, last_heartbeat = now() - interval '30 seconds' WHERE id = ${p.id}`;
    await heartbeat(srv, p.key);
    await flushHeartbeats(srv);
    expect(await covered()).toBeGreaterThanOrEqual(before + 29);
  });

  it("files a finished hour's coverage when a beat arrives in a later hour", async () => {
    const p = await newProvider(srv);
    await heartbeat(srv, p.key);
    await flushHeartbeats(srv);
    // Pretend the accumulator belongs to two hours ago and the last beat came 30 s ago.
    await srv.sql`
      UPDATE providers SET uptime_hour = date_trunc('hour', now()) - interval '2 hours', uptime_hour_seconds = 1234,
        last_heartbeat = now() - interval '30 seconds' WHERE id = ${p.id}`;
    await heartbeat(srv, p.key);
    await flushHeartbeats(srv);
    const filed = await srv.sql`SELECT covered_seconds FROM provider_uptime WHERE provider_id = ${p.id} AND hour = date_trunc('hour', now()) - interval '2 hours'`;
    expect(filed.map((r) => r.covered_seconds)).toEqual([1234]);
    const [row] = await srv.sql`SELECT uptime_hour = date_trunc('hour', now()) AS current, uptime_hour_seconds FROM providers WHERE id = ${p.id}`;
    expect(row.current).toBe(true);
    expect(row.uptime_hour_seconds).toBeGreaterThanOrEqual(29);
    expect(row.uptime_hour_seconds).toBeLessThanOrEqual(32);
  });
});

describe("heartbeat: stored times are the database's clock, whatever this host's clock says", () => {
  // The server runs in this process: its clock (Date) is moved with fake timers (Date only, still
  // advancing) while PostgreSQL keeps the real time. Liveness is judged by the database's now().
  restoreClockAfterEach();
  const stored = async (id: number) =>
    (await srv.sql<{ last_heartbeat: Date; db_now: Date }[]>`SELECT last_heartbeat, clock_timestamp() AS db_now FROM providers WHERE id = ${id}`)[0];
  const coveredSeconds = async (providerId: number) =>
    (await srv.sql<{ s: number }[]>`
      SELECT p.uptime_hour_seconds + coalesce((SELECT sum(covered_seconds) FROM provider_uptime WHERE provider_id = p.id), 0)::int AS s
      FROM providers p WHERE p.id = ${providerId}`)[0].s;

  it("a provider that just beat on a host 3 minutes behind the database is live and takes a job", async () => {
    const p = await newProvider(srv);
    skewAppClock(-3 * 60_000);
    expect((await heartbeat(srv, p.key)).status).toBe(200); // the first beat: the state-changing write
    expect((await heartbeat(srv, p.key)).status).toBe(200); // a steady one: the coalesced write
    await flushHeartbeats(srv);
    const renter = await makeRenter(srv, 10_000);
    const r = await api.post("/api/jobs/submit", { job_type: "benchmark", provider_id: p.id }, renter.headers);
    vi.useRealTimers();
    const row = await stored(p.id);
    const lag = (row.db_now.getTime() - row.last_heartbeat.getTime()) / 1000;
    expect(r.body.job, `${r.text}; the stored beat lies ${lag} s behind the database clock`).toMatchObject({ status: "pending", provider_id: p.id });
    expect(lag).toBeGreaterThanOrEqual(0);
    expect(lag).toBeLessThan(10);
  });

  it("a beat on a host 10 minutes ahead is not stored in the database's future (a dead provider would stay live 10 minutes more)", async () => {
    const p = await newProvider(srv);
    skewAppClock(10 * 60_000);
    expect((await heartbeat(srv, p.key)).status).toBe(200);
    expect((await heartbeat(srv, p.key)).status).toBe(200);
    await flushHeartbeats(srv);
    vi.useRealTimers();
    const row = await stored(p.id);
    expect(row.last_heartbeat.getTime()).toBeLessThanOrEqual(row.db_now.getTime());
    expect(row.db_now.getTime() - row.last_heartbeat.getTime()).toBeLessThan(10_000);
    // Silent for the live window by the database's clock: not live.
    await srv.sql`UPDATE providers SET last_heartbeat = last_heartbeat - make_interval(secs => ${LIVE_WINDOW_SECONDS + 1}) WHERE id = ${p.id}`;
    const [{ live }] = await srv.sql<{ live: boolean }[]>`
      SELECT last_heartbeat > now() - make_interval(secs => ${LIVE_WINDOW_SECONDS}) AS live FROM providers WHERE id = ${p.id}`;
    expect(live).toBe(false);
  });

  it("a beat credits the time since the previous one by the database's clock, on a host behind or ahead of it", async () => {
    for (const skew of [-3 * 60_000, 10 * 60_000]) {
      const p = await newProvider(srv);
      expect((await heartbeat(srv, p.key)).status).toBe(200);
      await flushHeartbeats(srv);
      const before = await coveredSeconds(p.id);
      await srv.sql`UPDATE providers SET last_heartbeat = now() - interval '30 seconds' WHERE id = ${p.id}`;
      skewAppClock(skew);
      expect((await heartbeat(srv, p.key)).status).toBe(200);
      await flushHeartbeats(srv);
      vi.useRealTimers();
      const credited = (await coveredSeconds(p.id)) - before;
      expect(credited, `app clock ${skew / 1000} s off`).toBeGreaterThanOrEqual(29);
      expect(credited, `app clock ${skew / 1000} s off`).toBeLessThanOrEqual(32);
      const row = await stored(p.id);
      expect(row.db_now.getTime() - row.last_heartbeat.getTime()).toBeLessThan(10_000);
    }
  });

  it("a later flush's beat is written though the earlier flush's statement started late; a beat older by more than the slack is not", async () => {
    const p = await newProvider(srv);
    expect((await heartbeat(srv, p.key)).status).toBe(200);
    await flushHeartbeats(srv);
    const beat = (ageMs: number, cachedModels: string[]) => ({ firstTs: performance.now() - ageMs, lastTs: performance.now() - ageMs, input: { cachedModels } });
    const stored = async () =>
      (await srv.sql<{ cached_models: string[]; ahead_ms: number }[]>`
        SELECT cached_models, (extract(epoch FROM last_heartbeat - now()) * 1000)::float8 AS ahead_ms FROM providers WHERE id = ${p.id}`)[0];
    // The earlier batch's statement waited 300 ms to start: its beat's time came out 300 ms late.
    await srv.sql`UPDATE providers SET last_heartbeat = now() + interval '300 milliseconds', cached_models = '{earlier}' WHERE id = ${p.id}`;
    await writeTelemetryRows(srv.sql, [[p.id, beat(0, ["later"])]]);
    let r = await stored();
    expect(r.cached_models).toEqual(["later"]);
    expect(r.ahead_ms, "last_heartbeat never moves back").toBeGreaterThan(200);
    // A beat from a batch retried long after (or another process's) is older than the slack: it changes nothing.
    await srv.sql`UPDATE providers SET last_heartbeat = now() WHERE id = ${p.id}`;
    await writeTelemetryRows(srv.sql, [[p.id, beat((BEAT_TIME_SLACK_SECONDS + 5) * 1000, ["stale"])]]);
    r = await stored();
    expect(r.cached_models).toEqual(["later"]);
  });

  it("uptime accumulates per UTC hour, whatever the session's TimeZone (Asia/Kolkata's hours start at :30 UTC)", async () => {
    const p = await newProvider(srv);
    const hourOf = async () =>
      (await srv.sql<{ uptime_hour: Date; utc_hour: Date }[]>`
        SELECT uptime_hour, date_trunc('hour', last_heartbeat, 'UTC') AS utc_hour FROM providers WHERE id = ${p.id}`)[0];
    const inKolkata = (write: (tx: Sql) => Promise<unknown>) =>
      srv.sql.begin(async (tx) => {
        await tx`SELECT set_config('TimeZone', 'Asia/Kolkata', true)`;
        await write(tx as unknown as Sql);
      });
    const beat = () => ({ firstTs: performance.now(), lastTs: performance.now(), input: {} });
    await inKolkata((tx) => writeStateRows(tx, [[p.id, beat()]], false));
    let h = await hourOf();
    expect(h.uptime_hour.getUTCMinutes()).toBe(0);
    expect(h.uptime_hour.toISOString()).toBe(h.utc_hour.toISOString());
    await srv.sql`UPDATE providers SET uptime_hour = NULL, last_heartbeat = now() - interval '30 seconds' WHERE id = ${p.id}`;
    await inKolkata((tx) => writeTelemetryRows(tx, [[p.id, beat()]]));
    h = await hourOf();
    expect(h.uptime_hour.getUTCMinutes()).toBe(0);
    expect(h.uptime_hour.toISOString()).toBe(h.utc_hour.toISOString());
  });
});
