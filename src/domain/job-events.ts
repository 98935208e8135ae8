// Cross-process job signals (LISTEN/NOTIFY), sent inside the transaction that
// makes the change, so a listener only hears of committed assignments/cancels.
// Payload: {"provider_id": N, "job_id": "job-..."}.
import type { Tx } from "../db/index.js";

export const ASSIGNED_CHANNEL = "svc_job_assigned";
export const CANCEL_CHANNEL = "svc_job_cancel";

export interface JobSignal {
  provider_id: number;
  job_id: string;
}

export async function notifyAssigned(tx: Tx, providerId: number, jobId: string): Promise<void> {
  await tx`SELECT pg_notify(${ASSIGNED_CHANNEL}, ${JSON.stringify({ provider_id: providerId, job_id: jobId } satisfies JobSignal)})`;
}

/** The provider must stop this job (cancelled, timed out, re-queued away from it). */
export async function notifyCancel(tx: Tx, providerId: number, jobId: string): Promise<void> {
  await tx`SELECT pg_notify(${CANCEL_CHANNEL}, ${JSON.stringify({ provider_id: providerId, job_id: jobId } satisfies JobSignal)})`;
}
