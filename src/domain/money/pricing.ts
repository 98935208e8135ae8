// The price rules, in one place: per-minute rates by job type, the estimate,
// the settled cost and the 75/25 revenue split (whole halala for jobs; exact
// in micro-halala for /v1 token charges, providerShareMicro).

/** Halala per minute (spec: "Job cost rates"). */
export const RATE_HALALA_PER_MINUTE = {
  "llm-inference": 15,
  llm_inference: 15,
  training: 25,
  rendering: 20,
  image_generation: 20,
  vllm_serve: 20,
  benchmark: 10,
  custom_container: 10,
} as const;

export type JobType = keyof typeof RATE_HALALA_PER_MINUTE;
export const JOB_TYPES = Object.keys(RATE_HALALA_PER_MINUTE) as JobType[];

export const PROVIDER_SHARE_PERCENT = 75;

/** Estimate held at submit: ceil(rate x minutes), at least 1 halala. */
export function estimateHalala(rate: number, durationMinutes: number): number {
  return Math.max(1, Math.ceil(rate * durationMinutes - 1e-9));
}

/** Billable whole minutes of a run: at least one. */
export function actualMinutes(runSeconds: number): number {
  return Math.max(1, Math.ceil(runSeconds / 60));
}

/**
 * Billable whole minutes of a job's run: never past its hard limit (max_duration_seconds), however
 * late the timeout is noticed or reported.
 */
export function billableMinutes(runSeconds: number, maxDurationSeconds: number): number {
  return actualMinutes(billableSeconds(runSeconds, maxDurationSeconds));
}

/** The seconds of a job's run that are billed: never past its hard limit (max_duration_seconds). */
export function billableSeconds(runSeconds: number, maxDurationSeconds: number): number {
  return Math.min(runSeconds, maxDurationSeconds);
}

/** Settled cost: rate x minutes run, within what is held for the job (the estimate, grown while it ran). */
export function actualCostHalala(rate: number, minutes: number, held: number): number {
  return Math.min(rate * minutes, held);
}

/** 75% to the provider (rounded down), the rest to the platform; sums to `cost`. */
export function splitRevenue(cost: number): { providerEarned: number; platformFee: number } {
  const providerEarned = Math.floor((cost * PROVIDER_SHARE_PERCENT) / 100);
  return { providerEarned, platformFee: cost - providerEarned };
}

/**
 * Micro-halala (a millionth of a halala) in one halala. /v1 token prices are
 * exact in it (halala per million tokens x tokens); the ledger moves whole
 * halala, and what is below one is carried (usage-billing.ts).
 */
export const MICRO_PER_HALALA = 1_000_000;

/**
 * The provider's share of `charged` whole halala in micro-halala, exact:
 * PROVIDER_SHARE_PERCENT of it, before any rounding (splitRevenue's rule; /v1
 * carries the part below one halala to the provider's next charge instead of
 * rounding it down).
 */
export function providerShareMicro(charged: number): bigint {
  if (!Number.isSafeInteger(charged) || charged < 0) throw new Error(`invalid charge ${charged}`);
  return (BigInt(charged) * BigInt(MICRO_PER_HALALA) * BigInt(PROVIDER_SHARE_PERCENT)) / 100n;
}

export const halalaToSar = (h: number): number => h / 100;
