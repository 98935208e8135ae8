// The server's own check of serving endpoints: a provider is paid by the
// minute for a vllm_serve job's run once it has reported the endpoint
// (endpoint-ready; until then no end of the job bills anything: job-end.ts
// servedNothing), so the server looks whether the endpoint serves. Every
// period (SVC_ENDPOINT_PROBE_SECONDS, src/workers/endpoint-health.ts) each
// running serving job with an endpoint gets one GET of the engine's health
// route (vLLM's /health at the server root: shared/serving-endpoint.ts), with
// the endpoint's key and under the /v1 gateway's outbound-address rules. The
// job's row records the outcome (migration 052). An endpoint failing every
// probe for longer than the grace (job-end.ts judgeEndpointHealth, the same
// rule a timeout and a renter's cancel are judged by) ends the attempt as its
// provider's failure, provider_error, through loseJobLocked: re-queued (or,
// pinned to the provider or out of attempts, failed with the hold back), the
// renter charged nothing for the attempt, the provider earning nothing for it
// and docked.
// Several processes may probe: each claims the jobs due (none probed within
// 90% of its period) with an UPDATE per batch, skipping rows locked elsewhere, so a
// job gets one probe per period whichever process takes it; no transaction is
// held while probing. A result is recorded under the job's row lock, and only
// when the job still runs the attempt and the claim probed: an end, a
// re-queue or a new endpoint-ready (which clears the record: the clock
// starts afresh) meanwhile discards it.
import type { Sql, Tx } from "../../db/index.js";
import { lockJobById } from "../money/settlement.js";
import { refreshReputation } from "../providers/reputation.js";
import { ENDPOINT_FAILING_GAP_SECONDS, judgeEndpointHealth } from "../shared/job-end.js";
import { probeEndpointHealth, type ProbeOptions, type ProbeResult } from "../shared/serving-endpoint.js";
import { dispatchForProvider, loseJobLocked, placeJobs } from "./dispatch.js";

/** How long a probe waits for the health route's answer (its headers). vLLM answers /health at once; a loaded engine in well under this. */
export const PROBE_TIMEOUT_MS = 5_000;
/**
 * A sweep in which every endpoint failed, of at least this many providers, records none of it: so
 * many providers' engines failing at once points at the platform's own network (a firewall change, a
 * DNS outage), and providers are not blamed for it. Counted in providers, not endpoints: one
 * provider's dead engines do not excuse themselves. With fewer the two cannot be told apart.
 */
export const OUTAGE_MIN_PROVIDERS = 3;
/** Most jobs one claim of a sweep takes (a sweep claims again until none is due); probes in flight at once. */
const BATCH = 500;
const CONCURRENCY = 32;

/** A job claimed for a probe: its endpoint as the claim read it. */
export interface ProbeClaim {
  id: number;
  attempt: number;
  endpoint_url: string;
  endpoint_api_key: string | null;
  provider_id: number;
  /** endpoint_probed_at as the claim set it: the result counts only while it is still the job's. */
  probed_at: Date;
  /** endpoint_probed_at before the claim: restored when the claim is given back unprobed. */
  prev_probed_at: Date | null;
}

/**
 * Claims the running serving jobs with an endpoint that no process probed
 * within 90% of `periodSeconds` (timers of several processes drift: a probe a
 * little early beats a skipped period), oldest probe first. Read through
 * jobs_serving_idx (migration 040), whose predicate is written out here.
 */
export function claimProbes(sql: Sql, periodSeconds: number, limit = BATCH) {
  return sql<ProbeClaim[]>`
    UPDATE jobs j SET endpoint_probed_at = now()
    FROM (
      SELECT id, endpoint_probed_at AS prev FROM jobs
      WHERE job_type = 'vllm_serve' AND status = 'running' AND endpoint_url IS NOT NULL
        AND (endpoint_probed_at IS NULL OR endpoint_probed_at <= now() - make_interval(secs => ${periodSeconds * 0.9}))
      ORDER BY endpoint_probed_at NULLS FIRST, id LIMIT ${limit}
      FOR UPDATE SKIP LOCKED
    ) due
    WHERE j.id = due.id
    RETURNING j.id, j.attempt, j.endpoint_url, j.endpoint_api_key, j.provider_id, j.endpoint_probed_at AS probed_at, due.prev AS prev_probed_at`;
}

/**
 * Gives back claims a stopped pass left unprobed: each job's probe time goes
 * back to what it was, so the job is due again at once (for any process),
 * unless something changed it since the claim (a new endpoint-ready, an end).
 * Compared to the millisecond: a JS Date holds no finer.
 */
async function releaseClaims(sql: Sql, claims: ProbeClaim[]): Promise<void> {
  if (claims.length === 0) return;
  await sql`
    UPDATE jobs j SET endpoint_probed_at = c.prev
    FROM unnest(${claims.map((c) => c.id)}::bigint[], ${claims.map((c) => new Date(c.probed_at).toISOString())}::timestamptz[],
                ${claims.map((c) => (c.prev_probed_at ? new Date(c.prev_probed_at).toISOString() : null))}::timestamptz[]) AS c(id, claimed, prev)
    WHERE j.id = c.id AND date_trunc('milliseconds', j.endpoint_probed_at) = c.claimed`;
}

export type ProbeOutcome =
  | { kind: "stale" }
  | { kind: "healthy" }
  | { kind: "failing" }
  | { kind: "requeued" | "failed"; providerId: number; jobId: number };

/**
 * Records one probe's result on its job (row locked, re-checked: still running
 * the claimed attempt, and the claim still the latest probe, which a new
 * endpoint-ready or re-queue clears). A failure continues the run of failures
 * when the one before was at most ENDPOINT_FAILING_GAP_SECONDS before it, else
 * starts one; a run longer than the grace ends the attempt as the provider's
 * failure (loseJobLocked). The caller places a re-queued job, refreshes the
 * provider's reliability and refills it once committed.
 */
export async function recordProbeLocked(tx: Tx, claim: ProbeClaim, result: ProbeResult): Promise<ProbeOutcome> {
  const job = await lockJobById(tx, claim.id);
  const current = job?.endpoint_probed_at && new Date(job.endpoint_probed_at).getTime() === new Date(claim.probed_at).getTime();
  if (!job || job.status !== "running" || job.attempt !== claim.attempt || job.provider_id === null || !current) return { kind: "stale" };
  if (result.healthy) {
    await tx`
      UPDATE jobs SET endpoint_healthy_at = endpoint_probed_at, endpoint_failing_since = NULL, endpoint_failed_at = NULL
      WHERE id = ${job.id}`;
    return { kind: "healthy" };
  }
  const [h] = await tx<{ failing_since: Date; failed_at: Date }[]>`
    UPDATE jobs SET
      endpoint_failing_since = CASE
        WHEN endpoint_failing_since IS NOT NULL AND endpoint_failed_at >= endpoint_probed_at - make_interval(secs => ${ENDPOINT_FAILING_GAP_SECONDS})
        THEN endpoint_failing_since ELSE endpoint_probed_at END,
      endpoint_failed_at = endpoint_probed_at
    WHERE id = ${job.id}
    RETURNING endpoint_failing_since AS failing_since, endpoint_failed_at AS failed_at`;
  const dead = judgeEndpointHealth(job.job_type, { failingSince: h.failing_since, failedAt: h.failed_at, at: h.failed_at });
  if (!dead) return { kind: "failing" };
  const providerId = job.provider_id;
  const kind = await loseJobLocked(tx, job, dead.reason, `provider ${providerId} failed the job: ${dead.error}; the last check: ${result.error}`);
  return { kind, providerId, jobId: job.id };
}

export interface EndpointSweep {
  probed: number;
  healthy: number;
  failing: number;
  /** Attempts ended as the provider's failure: re-queued, or failed (pinned, or out of attempts). */
  requeued: number;
  failed: number;
  /** Every endpoint probed, of OUTAGE_MIN_PROVIDERS or more providers, failed: taken for the platform's outage, nothing recorded. */
  outage: boolean;
}

/** Maps with at most `limit` calls in flight; once `stopped`, starts no more (their results left undefined). */
async function mapLimit<T, R>(items: T[], limit: number, f: (t: T) => Promise<R>, stopped?: () => boolean): Promise<(R | undefined)[]> {
  const out: (R | undefined)[] = new Array(items.length);
  let next = 0;
  const lane = async () => {
    while (next < items.length && !stopped?.()) {
      const i = next++;
      out[i] = await f(items[i]);
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, lane));
  return out;
}

/**
 * One pass: claims the due jobs, `batch` at a time (BATCH), until none is due
 * or the pass has run a period (what is left is the oldest due at the next
 * pass); probes them, CONCURRENCY at once; then records each result and ends
 * the attempts found dead. Every running serving job is probed each period
 * however many a process has, as long as the probes fit in it. Once `stopped`
 * (the process shutting down) it claims and starts no more: the probes in
 * flight finish and are recorded, the claims not probed are given back
 * (releaseClaims). Exported so tests and tools can drive it directly (`probe`
 * replaces the HTTP probe).
 */
export async function sweepEndpoints(
  sql: Sql,
  opts: { periodSeconds: number; allowPrivate: boolean; timeoutMs?: number; batch?: number; stopped?: () => boolean },
  probe: (url: string, o: ProbeOptions) => Promise<ProbeResult> = probeEndpointHealth,
): Promise<EndpointSweep> {
  const out: EndpointSweep = { probed: 0, healthy: 0, failing: 0, requeued: 0, failed: 0, outage: false };
  const batch = opts.batch ?? BATCH;
  const until = Date.now() + opts.periodSeconds * 1000;
  const claims: ProbeClaim[] = [];
  const results: ProbeResult[] = [];
  const unprobed: ProbeClaim[] = [];
  while (!opts.stopped?.()) {
    const claimed = await claimProbes(sql, opts.periodSeconds, batch);
    const probed = await mapLimit(claimed, CONCURRENCY, (c) =>
      probe(c.endpoint_url, { allowPrivate: opts.allowPrivate, timeoutMs: opts.timeoutMs ?? PROBE_TIMEOUT_MS, ...(c.endpoint_api_key ? { apiKey: c.endpoint_api_key } : {}) }),
      opts.stopped,
    );
    for (const [i, r] of probed.entries()) {
      if (r) {
        claims.push(claimed[i]);
        results.push(r);
      } else unprobed.push(claimed[i]);
    }
    if (claimed.length < batch || Date.now() >= until) break;
  }
  await releaseClaims(sql, unprobed);
  if (claims.length === 0) return out;
  if (new Set(claims.map((c) => c.provider_id)).size >= OUTAGE_MIN_PROVIDERS && results.every((r) => !r.healthy)) {
    out.outage = true;
    return out;
  }
  const requeued: number[] = [];
  const providers = new Set<number>();
  for (const [i, claim] of claims.entries()) {
    const r = await sql.begin((tx) => recordProbeLocked(tx, claim, results[i]));
    if (r.kind === "stale") continue;
    out.probed++;
    if (r.kind === "healthy" || r.kind === "failing") out[r.kind]++;
    else {
      out[r.kind]++;
      providers.add(r.providerId);
      if (r.kind === "requeued") requeued.push(r.jobId);
    }
  }
  await placeJobs(sql, requeued);
  if (providers.size > 0) await refreshReputation(sql, [...providers]);
  for (const providerId of providers) await dispatchForProvider(sql, providerId);
  return out;
}
