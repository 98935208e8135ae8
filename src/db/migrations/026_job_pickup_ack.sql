-- A running job's provider confirmed it has the job (src/domain/jobs/job-reports.ts):
-- a stream daemon's accept, or a legacy daemon's first report on a job it polled
-- (progress, logs, endpoint-ready, result, a daemon event naming it). The poll
-- marks a job running before its answer reaches the daemon; an answer lost on
-- the way leaves it running with acked_at NULL, which bills nothing and goes
-- back to the queue after the pickup window (not_picked_up). NULL while queued
-- or pending; cleared when the job is re-queued.
ALTER TABLE jobs ADD COLUMN acked_at timestamptz;

-- Jobs running when this runs were picked up under the earlier rule: confirmed.
UPDATE jobs SET acked_at = coalesce(started_at, now()) WHERE status = 'running';

-- The pickup sweep looks for running jobs nobody confirmed.
CREATE INDEX jobs_running_unacked_idx ON jobs (started_at) WHERE status = 'running' AND acked_at IS NULL;
