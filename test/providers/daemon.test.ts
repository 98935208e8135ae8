// The daemon's other reports over real HTTP: daemon-event (severity, the
// 5000-character truncation, ~100 KB diagnostics) and readiness.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { ADMIN, newProvider, type TestProvider } from "./helpers.js";

let p: TestProvider;

const srv = useTestServer({ SVC_LIVENESS_SWEEP_SECONDS: "0" });
const api = client(srv);
beforeAll(async () => {
  p = await newProvider(srv, { approve: false }); // daemons report before approval too
});

const events = (id: number, query = "") => api.get(`/api/admin/providers/${id}/events${query}`, ADMIN);

describe("daemon-event timestamp: RFC 3339, one without an offset read as UTC, years 1970 to 9999", () => {
  // The server runs in this process, here in Asia/Riyadh (UTC+3) as an operator's host may be.
  let zone: string | undefined;
  beforeAll(() => {
    zone = process.env.TZ;
    process.env.TZ = "Asia/Riyadh";
  });
  afterAll(() => {
    if (zone === undefined) delete process.env.TZ;
    else process.env.TZ = zone;
  });
  const send = (key: string, timestamp: string) =>
    api.post("/api/providers/daemon-event", { api_key: key, event_type: "probe", severity: "info", timestamp });
  const reportedAt = async (providerId: number) => (await events(providerId, "?limit=1")).body.events[0]?.reported_at as string | undefined;
  /** Each timestamp's answer, and what the admin's list shows for it ("400" when refused). */
  const outcomes = async (stamps: string[]) => {
    const q = await newProvider(srv);
    const out: Record<string, string | undefined> = {};
    for (const ts of stamps) {
      const r = await send(q.key, ts);
      // A refusal names the field and the form it takes.
      const named = r.status !== 400 || /^timestamp must be an RFC 3339 date-time/.test(r.body.error);
      out[ts] = r.status === 200 ? await reportedAt(q.id) : named ? String(r.status) : `${r.status}: ${r.body.error}`;
    }
    return out;
  };

  it("this process runs in Asia/Riyadh (precondition)", () => {
    expect(new Date(2024, 5, 1, 12).getTimezoneOffset()).toBe(-180);
  });

  it("reads a date-time without an offset as UTC, never in the server's local zone", async () => {
    expect(await outcomes(["2024-06-01T10:00:00", "2024-06-01 10:00:00", "2024-06-01t10:00:00.5"])).toEqual({
      "2024-06-01T10:00:00": "2024-06-01T10:00:00.000Z",
      "2024-06-01 10:00:00": "2024-06-01T10:00:00.000Z",
      "2024-06-01t10:00:00.5": "2024-06-01T10:00:00.500Z",
    });
  });

  it("honours offsets, keeps fractions to the millisecond, reads a leap second as its minute's last millisecond", async () => {
    expect(await outcomes(["2024-06-01T10:00:00+14:00", "2024-06-01T10:00:00-09:30", "2024-06-01T10:00:00.123456789Z", "2016-12-31T23:59:60Z", "2024-06-01T10:00:00.1z"])).toEqual({
      "2024-06-01T10:00:00+14:00": "2024-05-31T20:00:00.000Z",
      "2024-06-01T10:00:00-09:30": "2024-06-01T19:30:00.000Z",
      "2024-06-01T10:00:00.123456789Z": "2024-06-01T10:00:00.123Z",
      "2016-12-31T23:59:60Z": "2016-12-31T23:59:59.999Z",
      "2024-06-01T10:00:00.1z": "2024-06-01T10:00:00.100Z",
    });
  });

  it("refuses with 400 naming the field what is no RFC 3339 date-time (never some day of 2001)", async () => {
    const junk = ["1", "hello 5", "June 1", "Tue 3", "2024-06-01", "2024-06-01T10:00Z", "2024-06-01T10:00:00+0300", "2024-06-01T10:00:00 Z",
      "2023-02-29T00:00:00Z", "2024-13-01T00:00:00Z", "2024-04-31T00:00:00Z", "2024-06-01T24:00:00Z", "2024-06-01T10:60:00Z", "2024-06-01T10:00:00+24:00",
      "Sat, 01 Jun 2024 10:00:00 GMT", "1717236000"];
    const got = await outcomes(junk);
    expect(got).toEqual(Object.fromEntries(junk.map((j) => [j, "400"])));
  });

  it("takes 1970 to 9999 (UTC) and refuses other years with 400, not a 500 from the database nor a wrong year read back", async () => {
    const stamps = ["1970-01-01T00:00:00Z", "9999-12-31T23:59:59.999Z", "1970-01-01T01:00:00+01:00", "1969-12-31T23:00:00-01:00",
      "1969-12-31T23:59:59.999Z", "1970-01-01T00:30:00+01:00", "9999-12-31T23:59:59-00:01", "0000-01-01T00:00:00Z", "0001-01-01T00:00:00Z",
      "0075-01-01T00:00:00Z", "1850-01-01T00:00:00Z", "-000001-01-01T00:00:00Z", "+275760-09-13T00:00:00Z", "10000-01-01T00:00:00Z"];
    expect(await outcomes(stamps)).toEqual({
      "1970-01-01T00:00:00Z": "1970-01-01T00:00:00.000Z",
      "9999-12-31T23:59:59.999Z": "9999-12-31T23:59:59.999Z",
      "1970-01-01T01:00:00+01:00": "1970-01-01T00:00:00.000Z",
      "1969-12-31T23:00:00-01:00": "1970-01-01T00:00:00.000Z",
      "1969-12-31T23:59:59.999Z": "400",
      "1970-01-01T00:30:00+01:00": "400",
      "9999-12-31T23:59:59-00:01": "400",
      "0000-01-01T00:00:00Z": "400",
      "0001-01-01T00:00:00Z": "400",
      "0075-01-01T00:00:00Z": "400",
      "1850-01-01T00:00:00Z": "400",
      "-000001-01-01T00:00:00Z": "400",
      "+275760-09-13T00:00:00Z": "400",
      "10000-01-01T00:00:00Z": "400",
    });
  });

  it("an event with an empty timestamp is stored without one (reported_at null)", async () => {
    expect(await outcomes([""])).toEqual({ "": null });
  });
});

describe("daemon-event", () => {
  it("records an event with severity info by default and answers {success, event_type, provider_id}", async () => {
    const r = await api.post("/api/providers/daemon-event", {
      api_key: p.key,
      event_type: "daemon_started",
      daemon_version: "5.0.0",
      timestamp: "2025-01-02T03:04:05Z",
      hostname: "rig-01",
      os_info: "Ubuntu 22.04",
      python_version: "3.11.8",
      details: "started with 1 GPU",
      job_id: "job-123",
    });
    expect(r.status).toBe(200);
    expect(r.body).toEqual({ success: true, event_type: "daemon_started", provider_id: p.id });
    const list = await events(p.id);
    expect(list.status).toBe(200);
    expect(list.body.total).toBe(1);
    expect(list.body.events[0]).toEqual({
      id: expect.any(Number),
      provider_id: p.id,
      event_type: "daemon_started",
      severity: "info",
      details: "started with 1 GPU",
      details_truncated: false,
      details_length: 18,
      job_id: "job-123",
      daemon_version: "5.0.0",
      hostname: "rig-01",
      os_info: "Ubuntu 22.04",
      python_version: "3.11.8",
      reported_at: "2025-01-02T03:04:05.000Z",
      created_at: expect.stringMatching(/Z$/),
    });
  });

  it("accepts each documented severity and refuses another with 400 naming the field", async () => {
    for (const severity of ["info", "warning", "error", "critical", "ERROR"]) {
      const r = await api.post("/api/providers/daemon-event", { api_key: p.key, event_type: "job_failed", severity });
      expect(r.status, severity).toBe(200);
    }
    const bad = await api.post("/api/providers/daemon-event", { api_key: p.key, event_type: "x", severity: "fatal" });
    expect(bad.status).toBe(400);
    expect(bad.body.error).toMatch(/severity must be one of info, warning, error, critical/);
    const errors = await events(p.id, "?severity=error");
    expect(errors.body.total).toBe(2);
    expect(errors.body.events.every((e: { severity: string }) => e.severity === "error")).toBe(true);
  });

  it("400 for a missing event_type or an unparseable timestamp; 400 without a key; 401 with a bad key", async () => {
    const missing = await api.post("/api/providers/daemon-event", { api_key: p.key, severity: "info" });
    expect(missing.status).toBe(400);
    expect(missing.body.error).toBe("missing required fields: event_type");
    const ts = await api.post("/api/providers/daemon-event", { api_key: p.key, event_type: "x", timestamp: "yesterday-ish" });
    expect(ts.status).toBe(400);
    expect(ts.body.error).toMatch(/timestamp/);
    expect((await api.post("/api/providers/daemon-event", { event_type: "x" })).status).toBe(400);
    const bad = await api.post("/api/providers/daemon-event", { api_key: "svc-provider-nope-nope-nope-nope-nope", event_type: "x" });
    expect(bad.status).toBe(401);
  });

  it("truncates details beyond 5000 characters and stores them; exactly 5000 is kept whole", async () => {
    const exact = "a".repeat(5000);
    expect((await api.post("/api/providers/daemon-event", { api_key: p.key, event_type: "exact", details: exact })).status).toBe(200);
    // ~100 KB of diagnostics, as real daemons send, with multi-byte characters at the cut.
    const big = "é".repeat(4999) + "😀" + "x".repeat(100_000);
    const r = await api.post("/api/providers/daemon-event", { api_key: p.key, event_type: "crash_report", severity: "critical", details: big });
    expect(r.status).toBe(200);
    const list = await events(p.id, "?event_type=crash_report");
    const e = list.body.events[0];
    expect(e.details_truncated).toBe(true);
    expect(e.details_length).toBe(105_000);
    expect(Array.from(e.details as string)).toHaveLength(5000);
    expect((e.details as string).endsWith("😀")).toBe(true);
    const whole = (await events(p.id, "?event_type=exact")).body.events[0];
    expect(whole.details).toBe(exact);
    expect(whole.details_truncated).toBe(false);
  });

  it("stores details sent as an object as its JSON text", async () => {
    const r = await api.post("/api/providers/daemon-event", { api_key: p.key, event_type: "diag", details: { gpus: [1, 2], ok: false } });
    expect(r.status).toBe(200);
    const e = (await events(p.id, "?event_type=diag")).body.events[0];
    expect(JSON.parse(e.details)).toEqual({ gpus: [1, 2], ok: false });
  });

  it("lists events newest first with paging; 404 for an unknown provider; admin token required", async () => {
    const page1 = await events(p.id, "?limit=2");
    const page2 = await events(p.id, "?limit=2&offset=2");
    expect(page1.body.events).toHaveLength(2);
    expect(page1.body.events[0].id).toBeGreaterThan(page1.body.events[1].id);
    expect(page2.body.events[0].id).toBeLessThan(page1.body.events[1].id);
    expect(page1.body.total).toBe(page2.body.total);
    expect((await events(999_999)).status).toBe(404);
    expect((await api.get(`/api/admin/providers/${p.id}/events`)).status).toBe(401);
    expect((await events(p.id, "?limit=0")).status).toBe(400);
    expect((await events(p.id, "?severity=loud")).status).toBe(400);
  });
});

describe("readiness", () => {
  it("ready with CUDA, PyTorch and at least 4 GB of VRAM; checks echoed and stored", async () => {
    const checks = { cuda: true, pytorch: true, vram_gb: 4, driver: "550.54" };
    const r = await api.post("/api/providers/readiness", { api_key: p.key, daemon_version: "5.0.0", checks });
    expect(r.status).toBe(200);
    expect(r.body).toEqual({ success: true, readiness_status: "ready", checks });
    const [row] = await srv.sql`SELECT readiness_status, readiness_checks, daemon_version FROM providers WHERE id = ${p.id}`;
    expect(row).toEqual({ readiness_status: "ready", readiness_checks: checks, daemon_version: "5.0.0" });
    const admin = await api.get(`/api/admin/providers/${p.id}`, ADMIN);
    expect(admin.body.readiness_status).toBe("ready");
  });

  it("failed when a check is missing or VRAM is under 4 GB", async () => {
    const cases = [
      { cuda: false, pytorch: true, vram_gb: 24 },
      { cuda: true, pytorch: false, vram_gb: 24 },
      { cuda: true, pytorch: true, vram_gb: 3.99 },
      { cuda: true, pytorch: true },
      {},
    ];
    for (const checks of cases) {
      const r = await api.post("/api/providers/readiness", { api_key: p.key, checks });
      expect(r.status).toBe(200);
      expect(r.body.readiness_status, JSON.stringify(checks)).toBe("failed");
      expect(r.body.checks).toEqual(checks);
    }
    const none = await api.post("/api/providers/readiness", { api_key: p.key });
    expect(none.body.readiness_status).toBe("failed");
    const [row] = await srv.sql`SELECT readiness_status FROM providers WHERE id = ${p.id}`;
    expect(row.readiness_status).toBe("failed");
  });

  it("400 for a check of the wrong type, naming it; 401 with a bad key", async () => {
    const r = await api.post("/api/providers/readiness", { api_key: p.key, checks: { cuda: "maybe" } });
    expect(r.status).toBe(400);
    expect(r.body.error).toMatch(/cuda|checks/);
    expect((await api.post("/api/providers/readiness", { api_key: "svc-provider-zzzzzzzzzzzzzzzzzzzzzzzz", checks: {} })).status).toBe(401);
  });
});
