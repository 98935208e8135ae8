-- Live job events (WatchJob, GET /api/jobs/{id}/events): every change a
-- watcher sees is announced on one channel, 'svc_job_watch', with the job's
-- internal id as payload. Triggers rather than calls in each code path, so
-- every way a job changes (reports, settlement, cancel, sweeps, admin, any
-- process) is heard; watchers' processes then read the change once per job.
-- PostgreSQL folds identical notices of one transaction into one, so a
-- transaction touching the job, its attempt and its logs sends one notice.
CREATE FUNCTION job_watch_notify_job() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('svc_job_watch', NEW.id::text);
  RETURN NULL;
END $$;

CREATE FUNCTION job_watch_notify_attempt() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('svc_job_watch', NEW.job_id::text);
  RETURN NULL;
END $$;

-- Only what a watcher is shown: not every updated_at or hold extension.
CREATE TRIGGER jobs_watch AFTER UPDATE ON jobs FOR EACH ROW
  WHEN (OLD.status IS DISTINCT FROM NEW.status
     OR OLD.progress_pct IS DISTINCT FROM NEW.progress_pct
     OR OLD.progress_phase IS DISTINCT FROM NEW.progress_phase
     OR OLD.attempt IS DISTINCT FROM NEW.attempt
     OR OLD.provider_id IS DISTINCT FROM NEW.provider_id
     OR OLD.end_reason IS DISTINCT FROM NEW.end_reason)
  EXECUTE FUNCTION job_watch_notify_job();

CREATE TRIGGER job_attempts_watch AFTER INSERT OR UPDATE ON job_attempts FOR EACH ROW
  EXECUTE FUNCTION job_watch_notify_attempt();

-- Log lines arrive in batches: one notice per job per statement.
CREATE FUNCTION job_logs_watch_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('svc_job_watch', n.job_id::text) FROM (SELECT DISTINCT job_id FROM new_logs) n;
  RETURN NULL;
END $$;

CREATE TRIGGER job_logs_watch AFTER INSERT ON job_logs
  REFERENCING NEW TABLE AS new_logs FOR EACH STATEMENT EXECUTE FUNCTION job_logs_watch_notify();
