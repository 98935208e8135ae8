-- A carried attempt (reliability's success count, migration 034) must be paid
-- work for someone else. A provider that also holds a renter account could pin
-- tiny jobs to itself and report them done at once: each held 1 halala, its 75%
-- share rounded to 0, so a hundred of them cost next to nothing and took a new
-- provider's success rate from 0.5 to 0.99. Now an attempt is carried only when
--   - its renter was charged at least one minute of its rate (cost_halala >=
--     the job's rate_halala_per_minute: a settled attempt bills at least one
--     minute, so only a hold smaller than one minute charges less); below
--     that it counts neither way, and
--   - its renter's account email is not the provider's (case-insensitive):
--     a cheap link between two accounts of one person, not proof that they
--     are independent.
-- Provider faults count as before. The rule is here only: attempt_outcome,
-- which the per-day trigger calls for an attempt's old and new row alike.
-- The rate and both emails never change once a job is submitted, so an
-- attempt's outcome changes only with its own columns, which the trigger
-- watches (cost_halala now too). The outcome is read only for an attempt that
-- could be carried: three primary-key reads on the job's end.
--
-- The days already counted stay as they are (no backfill): the retention
-- sweep drops them within 31 days. The new rule only narrows the old one, so
-- an older attempt rewritten or deleted later takes away at most what it added.
CREATE FUNCTION attempt_outcome(a_job bigint, a_provider bigint, a_fault text, a_started timestamptz, a_cost bigint,
                                OUT carried integer, OUT faults integer)
LANGUAGE sql STABLE AS $$
  SELECT CASE WHEN a_fault = 'none' OR (a_fault = 'renter' AND a_started IS NOT NULL)
              THEN EXISTS (
                SELECT FROM jobs j JOIN renters r ON r.id = j.renter_id JOIN providers p ON p.id = a_provider
                WHERE j.id = a_job AND a_cost >= j.rate_halala_per_minute AND lower(r.email) <> lower(p.email))::int
              ELSE 0 END,
         (a_fault = 'provider')::int
$$;

CREATE OR REPLACE FUNCTION job_attempts_count_days() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  o record;
BEGIN
  IF TG_OP <> 'INSERT' AND OLD.fault IS NOT NULL AND OLD.ended_at IS NOT NULL AND OLD.provider_id IS NOT NULL THEN
    SELECT * INTO o FROM attempt_outcome(OLD.job_id, OLD.provider_id, OLD.fault, OLD.started_at, OLD.cost_halala);
    IF o.carried + o.faults > 0 THEN
      UPDATE provider_attempt_days SET carried = carried - o.carried, faults = faults - o.faults
      WHERE provider_id = OLD.provider_id AND day = (OLD.ended_at AT TIME ZONE 'UTC')::date;
    END IF;
  END IF;
  IF TG_OP <> 'DELETE' AND NEW.fault IS NOT NULL AND NEW.ended_at IS NOT NULL AND NEW.provider_id IS NOT NULL THEN
    SELECT * INTO o FROM attempt_outcome(NEW.job_id, NEW.provider_id, NEW.fault, NEW.started_at, NEW.cost_halala);
    IF o.carried + o.faults > 0 THEN
      INSERT INTO provider_attempt_days (provider_id, day, carried, faults)
      VALUES (NEW.provider_id, (NEW.ended_at AT TIME ZONE 'UTC')::date, o.carried, o.faults)
      ON CONFLICT (provider_id, day) DO UPDATE
        SET carried = provider_attempt_days.carried + EXCLUDED.carried, faults = provider_attempt_days.faults + EXCLUDED.faults;
    END IF;
  END IF;
  RETURN NULL;
END $$;

CREATE OR REPLACE TRIGGER job_attempts_count_days
  AFTER UPDATE OF fault, ended_at, started_at, provider_id, cost_halala ON job_attempts FOR EACH ROW
  WHEN ((OLD.fault IS NOT NULL OR NEW.fault IS NOT NULL)
        AND (OLD.fault IS DISTINCT FROM NEW.fault OR OLD.ended_at IS DISTINCT FROM NEW.ended_at
             OR (OLD.started_at IS NULL) <> (NEW.started_at IS NULL) OR OLD.provider_id IS DISTINCT FROM NEW.provider_id
             OR OLD.cost_halala IS DISTINCT FROM NEW.cost_halala))
  EXECUTE FUNCTION job_attempts_count_days();

-- The old rule, so that nothing counts by it.
DROP FUNCTION attempt_outcome(text, timestamptz);
