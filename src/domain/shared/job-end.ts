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
  /** It ran past its max_duration_seconds (the server's sweep, or the daemon's own kill), as far as the server's record bears it out (judgeTimeout). */
  timeout: "renter",
  /** The renter's balance could not extend the hold of a running job. */
  out_of_funds: "renter",
  /** The renter's monthly_spend_limit_halala left nothing to extend the hold of a running job. */
  spend_limit: "renter",
  /** An admin suspended the renter's account with stop_jobs: its active jobs end as a renter's cancel does. */
  renter_suspended: "renter",
  /** An admin cancelled it. */
  admin_cancelled: "platform",
  /** An admin handed the attempt back to the queue (no attempt spent: ATTEMPT_FREE_REASONS). */
  admin_requeued: "platform",
  /** Something on the platform's side failed (e.g. a task the service itself cannot vouch for). */
  platform_error: "platform",
  /**
   * An attempt only, never a job: its provider, paused (by the server's record) after the job was assigned
   * and before it was accepted, handed the job back. Its owner took it out of work as the platform allows:
   * no one's fault, nothing billed, no attempt spent (ATTEMPT_FREE_REASONS; dispatch.ts handBackLocked).
   */
  provider_paused: "none",
  /** The provider's daemon declined the job (busy, not enough free VRAM, ...). */
  provider_refused: "provider",
  /** The provider stopped heartbeating with the job on it. */
  provider_silent: "provider",
  /** The provider's daemon never picked the assigned job up. */
  not_picked_up: "provider",
  /** The provider stopped the job (its daemon was shut down or restarted). */
  provider_interrupted: "provider",
  /** The provider's machine failed the job (the container runtime, the GPU, ...), or a timeout the server's record contradicts (judgeTimeout). */
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

/**
 * Attempt end reasons that spend none of the attempts a job is allowed (SVC_JOB_MAX_ATTEMPTS): the
 * attempt stays in the job's history, and the job still gets that many attempts at being run
 * (dispatch.ts attemptsSpent). Neither is the renter's job failing on a provider: an admin's decision,
 * or a paused provider handing back a job it was never going to run.
 */
export const ATTEMPT_FREE_REASONS: readonly EndReason[] = ["admin_requeued", "provider_paused"];

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

/**
 * How much sooner than max_duration_seconds a daemon's timeout report is still
 * believed, measured by the database clock from the job's started_at (the run
 * time settlement bills). A daemon starts its own kill timer when it starts the
 * job, a moment before or after the server marked it running (the poll's answer
 * or the stream's accept on its way), on a clock and a timer of its own; a
 * minute covers that. A "timeout" reported sooner than this is the provider's
 * word against the server's own record, and is judged as the provider's failure.
 */
export const TIMEOUT_REPORT_SLACK_SECONDS = 60;

/** Job types whose work is to serve an endpoint (reported with endpoint-ready) for their whole run. */
export const SERVING_JOB_TYPES: readonly string[] = ["vllm_serve"];

/**
 * How much of a serving job's run before its endpoint was reported is billed: the engine's start
 * (weights loaded, model warmed). An endpoint reported later than this after the run started moves
 * the run's start (started_at, and its deadline with it) to this long before the report
 * (job-reports.ts endpointReady), so a provider that reports its endpoint late is paid for what it
 * served plus this, and the renter still gets max_duration_seconds less this of service.
 * SVC_SERVING_LOAD_GRACE_SECONDS.
 */
export const servingPolicy = { loadGraceSeconds: 600 };

/**
 * The one rule for a serving job whose attempt never reported its endpoint
 * (jobs.endpoint_url: set by endpoint-ready, cleared on re-queue): it served
 * nothing, so none of its run is billed however it ends (settlement.ts
 * billsTimeUsed), and an end that claims it did its work (a success report,
 * a timeout) is the provider's failure (judgeServed, judgeTimeout). A serving
 * job that did report its endpoint is billed for its run like any job.
 */
export const servedNothing = (job: { job_type: string; endpoint_url: string | null }): boolean => neverServed(job.job_type, job.endpoint_url !== null);

function neverServed(jobType: string, endpointReported: boolean): boolean {
  return SERVING_JOB_TYPES.includes(jobType) && !endpointReported;
}

const NEVER_SERVED = "the provider never reported the job's endpoint (endpoint-ready): it served nothing";

/**
 * A daemon's success report, against the server's record: for a serving job
 * that never reported its endpoint (servedNothing), or whose endpoint was
 * dead when it reported (deadAtEnd), it is the provider's failure (provider_error: re-queued at no charge or failed with the hold
 * back, dispatch.ts loseJobLocked, and the provider docked), as its timeout
 * would be. Undefined when the record bears the report out.
 */
export function judgeServed(
  job: Parameters<typeof deadAtEnd>[0] & { endpoint_url: string | null },
): { reason: "provider_error"; fault: "provider"; error: string } | undefined {
  if (servedNothing(job)) return { reason: "provider_error", fault: "provider", error: `the report claimed success, but ${NEVER_SERVED}` };
  const dead = deadAtEnd(job);
  return dead && { ...dead, error: `the report claimed success, but ${dead.error}` };
}

/**
 * A serving job's end against the probe's record: its endpoint had been failing every health check
 * for longer than the grace (judgeEndpointHealth), so it was serving nothing when it ended. Such an
 * end bills none of the run (settlement.ts billsTimeUsed, as for servedNothing; and as the renter's
 * cancel and the timeout judge it), and a success report is the provider's failure (judgeServed).
 * Undefined for any other job.
 */
export function deadAtEnd(job: {
  job_type: string; endpoint_failing_since: Date | null; endpoint_failed_at: Date | null; db_now: Date;
}): { reason: "provider_error"; fault: "provider"; error: string } | undefined {
  return judgeEndpointHealth(job.job_type, endpointHealthOf(job));
}

/** What the server's own records say of the attempt a timeout ends. */
export interface TimedRun {
  jobType: string;
  /** Seconds the attempt ran, by the database clock from started_at (settlement.ts runSeconds). */
  ranSeconds: number;
  /**
   * Seconds left to its deadline (timeout_at), by the database clock. A reported timeout is judged by
   * it: the deadline is set where the run (and a daemon's kill timer) started, and stays there when a
   * serving job's billed time is moved later (servingPolicy). Absent: judged by ranSeconds.
   */
  secondsToDeadline?: number;
  maxDurationSeconds: number;
  /** The attempt's endpoint was reported (jobs.endpoint_url, set by endpoint-ready and cleared on re-queue). */
  endpointReported: boolean;
  /** What the server's endpoint probe saw of it (endpointHealthOf). */
  endpointHealth?: EndpointHealth;
}

/**
 * Whose a timeout is: the renter's (`timeout`: the job ran to the limit it
 * set, the time used is billed) unless the server's records contradict it,
 * then the provider's (`provider_error`: the machine failed the job; re-queued
 * at no charge or failed with the hold back, dispatch.ts loseJobLocked, and
 * the provider docked), with an error text saying why:
 * - `reported` (a daemon's failure report named timeout) when the attempt ran
 *   less than max_duration_seconds minus TIMEOUT_REPORT_SLACK_SECONDS;
 * - a serving job (vllm_serve) that never reported its endpoint, whether the
 *   daemon reported the timeout or the server's sweep found it: it served
 *   nothing for all that time (servedNothing); unless its max_duration_seconds
 *   was shorter than an engine is given to start (servingPolicy): then the
 *   limit the renter set was the cause, the renter's timeout, billed nothing
 *   (it served nothing) and no mark against the provider;
 * - a serving job whose endpoint had been failing the server's health probe
 *   for longer than the grace when it timed out (judgeEndpointHealth).
 * The server's sweep (`reported` false) acts on its own deadline (timeout_at),
 * so only the last two rules apply to it.
 */
export function judgeTimeout(run: TimedRun, reported: boolean): { reason: "timeout"; fault: "renter" } | { reason: "provider_error"; fault: "provider"; error: string } {
  // How long it had run by the deadline's clock (its billed time may have started later).
  const ranSeconds = run.secondsToDeadline === undefined ? run.ranSeconds : run.maxDurationSeconds - run.secondsToDeadline;
  const ran = Math.floor(ranSeconds);
  if (reported && ranSeconds < run.maxDurationSeconds - TIMEOUT_REPORT_SLACK_SECONDS) {
    return {
      reason: "provider_error",
      fault: "provider",
      error: `the report claimed a timeout after ${ran} s of ${run.maxDurationSeconds} s (max_duration_seconds, by the server's clock): taken as the provider's failure`,
    };
  }
  const dead = run.endpointHealth && judgeEndpointHealth(run.jobType, run.endpointHealth);
  if (dead) {
    const when = reported ? `the report claimed a timeout after ${ran} s of ${run.maxDurationSeconds} s` : `its max_duration_seconds (${run.maxDurationSeconds} s) ran out`;
    return { ...dead, error: `${when}, and ${dead.error}` };
  }
  if (neverServed(run.jobType, run.endpointReported) && run.maxDurationSeconds >= servingPolicy.loadGraceSeconds) {
    const when = reported ? `the report claimed a timeout after ${ran} s of ${run.maxDurationSeconds} s` : `its max_duration_seconds (${run.maxDurationSeconds} s) ran out`;
    return { reason: "provider_error", fault: "provider", error: `${when}, and ${NEVER_SERVED}` };
  }
  return { reason: "timeout", fault: "renter" };
}

/**
 * How long a serving job's endpoint may fail the server's health probe
 * (src/domain/dispatch/endpoint-health.ts: GET /health, every
 * SVC_ENDPOINT_PROBE_SECONDS) without a break before the attempt is the
 * provider's failure. Three minutes, a fixed time rather than a count of
 * probes, so that every process and every path that ends a job (the probe,
 * the timeout sweep, a daemon's timeout report, a renter's cancel) judges by
 * the same figure whatever period each process probes at. Long enough to
 * ride out what a working provider goes through (a network blip between the
 * platform and the provider, a moment of overload of the engine; at the
 * default period that is seven failed probes in a row, at the longest three),
 * of the order of the liveness window (120 s without a heartbeat), and short
 * next to a serving job's reserved time. A longer grace costs the renter
 * nothing but waiting (a failed attempt is not charged); a shorter one would
 * end a working engine, unpaid, over a blip.
 */
export const ENDPOINT_FAILING_GRACE_SECONDS = 180;

/** The longest period a process may probe at (SVC_ENDPOINT_PROBE_SECONDS): three probes at least within the grace. */
export const ENDPOINT_PROBE_MAX_SECONDS = 60;

/**
 * How far apart two failed probes may be and still count as one failure
 * without a break: two of the longest periods (one probe missed: a process
 * restarting, a slow sweep). Failures further apart prove nothing of the time
 * between them (no process was probing), so the run starts again; and the
 * latest failure stands for the time after it only this long.
 */
export const ENDPOINT_FAILING_GAP_SECONDS = 2 * ENDPOINT_PROBE_MAX_SECONDS;

/** What the probe recorded of a serving job's endpoint (jobs.endpoint_failing_since, endpoint_failed_at; migration 052), judged at `at`. */
export interface EndpointHealth {
  /** When the first of the probes failing since without a break was started; null while healthy (or never probed). */
  failingSince: Date | null;
  /** When the latest failed probe was started. */
  failedAt: Date | null;
  /** The moment judged (the database clock: the probe's start, or the job's end). */
  at: Date;
}

export const endpointHealthOf = (job: { endpoint_failing_since: Date | null; endpoint_failed_at: Date | null; db_now: Date }): EndpointHealth => ({
  failingSince: job.endpoint_failing_since,
  failedAt: job.endpoint_failed_at,
  at: job.db_now,
});

/**
 * The one rule for a serving endpoint that does not serve: it failed every
 * health probe since failingSince, the latest (failedAt) no longer than
 * ENDPOINT_FAILING_GAP_SECONDS before `at`, and that was at least
 * ENDPOINT_FAILING_GRACE_SECONDS before `at`: the provider's failure
 * (provider_error: the attempt is not charged, the provider earns nothing for
 * it and is docked). Judged on the probes' own record: when no probe was taken
 * for longer than the gap, the record proves nothing after its latest failure.
 * Undefined when the record does not show that (or the job serves no endpoint).
 */
export function judgeEndpointHealth(jobType: string, h: EndpointHealth): { reason: "provider_error"; fault: "provider"; error: string } | undefined {
  if (!SERVING_JOB_TYPES.includes(jobType) || h.failingSince === null || h.failedAt === null) return undefined;
  const since = new Date(h.failingSince).getTime();
  const last = new Date(h.failedAt).getTime();
  const at = new Date(h.at).getTime();
  const until = at - last <= ENDPOINT_FAILING_GAP_SECONDS * 1000 ? Math.max(at, last) : last;
  const failing = Math.floor((until - since) / 1000);
  if (failing < ENDPOINT_FAILING_GRACE_SECONDS) return undefined;
  return {
    reason: "provider_error",
    fault: "provider",
    error: `its endpoint failed every health check for ${failing} s (since ${new Date(since).toISOString()}; the grace is ${ENDPOINT_FAILING_GRACE_SECONDS} s): it served nothing`,
  };
}
