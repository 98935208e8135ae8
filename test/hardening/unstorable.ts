// Helpers shared by the tests of text PostgreSQL cannot store (nul-text.test.ts,
// lone-surrogates.test.ts): the rows a refusal must not have written, and what a
// daemon's report was stored as.
import { expect } from "vitest";
import { ConnectError } from "@connectrpc/connect";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { pickUp } from "../jobs/helpers.js";
import type { TestServer } from "../helpers/server.js";

export interface StoredJob {
  status: string;
  end_reason: string | null;
  error: string | null;
  result: unknown;
  metrics: unknown;
  progress_phase: string | null;
  params: any;
}

export function unstorableHelpers(srv: TestServer) {
  const api = client(srv);
  return {
    /** How many jobs the renter has. */
    jobsOf: async (renterId: number) => (await srv.sql<{ n: number }[]>`SELECT count(*)::int AS n FROM jobs WHERE renter_id = ${renterId}`)[0].n,
    jobRow: async (jobId: string) =>
      (await srv.sql<StoredJob[]>`SELECT status, end_reason, error, result, metrics, progress_phase, params FROM jobs WHERE job_id = ${jobId}`)[0],
    logLines: async (jobId: string) =>
      (await srv.sql<{ message: string }[]>`SELECT l.message FROM job_logs l JOIN jobs j ON j.id = l.job_id WHERE j.job_id = ${jobId} ORDER BY l.id`).map((r) => r.message),
    /** A benchmark job submitted over REST (201), with `extra` fields. */
    async submitRest(renter: { headers: Record<string, string> }, extra: Record<string, unknown> = {}) {
      const r = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 1, params: { suite: "quick", iterations: 1 }, ...extra }, renter.headers);
      expect(r.status, r.text).toBe(201);
      return r.body.job.job_id as string;
    },
    /** A job submitted for a new provider, which has polled it (a legacy daemon's pick-up). */
    async polled() {
      const p = await makeProvider(srv);
      const renter = await makeRenter(srv, 1_000);
      const jobId = await this.submitRest(renter, { provider_id: p.id });
      expect((await pickUp(api, p.key))?.job_id).toBe(jobId);
      return { p, jobId, renter };
    },
  };
}

/** The ConnectError a call is refused with. */
export async function refusedWith(call: Promise<unknown>): Promise<ConnectError> {
  const err = await call.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(ConnectError);
  return err as ConnectError;
}
