// Stopping the TypeScript daemon as a service manager does: the real CLI
// (bin/svc-daemon.js) in a process group of its own, SIGTERM/SIGINT sent to
// the whole group. Idle, every process of the group is gone within 5 s; with
// a job running, the job is stopped, reported as interrupted by the provider
// (re-queued, nothing charged) and no process of it is left.
import { describe, expect, it } from "vitest";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import { waitFor, type Spawned } from "./helpers.js";
import { groupProcesses, jobProcesses } from "./procs.js";
import { useTsDaemonServer } from "./ts-harness.js";

const h = useTsDaemonServer();

/** Sends the signal to the daemon's process group and waits for it to exit; the group must be empty then. */
async function stopGroup(d: Spawned, signal: NodeJS.Signals, withinMs: number): Promise<number | null> {
  d.kill(signal);
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<"late">((resolve) => (timer = setTimeout(() => resolve("late"), withinMs)));
  const code = await Promise.race([d.exited, late]);
  clearTimeout(timer);
  expect(code, `still running ${withinMs} ms after ${signal}:\n${d.output()}`).not.toBe("late");
  await waitFor(() => groupProcesses(d.pid).length === 0, 2_000, `process group ${d.pid} empty`);
  return code as number | null;
}

async function daemonUp(providerId: number) {
  await waitFor(async () => (await h.srv.sql`SELECT readiness_status FROM providers WHERE id = ${providerId}`)[0].readiness_status, 45_000, "daemon up");
}

describe("svc-daemon (TypeScript) stop", { timeout: 90_000 }, () => {
  for (const signal of ["SIGTERM", "SIGINT"] as const) {
    it(`idle: every process is gone within 5 s of ${signal} (default grace)`, async () => {
      const p = await makeProvider(h.srv);
      // The default stop grace (no --stop-grace-seconds 1 from the harness).
      const d = h.startDaemon(p.key, ["--stop-grace-seconds", "10"], {}, { detached: true });
      await daemonUp(p.id);
      expect(await stopGroup(d, signal, 5_000)).toBe(0);
      expect(d.output()).toMatch(/stopped/);
      // The orderly shutdown let the process end by itself, not the safety net's exit.
      expect(d.output()).not.toMatch(/still open/);
    });
  }

  for (const jobToo of [false, true]) {
    it(`mid-job${jobToo ? ", the job's processes signalled too (systemd's control-group stop)" : ""}: stops the job, reports it interrupted by the provider (re-queued, nothing charged), leaves no process`, async () => {
      const p = await makeProvider(h.srv);
      const renter = await makeRenter(h.srv, 1_000);
      const d = h.startDaemon(p.key, ["--stop-grace-seconds", "10"], {}, { detached: true });
      await daemonUp(p.id);
      const j = await h.submit(renter, { job_type: "benchmark", params: { suite: "memory", iterations: 1000 } });
      expect(j.provider_id).toBe(p.id);
      await waitFor(async () => (await h.job(j.job_id)).status === "running" && jobProcesses(j.job_id).length > 0, 45_000, `running (${d.output()})`);

      if (jobToo) for (const pid of jobProcesses(j.job_id)) process.kill(pid, "SIGTERM");
      // The grace period (10 s) bounds it; the test's own timeout is the only clock here.
      expect(await stopGroup(d, "SIGTERM", 60_000)).toBe(0);
      expect(jobProcesses(j.job_id)).toEqual([]);
      const row = await waitFor(async () => {
        const r = await h.job(j.job_id);
        return r.attempt === 2 ? r : undefined;
      }, 10_000, "re-queued");
      expect(row.status).toBe("queued");
      expect(row.actual_cost_halala ?? 0).toBe(0);
      const [first] = await h.srv.sql`SELECT a.* FROM job_attempts a WHERE a.job_id = ${row.id} AND a.attempt = 1`;
      expect(first.status).toBe("requeued");
      expect(first.end_reason).toBe("provider_interrupted");
      expect(first.error).toMatch(/interrupted/);
      // Nothing spent: the hold waits for the next attempt; the provider earned nothing.
      const bal = (await h.api().get("/api/renters/balance", renter.headers)).body;
      expect(bal.balance_halala).toBe(1_000);
      expect((await h.srv.sql`SELECT total_earnings_halala FROM providers WHERE id = ${p.id}`)[0].total_earnings_halala).toBe(0);
      expect(d.output()).toMatch(/interrupted/);
      expect(await ledgerProblems(h.srv.sql)).toEqual([]);
    });
  }
});
