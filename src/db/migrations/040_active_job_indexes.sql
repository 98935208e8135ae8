-- Reads of the active jobs that ran over all of them: with a fleet of 100,000
-- providers each running a job, the job sweep (every second in every server
-- process) spent about 100 ms of database CPU a pass finding nothing to do,
-- and every /v1 request read every running job to find the few serving ones.

-- When a job's paid time ends: the start plus the whole minutes its hold pays
-- for (paidMinutes in src/domain/money/hold-extension.ts). Declared IMMUTABLE
-- so an index can hold it: timestamptz + interval is only STABLE because a
-- day or a month is as long as the time zone makes it, and this interval has
-- neither, only seconds.
CREATE FUNCTION svc_paid_until(started_at timestamptz, held bigint, rate bigint) RETURNS timestamptz
  LANGUAGE sql IMMUTABLE PARALLEL SAFE
  AS $$ SELECT started_at + make_interval(secs => floor(held::numeric / rate) * 60) $$;

-- The sweep's hold extension looks for running jobs whose paid time ends
-- within the lead: a range of this index, instead of every running job's
-- arithmetic. It replaces the index on the start time, which served only that.
CREATE INDEX jobs_paid_until_idx ON jobs (svc_paid_until(started_at, coalesce(held_halala, cost_halala), rate_halala_per_minute))
  WHERE status = 'running' AND acked_at IS NOT NULL;
DROP INDEX jobs_running_started_idx;

-- The serving endpoints /v1 routes requests to (src/http/v1/endpoints.ts).
CREATE INDEX jobs_serving_idx ON jobs (id) WHERE job_type = 'vllm_serve' AND status = 'running';
