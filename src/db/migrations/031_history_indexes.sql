-- Indexes for two reads whose cost grew with the history (found with EXPLAIN
-- on the history bench, bench/history.ts; before and after in
-- docs/benchmarks.md). Both replace an index of the same table, so writes
-- maintain as many index entries as before. CREATE INDEX on these tables
-- holds their writes while it builds, at start: its time at 10,000,000 jobs
-- is in docs/benchmarks.md.

-- 1. A provider's jobs newest first (GET /api/jobs as a provider, the recent
-- jobs of GET /api/providers/me). With (provider_id, status) PostgreSQL either
-- read every job the provider ever held and sorted them, or walked all jobs
-- newest first until it had found enough of this provider's. The status rides
-- along, so counting a provider's jobs of one status stays an index-only scan
-- as it was; reads by provider and an active status keep
-- jobs_active_provider_idx (migration 005).
CREATE INDEX jobs_provider_submitted_idx ON jobs (provider_id, submitted_at DESC, id DESC) INCLUDE (status);
DROP INDEX jobs_provider_idx;

-- 2. Reliability counts each provider's attempts of the last 30 days by fault
-- (src/domain/providers/reputation.ts), for up to 1,000 providers per liveness
-- sweep and on heartbeats. The index found them but each was read from the
-- table (a page per attempt); with the columns the count reads in the index,
-- it is an index-only scan.
CREATE INDEX job_attempts_provider_ended_cover_idx ON job_attempts (provider_id, ended_at) INCLUDE (fault, started_at)
  WHERE fault IS NOT NULL;
DROP INDEX job_attempts_provider_ended_idx;
