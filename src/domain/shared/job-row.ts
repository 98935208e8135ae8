// A jobs table row, an attempt's row and the job statuses: a leaf every area
// that reads jobs can import (dispatch and settlement among them) without
// importing job logic.
import type { GpuFacts } from "../../shared/receipt.js";

export interface JobRow {
  id: number;
  job_id: string;
  renter_id: number;
  provider_id: number | null;
  requested_provider_id: number | null;
  job_type: string;
  status: string;
  priority: number;
  duration_minutes: number;
  max_duration_seconds: number;
  rate_halala_per_minute: number;
  cost_halala: number;
  /** The job's hold now: NULL while it is the estimate (cost_halala); grown while the job runs. */
  held_halala: number | null;
  actual_cost_halala: number | null;
  provider_earned_halala: number | null;
  platform_fee_halala: number | null;
  params: Record<string, unknown> | null;
  container_spec: Record<string, unknown>;
  gpu_requirements: Record<string, unknown> | null;
  task_spec: Record<string, unknown>;
  task_spec_hmac: string;
  model: string | null;
  pricing_class: string;
  checkpoint_enabled: boolean;
  prewarm_requested: boolean;
  template_id: string | null;
  attempt: number;
  submitted_at: Date;
  assigned_at: Date | null;
  started_at: Date | null;
  /**
   * When the provider's daemon confirmed it has the running job: a stream
   * daemon's accept, a legacy daemon's first report on a job it polled. NULL
   * while running: the poll's answer may never have reached the daemon.
   */
  acked_at: Date | null;
  /** The latest JobPreparing notice of the daemon on the pending attempt (migration 053); NULL once it starts. */
  preparing_at: Date | null;
  completed_at: Date | null;
  timeout_at: Date | null;
  /** The daemon's result: an object, or a string for plain-text results. */
  result: unknown;
  error: string | null;
  metrics: Record<string, unknown> | null;
  progress_pct: number | null;
  progress_phase: string | null;
  endpoint_url: string | null;
  /** The serving endpoint's health probe (migration 052, dispatch/endpoint-health.ts): the latest probe's start (its claim). */
  endpoint_probed_at: Date | null;
  /** The start of the latest probe that found the endpoint healthy. */
  endpoint_healthy_at: Date | null;
  /** The start of the first of the probes failing since without a break; null while healthy. */
  endpoint_failing_since: Date | null;
  /** The start of the latest failed probe. */
  endpoint_failed_at: Date | null;
  /** Why a terminal job ended (job-end.ts END_REASONS). */
  end_reason: string | null;
  /** Whose fault the end was: none, renter, provider, platform, unattributed (job-end.ts). */
  fault: string | null;
  actual_minutes: number | null;
}

/** A job_attempts row: one assignment of a job to a provider. */
export interface JobAttemptRow {
  job_id: number;
  attempt: number;
  provider_id: number | null;
  status: string;
  assigned_at: Date | null;
  started_at: Date | null;
  ended_at: Date | null;
  end_reason: string | null;
  /** Whose fault the attempt's end was (job-end.ts). */
  fault: string | null;
  cost_halala: number | null;
  error: string | null;
  /** The GPU its provider reported when the attempt ended (migration 023): its receipt's GPU facts. */
  gpu: GpuFacts | null;
  /** Characters of the attempt's stored log messages (migration 055). */
  log_chars: number;
  /** Log lines were dropped at a bound. */
  log_truncated: boolean;
}

/**
 * What a job's summary reads (the Job message, a queued job's reason): the row without its specs
 * and outputs (params, container_spec, task_spec and its HMAC, result, metrics), which lists never
 * show and which are most of a row's bytes. Pages select these columns only.
 */
export const JOB_SUMMARY_COLUMNS = [
  "id", "job_id", "renter_id", "provider_id", "requested_provider_id", "job_type", "status", "priority",
  "duration_minutes", "max_duration_seconds", "rate_halala_per_minute", "cost_halala", "held_halala",
  "actual_cost_halala", "provider_earned_halala", "platform_fee_halala", "gpu_requirements", "model",
  "pricing_class", "attempt", "submitted_at", "assigned_at", "started_at", "completed_at", "error",
  "progress_pct", "progress_phase", "endpoint_url", "end_reason", "fault", "actual_minutes", "acked_at",
  "endpoint_failing_since", "endpoint_failed_at",
] as const satisfies readonly (keyof JobRow)[];

export type JobSummaryRow = Pick<JobRow, (typeof JOB_SUMMARY_COLUMNS)[number]>;

export { ACTIVE_STATUSES, TERMINAL_STATUSES } from "../../shared/job-status.js";
