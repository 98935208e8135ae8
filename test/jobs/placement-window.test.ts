// Placement reads at most 32 free providers (most reliable first) before it looks at the whole
// fleet. A queued job whose only fitting provider is a less reliable one outside that window is
// still placed by the job sweep, within one pass, and a later, lower-priority submit does not take
// that provider from an earlier, higher-priority job it fits.
import { beforeEach, describe, expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { sweepJobs } from "../../src/workers/job-timeouts.js";
import { dispatchQueued } from "../../src/domain/dispatch/dispatch.js";
import { clearMarketplace } from "./helpers.js";

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0" });
const api = client(srv);
beforeEach(() => clearMarketplace(srv));

/** HH:MM (UTC) `hours` from now. */
const hhmm = (hours: number) => {
  const d = new Date(Date.now() + hours * 3600_000);
  return `${String(d.getUTCHours()).padStart(2, "0")}:${String(d.getUTCMinutes()).padStart(2, "0")}`;
};

/** `n` idle, highly reliable RTX 4090 providers (they fill the candidate window) and one less reliable H100. */
async function fleet(n: number) {
  const fillers = [];
  for (let i = 0; i < n; i++) fillers.push(await makeProvider(srv));
  await srv.sql`UPDATE providers SET reliability_score = 0.99 WHERE id = ANY(${fillers.map((f) => f.id)}::bigint[])`;
  const h100 = await makeProvider(srv, { gpuModel: "NVIDIA H100 80GB HBM3", vramMib: 81920 });
  await srv.sql`UPDATE providers SET reliability_score = 0.5 WHERE id = ${h100.id}`;
  return { fillers, h100 };
}

const submit = (renter: { headers: Record<string, string> }, body: Record<string, unknown>) =>
  api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 1, ...body }, renter.headers);

/** The statements the job sweep's placement (dispatchQueued) runs on the server's pool. */
async function sweepStatements(): Promise<string[]> {
  const sql = srv.app.deps.sql;
  const options = (sql as unknown as { options: { debug?: unknown } }).options;
  const caught: string[] = [];
  const before = options.debug;
  options.debug = (_connection: number, string: string) => caught.push(string);
  try {
    await dispatchQueued(sql);
  } finally {
    options.debug = before;
  }
  return caught;
}

/** Of `statements`, the candidate reads: windowed (the window) and of the whole fleet. */
const candidateReads = (statements: string[]) => ({
  windowed: statements.filter((s) => s.includes("pool AS MATERIALIZED") && !s.includes("offer AS MATERIALIZED")).length,
  wholeFleet: statements.filter((s) => s.includes("offer AS MATERIALIZED")).length,
});

const jobRow = async (jobId: string) =>
  (await srv.sql<{ status: string; provider_id: number | null }[]>`SELECT status, provider_id FROM jobs WHERE job_id = ${jobId}`)[0];

describe("the candidate window", () => {
  // With 31 fillers the H100 is inside the window; with 32 it is the 33rd most reliable free provider.
  for (const [fillers, label] of [[31, "inside the window"], [32, "outside the 32 most reliable free providers"]] as const) {
    it(`the job sweep places a queued job on its only fitting provider within one pass (${label})`, async () => {
      const { h100 } = await fleet(fillers);
      const renter = await makeRenter(srv, 100_000);
      // The H100 runs on a schedule and is outside its window: the job waits.
      const sched = await api.post("/api/providers/preferences", { key: h100.key, run_mode: "scheduled", scheduled_start: hhmm(2), scheduled_end: hhmm(3) });
      expect(sched.status, sched.text).toBe(200);
      const r = await submit(renter, { gpu_requirements: { gpu_model: "H100" } });
      expect(r.status, r.text).toBe(201);
      expect(r.body.job.status).toBe("queued");
      const jobId = r.body.job.job_id as string;

      // Its window opens: nothing offers it work at that moment, only the job sweep notices.
      await srv.sql`UPDATE providers SET scheduled_start = ${hhmm(-1)}, scheduled_end = ${hhmm(1)} WHERE id = ${h100.id}`;
      const reason = (await api.get(`/api/jobs/${jobId}`, renter.headers)).body;
      expect(reason.queue_reason_code ?? reason.job?.queue_reason_code).toBe("waiting_for_dispatch");

      await sweepJobs(srv.sql);
      expect(await jobRow(jobId)).toEqual({ status: "pending", provider_id: h100.id });
    });
  }

  it("the job sweep reads past the window only when the window was full", async () => {
    const renter = await makeRenter(srv, 100_000);
    // A busy fleet: fewer free providers than the window holds, none of them fits the queued job.
    const { fillers, h100 } = await fleet(3);
    const running = await submit(renter, { gpu_requirements: { gpu_model: "H100" } });
    expect(running.body.job, running.text).toMatchObject({ status: "pending", provider_id: h100.id });
    const waiting = await submit(renter, { gpu_requirements: { gpu_model: "H100" } });
    expect(waiting.body.job?.status, waiting.text).toBe("queued");
    expect(candidateReads(await sweepStatements())).toEqual({ windowed: 1, wholeFleet: 0 });
    // The window full: free providers may lie beyond it, and the sweep looks (the H100 is still busy).
    for (let i = fillers.length; i < 32; i++) await makeProvider(srv);
    expect(candidateReads(await sweepStatements())).toEqual({ windowed: 1, wholeFleet: 1 });
    expect(await jobRow(waiting.body.job.job_id)).toEqual({ status: "queued", provider_id: null });
  });

  it("a later priority-3 submit does not take the provider an earlier priority-1 queued job was waiting for", async () => {
    const { h100 } = await fleet(32);
    const renter = await makeRenter(srv, 1_000_000);
    // 32 priority-1 jobs pinned to a paused provider: they stay queued, ahead of everything below.
    const parked = await makeProvider(srv);
    expect((await api.post("/api/providers/pause", { key: parked.key })).status).toBe(200);
    for (let i = 0; i < 32; i++) {
      const p = await submit(renter, { provider_id: parked.id, priority: 1 });
      expect(p.body.job?.status, p.text).toBe("queued");
    }
    // The H100 is paused while the priority-1 H100 job comes in: it waits.
    expect((await api.post("/api/providers/pause", { key: h100.key })).status).toBe(200);
    const first = await submit(renter, { gpu_requirements: { gpu_model: "H100" }, priority: 1 });
    expect(first.body.job?.status, first.text).toBe("queued");
    // Back, in a way that offers it nothing at once (as a scheduled window opening: no wake-up runs).
    await srv.sql`UPDATE providers SET is_paused = false, status = 'online', last_heartbeat = now() WHERE id = ${h100.id}`;

    // A low-priority H100 job is submitted afterwards.
    const later = await submit(renter, { gpu_requirements: { gpu_model: "H100" }, priority: 3 });
    expect(later.status, later.text).toBe(201);

    // Dispatch order is priority (1 high .. 3 low), then submit time: the priority-1 job goes first.
    expect({ first: await jobRow(first.body.job.job_id), later: await jobRow(later.body.job.job_id) }).toEqual({
      first: { status: "pending", provider_id: h100.id },
      later: { status: "queued", provider_id: null },
    });
  });
});
