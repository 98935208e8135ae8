// Area dispatch (src/domain/dispatch): placement, the queue and why a job
// waits, re-queueing, and the liveness sweep. It may use every area below it
// (shared, notify, money, accounts, providers); jobs and admin sit above it.
//
// Dispatch: which provider runs which job, decided in one place.
//
// A job goes to exactly one provider: queued jobs are claimed with
// `FOR UPDATE SKIP LOCKED` and moved with a status guard, and every assignment
// to a provider happens while holding that provider's `provider_load` row
// FOR UPDATE (its busy-slot count, kept by a trigger on jobs): locking re-reads
// the count, so "one running job per GPU" holds across any number of server
// processes. The same row says whether the provider stopped taking work
// (closed: suspended or rejected; away: paused or offline, migrations 056 and
// 060), written under its lock by whatever stops it, so no job lands on a
// provider after its pause, its going offline or its suspension committed.
// A suspended renter's queued jobs are given to no provider: an assignment
// holds the renter's row FOR KEY SHARE, which its suspension locks FOR UPDATE
// (renterActiveSql). Order is priority (1 high .. 3 low), then submit time.
//
// Lock order everywhere: job rows -> renter ledger accounts -> provider_load.
import type { PendingQuery, Row } from "postgres";
import type { Db, Sql, Tx } from "../../db/index.js";
import { LIVE_WINDOW_SECONDS } from "../shared/liveness.js";
import { upForSql } from "../shared/platform-pulse.js";
import { withinRunWindowSql } from "../providers/preferences.js";
import { refreshReputation } from "../providers/reputation.js";
import { belowMinimum, daemonPolicy, verifiesTasksSql } from "../providers/versions.js";
import { assignedNoticeSql, notifyCancel } from "../notify/job-notices.js";
import type { JobRow, JobSummaryRow } from "../shared/job-row.js";
import { endLocked, lockJobById, runSeconds, type LockedJob } from "../money/settlement.js";
import { ATTEMPT_FREE_REASONS, DECLINED_REASONS, endpointHealthOf, faultOf, judgeTimeout, type EndReason } from "../shared/job-end.js";

/** How many attempts a job gets before a lost provider fails it; set from config at start. */
export const jobPolicy = { maxAttempts: 3 };

// ---- SQL fragments over `providers p` (and `jobs j`, `provider_load l`) ----

/**
 * Approved, heartbeating, not suspended or offline: heard as a provider, whatever its daemon. Its
 * state part is also the predicate of providers_live_idx (migration 037): change both, or the reads
 * that look for live providers scan the table.
 */
export const heardSql = (db: Db) => db`(
  p.approval_status = 'approved' AND p.status NOT IN ('suspended', 'offline')
  AND p.last_heartbeat > now() - make_interval(secs => ${LIVE_WINDOW_SECONDS}))`;

/**
 * Heard, and its daemon can verify this server's tasks (no task-signing key mismatch,
 * task-key.ts; a daemon version not below the minimum): could run jobs at all.
 */
export const liveSql = (db: Db) => db`(${heardSql(db)} AND ${verifiesTasksSql(db, "p")})`;

/** Scheduled run mode: inside the provider's daily window (the providers' rule, src/domain/providers/preferences.ts). */
export const runWindowSql = (db: Db) => withinRunWindowSql(db, "p");

/**
 * Live and taking work now: not paused, inside its run window. Its state part is
 * also the predicate of providers_dispatch_idx (migration 010): change both, or
 * placement stops using the index (slower, still correct).
 */
export const availableSql = (db: Db) => db`(${liveSql(db)} AND NOT p.is_paused AND p.status <> 'paused' AND ${runWindowSql(db)})`;

/**
 * Hardware fit of provider p for job j's gpu_requirements. min_vram_gb counts
 * 1000 MiB per GB so nominal sizes match what nvidia-smi reports (24 GB =
 * 24564 MiB); the provider's vram_reserve_gb is not usable.
 */
export const hardwareFitSql = (db: Db) => db`(
  (j.gpu_requirements->>'min_vram_gb' IS NULL
    OR ${approvedVramSql(db)} - p.vram_reserve_gb * 1024 >= (j.gpu_requirements->>'min_vram_gb')::float8 * 1000)
  AND (j.gpu_requirements->>'gpu_model' IS NULL
    OR strpos(lower(p.gpu_model), lower(j.gpu_requirements->>'gpu_model')) > 0))`;

/**
 * Provider p's daemon runs job j's type: its heartbeats declared the type (migration 049), or
 * declared nothing (a daemon older than the declaration: offered every type, as before it).
 * Offering a job its daemon cannot run only bounced it back (unsupported_on_provider, the
 * provider's fault).
 */
export const jobTypeFitSql = (db: Db) => db`(p.supported_job_types IS NULL OR j.job_type = ANY(p.supported_job_types))`;

/** Provider p can run job j at all: its hardware fits and its daemon runs the job type. */
export const fitSql = (db: Db) => db`(${hardwareFitSql(db)} AND ${jobTypeFitSql(db)})`;

/**
 * Fit, the requested provider if any, and not one that declined or never started this job, nor
 * one whose daemon was shut down mid-job and has not heartbeated since (it is still "live" for a while),
 * nor one an admin took the job off (a re-queue is to run it elsewhere; a job pinned to a provider
 * goes back to it).
 */
export const matchesSql = (db: Db) => db`(
  (j.requested_provider_id IS NULL OR j.requested_provider_id = p.id)
  AND ${fitSql(db)}
  AND (j.attempt = 1 OR NOT EXISTS (
    SELECT 1 FROM job_attempts x WHERE x.job_id = j.id AND x.provider_id = p.id
      AND (x.end_reason = ANY(${DECLINED_REASONS as string[]}::text[])
        OR (x.end_reason = 'provider_interrupted' AND (p.last_heartbeat IS NULL OR p.last_heartbeat <= x.ended_at))
        OR (x.end_reason = 'admin_requeued' AND j.requested_provider_id IS NULL)))))`;

/**
 * Job j's renter is not suspended: a suspended renter's queued jobs wait, with their holds, until it
 * is unsuspended (admin.ts setRenterStatus). Read without a lock where placement plans; each
 * assignment joins the renter's row as `r` instead and holds it FOR KEY SHARE (renterHeldSql), so
 * a suspension, which locks the row FOR UPDATE, waits for an assignment under way, and one whose
 * statement read the renter before the suspension committed re-reads it under the lock and skips the job.
 */
export const renterActiveSql = (db: Db) => db`(SELECT r.status FROM renters r WHERE r.id = j.renter_id) <> 'suspended'`;

/** The locking clause for the renter rows `r` of the jobs an assignment takes (renterActiveSql); one a suspension holds is skipped. */
const renterHeldSql = (db: Db) => db`FOR KEY SHARE OF r SKIP LOCKED`;

/** A provider's GPUs, one job each: what it reports, at most what an admin approved (migration 047). */
export const slotsSql = (db: Db) => db`greatest(least(p.gpu_count, coalesce(p.approved_gpu_count, p.gpu_count)), 1)`;
/** A provider's GPU memory for placement: what it reports, at most what an admin approved. */
const approvedVramSql = (db: Db) => db`least(coalesce(p.gpu_vram_mib, 0), coalesce(p.approved_vram_mib, p.gpu_vram_mib, 0))`;
export const busySql = (db: Db) => db`coalesce((SELECT l.active FROM provider_load l WHERE l.provider_id = p.id), 0)`;

/**
 * The provider's load row `l` is open to assignments: not closed by a suspension or rejection
 * (migration 056), and not away (paused, or offline: migration 060). Every assignment checks it on
 * the row it locked, besides availableSql on its snapshot: a pause, the liveness sweep's "offline"
 * or a suspension writes that row in the transaction that records it, so one committed after the
 * assignment's snapshot was taken, and before its lock, is still seen.
 */
const openLoadSql = (db: Db) => db`(NOT l.closed AND NOT l.away)`;

// ---- assignment ----

// How a queued job becomes assigned, in one place for every path (fill() and assignPlanned()):
// pending on its provider, with its deadline, an attempt row, and a notice for connected daemons.

/** When an assigned job times out: its max_duration_seconds from now. `job` is the row's alias. */
const timeoutAtSql = (tx: Tx, job: string) => tx`now() + make_interval(secs => ${tx(job)}.max_duration_seconds)`;

/** The CTE body moving the queued jobs of `picked` (columns id, provider_id) to pending, returning their rows. */
const moveToPendingSql = (tx: Tx) => tx`
  UPDATE jobs SET status = 'pending', provider_id = picked.provider_id, assigned_at = now(),
         timeout_at = ${timeoutAtSql(tx, "jobs")}, updated_at = now()
  FROM picked WHERE jobs.id = picked.id AND jobs.status = 'queued'
  RETURNING jobs.*`;

/** The CTE body opening the attempt row of each job just assigned in `assigned` (a CTE of job rows). */
const openAttemptsSql = (tx: Tx, assigned: string) => tx`
  INSERT INTO job_attempts (job_id, attempt, provider_id, status, assigned_at)
  SELECT id, attempt, provider_id, 'pending', now() FROM ${tx(assigned)}
  ON CONFLICT (job_id, attempt) DO UPDATE SET provider_id = EXCLUDED.provider_id, status = 'pending', assigned_at = now()
  RETURNING job_id`;

export interface Assignment {
  id: number;
  jobId: string;
  providerId: number;
  /** The job row as assigned. */
  job: JobRow;
}

/**
 * Moves up to `free` queued jobs that the provider `target` names can run to
 * pending there, best first, skipping jobs other transactions hold: one
 * statement that also opens the attempt rows and tells connected daemons
 * (NOTIFY, delivered on commit). `target` is a query of one row (id, free)
 * whose provider_load row is locked: by the caller already, or by `target`
 * itself (then the lock and the fill are one round trip).
 * Returns the provider named (null when `target` found none) and what moved.
 */
async function fill(tx: Tx, target: ReturnType<Tx>): Promise<{ providerId: number | null; assigned: Assignment[] }> {
  const rows = await tx<(JobRow & { target_id: number; notified: string | null; opened: number })[]>`
    WITH target AS MATERIALIZED (${target}), picked AS (
      SELECT j.id, t.id AS provider_id FROM jobs j JOIN renters r ON r.id = j.renter_id, providers p, target t
      WHERE p.id = t.id AND j.status = 'queued' AND r.status <> 'suspended' AND ${matchesSql(tx)}
      ORDER BY j.priority, j.submitted_at, j.id
      LIMIT (SELECT free FROM target) FOR UPDATE OF j SKIP LOCKED ${renterHeldSql(tx)}
    ), moved AS (${moveToPendingSql(tx)}
    ), opened AS (${openAttemptsSql(tx, "moved")}
    )
    SELECT t.id AS target_id, m.*,
           CASE WHEN m.id IS NOT NULL THEN ${assignedNoticeSql(tx, tx`t.id`, "m")} END AS notified,
           (SELECT count(*) FROM opened) AS opened
    FROM target t LEFT JOIN moved m ON true ORDER BY m.priority, m.submitted_at, m.id`;
  if (rows.length === 0) return { providerId: null, assigned: [] };
  const providerId = rows[0].target_id;
  const assigned = rows
    .filter((r) => r.id !== null)
    .map(({ target_id: _t, notified: _n, opened: _o, ...job }) => ({ id: job.id, jobId: job.job_id, providerId, job: job as JobRow }));
  return { providerId, assigned };
}

/** fill() for a provider whose provider_load row the caller holds locked. */
async function fillLocked(tx: Tx, providerId: number, free: number): Promise<Assignment[]> {
  if (free <= 0) return [];
  return (await fill(tx, tx`SELECT ${providerId}::bigint AS id, ${free}::int AS free`)).assigned;
}

export interface PlaceResult {
  /** The provider the job went to, or null when it stays queued. */
  providerId: number | null;
  /** Providers with room that were locked by another transaction at that moment. */
  contended: number[];
  /** The job row after placement, when it was placed. */
  job?: JobRow;
}

/** How many candidates placement compares before it looks at the whole fleet (at least; more for a large batch). */
const CANDIDATE_WINDOW = 32;
/** The most candidates one placement round compares. */
const MAX_CANDIDATES = 256;
/** Queued jobs ahead of a batch that placement also offers to the providers it locks (priority order holds across submits). */
const QUEUE_HEAD = 32;

export interface Placement {
  providerId: number;
  /** The job row as assigned. */
  job: JobRow;
}

export interface PlaceManyResult {
  /** Jobs that went to a provider, by id: those asked for, and jobs from the head of the queue placed on the way. */
  placed: Map<number, Placement>;
  /** Providers with room that fit a job left queued but were locked by another transaction at that moment. */
  contended: number[];
}

export interface Candidate {
  id: number;
  active: number;
  slots: number;
  reliability: number | null;
  /** Ids of the queued jobs (of those offered) this provider can run. */
  fits: number[];
  /** The offered queued jobs in dispatch order (the same array on every candidate). */
  queue: number[];
}

/**
 * A job not written yet (a submit in its batch): placement can read
 * candidates for it before its row exists, so that the row, its hold and its
 * assignment then go out together. It is attempt 1, submitted now.
 */
export interface NewJob {
  id: number;
  jobType: string;
  priority: number;
  requestedProviderId: number | null;
  gpuRequirements: Record<string, unknown> | null;
}

/**
 * Available providers with a free slot that can run at least one of the
 * queued jobs `offered` or `fresh` (plus older queued jobs, but not the
 * jobs `skipped`: ones an earlier round found held elsewhere), least busy
 * first, then most reliable; read without locks (the assignment locks and
 * re-checks). Windowed: the most reliable available providers with a free
 * slot, read in order from providers_dispatch_idx (migration 010), plus the
 * providers the jobs asked for; otherwise the whole fleet for jobs not bound
 * to a provider. (The window leaves the jobs' fit out on purpose: its clauses
 * would make the planner expect one row and sort the whole fleet.)
 * `seen` (windowed only): told whether the window was full, i.e. whether
 * free providers may lie beyond it (the job sweep's fallback, placeMany).
 */
export async function readCandidates(
  tx: Tx,
  offered: number[],
  tried: number[],
  windowed: boolean,
  fresh: NewJob[] = [],
  skipped: number[] = [],
  seen?: { windowFull: boolean },
): Promise<Candidate[]> {
  const size = Math.min(MAX_CANDIDATES, Math.max(CANDIDATE_WINDOW, offered.length + fresh.length));
  const probe = windowed && seen !== undefined;
  const free = tx`${availableSql(tx)} AND l.active < ${slotsSql(tx)} AND p.id <> ALL(${tried})`;
  const freshRows = tx`
    SELECT id, job_type, priority, now() AS submitted_at, requested_provider_id, req::jsonb AS gpu_requirements, 1 AS attempt
    FROM unnest(${fresh.map((f) => f.id)}::bigint[], ${fresh.map((f) => f.jobType)}::text[], ${fresh.map((f) => f.priority)}::int[],
                ${fresh.map((f) => f.requestedProviderId)}::bigint[],
                ${fresh.map((f) => (f.gpuRequirements ? JSON.stringify(f.gpuRequirements) : null))}::text[]) AS f(id, job_type, priority, requested_provider_id, req)`;
  // None offered (a submit's batch): no read of jobs at all. A cached generic plan made while
  // jobs was small scans the whole table for `id = ANY('{}')`, once per batch.
  const offeredRows =
    offered.length === 0
      ? tx`SELECT NULL::bigint AS id, NULL::text AS job_type, NULL::int AS priority, NULL::timestamptz AS submitted_at,
                  NULL::bigint AS requested_provider_id, NULL::jsonb AS gpu_requirements, NULL::int AS attempt WHERE false`
      : tx`
    SELECT id, job_type, priority, submitted_at, requested_provider_id, gpu_requirements, attempt FROM jobs j
    WHERE status = 'queued' AND id = ANY(${offered}::bigint[]) AND id <> ALL(${skipped}::bigint[]) AND ${renterActiveSql(tx)}`;
  // The pool of providers, then the older queued jobs offered with the jobs: the first QUEUE_HEAD,
  // in dispatch order, that a provider of the pool can run (a head of jobs waiting for other
  // providers does not hide them: an older job that fits a provider goes before a newer one).
  // Windowed, the pool is the window (read once, in index order) and the providers the offered
  // jobs ask for. Whole fleet, it is the free providers, least busy then most reliable, that fit
  // one of the offered jobs not bound to a provider, each distinct standing of those tested once
  // per provider (`offer`: a first attempt's fit depends on its type and requirements alone); none
  // such (only pinned jobs): no provider is read at all.
  const window = tx`ARRAY(
          SELECT p.id FROM providers p JOIN provider_load l ON l.provider_id = p.id WHERE ${free}
          ORDER BY p.reliability_score DESC NULLS LAST, p.id LIMIT ${size})`;
  const pinned = tx`ARRAY(SELECT requested_provider_id FROM (${offeredRows} UNION ALL ${freshRows}) r WHERE requested_provider_id IS NOT NULL)`;
  const offer = windowed
    ? tx``
    : tx`offer AS MATERIALIZED (
      SELECT DISTINCT ON (job_type, gpu_requirements->>'min_vram_gb', gpu_requirements->>'gpu_model', CASE WHEN attempt = 1 THEN 0 ELSE id END) *
      FROM (${offeredRows} UNION ALL ${freshRows}) r WHERE requested_provider_id IS NULL
    ), `;
  const pool = !windowed
    ? tx`SELECT ARRAY(
          SELECT p.id FROM provider_load l JOIN providers p ON p.id = l.provider_id
          WHERE EXISTS (SELECT 1 FROM offer) AND ${free} AND EXISTS (SELECT 1 FROM offer j WHERE ${matchesSql(tx)})
          ORDER BY l.active, p.reliability_score DESC NULLS LAST, p.id LIMIT ${size}) AS ids`
    : probe
      ? tx`SELECT w.ids || ${pinned} AS ids, cardinality(w.ids) >= ${size} AS is_full FROM (SELECT ${window} AS ids) w`
      : tx`SELECT ${window} || ${pinned} AS ids`;
  // js: the jobs offered, with what matchesSql reads of a job (as j), in dispatch order.
  // The queue comes on one row only (it is the same for all) and is shared by every candidate.
  // Probing, one more row (no candidate) says whether the window was full.
  const rows = await tx<(Omit<Candidate, "queue"> & { queue: number[] | null; window_full?: boolean | null })[]>`
    WITH ${offer}pool AS MATERIALIZED (${pool}), js AS MATERIALIZED (
      SELECT q.*, row_number() OVER (ORDER BY q.priority, q.submitted_at, q.id) AS rank FROM (
        ${offeredRows}
        UNION
        SELECT * FROM (
          SELECT j.id, j.job_type, j.priority, j.submitted_at, j.requested_provider_id, j.gpu_requirements, j.attempt FROM jobs j
          WHERE j.status = 'queued' AND j.id <> ALL(${skipped}::bigint[]) AND ${renterActiveSql(tx)}
            AND EXISTS (SELECT 1 FROM providers p JOIN provider_load l ON l.provider_id = p.id, pool
                        WHERE l.provider_id = ANY(pool.ids) AND ${free} AND ${matchesSql(tx)})
          ORDER BY j.priority, j.submitted_at, j.id LIMIT ${QUEUE_HEAD}) older
        UNION ALL
        ${freshRows}
      ) q
    )
    SELECT c.*, CASE WHEN row_number() OVER () = 1 THEN (SELECT array_agg(id ORDER BY rank) FROM js) END AS queue${probe ? tx`, NULL::boolean AS window_full` : tx``}
    FROM (
      SELECT p.id, l.active, ${slotsSql(tx)} AS slots, p.reliability_score AS reliability,
             ARRAY(SELECT j.id FROM js j WHERE ${matchesSql(tx)} ORDER BY j.rank) AS fits
      FROM provider_load l JOIN providers p ON p.id = l.provider_id
      WHERE l.provider_id = ANY((SELECT ids FROM pool)::bigint[]) AND ${free}
      ORDER BY l.active, p.reliability_score DESC NULLS LAST, p.id
      LIMIT ${size}) c
    WHERE cardinality(c.fits) > 0${probe ? tx`
    UNION ALL SELECT NULL, NULL, NULL, NULL, NULL, NULL, (SELECT is_full FROM pool)` : tx``}`;
  if (seen) seen.windowFull = rows.some((r) => r.window_full === true);
  const candidates = probe ? rows.filter((r) => r.id !== null) : rows;
  const queue = candidates.find((r) => r.queue !== null)?.queue ?? [];
  return candidates.map(({ window_full: _w, ...r }) => ({ ...r, queue }));
}

/**
 * Candidates with the jobs renamed by `rename` (a fresh job's placeholder id to
 * its row's id) and dropped where it answers undefined (a refused submit).
 */
export function renameJobs(candidates: Candidate[], rename: (id: number) => number | undefined): Candidate[] {
  const map = (ids: number[]) => {
    const out: number[] = [];
    for (const id of ids) {
      const to = rename(id);
      if (to !== undefined) out.push(to);
    }
    return out;
  };
  const queue = map(candidates[0]?.queue ?? []);
  return candidates.map((c) => ({ ...c, fits: map(c.fits), queue })).filter((c) => c.fits.length > 0);
}

/**
 * Water-filling: each queued job, in dispatch order, goes to the least busy
 * candidate (counting what this plan already gave it) that fits and has a
 * free slot, then the most reliable. Returns [job id, provider id] pairs.
 */
export function planAssignments(candidates: Candidate[]): [number, number][] {
  if (candidates.length === 0) return [];
  const state = candidates.map((c) => ({ ...c, load: c.active, fits: new Set(c.fits) }));
  const better = (a: (typeof state)[number], b: (typeof state)[number]) =>
    a.load !== b.load ? a.load < b.load : (a.reliability ?? -Infinity) !== (b.reliability ?? -Infinity) ? (a.reliability ?? -Infinity) > (b.reliability ?? -Infinity) : a.id < b.id;
  const plan: [number, number][] = [];
  for (const jobId of candidates[0].queue) {
    let best: (typeof state)[number] | undefined;
    for (const c of state) if (c.load < c.slots && c.fits.has(jobId) && (!best || better(c, best))) best = c;
    if (!best) continue;
    plan.push([jobId, best.id]);
    best.load++;
  }
  return plan;
}

/**
 * New job rows for assignPlanned to write (a submit batch's): `select` yields
 * one row per job with exactly `columns` (the jobs columns a submit sets, `id`
 * among them) plus `ord`, their order.
 */
export interface FreshRows {
  columns: string[];
  /** Their ids. */
  ids: number[];
  // A query fragment (postgres.js): run only as part of assignPlanned's statement.
  select: PendingQuery<Row[]>;
}

const quoted = (name: string) => `"${name.replace(/"/g, '""')}"`;
const lists = new WeakMap<readonly string[], { plain: string; ofF: string }>();

/**
 * A column list as SQL text, quoted, once per list (the submit's columns are a
 * constant): "a", "b" and f."a", f."b". Built as a fragment per identifier it
 * cost forty nested fragments per batch, each built and then flattened again.
 */
function columnLists(columns: readonly string[]): { plain: string; ofF: string } {
  let l = lists.get(columns);
  if (!l) lists.set(columns, (l = { plain: columns.map(quoted).join(", "), ofF: columns.map((c) => `f.${quoted(c)}`).join(", ") }));
  return l;
}

/**
 * Carries out a plan in one statement: the planned providers' provider_load
 * rows are locked (skipping those other transactions hold) and re-checked,
 * the planned jobs still queued are locked (skipping held ones), each
 * provider takes its planned jobs up to its free slots now, and the assigned
 * jobs get their attempt rows and a notice for connected daemons (NOTIFY,
 * delivered on commit). With `fresh`, those new rows are inserted by the same
 * statement, already assigned where their provider was taken and queued
 * otherwise: a job placed at submit never passes through the queue (no queue
 * entry to update and leave behind). Returns the assigned rows and the
 * providers it locked, with their free slots when locked.
 */
async function assignPlanned(tx: Tx, plan: [number, number][], fresh?: FreshRows): Promise<{ moved: Placement[]; locked: Map<number, number> }> {
  const columns = fresh?.columns ?? [];
  // The planned jobs already in the table (queued ones). When there are none (a submit's batch
  // with no older job offered), the statement does not touch jobs but to insert: a cached
  // generic plan made while jobs was small would scan the whole table for them.
  const freshIds = new Set(fresh?.ids ?? []);
  const queuedIds = plan.map((p) => p[0]).filter((id) => !freshIds.has(id));
  const inserted = fresh
    ? tx`, inserted AS (
        INSERT INTO jobs (${tx.unsafe(columnLists(columns).plain)}, status, provider_id, assigned_at, timeout_at)
        SELECT ${tx.unsafe(columnLists(columns).ofF)},
               CASE WHEN p.provider_id IS NULL THEN 'queued' ELSE 'pending' END, p.provider_id,
               CASE WHEN p.provider_id IS NOT NULL THEN now() END,
               CASE WHEN p.provider_id IS NOT NULL THEN ${timeoutAtSql(tx, "f")} END
        FROM fresh f LEFT JOIN picked p ON p.id = f.id ORDER BY f.ord
        RETURNING *
      )`
    : tx``;
  const rows = await tx<(JobRow & { notified: string | null; opened: number; locked_ids: number[] | null; locked_free: number[] | null })[]>`
    WITH plan AS (
      SELECT * FROM unnest(${plan.map((p) => p[0])}::bigint[], ${plan.map((p) => p[1])}::bigint[]) WITH ORDINALITY AS x(job_id, provider_id, ord)
    ), fresh AS MATERIALIZED (
      ${fresh ? fresh.select : tx`SELECT NULL::bigint AS id WHERE false`}
    ), locked AS MATERIALIZED (
      SELECT l.provider_id AS id, ${slotsSql(tx)} - l.active AS free
      FROM provider_load l JOIN providers p ON p.id = l.provider_id
      WHERE l.provider_id IN (SELECT provider_id FROM plan) AND ${availableSql(tx)} AND ${openLoadSql(tx)} AND l.active < ${slotsSql(tx)}
      ORDER BY l.provider_id FOR UPDATE OF l SKIP LOCKED
    ), held AS MATERIALIZED (${
      queuedIds.length === 0
        ? tx`SELECT NULL::bigint AS id WHERE false`
        : tx`
          SELECT j.id FROM jobs j JOIN renters r ON r.id = j.renter_id
          WHERE j.id = ANY(${queuedIds}::bigint[]) AND j.status = 'queued' AND r.status <> 'suspended'
          ORDER BY j.id FOR UPDATE OF j SKIP LOCKED ${renterHeldSql(tx)}`}
    ), picked AS (
      SELECT job_id AS id, provider_id FROM (
        SELECT plan.job_id, plan.provider_id, locked.free, row_number() OVER (PARTITION BY plan.provider_id ORDER BY plan.ord) AS n
        FROM plan JOIN locked ON locked.id = plan.provider_id
        WHERE plan.job_id IN (SELECT id FROM held) OR plan.job_id IN (SELECT id FROM fresh)) x
      WHERE n <= free
    )${inserted}, moved AS (${queuedIds.length === 0 ? tx`SELECT * FROM jobs WHERE false` : moveToPendingSql(tx)}
    ), assigned AS (
      ${fresh ? tx`SELECT * FROM inserted WHERE status = 'pending' UNION ALL ` : tx``}SELECT * FROM moved
    ), opened AS (${openAttemptsSql(tx, "assigned")}
    )
    SELECT m.*,
           CASE WHEN m.id IS NOT NULL THEN ${assignedNoticeSql(tx, tx`m.provider_id`, "m")} END AS notified,
           (SELECT count(*) FROM opened) AS opened,
           (SELECT array_agg(id ORDER BY id) FROM locked) AS locked_ids,
           (SELECT array_agg(free ORDER BY id) FROM locked) AS locked_free
    FROM (SELECT 1) one LEFT JOIN assigned m ON true ORDER BY m.priority, m.submitted_at, m.id`;
  const ids = rows[0]?.locked_ids ?? [];
  const free = rows[0]?.locked_free ?? [];
  const locked = new Map(ids.map((id, i) => [id, free[i]]));
  const moved = rows
    .filter((r) => r.id !== null)
    .map(({ notified: _n, opened: _o, locked_ids: _l, locked_free: _f, ...job }) => ({ providerId: job.provider_id as number, job: job as JobRow }));
  return { moved, locked };
}

/**
 * Places queued jobs (inside the caller's transaction), any number at once:
 * candidates are read, a water-filling plan is made (planAssignments), and
 * the plan is carried out under the providers' locks (assignPlanned); jobs
 * the plan could not place (their provider was taken meanwhile) are tried
 * again elsewhere, first within the candidate window, then over every
 * provider. Queued jobs ahead of these in priority order that the same
 * providers can run are offered too, so a new job never overtakes an older
 * one that its provider can run. `wholeFleet: false` (the job sweep) goes
 * past the window only when the window was full (with fewer free providers
 * than it holds, every free provider was in it: a fleet that is busy costs
 * the sweep no read of the whole fleet), and reports no contention.
 * `firstRound`: the candidates already read for these jobs (readCandidates,
 * in the same transaction); `fresh`: their rows, not written yet (the first
 * round inserts them).
 */
export async function placeMany(
  tx: Tx,
  jobIds: number[],
  opts: { wholeFleet?: boolean; firstRound?: Candidate[]; fresh?: FreshRows } = {},
): Promise<PlaceManyResult> {
  const wholeFleet = opts.wholeFleet ?? true;
  let given = opts.firstRound;
  let fresh = opts.fresh;
  const placed = new Map<number, Placement>();
  const contended = new Set<number>();
  const tried: number[] = [0];
  const skipped: number[] = [];
  let pending = [...jobIds];
  let windowed = true;
  // Whether the window last read was full (the sweep's fallback; read only where it decides).
  const seen = { windowFull: false };
  for (let round = 0; round < 8 && pending.length > 0; round++) {
    const probe = windowed && !wholeFleet && !given;
    const plan = planAssignments(given ?? (await readCandidates(tx, pending, tried, windowed, [], skipped, probe ? seen : undefined)));
    given = undefined;
    if (plan.length === 0 && !fresh) {
      if (windowed && (wholeFleet || seen.windowFull)) {
        windowed = false;
        continue;
      }
      break;
    }
    // Carried out also when it gives every free slot to older jobs (they come first):
    // those providers are then tried, and the next round looks further for these jobs.
    const { moved, locked } = await assignPlanned(tx, plan, fresh);
    fresh = undefined;
    for (const m of moved) placed.set(m.job.id, m);
    const took = new Map<number, number>();
    for (const m of moved) took.set(m.providerId, (took.get(m.providerId) ?? 0) + 1);
    for (const [jobId, providerId] of plan) {
      const free = locked.get(providerId);
      if (free === undefined) contended.add(providerId); // held by another transaction, or no longer free
      // A provider is done with once it could not be locked or is full; one we hold that still has room
      // (a job planned for it was held elsewhere or already gone) is planned again next round, without that job.
      const full = free === undefined || (took.get(providerId) ?? 0) >= free;
      if (full && !tried.includes(providerId)) tried.push(providerId);
      // Not moved though its provider had room: the job itself was held elsewhere or already gone.
      if (!full && !placed.has(jobId) && !skipped.includes(jobId)) skipped.push(jobId);
    }
    pending = pending.filter((id) => !placed.has(id));
  }
  return { placed, contended: wholeFleet && pending.length > 0 ? [...contended] : [] };
}

/** placeMany for one job. */
export async function placeJob(tx: Tx, jobId: number, opts: { wholeFleet?: boolean } = {}): Promise<PlaceResult> {
  const { placed, contended } = await placeMany(tx, [jobId], opts);
  const got = placed.get(jobId);
  return got ? { providerId: got.providerId, contended: [], job: got.job } : { providerId: null, contended };
}

/**
 * A provider may have room (it heartbeated, resumed, finished a job, or a
 * slot opened): assign it the next queued jobs it can run, at once.
 */
export async function dispatchForProvider(sql: Sql, providerId: number): Promise<Assignment[]> {
  return sql.begin(async (tx) => {
    const [p] = await tx<{ free: number; ok: boolean }[]>`
      SELECT ${slotsSql(tx)} - l.active AS free, ${availableSql(tx)} AND ${openLoadSql(tx)} AS ok
      FROM providers p JOIN provider_load l ON l.provider_id = p.id
      WHERE p.id = ${providerId} FOR UPDATE OF l`;
    if (!p?.ok || p.free <= 0) return [];
    return fillLocked(tx, providerId, p.free);
  });
}

/** Whether any job waits in the queue (one read of the queue index). */
export async function hasQueuedJobs(db: Db): Promise<boolean> {
  const [r] = await db<{ any: boolean }[]>`SELECT EXISTS (SELECT 1 FROM jobs WHERE status = 'queued') AS any`;
  return r.any;
}

/**
 * Safety net run by the job worker (and after re-queues): the oldest queued
 * jobs, in dispatch order, are offered to the candidate window again (a slot
 * opened, a provider came back, a scheduled window opened, a lock was busy),
 * and those the window could not place to the whole fleet when the window
 * was full (placeMany with `wholeFleet: false`): a job whose only fitting
 * provider is outside the window is placed within one pass. Driven by the
 * queue, not by the fleet: a job waiting for one offline provider costs one
 * index read, not a pass over every provider. Returns how many of them were placed.
 */
export async function dispatchQueued(sql: Sql, limit = 100): Promise<number> {
  // A suspended renter's jobs are not among them: a head of those would leave the sweep nothing to place.
  const queued = await sql<{ id: number }[]>`
    SELECT id FROM jobs j WHERE status = 'queued' AND ${renterActiveSql(sql)} ORDER BY priority, submitted_at, id LIMIT ${limit}`;
  if (queued.length === 0) return 0;
  const ids = queued.map((q) => q.id);
  const { placed } = await sql.begin((tx) => placeMany(tx, ids, { wholeFleet: false }));
  return ids.filter((id) => placed.has(id)).length;
}

// ---- re-queue ----

/**
 * Ends the current attempt of a pending/running job (row locked by the caller)
 * and puts the job back in the queue as a new attempt. The old provider is
 * told to stop. Money is untouched: the renter pays nothing for the attempt
 * (its hold stays for the next one) and the provider earns nothing for it.
 */
export async function requeueLocked(tx: Tx, job: JobRow, reason: EndReason, error?: string): Promise<void> {
  await tx`
    UPDATE job_attempts SET status = 'requeued', ended_at = now(), end_reason = ${reason}, fault = ${faultOf(reason)},
           error = ${error ?? null}, cost_halala = 0
    WHERE job_id = ${job.id} AND attempt = ${job.attempt}`;
  await backToQueue(tx, job.id);
  if (job.provider_id !== null) await notifyCancel(tx, job.provider_id, job.job_id);
}

/** Puts a job (row locked) back in the queue, off its provider, as its next attempt. */
function backToQueue(tx: Tx, id: number) {
  return tx`
    UPDATE jobs SET status = 'queued', provider_id = NULL, attempt = attempt + 1, assigned_at = NULL, started_at = NULL,
           acked_at = NULL, timeout_at = NULL, progress_pct = NULL, progress_phase = NULL, preparing_at = NULL, endpoint_url = NULL,
           endpoint_probed_at = NULL, endpoint_healthy_at = NULL, endpoint_failing_since = NULL, endpoint_failed_at = NULL, updated_at = now()
    WHERE id = ${id}`;
}

/**
 * A pending job (row locked) whose provider's daemon refused it while the provider is paused by the
 * server's record. No job is assigned to a paused provider, so it was assigned just before the pause
 * (which waits for an assignment in flight: migration 060), and the daemon, told it is paused, refused
 * it: the provider was never going to run it, and its owner took it out of work as the platform
 * allows. The attempt ends as provider_paused (kept in the job's history: no one's fault, nothing
 * billed, and not one of the attempts the job is allowed: attemptsSpent), the job goes back to the
 * queue as its next attempt, and a job pinned to the provider waits for it to resume.
 */
function handBackLocked(tx: Tx, job: LockedJob, error: string): Promise<void> {
  return requeueLocked(tx, job, "provider_paused", error);
}

/**
 * The attempts a job (row locked) has used of jobPolicy.maxAttempts, its current one included: its
 * earlier attempts that ended for a reason that spends none (ATTEMPT_FREE_REASONS) are not among them.
 */
async function attemptsSpent(tx: Tx, job: LockedJob): Promise<number> {
  // Only a job at or past the limit by its attempt number can have used them all: a read for those alone.
  if (job.attempt < jobPolicy.maxAttempts) return job.attempt;
  const [r] = await tx<{ n: number }[]>`
    SELECT count(*)::int AS n FROM job_attempts
    WHERE job_id = ${job.id} AND attempt < ${job.attempt} AND end_reason = ANY(${ATTEMPT_FREE_REASONS as string[]}::text[])`;
  return job.attempt - r.n;
}

/** Places jobs that just went back to the queue (one transaction). */
export async function placeJobs(sql: Sql, ids: number[]): Promise<void> {
  if (ids.length > 0) await sql.begin((tx) => placeMany(tx, ids));
}

/** End reasons of the provider's fault that take a job off its provider (dispatch re-queues them). */
export type ProviderFaultReason = "provider_silent" | "provider_refused" | "provider_interrupted" | "not_picked_up" | "provider_error" | "signature_mismatch" | "unsupported_on_provider";
/** What takes a job off its provider: the provider's fault, or an admin's decision about the provider. */
type LossReason = ProviderFaultReason | "admin_requeued";

/**
 * A job its provider failed (went silent, refused it, stopped it, its machine
 * failed it; or an admin took the provider out): the renter pays nothing for
 * the attempt and the provider earns nothing. A new attempt in the queue while attempts
 * remain; once they are used up, or when the job is pinned to this provider
 * (provider_id at submit), failed with the fault shown and the hold released.
 * Two exceptions for a job its provider never picked up (pending): one pinned to
 * a provider that went silent goes back to the queue to wait for it (as it would
 * have, had its assignment come a moment later: attempts allowing); and one its
 * provider's daemon refused while the provider is paused (by the server's record)
 * is not taken off as a failure at all: it is handed back (handBackLocked).
 * The caller refreshes the provider's reliability after commit (reputation.ts).
 */
export async function loseJobLocked(tx: Tx, job: LockedJob, reason: LossReason, error: string): Promise<"requeued" | "failed"> {
  if (reason === "provider_refused" && job.status === "pending" && job.provider_id !== null) {
    const [p] = await tx<{ paused: boolean }[]>`SELECT (is_paused OR status = 'paused') AS paused FROM providers WHERE id = ${job.provider_id}`;
    if (p?.paused) {
      await handBackLocked(tx, job, error);
      return "requeued";
    }
  }
  // An end that spends no attempt (an admin's decision about the provider) cannot use the last one up.
  const spent = ATTEMPT_FREE_REASONS.includes(reason) ? 0 : await attemptsSpent(tx, job);
  const exhausted = spent >= jobPolicy.maxAttempts;
  // Never picked up by a provider that went silent: a pinned job waits for that provider in the queue.
  const waitsForProvider = reason === "provider_silent" && job.status === "pending";
  const pinned = job.requested_provider_id !== null && !waitsForProvider;
  if (exhausted || pinned) {
    const why = exhausted
      ? `${error}; gave up after ${spent} attempt${spent === 1 ? "" : "s"}`
      : `${error}; the job asked for this provider, so it is not sent to another`;
    await endLocked(tx, job, "failed", { reason, error: why });
    return "failed";
  }
  await requeueLocked(tx, job, reason, error);
  return "requeued";
}

/**
 * Why every job of a provider is taken off it, and the end reason that
 * records: it went silent (the sweeps; judged again under the lock below,
 * since it may have beaten since it was found silent), an admin suspended or
 * rejected it (the platform's doing), or its daemon cannot verify this
 * server's tasks.
 */
export const PROVIDER_REMOVALS = {
  silent: "provider_silent",
  admin: "admin_requeued",
  // Its daemon (re)connected pinning another key: handed back as by a restart, and offered to it
  // again once it heartbeats with the right key.
  task_key: "provider_interrupted",
} as const satisfies Record<string, EndReason>;
export type ProviderRemoval = keyof typeof PROVIDER_REMOVALS;

/**
 * Re-queues each of the provider's pending/running jobs as a new attempt
 * (recorded in history) or, past the attempt limit, fails and refunds it.
 * A silence is checked again with the provider's row locked, after its jobs':
 * a heartbeat that came meanwhile keeps them where they are, and one that
 * comes later waits for this to commit. Safe to call any number of times,
 * from any process.
 */
export async function requeueJobsOfProvider(
  sql: Sql,
  providerId: number,
  removal: ProviderRemoval,
  message: string,
): Promise<{ requeued: string[]; failed: string[] }> {
  // Collected inside the transaction: a deadlock runs it again from the start (db/index.ts).
  const removed = await sql.begin((tx) => takeJobsOffProvider(tx, providerId, removal, message));
  await afterJobsTakenOff(sql, providerId, removed);
  return { requeued: removed.requeued, failed: removed.failed };
}

export interface JobsTakenOff {
  requeued: string[];
  failed: string[];
  /** jobs.id of the re-queued ones, for placeJobs once committed. */
  requeuedIds: number[];
}

/**
 * requeueJobsOfProvider's work inside `tx`: an admin's suspension or rejection
 * takes the provider's jobs off in the transaction that records it, so that no
 * report of the provider's is taken in between. afterJobsTakenOff once committed.
 * `pinnedQueued` (a rejection: the provider will never take work again): the
 * queued jobs that asked for it fail too, their holds released, as its pinned
 * running ones do.
 */
export async function takeJobsOffProvider(
  tx: Tx,
  providerId: number,
  removal: ProviderRemoval,
  message: string,
  pinnedQueued = false,
): Promise<JobsTakenOff> {
  const out: JobsTakenOff = { requeued: [], failed: [], requeuedIds: [] };
  const jobs = await lockJobsOfProvider(tx, providerId, pinnedQueued);
  if (jobs.length > 0 && removal === "silent") {
    const silent = await tx`SELECT 1 FROM providers p WHERE p.id = ${providerId} AND NOT ${liveSql(tx)} FOR NO KEY UPDATE`;
    if (silent.length === 0) return out;
  }
  for (const job of jobs) {
    const r = await loseJobLocked(tx, job, PROVIDER_REMOVALS[removal], message);
    out[r].push(job.job_id);
    if (r === "requeued") out.requeuedIds.push(job.id);
  }
  return out;
}

/**
 * The provider's active jobs (with `pinnedQueued`, also the queued jobs that asked for it), locked in
 * id order: before its own row when both are taken (a result settling takes its job, then the
 * provider), so a transaction doing both does not deadlock with one.
 */
export function lockJobsOfProvider(tx: Tx, providerId: number, pinnedQueued = false) {
  return tx<LockedJob[]>`
    SELECT *, now() AS db_now FROM jobs
    WHERE (provider_id = ${providerId} AND status IN ('pending', 'running'))
       ${pinnedQueued ? tx`OR (status = 'queued' AND requested_provider_id = ${providerId})` : tx``}
    ORDER BY id FOR UPDATE`;
}

/** After takeJobsOffProvider committed: places the re-queued jobs and refreshes the provider's reliability. */
export async function afterJobsTakenOff(sql: Sql, providerId: number, removed: JobsTakenOff): Promise<void> {
  await placeJobs(sql, removed.requeuedIds);
  if (removed.requeued.length + removed.failed.length > 0) await refreshReputation(sql, [providerId]);
}

/**
 * How long an assigned job may wait for its daemon to pick it up (poll or
 * stream ack), and a polled job for the daemon's first report on it.
 */
export const PICKUP_SECONDS = LIVE_WINDOW_SECONDS;

/**
 * How long after its assignment a job may wait while its daemon says it prepares it (its image
 * pulled: JobPreparing on a stream, POST /api/jobs/{id}/preparing after a legacy poll; each notice
 * good for a pickup window) before it runs. Past it the job goes to another provider as never picked
 * up; the daemons give up a little sooner (daemon.ts PREPARE_WAIT_MS, svc_daemon.py PREPARE_WAIT_SECONDS).
 */
export const PREPARE_LIMIT_SECONDS = 30 * 60;

/** Why a job counts as never picked up, when it does (row locked, database clock). */
function unclaimedWhy(job: LockedJob): string | undefined {
  const since = (at: Date | null) => (at === null ? 0 : new Date(job.db_now).getTime() - new Date(at).getTime());
  // Handed out: assigned (a stream daemon accepts it), or polled (a legacy daemon's first report confirms it).
  const polled = job.status === "running" && job.acked_at === null;
  if (!(job.status === "pending" || polled) || since(polled ? job.started_at : job.assigned_at) < PICKUP_SECONDS * 1000) return undefined;
  if (job.preparing_at === null) {
    return polled
      ? `provider ${job.provider_id} polled the job but sent no report on it within ${PICKUP_SECONDS} seconds (the answer may not have reached its daemon)`
      : `provider ${job.provider_id} did not pick the job up within ${PICKUP_SECONDS} seconds`;
  }
  if (since(job.assigned_at) >= PREPARE_LIMIT_SECONDS * 1000) {
    return `provider ${job.provider_id} was still preparing the job ${PREPARE_LIMIT_SECONDS / 60} minutes after it was assigned (${job.progress_phase ?? "no detail"})`;
  }
  if (since(job.preparing_at) >= PICKUP_SECONDS * 1000) {
    return `provider ${job.provider_id} said it was preparing the job, then nothing for ${PICKUP_SECONDS} seconds`;
  }
  return undefined;
}

/**
 * The jobs releaseUnclaimed looks at, oldest first. A job is assigned after it
 * was submitted, so the bound on submitted_at changes nothing but lets the read
 * take a range of admin_jobs_status_idx instead of every pending job. The window
 * is SQL text, not a parameter: a generic plan, blind to it, read them all again.
 */
export function unclaimedSql(db: Db, limit: number) {
  const cutoff = db.unsafe(`now() - interval '${PICKUP_SECONDS} seconds'`);
  const prepareCutoff = db.unsafe(`now() - interval '${PREPARE_LIMIT_SECONDS} seconds'`);
  // None within a pickup window of an outage of the platform's own (platform-pulse.ts).
  const up = upForSql(db, PICKUP_SECONDS);
  return db<{ id: number }[]>`
    (SELECT id, assigned_at AS since FROM jobs WHERE status = 'pending' AND submitted_at < ${cutoff} AND assigned_at < ${cutoff} AND ${up}
       AND (preparing_at IS NULL OR preparing_at < ${cutoff} OR assigned_at < ${prepareCutoff}))
    UNION ALL
    (SELECT id, started_at FROM jobs WHERE status = 'running' AND acked_at IS NULL AND started_at < ${cutoff} AND ${up}
       AND (preparing_at IS NULL OR preparing_at < ${cutoff} OR assigned_at < ${prepareCutoff}))
    ORDER BY since LIMIT ${limit}`;
}

/**
 * Jobs their live provider never picked up: pending ones it did not take, and
 * running ones it polled without a report since (the poll's answer may never
 * have reached the daemon: job-reports.ts pollJob). The provider's fault
 * (not_picked_up): the job goes to another provider (this one is skipped for
 * it from now on) or, past the attempt limit, fails; nothing is charged.
 */
export async function releaseUnclaimed(sql: Sql, limit = 100): Promise<{ requeued: number; failed: number }> {
  const ids = await unclaimedSql(sql, limit);
  const out = { requeued: 0, failed: 0 };
  for (const { id } of ids) {
    const lost = await sql.begin(async (tx) => {
      const [job] = await tx<LockedJob[]>`SELECT *, now() AS db_now FROM jobs WHERE id = ${id} FOR UPDATE`;
      const why = job && unclaimedWhy(job);
      if (!why) return undefined;
      const r = await loseJobLocked(tx, job, "not_picked_up", why);
      return { r, providerId: job.provider_id! };
    });
    if (!lost) continue;
    if (lost.r === "requeued") {
      out.requeued++;
      await placeJobs(sql, [id]);
    } else out.failed++;
    await refreshReputation(sql, [lost.providerId]);
  }
  return out;
}

/**
 * Ends a running job past its max_duration_seconds (the sweep; row locked and
 * re-checked), unless something else ended it first. The renter's timeout, the
 * limit it set: the time used is paid (settlement.ts endLocked). Unless the
 * server's records say the provider failed it (job-end.ts judgeTimeout: a
 * serving job that never reported its endpoint, or whose endpoint had been
 * failing the health probe for longer than the grace, served nothing): then it is the
 * provider's failure (provider_error), re-queued at no charge or, like any
 * provider fault, failed with the hold back (loseJobLocked). A pending job, or
 * a polled one its daemon never confirmed, is not timed out (settlement.ts
 * overdueJobIds). Returns the provider to refill and what became of the job;
 * the caller places a re-queued job and, after a provider fault, refreshes the
 * provider's reliability.
 */
export async function timeOutJob(tx: Tx, id: number): Promise<{ providerId: number; outcome: "timeout" | "requeued" | "failed" } | undefined> {
  const job = await lockJobById(tx, id);
  if (!job || job.status !== "running" || job.acked_at === null || job.provider_id === null) return undefined;
  if (job.timeout_at === null || new Date(job.timeout_at) > new Date(job.db_now)) return undefined;
  const providerId = job.provider_id;
  const run = {
    jobType: job.job_type,
    ranSeconds: runSeconds(job),
    maxDurationSeconds: job.max_duration_seconds,
    endpointReported: job.endpoint_url !== null,
    endpointHealth: endpointHealthOf(job),
  };
  const judged = judgeTimeout(run, false);
  if (judged.fault === "provider") {
    return { providerId, outcome: await loseJobLocked(tx, job, judged.reason, `provider ${providerId} failed the job: ${judged.error}`) };
  }
  await endLocked(tx, job, "failed", { reason: "timeout", error: `exceeded max_duration_seconds (${job.max_duration_seconds} s)` });
  return { providerId, outcome: "timeout" };
}

/** Jobs held by providers that are no longer live (the worker's safety net). */
export async function providersWithLostJobs(db: Db, limit = 100): Promise<number[]> {
  const rows = await db<{ id: number }[]>`
    SELECT DISTINCT p.id FROM jobs j JOIN providers p ON p.id = j.provider_id
    WHERE j.status IN ('pending', 'running') AND NOT ${liveSql(db)} AND ${upForSql(db, LIVE_WINDOW_SECONDS)}
    LIMIT ${limit}`;
  return rows.map((r) => r.id);
}

// ---- why a job waits ----

export interface QueueReason {
  code: string;
  reason: string;
}

/**
 * 1-based place of a queued job in dispatch order (priority, then submit time), among the jobs that
 * dispatch would give a provider: the queued jobs of suspended renters ahead of it are not counted
 * (renterActiveSql; they wait until an unsuspension puts them back in line).
 */
export async function queuePosition(db: Db, id: number): Promise<number> {
  return (await queuePositions(db, [id])).get(id) ?? 1;
}

/**
 * queuePosition of several queued jobs (a page of them) in one pass over the queue's index, up to the
 * last of them: counting each one's jobs ahead on its own read the queue once per job, so a page of
 * 50 jobs at the back of a queue of 1,484 joined 72,925 rows (19 ms, growing with the queue times the
 * page; 1–2 ms in one pass). A job no longer queued has no place.
 */
export async function queuePositions(db: Db, ids: number[]): Promise<Map<number, number>> {
  return new Map([...(await queuePlaces(db, ids))].map(([id, p]) => [id, p.position]));
}

/** A queued job's place, and whether its renter is suspended (its jobs wait whatever their place). */
interface QueuePlace {
  position: number;
  suspended: boolean;
}

/** queuePositions, with each job's renter's suspension read in the same statement. */
async function queuePlaces(db: Db, ids: number[]): Promise<Map<number, QueuePlace>> {
  const rows = await db<{ id: number; pos: number; suspended: boolean }[]>`
    WITH mine AS MATERIALIZED (
      SELECT id, priority, submitted_at, (SELECT r.status = 'suspended' FROM renters r WHERE r.id = j.renter_id) AS suspended
      FROM jobs j WHERE id = ANY(${ids}::bigint[]) AND status = 'queued'
    ), last AS MATERIALIZED (
      SELECT priority, submitted_at, id FROM mine ORDER BY priority DESC, submitted_at DESC, id DESC LIMIT 1
    ), held AS MATERIALIZED (
      -- The queued jobs of suspended renters (renterActiveSql's rule) up to the last, left out of the places:
      -- read through the few suspended renters (migration 062), not by a renter read per queued job.
      SELECT j.priority, j.submitted_at, j.id FROM renters r JOIN jobs j ON j.renter_id = r.id
      WHERE r.status = 'suspended' AND j.status = 'queued'
        AND (j.priority, j.submitted_at, j.id) <= ((SELECT priority FROM last), (SELECT submitted_at FROM last), (SELECT id FROM last))
    )
    SELECT q.id, q.pos - (SELECT count(*) FROM held h WHERE (h.priority, h.submitted_at, h.id) < (q.priority, q.submitted_at, q.id)) AS pos,
           mine.suspended FROM (
      SELECT j.id, j.priority, j.submitted_at, row_number() OVER (ORDER BY j.priority, j.submitted_at, j.id) AS pos
      FROM jobs j WHERE j.status = 'queued'
        -- As three values, so that the bound is the queue index's range, not a filter.
        AND (j.priority, j.submitted_at, j.id) <= ((SELECT priority FROM last), (SELECT submitted_at FROM last), (SELECT id FROM last))
    ) q JOIN mine ON mine.id = q.id`;
  return new Map(rows.map((r) => [Number(r.id), { position: Number(r.pos), suspended: r.suspended }]));
}

function describeRequirements(req: Record<string, unknown> | null): string {
  const parts: string[] = [];
  if (req?.min_vram_gb !== undefined) parts.push(`≥ ${req.min_vram_gb} GB VRAM`);
  if (req?.gpu_model !== undefined) parts.push(`a GPU model matching '${req.gpu_model}'`);
  return parts.length ? ` with ${parts.join(" and ")}` : "";
}

/** What a provider's daemon declared it runs, for a message that names why it was passed over. */
export const declaredTypes = (types: readonly string[] | null) => `its daemon runs ${types?.length ? types.join(", ") : "any job type"}`;

const plural = (n: number, word: string) => `${n} ${word}${n === 1 ? "" : "s"}`;
const allOf = (n: number, verb: string) =>
  n === 1 ? `the only matching provider is ${verb}` : n > EXPLAIN_CAP ? `all of the ${EXPLAIN_CAP.toLocaleString("en-US")}+ matching providers looked at are ${verb}` : `all ${n} matching providers are ${verb}`;

/**
 * How many live providers that fit a job explainQueue looks at: the reason is
 * read on every poll of a queued job and for each one GET /api/jobs lists, so
 * its cost must not grow with the fleet. Past this many, counts read "N+".
 */
export const EXPLAIN_CAP = 1000;

/** What explainQueue reads of the providers for a job: the requested one, or counts over those that fit. */
type Standing = { pinned: PinnedProvider | undefined } | { counts: { fit: number; live: number; available: number; free: number } };
type PinnedProvider = {
  live: boolean; approval_status: string; status: string; paused: boolean; in_window: boolean; busy: number; slots: number; fits: boolean;
  runs_type: boolean; supported_job_types: string[] | null; scheduled_start: string | null; scheduled_end: string | null; task_key_mismatch: string | null; daemon_version: string | null;
};

async function standingOf(db: Db, job: JobSummaryRow): Promise<Standing> {
  if (job.requested_provider_id !== null) {
    const id = job.requested_provider_id;
    const [p] = await db<PinnedProvider[]>`
      SELECT ${liveSql(db)} AS live, p.approval_status, p.status, (p.is_paused OR p.status = 'paused') AS paused, p.task_key_mismatch, p.daemon_version,
             ${runWindowSql(db)} AS in_window, ${busySql(db)} AS busy, ${slotsSql(db)} AS slots,
             p.scheduled_start, p.scheduled_end, p.supported_job_types,
             (SELECT ${hardwareFitSql(db)} FROM jobs j WHERE j.id = ${job.id}) AS fits,
             (SELECT ${jobTypeFitSql(db)} FROM jobs j WHERE j.id = ${job.id}) AS runs_type
      FROM providers p WHERE p.id = ${id}`;
    return { pinned: p };
  }
  const [c] = await db<{ fit: number; live: number; available: number; free: number }[]>`${standingCountsSql(db, job.id)}`;
  return { counts: { fit: Number(c.fit), live: Number(c.live), available: Number(c.available), free: Number(c.free) } };
}

/**
 * The counts of a job's standing, over at most EXPLAIN_CAP + 1 live providers that fit (see
 * EXPLAIN_CAP); the live ones are found through providers_live_idx (migration 037).
 */
export const standingCountsSql = (db: Db, jobId: number) => db`
    SELECT count(*)::bigint AS fit,
           count(*) FILTER (WHERE ${matchesSql(db)})::bigint AS live,
           count(*) FILTER (WHERE ${availableSql(db)} AND ${matchesSql(db)})::bigint AS available,
           count(*) FILTER (WHERE ${availableSql(db)} AND ${matchesSql(db)} AND ${busySql(db)} < ${slotsSql(db)})::bigint AS free
    FROM jobs j, LATERAL (
      SELECT p.* FROM providers p WHERE ${liveSql(db)} AND ${fitSql(db)} LIMIT ${EXPLAIN_CAP + 1}
    ) p
    WHERE j.id = ${jobId}`;

/**
 * Jobs whose standing is the same: a first attempt's depends only on the provider it asked for, its
 * job type and its gpu_requirements (a later attempt's also on the providers that declined it, so it has none).
 */
function standingKey(job: JobSummaryRow): string | undefined {
  if (job.attempt !== 1) return undefined;
  const r = job.gpu_requirements;
  return JSON.stringify([job.requested_provider_id, job.job_type, r?.min_vram_gb ?? null, r?.gpu_model ?? null]);
}

/** The reason, from the standing, the number of queued jobs ahead and whether the job's renter is suspended. */
function reasonOf(job: JobSummaryRow, standing: Standing, ahead: number, renterSuspended: boolean): QueueReason {
  if (renterSuspended) {
    return { code: "renter_suspended", reason: "the account is suspended: its jobs are given to no provider until an operator unsuspends it" };
  }
  const aheadText = ahead > 0 ? `; ${plural(ahead, "job")} ahead in the queue` : "";
  if ("pinned" in standing) {
    const id = job.requested_provider_id;
    const p = standing.pinned;
    if (!p || p.approval_status !== "approved" || p.status === "suspended") {
      return { code: "provider_unavailable", reason: `requested provider ${id} is not approved for jobs` };
    }
    if (p.task_key_mismatch) return { code: "provider_cannot_verify_tasks", reason: `requested provider ${id} cannot take jobs: ${p.task_key_mismatch}` };
    if (belowMinimum(p.daemon_version)) {
      return {
        code: "provider_daemon_outdated",
        reason: `requested provider ${id} runs daemon ${p.daemon_version}, below the minimum ${daemonPolicy.minVersion}; it is given jobs once its daemon has updated itself`,
      };
    }
    if (!p.live) return { code: "provider_offline", reason: `requested provider ${id} is offline (no heartbeat in the last 120 seconds)` };
    if (!p.fits) return { code: "provider_mismatch", reason: `requested provider ${id} does not meet the job's gpu_requirements` };
    if (!p.runs_type) {
      return { code: "provider_unsupported_job_type", reason: `requested provider ${id} does not run ${job.job_type} jobs (${declaredTypes(p.supported_job_types)})` };
    }
    if (p.paused) return { code: "provider_paused", reason: `requested provider ${id} is paused` };
    if (!p.in_window) {
      return { code: "provider_outside_schedule", reason: `requested provider ${id} is outside its scheduled window (${p.scheduled_start ?? "?"}-${p.scheduled_end ?? "?"} UTC)` };
    }
    if (p.busy >= p.slots) return { code: "provider_busy", reason: `requested provider ${id} is busy (${p.busy} of ${plural(p.slots, "GPU")} running jobs)${aheadText}` };
    return { code: "waiting_for_dispatch", reason: `requested provider ${id} has a free GPU; the job is being assigned${aheadText}` };
  }
  const c = standing.counts;
  const live = c.live;
  const available = c.available;
  if (c.fit === 0) {
    return { code: "no_matching_provider", reason: `no approved provider that runs ${job.job_type} jobs${describeRequirements(job.gpu_requirements)} is online` };
  }
  if (live === 0) {
    return { code: "providers_declined", reason: `every online provider that fits declined this job, did not start it, or had it taken off by an admin; waiting for another` };
  }
  if (available === 0) {
    return { code: "providers_paused", reason: allOf(live, "paused or outside scheduled hours") };
  }
  if (c.free === 0) return { code: "providers_busy", reason: `${allOf(available, "busy")}${aheadText}` };
  return { code: "waiting_for_dispatch", reason: `a matching provider has a free GPU; the job is being assigned${aheadText}` };
}

/** Why a queued job is still waiting, answered on submit and every read. */
export async function explainQueue(db: Db, job: JobSummaryRow): Promise<QueueReason> {
  const [places, standing] = await Promise.all([queuePlaces(db, [job.id]), standingOf(db, job)]);
  const place = places.get(job.id);
  return reasonOf(job, standing, (place?.position ?? 1) - 1, place?.suspended ?? false);
}

/** A queued job's reason for waiting, and its 1-based place in the queue. */
export interface QueueStanding {
  reason: QueueReason;
  position: number;
}

/**
 * explainQueue for several queued jobs (a page of GET /api/jobs, a submit batch's queued jobs), with
 * their places: the places in one read, and each standing read once for the jobs that share it,
 * instead of two reads per job. Jobs not queued are left out.
 */
export async function queueStandings(db: Db, jobs: JobSummaryRow[]): Promise<Map<number, QueueStanding>> {
  const queued = jobs.filter((j) => j.status === "queued");
  const out = new Map<number, QueueStanding>();
  if (queued.length === 0) return out;
  const places = await queuePlaces(db, queued.map((j) => j.id));
  const shared = new Map<string, Promise<Standing>>();
  await Promise.all(
    queued.map(async (job) => {
      const key = standingKey(job);
      let standing: Promise<Standing>;
      if (key === undefined) standing = standingOf(db, job);
      else {
        standing = shared.get(key) ?? standingOf(db, job);
        shared.set(key, standing);
      }
      const place = places.get(job.id);
      const position = place?.position ?? 1;
      out.set(job.id, { reason: reasonOf(job, await standing, position - 1, place?.suspended ?? false), position });
    }),
  );
  return out;
}

/** explainQueue for the queued jobs of a page (GET /api/jobs): queueStandings' reasons. */
export async function explainQueues(db: Db, jobs: JobSummaryRow[]): Promise<Map<number, QueueReason>> {
  return new Map([...(await queueStandings(db, jobs))].map(([id, s]) => [id, s.reason]));
}
