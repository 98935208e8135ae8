-- The ledger audit goes incremental (src/domain/money/ledger-audit.ts): a run
-- checks only what was written after the last clean run's watermark, so the
-- entries below it must never change.

-- Ledger entries are append-only: the database refuses to change or remove one.
CREATE FUNCTION ledger_transfers_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'ledger entries are append-only (% refused)', TG_OP USING ERRCODE = 'integrity_constraint_violation';
END $$;
CREATE TRIGGER ledger_transfers_append_only BEFORE UPDATE OR DELETE ON ledger_transfers
  FOR EACH ROW EXECUTE FUNCTION ledger_transfers_append_only();
CREATE TRIGGER ledger_transfers_no_truncate BEFORE TRUNCATE ON ledger_transfers
  FOR EACH STATEMENT EXECUTE FUNCTION ledger_transfers_append_only();

-- ledger_transfer (migration 009) wrote the entry first and deleted it again
-- when the debit was short. Now the kept balances are locked and the debit
-- checked first, and the entry is written only when it moves: nothing is
-- ever deleted. A repeat of a key that already moved still does nothing
-- (also when the balance is short now), and a concurrent repeat waits on the
-- account locks, then on the key, and does nothing.
CREATE OR REPLACE FUNCTION ledger_transfer(
  p_from bigint, p_to bigint, p_amount bigint, p_kind text, p_key text,
  p_job bigint, p_payment text, p_memo text, p_materialized text[],
  OUT moved boolean, OUT short_balance bigint
) LANGUAGE plpgsql AS $$
DECLARE
  v_transfer bigint;
  v_debit bigint;
  v_locked bigint[];
BEGIN
  moved := false;
  -- NO KEY UPDATE: the entry's foreign keys take KEY SHARE locks on both
  -- accounts; FOR UPDATE would deadlock with a concurrent transfer.
  SELECT array_agg(id), max(balance) FILTER (WHERE id = p_from) INTO v_locked, v_debit
  FROM (SELECT id, balance FROM ledger_accounts
        WHERE id IN (p_from, p_to) AND kind = ANY (p_materialized)
        ORDER BY id FOR NO KEY UPDATE) a;
  IF v_debit IS NOT NULL AND v_debit < p_amount THEN
    IF NOT EXISTS (SELECT 1 FROM ledger_transfers WHERE idempotency_key = p_key) THEN
      short_balance := v_debit;
    END IF;
    RETURN;
  END IF;
  INSERT INTO ledger_transfers (debit_account_id, credit_account_id, amount, kind, idempotency_key, job_id, payment_id, memo)
  VALUES (p_from, p_to, p_amount, p_kind, p_key, p_job, p_payment, p_memo)
  ON CONFLICT (idempotency_key) DO NOTHING RETURNING id INTO v_transfer;
  IF v_transfer IS NULL THEN RETURN; END IF;
  IF v_locked IS NOT NULL THEN
    UPDATE ledger_accounts
    SET balance = balance + CASE WHEN id = p_to THEN p_amount ELSE -p_amount END
    WHERE id = ANY (v_locked);
  END IF;
  moved := true;
END $$;

-- What each run covered. mode: full (every entry) or incremental (the
-- entries after from_entry_id, and every open hold). to_entry_id: the
-- highest entry id it read. watermark: set when the run became the base of
-- the next incremental one (it found nothing, every entry up to the
-- watermark was committed when it read them, and ledger_audit_totals now
-- holds each account's entries up to it); NULL otherwise.
ALTER TABLE ledger_audits
  ADD COLUMN mode text NOT NULL DEFAULT 'full' CHECK (mode IN ('full', 'incremental')),
  ADD COLUMN from_entry_id bigint NOT NULL DEFAULT 0,
  ADD COLUMN to_entry_id bigint,
  ADD COLUMN watermark bigint;
CREATE INDEX ledger_audits_base_idx ON ledger_audits (id) WHERE watermark IS NOT NULL;

-- Each account's credits minus debits over the entries up to the base run's
-- watermark (accounts whose total is 0 have no row): where an incremental
-- run starts its sums. Written only with the run that becomes the base.
CREATE TABLE ledger_audit_totals (
  account_id  bigint PRIMARY KEY,
  total       bigint NOT NULL
);
