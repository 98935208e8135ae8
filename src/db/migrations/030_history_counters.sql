-- Counters kept by the writes, for two reads whose cost grew with the history
-- (found with EXPLAIN on the history bench, bench/history.ts; before and after
-- in docs/benchmarks.md). Each is kept by triggers, so every way the rows it
-- summarises are written counts, and each trigger is created before its
-- backfill: creating it holds writes to its table until this migration
-- commits, so every row is counted once, by the backfill or by the trigger.
-- The backfills' cost at 10,000,000 jobs is in docs/benchmarks.md.

-- 1. What each renter was charged per UTC month, for the
-- monthly_spend_limit_halala quota read at every submit
-- (src/domain/money/quota.ts). Summing the month's charge entries read each of
-- them: the more a renter ran this month, the slower each of its submits (a
-- renter with 140,000 jobs this month made every submit read 280,000 ledger
-- entries). Each transfer of a charge kind (ledger.ts CHARGE_KINDS; a test
-- checks the lists agree) debiting a renter's account adds its amount to the
-- renter's row of the UTC month of its created_at; a deleted one
-- (ledger_transfer() deletes a transfer it refused for want of funds) takes it
-- back. Transfers are never updated. Both writers of charges (settle,
-- chargeTokenUsage) hold the renter's ledger accounts before they write one,
-- so the counter row, written after, adds no lock order of its own. The
-- backfill covers the current month, the one the quota reads (earlier months
-- stay in the ledger alone), read through the (kind, created_at) index.
CREATE TABLE renter_monthly_spend (
  renter_id     bigint NOT NULL REFERENCES renters(id),
  -- The first day of the UTC month.
  month         date   NOT NULL,
  spent_halala  bigint NOT NULL CHECK (spent_halala >= 0),
  PRIMARY KEY (renter_id, month)
);

CREATE FUNCTION ledger_count_spend() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'DELETE' THEN
    UPDATE renter_monthly_spend s SET spent_halala = s.spent_halala - OLD.amount
    FROM ledger_accounts a
    WHERE a.id = OLD.debit_account_id AND a.kind IN ('renter_available', 'renter_held')
      AND s.renter_id = a.owner_id AND s.month = date_trunc('month', OLD.created_at AT TIME ZONE 'UTC')::date;
  ELSE
    INSERT INTO renter_monthly_spend (renter_id, month, spent_halala)
    SELECT a.owner_id, date_trunc('month', NEW.created_at AT TIME ZONE 'UTC')::date, NEW.amount
    FROM ledger_accounts a WHERE a.id = NEW.debit_account_id AND a.kind IN ('renter_available', 'renter_held')
    ON CONFLICT (renter_id, month) DO UPDATE SET spent_halala = renter_monthly_spend.spent_halala + EXCLUDED.spent_halala;
  END IF;
  RETURN NULL;
END $$;

CREATE TRIGGER ledger_count_spend AFTER INSERT ON ledger_transfers FOR EACH ROW
  WHEN (NEW.kind IN ('charge_provider', 'charge_platform', 'v1_charge_provider', 'v1_charge_platform'))
  EXECUTE FUNCTION ledger_count_spend();
CREATE TRIGGER ledger_uncount_spend AFTER DELETE ON ledger_transfers FOR EACH ROW
  WHEN (OLD.kind IN ('charge_provider', 'charge_platform', 'v1_charge_provider', 'v1_charge_platform'))
  EXECUTE FUNCTION ledger_count_spend();

INSERT INTO renter_monthly_spend (renter_id, month, spent_halala)
SELECT a.owner_id, date_trunc('month', now() AT TIME ZONE 'UTC')::date, sum(t.amount)
FROM ledger_transfers t JOIN ledger_accounts a ON a.id = t.debit_account_id
WHERE t.kind IN ('charge_provider', 'charge_platform', 'v1_charge_provider', 'v1_charge_platform')
  AND t.created_at >= date_trunc('month', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
  AND a.kind IN ('renter_available', 'renter_held')
GROUP BY a.owner_id;

-- The quota's first SQL form (migration 009), unused since quota.ts reads the
-- usage itself, summed the month's charges the same way.
DROP FUNCTION renter_quota_usage(bigint, text[]);

-- 2. Ended jobs per renter and end status, for the job totals read on every
-- GET /api/jobs (`total`) and renter read (`total_jobs`): counting the
-- renter's jobs visited each of them, so a renter with 1,000,000 jobs waited
-- seconds for its first page of 50. A renter's jobs are now its ended ones
-- from here plus its active ones (queued, pending, running), counted: those
-- are few whatever the history (src/domain/accounts/renters.ts jobCountSql).
-- A job entering completed, failed or cancelled adds one to its row, one
-- leaving it (or deleted) takes one away. Jobs end only in settlement.ts,
-- which locks the renter's ledger accounts first, so the counter row, written
-- after them, adds no lock order of its own (a renter's ends were serialised
-- on those accounts already). The backfill counts every ended job.
CREATE TABLE renter_job_ends (
  renter_id  bigint NOT NULL REFERENCES renters(id),
  status     text   NOT NULL CHECK (status IN ('completed', 'failed', 'cancelled')),
  jobs       bigint NOT NULL CHECK (jobs >= 0),
  PRIMARY KEY (renter_id, status)
);

CREATE FUNCTION jobs_count_ends() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP <> 'INSERT' AND OLD.status IN ('completed', 'failed', 'cancelled') THEN
    UPDATE renter_job_ends SET jobs = jobs - 1 WHERE renter_id = OLD.renter_id AND status = OLD.status;
  END IF;
  IF TG_OP <> 'DELETE' AND NEW.status IN ('completed', 'failed', 'cancelled') THEN
    INSERT INTO renter_job_ends (renter_id, status, jobs) VALUES (NEW.renter_id, NEW.status, 1)
    ON CONFLICT (renter_id, status) DO UPDATE SET jobs = renter_job_ends.jobs + 1;
  END IF;
  RETURN NULL;
END $$;

CREATE TRIGGER jobs_count_ends AFTER UPDATE OF status, renter_id ON jobs FOR EACH ROW
  WHEN ((OLD.status IS DISTINCT FROM NEW.status OR OLD.renter_id IS DISTINCT FROM NEW.renter_id)
        AND (OLD.status IN ('completed', 'failed', 'cancelled') OR NEW.status IN ('completed', 'failed', 'cancelled')))
  EXECUTE FUNCTION jobs_count_ends();
CREATE TRIGGER jobs_count_ends_insert AFTER INSERT ON jobs FOR EACH ROW
  WHEN (NEW.status IN ('completed', 'failed', 'cancelled'))
  EXECUTE FUNCTION jobs_count_ends();
CREATE TRIGGER jobs_count_ends_delete AFTER DELETE ON jobs FOR EACH ROW
  WHEN (OLD.status IN ('completed', 'failed', 'cancelled'))
  EXECUTE FUNCTION jobs_count_ends();

INSERT INTO renter_job_ends (renter_id, status, jobs)
SELECT renter_id, status, count(*) FROM jobs WHERE status IN ('completed', 'failed', 'cancelled') GROUP BY 1, 2;
