// A submit that no provider can take because the providers that could run it have a daemon below
// SVC_DAEMON_MIN_VERSION (given no jobs until it updates itself) answers 503 saying so, not that
// no provider matches requirements the job may not even have set; nothing is held.
import { beforeEach, describe, expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { clearMarketplace } from "./helpers.js";

const srv = useTestServer({ SVC_DAEMON_MIN_VERSION: "5.0.0", SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0" });
const api = client(srv);
beforeEach(() => clearMarketplace(srv));

/** An approved, online provider whose daemon reported `version`. */
async function runningDaemon(version: string, opts: { vramMib?: number } = {}) {
  const p = await makeProvider(srv, opts);
  await srv.sql`UPDATE providers SET daemon_version = ${version} WHERE id = ${p.id}`;
  return p;
}

const submit = (headers: Record<string, string>, body: Record<string, unknown>) => api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 2, ...body }, headers);

describe("503 when the only providers that could run a job have outdated daemons", () => {
  it("says the daemons are below the minimum version, for a job with or without gpu_requirements, and holds nothing", async () => {
    const renter = await makeRenter(srv, 100_000);
    await runningDaemon("4.9.0");
    const why = /^no providers available: the online providers that could run this job have a daemon below the minimum version 5\.0\.0 \(SVC_DAEMON_MIN_VERSION\)/;
    for (const body of [{}, { gpu_requirements: { min_vram_gb: 16 } }]) {
      const r = await submit(renter.headers, body);
      expect(r.status, r.text).toBe(503);
      expect(r.body.error).toMatch(why);
      expect(r.body.error).not.toMatch(/gpu_requirements/);
      expect(r.headers.get("retry-after")).toBe("30");
    }
    expect((await api.get("/api/renters/balance", renter.headers)).body.held_halala).toBe(0);
    // Requirements no provider meets, outdated or not, are still named as such.
    const big = await submit(renter.headers, { gpu_requirements: { min_vram_gb: 80 } });
    expect(big.status).toBe(503);
    expect(big.body.error).toBe("no providers available: no approved, online provider matches this job's gpu_requirements");
    // The daemon updates itself: the job is taken.
    await runningDaemon("5.0.0");
    expect((await submit(renter.headers, {})).status).toBe(201);
  });

  it("names a requested provider's outdated daemon", async () => {
    const renter = await makeRenter(srv, 100_000);
    const old = await runningDaemon("4.2.1");
    const r = await submit(renter.headers, { provider_id: old.id });
    expect(r.status, r.text).toBe(503);
    expect(r.body.error).toBe(
      `provider ${old.id} is not available: its daemon is below the minimum version 5.0.0 (SVC_DAEMON_MIN_VERSION) and is given no jobs until it updates itself`,
    );
    expect(r.headers.get("retry-after")).toBe("30");
  });

  it("says no provider is online when none is and the job set no gpu_requirements", async () => {
    const renter = await makeRenter(srv, 100_000);
    await makeProvider(srv, { online: false });
    const r = await submit(renter.headers, {});
    expect(r.status, r.text).toBe(503);
    expect(r.body.error).toBe("no providers available: no approved provider is online");
  });
});
