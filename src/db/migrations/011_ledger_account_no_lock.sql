-- ledger_account (migration 009) created a missing account with
-- INSERT ... ON CONFLICT DO UPDATE. When two transactions create the same
-- account at once, the second waits for the first and then, through DO
-- UPDATE, takes a row lock on the account: outside the id order in which the
-- ledger locks accounts (settle locks held, available and earnings sorted by
-- id), so two settles paying the same new provider could deadlock (seen once
-- by the ledger property test under load). DO NOTHING waits the same way but
-- locks nothing; the account is then read by a statement with a fresh snapshot.
CREATE OR REPLACE FUNCTION ledger_account(p_kind text, p_owner bigint) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
  v_id bigint;
BEGIN
  SELECT id INTO v_id FROM ledger_accounts WHERE kind = p_kind AND coalesce(owner_id, 0) = coalesce(p_owner, 0);
  IF v_id IS NULL THEN
    INSERT INTO ledger_accounts (kind, owner_id) VALUES (p_kind, p_owner)
    ON CONFLICT (kind, coalesce(owner_id, 0)) DO NOTHING
    RETURNING id INTO v_id;
  END IF;
  IF v_id IS NULL THEN
    SELECT id INTO v_id FROM ledger_accounts WHERE kind = p_kind AND coalesce(owner_id, 0) = coalesce(p_owner, 0);
  END IF;
  RETURN v_id;
END $$;
