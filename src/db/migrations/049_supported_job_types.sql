-- The job types a provider's daemon says it can run, from its heartbeats
-- (src/domain/providers/heartbeat-write.ts). Placement offered every job to
-- every provider that fit its hardware, and a daemon that could not run one
-- (the legacy daemon and vllm_serve, a host without docker and a container
-- job) refused it as unsupported_on_provider: the provider's fault, docking
-- its reliability, and a bounce back to the queue for the renter. Dispatch now
-- offers a job only to providers whose list holds its type
-- (src/domain/dispatch/dispatch.ts jobTypeFitSql). NULL: declared none (a
-- daemon older than the field), offered every job type as before.
ALTER TABLE providers ADD COLUMN supported_job_types text[];
