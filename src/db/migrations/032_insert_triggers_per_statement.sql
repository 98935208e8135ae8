-- A submit batch inserts its jobs, and their attempt rows, with one statement
-- each; two row-level triggers then ran once per row: the provider's load
-- count (migration 005), one INSERT ... ON CONFLICT per job, and the job-watch
-- notice of each attempt (migration 019). On inserts both now run once per
-- statement over its new rows (a transition table): one load update per
-- provider and one pass for the notices. Updates keep their row-level
-- triggers (a transition table cannot be limited to the columns those watch).

DROP TRIGGER jobs_provider_load ON jobs;
CREATE TRIGGER jobs_provider_load AFTER UPDATE OF status, provider_id ON jobs
  FOR EACH ROW EXECUTE FUNCTION jobs_provider_load();

CREATE FUNCTION jobs_provider_load_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  -- In provider order, the order every path locks load rows in.
  INSERT INTO provider_load (provider_id, active)
  SELECT provider_id, count(*) FROM new_jobs
  WHERE provider_id IS NOT NULL AND status IN ('pending', 'running')
  GROUP BY provider_id ORDER BY provider_id
  ON CONFLICT (provider_id) DO UPDATE SET active = provider_load.active + EXCLUDED.active;
  RETURN NULL;
END $$;

CREATE TRIGGER jobs_provider_load_inserted AFTER INSERT ON jobs
  REFERENCING NEW TABLE AS new_jobs FOR EACH STATEMENT EXECUTE FUNCTION jobs_provider_load_inserted();

DROP TRIGGER job_attempts_watch ON job_attempts;
CREATE TRIGGER job_attempts_watch AFTER UPDATE ON job_attempts FOR EACH ROW
  EXECUTE FUNCTION job_watch_notify_attempt();

CREATE FUNCTION job_watch_notify_attempts_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('svc_job_watch', n.job_id::text) FROM new_attempts n;
  RETURN NULL;
END $$;

CREATE TRIGGER job_attempts_watch_inserted AFTER INSERT ON job_attempts
  REFERENCING NEW TABLE AS new_attempts FOR EACH STATEMENT EXECUTE FUNCTION job_watch_notify_attempts_inserted();
