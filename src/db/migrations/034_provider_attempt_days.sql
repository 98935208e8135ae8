-- Each provider's ended job attempts per UTC day, by what they count for in its
-- reliability score (src/domain/providers/reputation.ts): carried (completed,
-- or ended by the renter's fault after it ran) or the provider's fault.
-- Reliability read every attempt the provider ended in the last 30 days, for
-- up to 1,000 providers per liveness sweep and on heartbeats, so its cost
-- followed the fleet's recent activity (found with the history bench,
-- bench/history.ts: 1.5x the empty database's at 170 attempts per provider).
-- It now reads at most 30 index entries per provider.
--
-- Kept by triggers, so every way an attempt is written counts; the trigger is
-- created before the backfill, which holds writes to job_attempts until this
-- migration commits, so each attempt is counted once. Attempts end only in
-- settlement.ts and dispatch.ts (re-queue), each with its job row locked and
-- before any other attempt row of that transaction, so the provider's day row,
-- written there, adds no lock order of its own. The backfill counts every ended
-- attempt (a scan of job_attempts; its time at 10,000,000 jobs is in
-- docs/benchmarks.md), so every day's row agrees with the attempts it counts.
CREATE TABLE provider_attempt_days (
  provider_id  bigint  NOT NULL REFERENCES providers(id) ON DELETE CASCADE,
  day          date    NOT NULL,
  carried      integer NOT NULL CHECK (carried >= 0),
  faults       integer NOT NULL CHECK (faults >= 0),
  -- The counts ride in the key's index, so the score's read of a provider's
  -- 30 days is an index-only scan: a provider's days are appended one a day,
  -- so read from the table they sit on 30 pages.
  PRIMARY KEY (provider_id, day) INCLUDE (carried, faults)
);

-- What one attempt row adds: nothing unless it has ended with a fault decided;
-- platform faults and unattributed ends count neither way.
CREATE FUNCTION attempt_outcome(fault text, started_at timestamptz, OUT carried integer, OUT faults integer)
LANGUAGE sql IMMUTABLE AS $$
  SELECT (fault = 'none' OR (fault = 'renter' AND started_at IS NOT NULL))::int, (fault = 'provider')::int
$$;

CREATE FUNCTION job_attempts_count_days() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  o record;
BEGIN
  IF TG_OP <> 'INSERT' AND OLD.fault IS NOT NULL AND OLD.ended_at IS NOT NULL AND OLD.provider_id IS NOT NULL THEN
    SELECT * INTO o FROM attempt_outcome(OLD.fault, OLD.started_at);
    IF o.carried + o.faults > 0 THEN
      UPDATE provider_attempt_days SET carried = carried - o.carried, faults = faults - o.faults
      WHERE provider_id = OLD.provider_id AND day = (OLD.ended_at AT TIME ZONE 'UTC')::date;
    END IF;
  END IF;
  IF TG_OP <> 'DELETE' AND NEW.fault IS NOT NULL AND NEW.ended_at IS NOT NULL AND NEW.provider_id IS NOT NULL THEN
    SELECT * INTO o FROM attempt_outcome(NEW.fault, NEW.started_at);
    IF o.carried + o.faults > 0 THEN
      INSERT INTO provider_attempt_days (provider_id, day, carried, faults)
      VALUES (NEW.provider_id, (NEW.ended_at AT TIME ZONE 'UTC')::date, o.carried, o.faults)
      ON CONFLICT (provider_id, day) DO UPDATE
        SET carried = provider_attempt_days.carried + EXCLUDED.carried, faults = provider_attempt_days.faults + EXCLUDED.faults;
    END IF;
  END IF;
  RETURN NULL;
END $$;

CREATE TRIGGER job_attempts_count_days AFTER UPDATE OF fault, ended_at, started_at, provider_id ON job_attempts FOR EACH ROW
  WHEN ((OLD.fault IS NOT NULL OR NEW.fault IS NOT NULL)
        AND (OLD.fault IS DISTINCT FROM NEW.fault OR OLD.ended_at IS DISTINCT FROM NEW.ended_at
             OR (OLD.started_at IS NULL) <> (NEW.started_at IS NULL) OR OLD.provider_id IS DISTINCT FROM NEW.provider_id))
  EXECUTE FUNCTION job_attempts_count_days();
CREATE TRIGGER job_attempts_count_days_insert AFTER INSERT ON job_attempts FOR EACH ROW
  WHEN (NEW.fault IS NOT NULL)
  EXECUTE FUNCTION job_attempts_count_days();
CREATE TRIGGER job_attempts_count_days_delete AFTER DELETE ON job_attempts FOR EACH ROW
  WHEN (OLD.fault IS NOT NULL)
  EXECUTE FUNCTION job_attempts_count_days();

INSERT INTO provider_attempt_days (provider_id, day, carried, faults)
SELECT a.provider_id, (a.ended_at AT TIME ZONE 'UTC')::date, sum(o.carried), sum(o.faults)
FROM job_attempts a CROSS JOIN LATERAL attempt_outcome(a.fault, a.started_at) o
WHERE a.fault IS NOT NULL AND a.provider_id IS NOT NULL
  AND a.ended_at IS NOT NULL
  AND o.carried + o.faults > 0
GROUP BY 1, 2;

-- Read only by reliability (migration 031), which now reads the days above.
DROP INDEX job_attempts_provider_ended_cover_idx;
