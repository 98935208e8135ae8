// Pause, resume, preferences (every bound) and status/{api_key} over real
// HTTP; the run-window rule in TypeScript and its SQL twin agree.
import { describe, expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { withinRunWindowSql } from "../../src/domain/providers/preferences.js";
import { withinRunWindow } from "../../src/shared/run-window.js";
import { ADMIN, flushHeartbeats, heardSecondsAgo, heartbeat, newProvider } from "./helpers.js";

const srv = useTestServer({ SVC_LIVENESS_SWEEP_SECONDS: "0" });
const api = client(srv);

describe("pause and resume", () => {
  it("pause -> paused (is_paused), resume -> online when live, connected when not", async () => {
    const p = await newProvider(srv);
    await heartbeat(srv, p.key);
    const paused = await api.post("/api/providers/pause", { key: p.key });
    expect(paused.status).toBe(200);
    expect(paused.body).toEqual({ success: true, status: "paused" });
    let me = await api.get(`/api/providers/me?key=${p.key}`);
    expect(me.body.provider.status).toBe("paused");
    expect(me.body.provider.is_paused).toBe(true);

    const resumed = await api.post("/api/providers/resume", { key: p.key });
    expect(resumed.body).toEqual({ success: true, status: "online" });
    me = await api.get(`/api/providers/me?key=${p.key}`);
    expect(me.body.provider.is_paused).toBe(false);

    await api.post("/api/providers/pause", { key: p.key });
    await heardSecondsAgo(srv, p.id, 600);
    expect((await api.post("/api/providers/resume", { key: p.key })).body).toEqual({ success: true, status: "connected" });
    // The next heartbeat brings it online.
    expect((await heartbeat(srv, p.key)).body.paused).toBe(false);
    expect((await api.get(`/api/providers/status/${p.key}`)).body.status).toBe("online");
  });

  it("accepts the key in the header too; 400 without a key; 401 with a bad key; 403 when suspended", async () => {
    const p = await newProvider(srv);
    expect((await api.post("/api/providers/pause", {}, { "x-provider-key": p.key })).status).toBe(200);
    expect((await api.post("/api/providers/pause", {})).status).toBe(400);
    expect((await api.post("/api/providers/resume", { key: "svc-provider-badbadbadbadbadbadbadbad" })).status).toBe(401);
    await api.post(`/api/admin/providers/${p.id}/suspend`, {}, ADMIN);
    const r = await api.post("/api/providers/resume", { key: p.key });
    expect(r.status).toBe(403);
    expect(r.body.error).toMatch(/suspended/);
    expect((await api.post("/api/providers/pause", { key: p.key })).status).toBe(403);
  });
});

describe("row locks", () => {
  it("pausing does not wait for a transaction that references the provider, nor deadlock with it", async () => {
    // A settlement records the provider on the job's hold (a foreign key: KEY SHARE on the provider
    // row) and updates the provider's totals at the end. A pause taking FOR UPDATE in between would
    // wait for that key share and make the settlement's own update wait behind it: a deadlock.
    const p = await newProvider(srv);
    const settlement = await srv.sql.reserve();
    try {
      await settlement`BEGIN`;
      await settlement`INSERT INTO daemon_events (provider_id, event_type, severity) VALUES (${p.id}, 'lock_test', 'info')`;
      // Answered while that transaction is still open (not queued behind its key share).
      const pausing = api.post("/api/providers/pause", { key: p.key });
      const pause = await Promise.race([pausing, new Promise<"blocked">((r) => setTimeout(() => r("blocked"), 3_000))]);
      expect(pause === "blocked" ? pause : pause.status).toBe(200);
      await settlement`UPDATE providers SET total_jobs = total_jobs + 1 WHERE id = ${p.id}`;
      await settlement`COMMIT`;
    } finally {
      await settlement`ROLLBACK`.catch(() => {});
      settlement.release();
    }
    const [row] = await srv.sql`SELECT status, total_jobs FROM providers WHERE id = ${p.id}`;
    expect(row).toMatchObject({ status: "paused", total_jobs: 1 });
  });
});

describe("preferences", () => {
  it("stores every preference and answers them all", async () => {
    const p = await newProvider(srv);
    const r = await api.post("/api/providers/preferences", {
      key: p.key,
      run_mode: "scheduled",
      scheduled_start: "22:00",
      scheduled_end: "06:30",
      gpu_usage_cap_pct: 80,
      vram_reserve_gb: 2.5,
      temp_limit_c: 78,
    });
    expect(r.status).toBe(200);
    expect(r.body).toEqual({
      success: true,
      preferences: {
        run_mode: "scheduled",
        scheduled_start: "22:00",
        scheduled_end: "06:30",
        gpu_usage_cap_pct: 80,
        vram_reserve_gb: 2.5,
        temp_limit_c: 78,
      },
    });
    const me = (await api.get(`/api/providers/me?key=${p.key}`)).body.provider;
    expect([me.run_mode, me.gpu_usage_cap_pct, me.vram_reserve_gb, me.temp_limit_c]).toEqual(["scheduled", 80, 2.5, 78]);

    // Omitted preferences keep their value.
    const partial = await api.post("/api/providers/preferences", { key: p.key, temp_limit_c: 90 });
    expect(partial.body.preferences).toMatchObject({ run_mode: "scheduled", scheduled_start: "22:00", gpu_usage_cap_pct: 80, temp_limit_c: 90 });
    const always = await api.post("/api/providers/preferences", { key: p.key, run_mode: "always-on", scheduled_start: "", scheduled_end: "" });
    expect(always.body.preferences).toMatchObject({ run_mode: "always-on", scheduled_start: null, scheduled_end: null });
  });

  it("accepts the bounds exactly and refuses one step outside with 400 naming the field", async () => {
    const p = await newProvider(srv);
    const ok = [
      { gpu_usage_cap_pct: 0 }, { gpu_usage_cap_pct: 100 },
      { vram_reserve_gb: 0 }, { vram_reserve_gb: 16 }, { vram_reserve_gb: 15.5 },
      { temp_limit_c: 50 }, { temp_limit_c: 100 },
      { run_mode: "manual" }, { run_mode: "always-on" },
    ];
    for (const body of ok) {
      const r = await api.post("/api/providers/preferences", { key: p.key, ...body });
      expect(r.status, JSON.stringify(body)).toBe(200);
    }
    const bad: [Record<string, unknown>, string][] = [
      [{ gpu_usage_cap_pct: -1 }, "gpu_usage_cap_pct"],
      [{ gpu_usage_cap_pct: 101 }, "gpu_usage_cap_pct"],
      [{ gpu_usage_cap_pct: 50.5 }, "gpu_usage_cap_pct"],
      [{ vram_reserve_gb: -0.1 }, "vram_reserve_gb"],
      [{ vram_reserve_gb: 16.01 }, "vram_reserve_gb"],
      [{ temp_limit_c: 49 }, "temp_limit_c"],
      [{ temp_limit_c: 101 }, "temp_limit_c"],
      [{ temp_limit_c: "hot" }, "temp_limit_c"],
      [{ run_mode: "sometimes" }, "run_mode"],
      [{ scheduled_start: "25:00" }, "scheduled_start"],
      [{ scheduled_end: "7pm" }, "scheduled_end"],
      [{ run_mode: "scheduled" }, "scheduled_start"],
      [{ run_mode: "scheduled", scheduled_start: "08:00" }, "scheduled_end"],
      [{ run_mode: "scheduled", scheduled_start: "08:00", scheduled_end: "08:00" }, "scheduled_end"],
    ];
    for (const [body, field] of bad) {
      const r = await api.post("/api/providers/preferences", { key: p.key, ...body });
      expect(r.status, JSON.stringify(body)).toBe(400);
      expect(r.body.error, JSON.stringify(body)).toContain(field);
    }
    // Nothing half-written: the last good values stand.
    const me = (await api.get(`/api/providers/me?key=${p.key}`)).body.provider;
    expect([me.run_mode, me.gpu_usage_cap_pct, me.vram_reserve_gb, me.temp_limit_c]).toEqual(["always-on", 100, 15.5, 100]);
  });

  it("400 without a key, 401 with a bad one", async () => {
    expect((await api.post("/api/providers/preferences", { temp_limit_c: 60 })).status).toBe(400);
    expect((await api.post("/api/providers/preferences", { key: "svc-provider-xxxxxxxxxxxxxxxxxxxxxxxx" })).status).toBe(401);
  });
});

describe("run window", () => {
  const at = (hhmm: string) => new Date(`2025-03-04T${hhmm}:00Z`);
  const cases: [string, string | null, string | null, string, boolean][] = [
    ["always-on", null, null, "03:00", true],
    ["manual", null, null, "03:00", true],
    ["scheduled", "09:00", "17:00", "08:59", false],
    ["scheduled", "09:00", "17:00", "09:00", true],
    ["scheduled", "09:00", "17:00", "16:59", true],
    ["scheduled", "09:00", "17:00", "17:00", false],
    ["scheduled", "22:00", "06:00", "21:59", false],
    ["scheduled", "22:00", "06:00", "22:00", true],
    ["scheduled", "22:00", "06:00", "00:00", true],
    ["scheduled", "22:00", "06:00", "05:59", true],
    ["scheduled", "22:00", "06:00", "06:00", false],
    ["scheduled", "22:00", "06:00", "12:00", false],
    ["scheduled", null, "06:00", "03:00", false],
    ["scheduled", "08:00", "08:00", "08:00", false],
    ["scheduled", "bogus", "06:00", "03:00", false],
  ];

  it("withinRunWindow: UTC, [start, end), crossing midnight", () => {
    for (const [mode, s, e, t, want] of cases) expect(withinRunWindow(mode, s, e, at(t)), `${mode} ${s}-${e} @${t}`).toBe(want);
  });

  it("svc_within_run_window (SQL) agrees with withinRunWindow", async () => {
    for (const [mode, s, e, t, want] of cases) {
      const [r] = await srv.sql`SELECT svc_within_run_window(${mode}, ${s}, ${e}, ${at(t)}) AS ok`;
      expect(r.ok, `${mode} ${s}-${e} @${t}`).toBe(want);
    }
    const p = await newProvider(srv);
    await api.post("/api/providers/preferences", { key: p.key, run_mode: "scheduled", scheduled_start: "00:00", scheduled_end: "23:59" });
    const [row] = await srv.sql`SELECT ${withinRunWindowSql(srv.sql, "p")} AS ok, run_mode, scheduled_start, scheduled_end FROM providers p WHERE id = ${p.id}`;
    expect(row.ok).toBe(withinRunWindow(row.run_mode, row.scheduled_start, row.scheduled_end, new Date()));
  });
});

describe("status/{api_key}", () => {
  it("answers the documented fields with their types", async () => {
    const p = await newProvider(srv, { name: "Status Rig", gpuModel: "H100" });
    const before = await api.get(`/api/providers/status/${p.key}`);
    expect(before.status).toBe(200);
    expect(before.body).toMatchObject({ provider_id: p.id, name: "Status Rig", status: "registered", gpu_model: "H100", last_heartbeat: null, total_earnings: 0, total_jobs: 0, uptime_percent: 0, is_live: false });
    await heartbeat(srv, p.key);
    await flushHeartbeats(srv); // the reputation figures follow with the next batch write
    const after = await api.get(`/api/providers/status/${p.key}`);
    expect(after.body).toEqual({
      provider_id: p.id,
      name: "Status Rig",
      status: "online",
      gpu_model: "H100",
      last_heartbeat: expect.stringMatching(/Z$/),
      total_earnings: 0,
      total_jobs: 0,
      uptime_percent: expect.any(Number),
      is_live: true,
      approval_status: "approved",
      is_paused: false,
      reliability_score: expect.any(Number),
      // Why dispatch skips the provider, when its daemon refused the server's task-signing key (docs/daemons.md).
      task_key_mismatch: null,
    });
  });

  it("404 'provider not found' for an unknown key in the status path; 401 on the job poll", async () => {
    const r = await api.get("/api/providers/status/svc-provider-unknownunknownunknown");
    expect(r.status).toBe(404);
    expect(r.body.error).toMatch(/provider not found/);
    expect((await api.get("/api/providers/svc-provider-unknownunknownunknown/jobs")).status).toBe(401);
  });
});
