// GET /api/providers/status/{key} judges is_live by the database's clock, which stored the last
// heartbeat, whatever this host's clock says.
import { describe, expect, it, vi } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { flushHeartbeats, heartbeat, newProvider } from "../providers/helpers.js";
import { restoreClockAfterEach, skewAppClock } from "../helpers/clock.js";

const srv = useTestServer({ SVC_LIVENESS_SWEEP_SECONDS: "0" });
const api = client(srv);
restoreClockAfterEach();

describe("provider status is_live by the database's clock", () => {
  it("a provider that just beat is live on a host 10 minutes ahead of the database", async () => {
    const p = await newProvider(srv);
    skewAppClock(10 * 60_000);
    expect((await heartbeat(srv, p.key)).status).toBe(200);
    expect((await heartbeat(srv, p.key)).status).toBe(200);
    await flushHeartbeats(srv);
    const s = await api.get(`/api/providers/status/${p.key}`);
    const avail = await api.get(`/api/renters/available-providers?limit=100`);
    vi.useRealTimers();
    expect(s.status, s.text).toBe(200);
    // The marketplace (SQL now()) says live; the status route must agree.
    const listed = (avail.body.providers ?? []).find((x: { id: number }) => x.id === p.id);
    expect(listed?.is_live).toBe(true);
    expect(s.body.is_live).toBe(true);
  });

  it("a provider silent for 3 minutes by the database's clock is not live on a host 3 minutes behind", async () => {
    const p = await newProvider(srv);
    expect((await heartbeat(srv, p.key)).status).toBe(200);
    await flushHeartbeats(srv);
    await srv.sql`UPDATE providers SET last_heartbeat = now() - interval '180 seconds' WHERE id = ${p.id}`;
    skewAppClock(-3 * 60_000);
    const s = await api.get(`/api/providers/status/${p.key}`);
    vi.useRealTimers();
    expect(s.status, s.text).toBe(200);
    expect(s.body.is_live).toBe(false);
  });
});
