// How a job attempt ends and whose doing it was: the one table every path
// that ends an attempt (settlement, dispatch, daemon reports, cancel, the
// sweeps) reads, and the rules daemons' reports are judged by. Money,
// dispatch and reputation follow the fault (src/domain/money/settlement.ts,
// src/domain/dispatch/dispatch.ts, src/domain/providers/reputation.ts).

/** Whose doing the end was. */
export const FAULTS = ["none", "renter", "provider", "platform", "unattributed"] as const;
export type Fault = (typeof FAULTS)[number];

/** What a daemon may name as the fault of a failure it reports (the rest the server decides). */
export const REPORTED_FAULTS = ["renter", "provider", "platform"] as const;
export type ReportedFault = (typeof REPORTED_FAULTS)[number];

/**
 * Every end reason, with its fault. `runtime_error` is the job's own run
 * failing: the renter's fault when the daemon says so (its code, image or
 * input), unattributed when the report does not say (the legacy protocol's
 * bare `success:false`).
 */
export const END_REASONS = {
  /** The daemon reported a result. */
  completed: "none",
  /** The job's own code, image or input failed (renter), or a failure report that names no one (unattributed). */
  runtime_error: "renter",
  /** The renter cancelled it. */
  renter_cancelled: "renter",
  /** It ran past its max_duration_seconds (the server's sweep, or the daemon's own kill). */
  timeout: "renter",
  /** The renter's balance could not extend the hold of a running job. */
  out_of_funds: "renter",
  /** The renter's monthly_spend_limit_halala left nothing to extend the hold of a running job. */
  spend_limit: "renter",
  /** An admin cancelled it. */
  admin_cancelled: "platform",
  /** An admin handed the attempt back to the queue. */
  admin_requeued: "platform",
  /** Something on the platform's side failed (e.g. a task the service itself cannot vouch for). */
  platform_error: "platform",
  /** The provider's daemon declined the job (busy, not enough free VRAM, ...). */
  provider_refused: "provider",
  /** The provider stopped heartbeating with the job on it. */
  provider_silent: "provider",
  /** The provider's daemon never picked the assigned job up. */
  not_picked_up: "provider",
  /** The provider stopped the job (its daemon was shut down or restarted). */
  provider_interrupted: "provider",
  /** The provider's machine failed the job (the container runtime, the GPU, ...). */
  provider_error: "provider",
  /** The provider's daemon could not verify the task's signature (a stale or wrong key). */
  signature_mismatch: "provider",
  /** The provider's daemon cannot run this job type. */
  unsupported_on_provider: "provider",
} as const satisfies Record<string, Fault>;
export type EndReason = keyof typeof END_REASONS;

/** End reasons a daemon may put in a failure report (the rest are the server's own). */
export const REPORTED_FAILURE_REASONS = [
  "runtime_error",
  "timeout",
  "provider_error",
  "provider_interrupted",
  "signature_mismatch",
  "unsupported_on_provider",
  "platform_error",
] as const satisfies readonly EndReason[];
export type ReportedFailureReason = (typeof REPORTED_FAILURE_REASONS)[number];

/** End reasons a daemon may give when it refuses (hands back) a job. */
export const REFUSAL_REASONS = ["provider_refused", "provider_interrupted", "signature_mismatch", "unsupported_on_provider"] as const satisfies readonly EndReason[];
export type RefusalReason = (typeof REFUSAL_REASONS)[number];

/**
 * Attempt end reasons after which dispatch does not offer the job to that
 * provider again (it refused it, never started it, or its machine failed it).
 * provider_interrupted is skipped only until the provider heartbeats again
 * (dispatch.ts matchesSql); provider_silent once it is live again.
 */
export const DECLINED_REASONS: readonly EndReason[] = ["provider_refused", "not_picked_up", "signature_mismatch", "unsupported_on_provider", "provider_error"];

export const faultOf = (reason: EndReason): Fault => END_REASONS[reason];

/**
 * The end reason and fault of a daemon's failure report. A report that says
 * neither is unattributed (a full refund, as the legacy protocol documents);
 * a fault alone picks the reason (renter: runtime_error, provider:
 * provider_error, platform: platform_error); a reason alone takes its own
 * fault; both must agree. Returns an error text naming the field otherwise.
 */
export function judgeFailure(reason: string | undefined, fault: string | undefined): { reason: EndReason; fault: Fault } | { error: string } {
  if (fault !== undefined && !(REPORTED_FAULTS as readonly string[]).includes(fault)) {
    return { error: `fault must be one of ${REPORTED_FAULTS.join(", ")}` };
  }
  if (reason !== undefined && !(REPORTED_FAILURE_REASONS as readonly string[]).includes(reason)) {
    return { error: `end_reason must be one of ${REPORTED_FAILURE_REASONS.join(", ")}` };
  }
  const f = fault as ReportedFault | undefined;
  const r = reason as ReportedFailureReason | undefined;
  if (r === undefined) {
    if (f === undefined) return { reason: "runtime_error", fault: "unattributed" };
    return { reason: f === "renter" ? "runtime_error" : f === "provider" ? "provider_error" : "platform_error", fault: f };
  }
  if (f !== undefined && f !== END_REASONS[r]) return { error: `fault ${f} does not match end_reason ${r} (its fault is ${END_REASONS[r]})` };
  return { reason: r, fault: END_REASONS[r] };
}
