// Job totals as SQL: the total of GET /api/jobs (a renter's, a provider's,
// the admin's), of the operator's job list and of a renter's total_jobs (the
// dashboard reads job_ends itself). None counts the history: ended jobs come from
// counters kept by a trigger on jobs (migrations 030 and 042), so no code path
// can forget to bump them, and only the active jobs, few whatever the history,
// are counted.
import type { Db, Sql } from "../../db/index.js";
import { ACTIVE_STATUSES, TERMINAL_STATUSES } from "./job-row.js";

type Id = number | ReturnType<Sql>;

/** The statuses a job holding a provider can be in (a queued job has none). */
const HELD_STATUSES = ["pending", "running"] as const;

const literals = (db: Db, statuses: readonly string[]) => db.unsafe(statuses.map((s) => `'${s}'`).join(", "));

/**
 * How many jobs match, as a SQL expression (a bigint): one renter's or one
 * provider's (not both at once) or every renter's, in one status or all, of
 * one job type or all. Ended ones from renter_job_ends, provider_job_ends or
 * job_ends (the platform's: a few rows, not the sum of every renter's).
 */
export function jobCountSql(db: Db, f: { renterId?: Id; providerId?: Id; status?: string; jobType?: string }) {
  if (f.renterId !== undefined && f.providerId !== undefined) throw new Error("jobCountSql: a renter's or a provider's jobs, not both");
  const ended = !f.status || (TERMINAL_STATUSES as readonly string[]).includes(f.status);
  const active = !f.status || (ACTIVE_STATUSES as readonly string[]).includes(f.status);
  const owner =
    f.renterId !== undefined ? db`AND renter_id = ${f.renterId}` : f.providerId !== undefined ? db`AND provider_id = ${f.providerId}` : db``;
  const jobType = f.jobType === undefined ? db`` : db`AND job_type = ${f.jobType}`;
  const endedStatus = db`status = ANY(${f.status ? [f.status] : [...TERMINAL_STATUSES]}::text[])`;
  const counter = f.renterId !== undefined ? "renter_job_ends" : f.providerId !== undefined ? "provider_job_ends" : "job_ends";
  const endedSql = db`(SELECT coalesce(sum(jobs), 0) FROM ${db.unsafe(counter)} WHERE ${endedStatus} ${owner} ${jobType})`;
  // The active statuses as literals (constants), so that every plan, generic ones too, reads the
  // partial index of active jobs (a renter's, migration 033; a provider's, jobs_active_provider_idx)
  // instead of filtering the owner's whole history.
  const activeStatus = f.status
    ? db`status = ${f.status}`
    : db`status IN (${literals(db, f.providerId !== undefined ? HELD_STATUSES : ACTIVE_STATUSES)})`;
  const activeSql = db`(SELECT count(*) FROM jobs WHERE ${activeStatus} ${owner} ${jobType})`;
  return db`(${ended ? endedSql : db`0`} + ${active ? activeSql : db`0`})::bigint`;
}
