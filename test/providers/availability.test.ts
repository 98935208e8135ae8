// What renters see of supply, over real HTTP: available-providers (filter,
// sort, every documented field, the 120 s liveness edge), the marketplace
// summary, the liveness sweep, and uptime/reliability.
import { describe, expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeRenter } from "../helpers/fixtures.js";
import { sweepOnce } from "../../src/workers/liveness-sweep.js";
import { reliabilityScore } from "../../src/domain/providers/reputation.js";
import { RATE_HALALA_PER_MINUTE } from "../../src/domain/money/pricing.js";
import { marketplaceSummaries } from "../../src/domain/providers/marketplace.js";
import { ADMIN, flushHeartbeats, gpuStatus, heardSecondsAgo, heartbeat, newProvider } from "./helpers.js";

const srv = useTestServer({ SVC_LIVENESS_SWEEP_SECONDS: "0" });
const api = client(srv);

const ids = (r: { body: { providers: { id: number }[] } }) => r.body.providers.map((p) => p.id);

describe("available-providers", () => {
  it("lists only online, approved, unpaused, live providers, largest VRAM first, with every documented field", async () => {
    const small = await newProvider(srv, { gpuModel: "RTX 3060" });
    const big = await newProvider(srv, { gpuModel: "H100 80GB" });
    const mid = await newProvider(srv, { gpuModel: "RTX 4090" });
    const paused = await newProvider(srv);
    const pending = await newProvider(srv, { approve: false });
    const suspended = await newProvider(srv);
    const silent = await newProvider(srv);
    await heartbeat(srv, small.key, { gpu_status: gpuStatus(12288), cached_models: ["tinyllama"] });
    await heartbeat(srv, big.key, { gpu_status: gpuStatus(81559, { gpu_count: 8, compute_capability: "9.0", cuda_version: "12.2", driver_version: "535.1" }) });
    await heartbeat(srv, mid.key, { gpu_status: gpuStatus(24564) });
    await heartbeat(srv, paused.key, { gpu_status: gpuStatus(49140) });
    await api.post("/api/providers/pause", { key: paused.key });
    await heartbeat(srv, pending.key, { gpu_status: gpuStatus(98304) });
    await heartbeat(srv, suspended.key, { gpu_status: gpuStatus(98304) });
    await api.post(`/api/admin/providers/${suspended.id}/suspend`, {}, ADMIN);
    await heartbeat(srv, silent.key, { gpu_status: gpuStatus(65536) });
    await heardSecondsAgo(srv, silent.id, 121); // not live any more, though the sweep has not run yet: listed, is_live false

    const r = await api.get("/api/renters/available-providers");
    expect(r.status).toBe(200);
    expect(ids(r)).toEqual([big.id, silent.id, mid.id, small.id]);
    expect(r.body.total).toBe(4);
    expect(r.body.providers.map((p: { is_live: boolean }) => p.is_live)).toEqual([true, false, true, true]);
    expect(r.body.discovery_mode).toBe("sqlite");
    expect(r.body.discovery_health).toEqual({ mode: "sqlite", enabled: false, announcement_enabled: false, bootstrap_configured: false });
    expect(r.body.providers[0]).toEqual({
      id: big.id,
      name: "Rig",
      gpu_model: "H100 80GB",
      vram_gb: 80,
      vram_mib: 81559,
      gpu_count: 8,
      driver_version: "535.1",
      compute_capability: "9.0",
      cuda_version: "12.2",
      status: "online",
      is_live: true,
      location: null,
      reliability_score: expect.any(Number),
      cached_models: [],
      discovery_source: "sqlite",
      discovered_at: null,
      addrs: [],
      stale: false,
    });
    expect(r.body.providers[3].cached_models).toEqual(["tinyllama"]);
    expect(r.body.providers[2].vram_gb).toBe(24);

    // Paging (an extension): total still counts all.
    const page = await api.get("/api/renters/available-providers?limit=1&offset=2");
    expect(ids(page)).toEqual([mid.id]);
    expect(page.body.total).toBe(4);
    expect((await api.get("/api/renters/available-providers?limit=0")).status).toBe(400);

    // Resume brings the paused one back, in VRAM order.
    await api.post("/api/providers/resume", { key: paused.key });
    expect(ids(await api.get("/api/renters/available-providers"))).toEqual([big.id, silent.id, paused.id, mid.id, small.id]);
    await api.post("/api/providers/pause", { key: paused.key });
  });

  it("the 120 s edge: heard 119 s ago is live, 121 s ago is listed not live; the sweep then marks it offline and it leaves the list", async () => {
    const edge = await newProvider(srv);
    const gone = await newProvider(srv);
    await heartbeat(srv, edge.key, { gpu_status: gpuStatus(200_000) });
    await heartbeat(srv, gone.key, { gpu_status: gpuStatus(199_000) });
    await heardSecondsAgo(srv, edge.id, 119);
    await heardSecondsAgo(srv, gone.id, 121);

    const listed = await api.get("/api/renters/available-providers");
    const live = (id: number) => listed.body.providers.find((p: { id: number }) => p.id === id)?.is_live;
    expect(live(edge.id)).toBe(true);
    expect(live(gone.id)).toBe(false);
    expect((await api.get(`/api/providers/status/${edge.key}`)).body).toMatchObject({ status: "online", is_live: true });
    expect((await api.get(`/api/providers/status/${gone.key}`)).body).toMatchObject({ status: "online", is_live: false });

    const { offline } = await sweepOnce(srv.app.deps);
    expect(offline).toContain(gone.id);
    expect(offline).not.toContain(edge.id);
    expect((await api.get(`/api/providers/status/${gone.key}`)).body.status).toBe("offline");
    expect((await api.get(`/api/providers/status/${edge.key}`)).body.status).toBe("online");
    expect(ids(await api.get("/api/renters/available-providers"))).not.toContain(gone.id);

    // The next heartbeat brings it straight back (the sweep told the cache).
    expect((await heartbeat(srv, gone.key)).status).toBe(200);
    expect((await api.get(`/api/providers/status/${gone.key}`)).body).toMatchObject({ status: "online", is_live: true });
    expect(ids(await api.get("/api/renters/available-providers"))).toContain(gone.id);
  });

  it("the sweep gives a resumed-but-silent (connected) provider one window, and leaves paused ones alone", async () => {
    const p = await newProvider(srv);
    await heartbeat(srv, p.key);
    await api.post("/api/providers/pause", { key: p.key });
    await heardSecondsAgo(srv, p.id, 600);
    await sweepOnce(srv.app.deps);
    expect((await api.get(`/api/providers/status/${p.key}`)).body.status).toBe("paused");
    expect((await api.post("/api/providers/resume", { key: p.key })).body.status).toBe("connected");
    await sweepOnce(srv.app.deps);
    expect((await api.get(`/api/providers/status/${p.key}`)).body.status).toBe("connected");
    await srv.sql`UPDATE providers SET status_since = now() - interval '121 seconds' WHERE id = ${p.id}`;
    expect((await sweepOnce(srv.app.deps)).offline).toContain(p.id);
    expect((await api.get(`/api/providers/status/${p.key}`)).body.status).toBe("offline");
  });
});

describe("marketplace", () => {
  it("is public and cacheable, summarises supply per GPU model and carries the rate table", async () => {
    const r = await api.get("/api/providers/marketplace");
    expect(r.status).toBe(200);
    expect(r.headers.get("cache-control")).toBe("public, max-age=30");
    expect(r.body.rates).toEqual(Object.entries(RATE_HALALA_PER_MINUTE).map(([job_type, rate]) => ({ job_type, rate_halala_per_minute: rate })));
    expect(Date.parse(r.body.generated_at)).not.toBeNaN();
    const h100 = r.body.gpus.find((g: { gpu_model: string }) => g.gpu_model === "H100 80GB");
    expect(h100).toEqual({ gpu_model: "H100 80GB", providers_online: 1, providers_total: 1, vram_mib: 81559, vram_gb: 80, gpu_count_online: 8 });
    // Counts add up with available-providers; pending and suspended providers are not supply.
    const available = await api.get("/api/renters/available-providers");
    expect(r.body.providers_online).toBe(available.body.total);
    const sum = r.body.gpus.reduce((n: number, g: { providers_online: number }) => n + g.providers_online, 0);
    expect(sum).toBe(available.body.total);
    const [{ n }] = await srv.sql`SELECT count(*)::int AS n FROM providers WHERE approval_status = 'approved' AND status <> 'suspended'`;
    expect(r.body.gpus.reduce((t: number, g: { providers_total: number }) => t + g.providers_total, 0)).toBe(n);
    // Sorted by providers online, most first.
    const online = r.body.gpus.map((g: { providers_online: number }) => g.providers_online);
    expect([...online].sort((a, b) => b - a)).toEqual(online);
  });
});

describe("marketplace reuse", () => {
  it("reads the summary at most once per period: a provider that comes online shows in the next period's", async () => {
    let now = 0;
    const summaries = marketplaceSummaries(srv.sql, 5000, () => now);
    const [first, together] = await Promise.all([summaries(), summaries()]);
    expect(together).toBe(first); // callers during a read share it
    const model = `Reuse Test GPU ${process.pid}`;
    const p = await newProvider(srv, { gpuModel: model });
    await heartbeat(srv, p.key, { gpu_status: gpuStatus(24564) });
    await flushHeartbeats(srv);
    now = 4999;
    const within = await summaries();
    expect(within).toBe(first);
    expect(within.gpus!.some((g) => g.gpuModel === model)).toBe(false);
    now = 5000;
    const next = await summaries();
    expect(next).not.toBe(first);
    expect(next.gpus!.find((g) => g.gpuModel === model)).toMatchObject({ providersOnline: 1n, providersTotal: 1n });
  });
});

describe("uptime and reliability", () => {
  it("uptime_percent is the heartbeat coverage of the window; reliability follows the documented formula", async () => {
    const p = await newProvider(srv);
    await heartbeat(srv, p.key);
    await flushHeartbeats(srv); // the first beat's own reputation refresh is done before the setup below
    const renter = await makeRenter(srv, 0);
    // Ten hours on record, five of them covered, and attempts of which 8 completed (each charged its minute) and 2 ended by the
    // provider's fault; an unattributed failure and a platform fault count neither way.
    await srv.sql`UPDATE providers SET first_heartbeat_at = now() - interval '10 hours', reputation_at = NULL WHERE id = ${p.id}`;
    await srv.sql`DELETE FROM provider_uptime WHERE provider_id = ${p.id}`;
    await srv.sql`
      INSERT INTO provider_uptime (provider_id, hour, covered_seconds)
      SELECT ${p.id}, date_trunc('hour', now()) - make_interval(hours => h), 3600 FROM generate_series(2, 6) AS h`;
    const faults = ["none", "none", "none", "none", "none", "none", "none", "none", "provider", "provider", "unattributed", "platform"];
    for (const [i, fault] of faults.entries()) {
      await srv.sql`
        WITH j AS (
          INSERT INTO jobs (job_id, renter_id, provider_id, job_type, status, duration_minutes, max_duration_seconds, rate_halala_per_minute, cost_halala)
          VALUES (${`rep-${p.id}-${i}`}, ${renter.id}, ${p.id}, 'benchmark', ${fault === "none" ? "completed" : "failed"}, 1, 60, 10, 10) RETURNING id, status)
        INSERT INTO job_attempts (job_id, attempt, provider_id, status, started_at, ended_at, fault, cost_halala)
        SELECT id, 1, ${p.id}, status, now() - interval '2 minutes', now() - interval '1 minute', ${fault}, ${fault === "none" ? 10 : 0} FROM j`;
    }
    await srv.sql`UPDATE providers SET last_heartbeat = now() - interval '10 seconds', reputation_at = NULL WHERE id = ${p.id}`;
    const hb = await heartbeat(srv, p.key); // cached: the batch write recomputes (reputation due)
    expect(hb.status).toBe(200);
    await flushHeartbeats(srv);
    const s = (await api.get(`/api/providers/status/${p.key}`)).body;
    // 5 h covered + the open span since the last beat (about 10 s credited, then a few ms) over 10 h.
    expect(s.uptime_percent).toBeGreaterThan(50);
    expect(s.uptime_percent).toBeLessThan(50.2);
    const want = reliabilityScore({ completedJobs: 8, failedJobs: 2, uptimePercent: s.uptime_percent, ageDays: 10 / 24 });
    expect(s.reliability_score).toBeCloseTo(want, 1);
    expect(want).toBeCloseTo(100 * (0.5 * (9 / 12) + 0.35 * 0.5 + 0.15 * (10 / 24 / 30)), 0);
    const me = (await api.get(`/api/providers/me?key=${p.key}`)).body.provider;
    expect(me.uptime_percent).toBe(s.uptime_percent);
  });

  it("reliabilityScore: bounds and weights", () => {
    expect(reliabilityScore({ completedJobs: 0, failedJobs: 0, uptimePercent: 0, ageDays: 0 })).toBe(25);
    expect(reliabilityScore({ completedJobs: 1e9, failedJobs: 0, uptimePercent: 100, ageDays: 365 })).toBe(100);
    expect(reliabilityScore({ completedJobs: 0, failedJobs: 1e9, uptimePercent: 0, ageDays: 0 })).toBe(0);
    expect(reliabilityScore({ completedJobs: 0, failedJobs: 0, uptimePercent: 140, ageDays: -5 })).toBe(60);
  });

  it("the sweep keeps a silent provider's uptime decaying", async () => {
    const p = await newProvider(srv);
    await heartbeat(srv, p.key);
    await flushHeartbeats(srv);
    await srv.sql`DELETE FROM provider_uptime WHERE provider_id = ${p.id}`;
    await srv.sql`
      UPDATE providers SET first_heartbeat_at = now() - interval '48 hours', last_heartbeat = now() - interval '3 hours',
        uptime_percent = 100, reputation_at = now() - interval '1 hour' WHERE id = ${p.id}`;
    await srv.sql`INSERT INTO provider_uptime (provider_id, hour, covered_seconds) VALUES (${p.id}, date_trunc('hour', now()) - interval '4 hours', 3600)`;
    await sweepOnce(srv.app.deps);
    const s = (await api.get(`/api/providers/status/${p.key}`)).body;
    expect(s.status).toBe("offline");
    expect(s.uptime_percent).toBeCloseTo((100 * 3600) / (24 * 3600), 0);
  });

  it("a provider that never beat has uptime 0 and no reliability score", async () => {
    const p = await newProvider(srv);
    const s = (await api.get(`/api/providers/status/${p.key}`)).body;
    expect(s.uptime_percent).toBe(0);
    expect(s.reliability_score).toBeNull();
  });
});
