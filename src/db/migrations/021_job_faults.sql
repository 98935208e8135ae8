-- Whose fault a job's end was (src/domain/shared/job-end.ts): per attempt and
-- for the job, next to end_reason, whose old values are renamed to the
-- documented set. Dispatch and reputation read attempts by provider and end.
ALTER TABLE jobs ADD COLUMN fault text
  CHECK (fault IN ('none', 'renter', 'provider', 'platform', 'unattributed'));
ALTER TABLE job_attempts ADD COLUMN fault text
  CHECK (fault IN ('none', 'renter', 'provider', 'platform', 'unattributed'));

UPDATE jobs SET end_reason = CASE
    WHEN end_reason = 'result' AND status = 'completed' THEN 'completed'
    WHEN end_reason = 'result' THEN 'runtime_error'
    WHEN end_reason = 'cancelled' AND error LIKE 'cancelled by admin%' THEN 'admin_cancelled'
    WHEN end_reason = 'cancelled' THEN 'renter_cancelled'
    WHEN end_reason = 'provider_lost' THEN 'provider_silent'
    WHEN end_reason = 'rejected' THEN 'provider_refused'
    ELSE end_reason END
  WHERE end_reason IS NOT NULL;
UPDATE job_attempts a SET end_reason = CASE
    WHEN a.end_reason = 'result' AND a.status = 'completed' THEN 'completed'
    WHEN a.end_reason = 'result' THEN 'runtime_error'
    WHEN a.end_reason = 'cancelled' THEN j.end_reason
    WHEN a.end_reason = 'provider_lost' THEN 'provider_silent'
    WHEN a.end_reason = 'rejected' THEN 'provider_refused'
    WHEN a.end_reason = 'admin' THEN 'admin_requeued'
    ELSE a.end_reason END
  FROM jobs j WHERE j.id = a.job_id AND a.end_reason IS NOT NULL;

-- Failures from before carried no attribution: unattributed, as a legacy report that names no one.
UPDATE jobs SET fault = CASE
    WHEN end_reason = 'completed' THEN 'none'
    WHEN end_reason IN ('renter_cancelled', 'timeout') THEN 'renter'
    WHEN end_reason IN ('admin_cancelled', 'admin_requeued') THEN 'platform'
    WHEN end_reason IN ('provider_silent', 'provider_refused', 'not_picked_up', 'provider_interrupted') THEN 'provider'
    ELSE 'unattributed' END WHERE end_reason IS NOT NULL;
UPDATE job_attempts SET fault = CASE
    WHEN end_reason = 'completed' THEN 'none'
    WHEN end_reason IN ('renter_cancelled', 'timeout') THEN 'renter'
    WHEN end_reason IN ('admin_cancelled', 'admin_requeued') THEN 'platform'
    WHEN end_reason IN ('provider_silent', 'provider_refused', 'not_picked_up', 'provider_interrupted') THEN 'provider'
    ELSE 'unattributed' END WHERE end_reason IS NOT NULL;

-- Reliability counts a provider's attempts that ended in a window.
CREATE INDEX job_attempts_provider_ended_idx ON job_attempts (provider_id, ended_at) WHERE fault IS NOT NULL;
