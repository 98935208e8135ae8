-- Jobs: what dispatch, settlement and the timeout worker need beyond 001.

-- Why a job ended (result, timeout, cancelled, provider_lost, rejected, admin):
-- a repeated job-result after a result is answered with the same figures,
-- one after a timeout or cancel is refused.
ALTER TABLE jobs ADD COLUMN end_reason text;
-- Billable minutes of a settled job (answered again on a repeated job-result).
ALTER TABLE jobs ADD COLUMN actual_minutes bigint;
-- Job status moves are guarded by a CHECK of consistency: a pending or
-- running job has a provider, a queued one has none.
ALTER TABLE jobs ADD CONSTRAINT jobs_provider_when_assigned
  CHECK ((status IN ('pending','running')) = (provider_id IS NOT NULL) OR status IN ('completed','failed','cancelled'));

-- Dispatch order is priority, then submit time; id breaks ties.
DROP INDEX IF EXISTS jobs_queue_idx;
CREATE INDEX jobs_queue_idx ON jobs (priority, submitted_at, id) WHERE status = 'queued';
-- Busy slots of a provider (one running job per GPU).
CREATE INDEX jobs_active_provider_idx ON jobs (provider_id) WHERE status IN ('pending','running');
-- The timeout worker's scan.
CREATE INDEX jobs_timeout_idx ON jobs (timeout_at) WHERE status IN ('pending','running');
-- GET /api/jobs?status= for a renter.
CREATE INDEX jobs_renter_status_idx ON jobs (renter_id, status, submitted_at DESC);

-- Every provider that ever held an attempt may read the job.
CREATE INDEX job_attempts_provider_idx ON job_attempts (provider_id, job_id);
ALTER TABLE job_attempts ADD COLUMN error text;

-- Busy slots per provider (one row per provider), kept by a trigger on every
-- job status move so that dispatch reads one row instead of counting jobs.
-- The row is also the provider's dispatch lock: assignments to a provider
-- happen only while holding it FOR UPDATE (src/domain/dispatch/dispatch.ts), and the
-- lock re-reads `active`, so "one running job per GPU" holds under concurrency.
CREATE TABLE provider_load (
  provider_id  bigint PRIMARY KEY REFERENCES providers(id),
  active       integer NOT NULL DEFAULT 0 CHECK (active >= 0)
);
INSERT INTO provider_load (provider_id, active)
SELECT p.id, (SELECT count(*) FROM jobs j WHERE j.provider_id = p.id AND j.status IN ('pending','running'))
FROM providers p;

CREATE FUNCTION providers_open_load() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO provider_load (provider_id) VALUES (NEW.id) ON CONFLICT DO NOTHING;
  RETURN NULL;
END $$;
CREATE TRIGGER providers_open_load AFTER INSERT ON providers
  FOR EACH ROW EXECUTE FUNCTION providers_open_load();

CREATE FUNCTION jobs_provider_load() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  was_active boolean := TG_OP = 'UPDATE' AND OLD.provider_id IS NOT NULL AND OLD.status IN ('pending','running');
  is_active  boolean := NEW.provider_id IS NOT NULL AND NEW.status IN ('pending','running');
BEGIN
  IF was_active AND (NOT is_active OR NEW.provider_id <> OLD.provider_id) THEN
    UPDATE provider_load SET active = active - 1 WHERE provider_id = OLD.provider_id;
  END IF;
  IF is_active AND (NOT was_active OR NEW.provider_id <> OLD.provider_id) THEN
    INSERT INTO provider_load (provider_id, active) VALUES (NEW.provider_id, 1)
    ON CONFLICT (provider_id) DO UPDATE SET active = provider_load.active + 1;
  END IF;
  RETURN NULL;
END $$;

CREATE TRIGGER jobs_provider_load AFTER INSERT OR UPDATE OF status, provider_id ON jobs
  FOR EACH ROW EXECUTE FUNCTION jobs_provider_load();
