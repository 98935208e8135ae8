-- A serving job's endpoint health, as the server's own probe sees it
-- (src/domain/dispatch/endpoint-health.ts, run by src/workers/endpoint-health.ts):
-- every SVC_ENDPOINT_PROBE_SECONDS a process GETs the engine's /health on each
-- running vllm_serve job whose endpoint was reported. An endpoint that fails
-- every probe for longer than the grace (job-end.ts
-- ENDPOINT_FAILING_GRACE_SECONDS, judged on failing_since and failed_at) ends
-- the attempt as the provider's failure (provider_error); so does a timeout
-- or a renter's cancel of a job whose record already shows that. All NULL
-- until the first probe, and again when the endpoint is reported (again:
-- endpoint-ready, the clock starts afresh) or the job goes back to the queue.
--   endpoint_probed_at     when the latest probe was started: its claim, so
--                          that of several processes one probes a job per period
--   endpoint_healthy_at    when the latest probe that found it healthy (HTTP 2xx) was started
--   endpoint_failing_since when the first of the probes failing since, without
--                          a break, was started; NULL while healthy
--   endpoint_failed_at     when the latest failed probe was started
-- The probe's due jobs are read through jobs_serving_idx (migration 040).
ALTER TABLE jobs
  ADD COLUMN endpoint_probed_at timestamptz,
  ADD COLUMN endpoint_healthy_at timestamptz,
  ADD COLUMN endpoint_failing_since timestamptz,
  ADD COLUMN endpoint_failed_at timestamptz;
