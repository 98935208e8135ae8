-- How much log text each job attempt holds (src/domain/jobs/job-reports.ts
-- appendLogs): besides the 10,000 lines, an attempt keeps at most
-- MAX_LOG_CHARS_PER_ATTEMPT characters of messages, so that one read of its
-- log (GET /api/jobs/{id}/logs, a watch's replay) is bounded in bytes too.
--   log_chars      characters of the attempt's stored messages (kept by the appends)
--   log_truncated  lines were dropped at a bound; later ones are dropped too
-- Attempts from before this count from 0.
ALTER TABLE job_attempts
  ADD COLUMN log_chars bigint NOT NULL DEFAULT 0,
  ADD COLUMN log_truncated boolean NOT NULL DEFAULT false;
