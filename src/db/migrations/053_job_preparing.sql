-- A stream daemon preparing a job it was handed before it accepts it (pulling
-- the job's container image, which can take minutes): its JobPreparing notices
-- (daemon.proto) keep the attempt from being taken back as never picked up
-- (dispatch.ts releaseUnclaimed) for a pickup window after each, up to
-- PREPARE_LIMIT_SECONDS after the assignment. Nothing is billed while it
-- prepares: the billed time starts at the accept.
--   preparing_at  when the latest notice on the pending attempt came; NULL
--                 once it starts, or goes back to the queue
ALTER TABLE jobs ADD COLUMN preparing_at timestamptz;
