-- Jobs each renter submitted per UTC day, for the daily_jobs_limit quota read
-- at every submit. Counting the renter's jobs of the day instead visited each
-- of them: the busier a renter's day, the slower each of its submits (a
-- renter with 50 jobs today made the quota read a third of a submit batch's
-- database time). Kept by a statement trigger on jobs, so every way a job row
-- is written counts, one upsert per renter and day per statement.
CREATE TABLE renter_daily_jobs (
  renter_id  bigint NOT NULL REFERENCES renters(id),
  day        date   NOT NULL,
  jobs       bigint NOT NULL CHECK (jobs >= 0),
  PRIMARY KEY (renter_id, day)
);

CREATE FUNCTION jobs_count_daily() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO renter_daily_jobs (renter_id, day, jobs)
  SELECT renter_id, (submitted_at AT TIME ZONE 'UTC')::date, count(*) FROM new_jobs GROUP BY 1, 2
  ORDER BY 1, 2
  ON CONFLICT (renter_id, day) DO UPDATE SET jobs = renter_daily_jobs.jobs + EXCLUDED.jobs;
  RETURN NULL;
END $$;

CREATE TRIGGER jobs_count_daily AFTER INSERT ON jobs
  REFERENCING NEW TABLE AS new_jobs FOR EACH STATEMENT EXECUTE FUNCTION jobs_count_daily();

-- The backfill comes after the trigger: creating it locks jobs against inserts until this migration
-- commits, so a job another process inserts meanwhile is counted once, by the trigger, after this.
INSERT INTO renter_daily_jobs (renter_id, day, jobs)
SELECT renter_id, (submitted_at AT TIME ZONE 'UTC')::date, count(*) FROM jobs GROUP BY 1, 2;
