// Three server processes on one database, rounds of parallel
// submits (mixed priorities and VRAM needs) racing results, cancels and re-offers.
// After every round: no provider holds more active jobs than its approved GPUs, the
// provider_load counter agrees, no job has two open attempts or two providers, and
// (once quiet, after one re-offer per provider) no GPU is idle beside a job it fits. One
// provider is paused during each round (resumed before the quiet check): its load row's `away`
// agrees with its state, and nothing is assigned to it once its pause was answered.
// Checks the placement rules hold together under concurrency.
import { afterAll, beforeAll, expect, it } from "vitest";
import { startTestServer, type TestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { dispatchForProvider } from "../../src/domain/dispatch/dispatch.js";
import { markJobAccepted, reportResult } from "../../src/domain/jobs/job-reports.js";
import { cancelJob } from "../../src/domain/jobs/job-control.js";
import { pauseProvider, resumeProvider } from "../../src/domain/providers/providers.js";
import { ledgerProblems } from "../../src/domain/money/ledger.js";

let servers: TestServer[] = [];
beforeAll(async () => {
  const env = { SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0" };
  const a = await startTestServer(env);
  servers = [a, await startTestServer(env, a.databaseUrl), await startTestServer(env, a.databaseUrl)];
}, 60_000);
afterAll(async () => {
  for (const s of servers.reverse()) await s.close();
});

it("no double assignment across three processes; counters agree; no idle fitting GPU once quiet", async () => {
  const a = servers[0];
  const sql = a.sql;
  const GPUS = [2, 3, 1, 2];
  const VRAM = [24576, 81920, 24576, 49152];
  const providers = [];
  for (const [i, g] of GPUS.entries()) {
    const p = await makeProvider(a, { vramMib: VRAM[i], gpuModel: i === 1 ? "NVIDIA H100 80GB HBM3" : "NVIDIA GeForce RTX 4090" });
    await sql`UPDATE providers SET gpu_count = ${g}, approved_gpu_count = ${g} WHERE id = ${p.id}`;
    providers.push(p);
  }
  const renters = [];
  for (let i = 0; i < 4; i++) renters.push(await makeRenter(a, 1_000_000));

  const check = async (round: number) => {
    const over = await sql`
      SELECT p.id, l.active, (SELECT count(*)::int FROM jobs j WHERE j.provider_id = p.id AND j.status IN ('pending','running')) AS n,
             least(p.gpu_count, coalesce(p.approved_gpu_count, p.gpu_count)) AS slots
      FROM providers p JOIN provider_load l ON l.provider_id = p.id`;
    for (const r of over) {
      expect(r.n, `round ${round} provider ${r.id}`).toBeLessThanOrEqual(r.slots);
      expect(r.active, `round ${round} provider ${r.id} counter`).toBe(r.n);
    }
    const twoOpen = await sql`
      SELECT job_id FROM job_attempts WHERE status IN ('pending','running') GROUP BY job_id HAVING count(*) > 1`;
    expect(twoOpen, `round ${round}`).toEqual([]);
    const mismatch = await sql`
      SELECT j.id FROM jobs j JOIN job_attempts x ON x.job_id = j.id AND x.attempt = j.attempt
      WHERE j.status IN ('pending','running') AND x.provider_id IS DISTINCT FROM j.provider_id`;
    expect(mismatch, `round ${round}`).toEqual([]);
  };

  for (let round = 0; round < 6; round++) {
    const active = await sql<{ job_id: string; provider_id: number; status: string; renter_id: number }[]>`
      SELECT job_id, provider_id, status, renter_id FROM jobs WHERE status IN ('pending','running') ORDER BY id`;
    const ops: Promise<unknown>[] = [];
    // 30 submits spread over the three processes.
    for (let k = 0; k < 30; k++) {
      const srv = servers[k % 3];
      const renter = renters[k % 4];
      const big = k % 5 === 0;
      ops.push(
        client(srv.url).post(
          "/api/jobs/submit",
          { job_type: "benchmark", duration_minutes: 1, priority: 1 + (k % 3), ...(big ? { gpu_requirements: { min_vram_gb: 70 } } : {}) },
          renter.headers,
        ),
      );
    }
    // Half the active jobs finish, a few are cancelled, every provider is re-offered work, all at once.
    for (const [i, j] of active.entries()) {
      if (i % 2 === 0) {
        ops.push(
          (async () => {
            if (j.status === "pending") await markJobAccepted(sql, j.provider_id, { jobId: j.job_id }).catch(() => {});
            await reportResult(servers[i % 3].sql, j.provider_id, { jobId: j.job_id, success: true, result: { ok: true } }).catch(() => {});
          })(),
        );
      } else if (i % 5 === 1) {
        ops.push(cancelJob(servers[i % 3].sql, j.job_id, { role: "renter", renterId: j.renter_id }).catch(() => {}));
      }
    }
    for (const [i, p] of providers.entries()) ops.push(dispatchForProvider(servers[i % 3].sql, p.id));
    // One provider's owner pauses it meanwhile.
    const paused = providers[round % providers.length];
    let pausedAt: Date | undefined;
    ops.push(pauseProvider(servers[(round + 1) % 3].sql, paused.id).then(async () => {
      pausedAt = (await sql<{ now: Date }[]>`SELECT clock_timestamp() AS now`)[0].now;
    }));
    const answers = await Promise.all(ops);
    for (const r of answers.slice(0, 30) as { status: number; text: string }[]) expect(r.status, r.text).toBe(201);
    await check(round);
    const drift = await sql`
      SELECT p.id FROM providers p JOIN provider_load l ON l.provider_id = p.id
      WHERE l.away IS DISTINCT FROM (p.is_paused OR p.status IN ('paused', 'offline'))`;
    expect(drift, `round ${round}`).toEqual([]);
    const late = await sql`
      SELECT job_id FROM job_attempts WHERE provider_id = ${paused.id} AND assigned_at > ${pausedAt!}`;
    expect(late, `round ${round}: assigned after the pause was answered`).toEqual([]);
    await resumeProvider(sql, paused.id);
    // Quiet: one re-offer per provider, then no GPU may be idle beside a queued job it fits.
    for (const p of providers) await dispatchForProvider(sql, p.id);
    const idle = await sql`
      SELECT p.id, j.job_id FROM providers p JOIN provider_load l ON l.provider_id = p.id, jobs j
      WHERE j.status = 'queued' AND l.active < least(p.gpu_count, coalesce(p.approved_gpu_count, p.gpu_count))
        AND (j.gpu_requirements->>'min_vram_gb' IS NULL OR p.gpu_vram_mib >= (j.gpu_requirements->>'min_vram_gb')::float8 * 1000)`;
    expect(idle, `round ${round}`).toEqual([]);
  }
  expect(await ledgerProblems(sql)).toEqual([]);
}, 120_000);
