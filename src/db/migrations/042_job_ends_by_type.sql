-- Ended jobs counted by job type and by provider too. The operator's job list
-- filtered by job type (GET /api/admin/jobs?job_type=...) counted its total
-- over every job of that type ever submitted: 2.3 s at 10,000,000 jobs, on
-- every page; a provider's list (GET /api/jobs as a provider, the operator's
-- list by provider) counted every job the provider ever held. With the type
-- and the provider in the counters, each total is a counter plus the active
-- jobs, as it already was for the renter and status filters.
--
-- renter_job_ends gains the type; provider_job_ends counts a provider's ended
-- jobs (those it held last) by status and type. The platform's totals (the
-- dashboard, the operator's lists) get their own counter, job_ends, so that
-- they read a few rows instead of summing every renter's. It is kept in 16
-- shards, each connection writing its own (its backend pid's): jobs ending at
-- once on different connections do not wait for one row's lock, and a
-- transaction that ends many jobs holds one shard's rows, so two such
-- transactions do not lock shards in opposite orders. The count is the sum of
-- the shards; one shard may go below zero (an end undone on another
-- connection than the one that counted it).
--
-- All three are recounted from the jobs in one pass, with their writes held
-- meanwhile (the lock): a job that ended while the count ran would be counted
-- twice or not at all. Its time at 10,000,000 jobs is in docs/operations.md.
LOCK TABLE jobs IN SHARE ROW EXCLUSIVE MODE;

TRUNCATE renter_job_ends;
ALTER TABLE renter_job_ends
  ADD COLUMN job_type text NOT NULL,
  DROP CONSTRAINT renter_job_ends_pkey,
  ADD PRIMARY KEY (renter_id, status, job_type);

CREATE TABLE job_ends (
  status    text     NOT NULL CHECK (status IN ('completed', 'failed', 'cancelled')),
  job_type  text     NOT NULL,
  shard     smallint NOT NULL CHECK (shard >= 0 AND shard < 16),
  jobs      bigint   NOT NULL,
  PRIMARY KEY (status, job_type, shard)
);

CREATE TABLE provider_job_ends (
  provider_id bigint NOT NULL REFERENCES providers(id),
  status      text   NOT NULL CHECK (status IN ('completed', 'failed', 'cancelled')),
  job_type    text   NOT NULL,
  jobs        bigint NOT NULL CHECK (jobs >= 0),
  PRIMARY KEY (provider_id, status, job_type)
);

-- One pass: `counter` tells the grouping sets apart (GROUPING's bit per column not grouped).
CREATE TEMP TABLE ended_jobs_count ON COMMIT DROP AS
SELECT renter_id, provider_id, status, job_type, id % 16 AS shard, count(*) AS jobs,
       GROUPING(renter_id, provider_id, id % 16) AS counter
FROM jobs WHERE status IN ('completed', 'failed', 'cancelled')
GROUP BY GROUPING SETS ((renter_id, status, job_type), (provider_id, status, job_type), (status, job_type, id % 16));

INSERT INTO renter_job_ends (renter_id, status, job_type, jobs)
SELECT renter_id, status, job_type, jobs FROM ended_jobs_count WHERE counter = 3;
INSERT INTO provider_job_ends (provider_id, status, job_type, jobs)
SELECT provider_id, status, job_type, jobs FROM ended_jobs_count WHERE counter = 5 AND provider_id IS NOT NULL;
INSERT INTO job_ends (status, job_type, shard, jobs)
SELECT status, job_type, shard, jobs FROM ended_jobs_count WHERE counter = 6;

CREATE OR REPLACE FUNCTION jobs_count_ends() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP <> 'INSERT' AND OLD.status IN ('completed', 'failed', 'cancelled') THEN
    UPDATE renter_job_ends SET jobs = jobs - 1
    WHERE renter_id = OLD.renter_id AND status = OLD.status AND job_type = OLD.job_type;
    INSERT INTO job_ends (status, job_type, shard, jobs) VALUES (OLD.status, OLD.job_type, pg_backend_pid() % 16, -1)
    ON CONFLICT (status, job_type, shard) DO UPDATE SET jobs = job_ends.jobs - 1;
    IF OLD.provider_id IS NOT NULL THEN
      UPDATE provider_job_ends SET jobs = jobs - 1
      WHERE provider_id = OLD.provider_id AND status = OLD.status AND job_type = OLD.job_type;
    END IF;
  END IF;
  IF TG_OP <> 'DELETE' AND NEW.status IN ('completed', 'failed', 'cancelled') THEN
    INSERT INTO renter_job_ends (renter_id, status, job_type, jobs) VALUES (NEW.renter_id, NEW.status, NEW.job_type, 1)
    ON CONFLICT (renter_id, status, job_type) DO UPDATE SET jobs = renter_job_ends.jobs + 1;
    INSERT INTO job_ends (status, job_type, shard, jobs) VALUES (NEW.status, NEW.job_type, pg_backend_pid() % 16, 1)
    ON CONFLICT (status, job_type, shard) DO UPDATE SET jobs = job_ends.jobs + 1;
    IF NEW.provider_id IS NOT NULL THEN
      INSERT INTO provider_job_ends (provider_id, status, job_type, jobs) VALUES (NEW.provider_id, NEW.status, NEW.job_type, 1)
      ON CONFLICT (provider_id, status, job_type) DO UPDATE SET jobs = provider_job_ends.jobs + 1;
    END IF;
  END IF;
  RETURN NULL;
END $$;

-- An ended job whose type or provider were changed moves between counters like one whose renter changed.
DROP TRIGGER jobs_count_ends ON jobs;
CREATE TRIGGER jobs_count_ends AFTER UPDATE OF status, renter_id, job_type, provider_id ON jobs FOR EACH ROW
  WHEN ((OLD.status IS DISTINCT FROM NEW.status OR OLD.renter_id IS DISTINCT FROM NEW.renter_id OR OLD.job_type IS DISTINCT FROM NEW.job_type
         OR OLD.provider_id IS DISTINCT FROM NEW.provider_id)
        AND (OLD.status IN ('completed', 'failed', 'cancelled') OR NEW.status IN ('completed', 'failed', 'cancelled')))
  EXECUTE FUNCTION jobs_count_ends();
