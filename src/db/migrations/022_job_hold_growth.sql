-- A running job's hold grows from the renter's available balance before its
-- paid time runs out (src/domain/money/hold-extension.ts). held_halala is the
-- job's hold now (NULL: the estimate, cost_halala, as submit held it); it is
-- written with every extension, in the transaction that moves the money, so
-- job reads show it and the running cost without reading the ledger.
ALTER TABLE jobs ADD COLUMN held_halala bigint CHECK (held_halala IS NULL OR held_halala >= cost_halala);

-- The sweep looks for running jobs whose paid time is about to run out.
CREATE INDEX jobs_running_started_idx ON jobs (started_at) WHERE status = 'running';
