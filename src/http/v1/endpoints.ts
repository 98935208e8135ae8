// Where /v1 requests can go: vllm_serve jobs that are running with an
// endpoint reported through POST /api/jobs/{id}/endpoint-ready, on approved,
// live providers. A renter's own serving jobs serve its requests only (it pays
// for their GPU by the minute, so its tokens there are not charged); a job
// submitted with params.public serves every renter, billed per token. The
// picker spreads load (fewest requests in flight from this process first,
// random among equals) and tries last an endpoint that just failed here or that
// the health probe finds failing (src/domain/dispatch/endpoint-health.ts).
import type { Db } from "../../db/index.js";
import { LIVE_WINDOW_SECONDS } from "../../domain/shared/liveness.js";
import { chatCompletionsUrl } from "../../domain/shared/serving-endpoint.js";

export interface Upstream {
  jobId: number;
  providerId: number;
  model: string;
  /** The upstream's chat completions URL. */
  url: string;
  startedAt: Date;
  /** The requesting renter's own serving job. */
  own: boolean;
  /**
   * The endpoint's secret its daemon reported (endpoint-ready's endpoint_api_key), sent upstream as
   * `Authorization: Bearer`; never logged nor shown. Absent: the endpoint gets no credential.
   */
  apiKey?: string;
  /** The health probe's last checks of it failed (jobs.endpoint_failing_since is set). */
  failing?: boolean;
}

interface EndpointRow {
  job_id: number;
  provider_id: number;
  model: string;
  endpoint_url: string;
  endpoint_api_key: string | null;
  started_at: Date;
  own: boolean;
  failing: boolean;
}

/** Which endpoints: of one model or of all; those a renter may use (its own and the public ones), or every one. */
export interface EndpointFilter {
  model?: string;
  renterId?: number;
}

/**
 * Serving endpoints right now: read through jobs_serving_idx (migration 040),
 * so each request visits the serving jobs only, not every running one.
 */
export function servingEndpointsSql(db: Db, f: EndpointFilter = {}) {
  const renter = f.renterId ?? null;
  return db<EndpointRow[]>`
    SELECT * FROM (
      SELECT j.id AS job_id, j.provider_id, coalesce(j.model, j.params->>'model') AS model, j.endpoint_url, j.endpoint_api_key,
             coalesce(j.started_at, j.assigned_at, j.submitted_at) AS started_at,
             j.renter_id = ${renter}::bigint IS TRUE AS own, j.params->>'public' = 'true' AS public,
             j.endpoint_failing_since IS NOT NULL AS failing
      FROM jobs j JOIN providers p ON p.id = j.provider_id
      WHERE j.job_type = 'vllm_serve' AND j.status = 'running' AND j.endpoint_url ~* '^https?://'
        AND p.approval_status = 'approved' AND p.status <> 'suspended'
        AND p.last_heartbeat > now() - make_interval(secs => ${LIVE_WINDOW_SECONDS})
    ) e
    WHERE e.model IS NOT NULL ${f.model === undefined ? db`` : db`AND e.model = ${f.model}`}
      ${f.renterId === undefined ? db`` : db`AND (e.own OR e.public)`}
    ORDER BY e.job_id`;
}

export async function servingEndpoints(db: Db, f: EndpointFilter = {}): Promise<Upstream[]> {
  const rows = await servingEndpointsSql(db, f);
  return rows.map((r) => ({
    jobId: r.job_id,
    providerId: r.provider_id,
    model: r.model,
    url: chatCompletionsUrl(r.endpoint_url),
    startedAt: r.started_at,
    own: r.own,
    ...(r.endpoint_api_key ? { apiKey: r.endpoint_api_key } : {}),
    ...(r.failing ? { failing: true } : {}),
  }));
}

/**
 * Where a renter's request for a model goes: its own serving jobs when it has
 * any (not charged per token: it pays for them by the minute), else the public
 * ones (billed per token).
 */
export async function endpointsFor(db: Db, renterId: number, model: string): Promise<{ upstreams: Upstream[]; own: boolean }> {
  const all = await servingEndpoints(db, { model, renterId });
  const own = all.filter((u) => u.own);
  return own.length > 0 ? { upstreams: own, own: true } : { upstreams: all, own: false };
}

/** How long an endpoint that failed is tried only after the others. */
export const REST_MS = 15_000;

export class EndpointPicker {
  private readonly inflight = new Map<number, number>();
  private readonly restingUntil = new Map<number, number>();

  /**
   * Candidates in the order to try them: the unsuspected first (neither resting after a failure here
   * nor found failing by the health probe), then those under one suspicion, then both; fewest in
   * flight first, random among equals. A suspect is still tried when nothing better answers.
   */
  order(candidates: Upstream[], now = Date.now()): Upstream[] {
    const keyed = candidates.map((u) => ({
      u,
      suspicion: ((this.restingUntil.get(u.jobId) ?? 0) > now ? 1 : 0) + (u.failing ? 1 : 0),
      load: this.inflight.get(u.jobId) ?? 0,
      tie: Math.random(),
    }));
    keyed.sort((a, b) => a.suspicion - b.suspicion || a.load - b.load || a.tie - b.tie);
    return keyed.map((k) => k.u);
  }

  /** Counts a request in flight on `u`; call the returned function when it ends. */
  acquire(u: Upstream): () => void {
    this.inflight.set(u.jobId, (this.inflight.get(u.jobId) ?? 0) + 1);
    let done = false;
    return () => {
      if (done) return;
      done = true;
      const n = (this.inflight.get(u.jobId) ?? 1) - 1;
      if (n <= 0) this.inflight.delete(u.jobId);
      else this.inflight.set(u.jobId, n);
    };
  }

  failed(u: Upstream, now = Date.now()): void {
    // Rests that ran out go here, so endpoints that failed once and were never asked again are not kept for good.
    for (const [jobId, until] of this.restingUntil) if (until <= now) this.restingUntil.delete(jobId);
    this.restingUntil.set(u.jobId, now + REST_MS);
  }

  /** Endpoints remembered as resting (for tests). */
  get resting(): number {
    return this.restingUntil.size;
  }

  succeeded(u: Upstream): void {
    this.restingUntil.delete(u.jobId);
  }
}
