// Shared setup for admin tests: the admin header and rows written straight
// into the database where another area's endpoint is not what is under test.
import crypto from "node:crypto";
import { hold, settle } from "../../src/domain/money/ledger.js";
import { ADMIN_TOKEN, type TestServer } from "../helpers/server.js";

export const ADMIN = { "x-admin-token": ADMIN_TOKEN };

export interface JobSeed {
  renterId: number;
  providerId?: number | null;
  status?: string;
  jobType?: string;
  cost?: number;
  submittedAt?: Date;
}

/** A job row with its estimate held, as submit leaves it. */
export async function seedJob(srv: TestServer, j: JobSeed): Promise<{ id: number; jobId: string }> {
  const jobId = `job-${crypto.randomBytes(8).toString("hex")}`;
  const cost = j.cost ?? 100;
  return srv.sql.begin(async (tx) => {
    const [row] = await tx<{ id: number }[]>`
      INSERT INTO jobs (job_id, renter_id, provider_id, job_type, status, duration_minutes, max_duration_seconds,
                        rate_halala_per_minute, cost_halala, submitted_at)
      VALUES (${jobId}, ${j.renterId}, ${j.providerId ?? null}, ${j.jobType ?? "llm-inference"}, ${j.status ?? "queued"},
              10, 1800, 10, ${cost}, ${j.submittedAt ?? new Date()})
      RETURNING id`;
    await hold(tx as never, j.renterId, row.id, cost);
    return { id: row.id, jobId };
  });
}

/** Settles a seeded job through the ledger and ends its attempt on the provider (as job-result would). */
export async function settleJob(srv: TestServer, job: { id: number }, renterId: number, providerId: number, estimate: number, cost: number) {
  await srv.sql.begin(async (tx) => {
    await settle(tx as never, renterId, providerId, job.id, estimate, cost);
    await tx`UPDATE jobs SET status = 'completed', completed_at = now() WHERE id = ${job.id}`;
    await tx`
      INSERT INTO job_attempts (job_id, attempt, provider_id, status, assigned_at, started_at, ended_at, end_reason, fault, cost_halala)
      SELECT id, attempt, ${providerId}, 'completed', coalesce(assigned_at, now()), coalesce(started_at, now()), now(), 'completed', 'none', ${cost}
      FROM jobs WHERE id = ${job.id}
      ON CONFLICT (job_id, attempt) DO UPDATE SET status = 'completed', ended_at = now(), end_reason = 'completed', fault = 'none', cost_halala = ${cost}`;
  });
}
