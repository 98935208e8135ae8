-- The platform's figures per UTC day (GET /api/admin/daily; the operator
-- console reads 14 days of them every 30 s). Read from the rows, 14 days took
-- 11 s at 10,000,000 jobs: the completed jobs were found by reading every job
-- (their completion time had no index) and the days' charges by reading the
-- ledger whole. A day that is over is final: the first report that asks for it
-- writes it here (src/domain/money/daily-reports.ts), and the days still open
-- are read from the rows through the indexes.
CREATE TABLE platform_days (
  day date PRIMARY KEY,
  jobs bigint NOT NULL,
  completed_jobs bigint NOT NULL,
  revenue_halala bigint NOT NULL,
  fees_halala bigint NOT NULL,
  written_at timestamptz NOT NULL DEFAULT now()
);

-- Completed jobs by when they completed: an open day's count.
CREATE INDEX jobs_completed_at_idx ON jobs (completed_at) WHERE status = 'completed';
