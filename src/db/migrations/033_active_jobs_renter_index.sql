-- A renter's active jobs, counted for the total of GET /api/jobs (jobCountSql in
-- src/domain/accounts/renters.ts: ended jobs come from counters, active ones
-- are counted). Found with the history bench: under a generic plan (which
-- prepared statements switch to) `status = ANY($n)` was a filter, not an index
-- condition, so a renter with a million ended jobs had each of them read to
-- count its few active ones (300 ms for the first page). The count now names
-- the statuses as literals and reads this index, which holds active jobs only:
-- small, and cheap to keep (a job enters it at submit and leaves it when it
-- ends). Without a renter (the admin's total) it is the whole index.
CREATE INDEX jobs_renter_active_idx ON jobs (renter_id) WHERE status IN ('queued', 'pending', 'running');
