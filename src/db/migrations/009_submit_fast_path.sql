-- Submit fast path: ledger movements as one round trip each. The rules are the
-- ones src/domain/money/ledger.ts documents (it calls these and nothing else moves
-- money): the transfer row first (its idempotency key makes a repeat a no-op),
-- then the kept balances locked in id order and the debit checked, so an
-- overdraft is refused without aborting the caller's transaction. Which kinds
-- keep a balance is passed in by ledger.ts (its MATERIALIZED list).

-- moved: false for a repeat of the key. short_balance: set (and nothing
-- written) when the debited account holds less than p_amount.
CREATE FUNCTION ledger_transfer(
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
  INSERT INTO ledger_transfers (debit_account_id, credit_account_id, amount, kind, idempotency_key, job_id, payment_id, memo)
  VALUES (p_from, p_to, p_amount, p_kind, p_key, p_job, p_payment, p_memo)
  ON CONFLICT (idempotency_key) DO NOTHING RETURNING id INTO v_transfer;
  IF v_transfer IS NULL THEN RETURN; END IF;
  -- NO KEY UPDATE: the transfer row holds KEY SHARE locks on both accounts
  -- (foreign keys); FOR UPDATE would deadlock with a concurrent transfer.
  SELECT array_agg(id), max(balance) FILTER (WHERE id = p_from) INTO v_locked, v_debit
  FROM (SELECT id, balance FROM ledger_accounts
        WHERE id IN (p_from, p_to) AND kind = ANY (p_materialized)
        ORDER BY id FOR NO KEY UPDATE) a;
  IF v_debit IS NOT NULL AND v_debit < p_amount THEN
    DELETE FROM ledger_transfers WHERE id = v_transfer;
    short_balance := v_debit;
    RETURN;
  END IF;
  IF v_locked IS NOT NULL THEN
    UPDATE ledger_accounts
    SET balance = balance + CASE WHEN id = p_to THEN p_amount ELSE -p_amount END
    WHERE id = ANY (v_locked);
  END IF;
  moved := true;
END $$;

-- The account of a kind and owner (NULL for system accounts), created when missing.
CREATE FUNCTION ledger_account(p_kind text, p_owner bigint) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
  v_id bigint;
BEGIN
  SELECT id INTO v_id FROM ledger_accounts WHERE kind = p_kind AND coalesce(owner_id, 0) = coalesce(p_owner, 0);
  IF v_id IS NULL THEN
    INSERT INTO ledger_accounts (kind, owner_id) VALUES (p_kind, p_owner)
    ON CONFLICT (kind, coalesce(owner_id, 0)) DO UPDATE SET kind = EXCLUDED.kind
    RETURNING id INTO v_id;
  END IF;
  RETURN v_id;
END $$;

-- A job's hold: opens the ledger_holds row and moves the estimate from
-- available to held (key p_key). opened: false when the job already has a
-- hold. short_balance: set (and nothing written) when available is short.
CREATE FUNCTION ledger_hold(
  p_renter bigint, p_job bigint, p_amount bigint, p_key text, p_materialized text[],
  OUT opened boolean, OUT short_balance bigint
) LANGUAGE plpgsql AS $$
DECLARE
  t record;
BEGIN
  opened := false;
  INSERT INTO ledger_holds (job_id, renter_id, amount) VALUES (p_job, p_renter, p_amount)
  ON CONFLICT (job_id) DO NOTHING;
  IF NOT FOUND THEN RETURN; END IF;
  SELECT * INTO t FROM ledger_transfer(
    ledger_account('renter_available', p_renter), ledger_account('renter_held', p_renter),
    p_amount, 'hold', p_key, p_job, NULL, NULL, p_materialized);
  IF t.short_balance IS NOT NULL THEN
    DELETE FROM ledger_holds WHERE job_id = p_job;
    short_balance := t.short_balance;
    RETURN;
  END IF;
  opened := true;
END $$;

-- A renter's quota and usage for a submit (src/domain/money/quota.ts holds the
-- rules and defaults). Two statements, one round trip: the quota row is
-- locked first (serialising one renter's submits), and the usage is read
-- after that lock is held, by a statement with a fresh snapshot, so two
-- racing submits cannot both pass the last free slot.
CREATE FUNCTION renter_quota_usage(
  p_renter bigint, p_charge_kinds text[],
  OUT daily_jobs_limit bigint, OUT monthly_spend_limit_halala bigint,
  OUT jobs_today bigint, OUT settled bigint, OUT held bigint
) LANGUAGE plpgsql AS $$
BEGIN
  SELECT q.daily_jobs_limit, q.monthly_spend_limit_halala INTO daily_jobs_limit, monthly_spend_limit_halala
  FROM renter_quota q WHERE q.renter_id = p_renter FOR NO KEY UPDATE;
  SELECT
    (SELECT count(*) FROM jobs
      WHERE renter_id = p_renter
        AND submitted_at >= date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'),
    (SELECT coalesce(sum(t.amount), 0) FROM ledger_transfers t
      WHERE t.debit_account_id IN (SELECT id FROM ledger_accounts WHERE owner_id = p_renter AND kind IN ('renter_available', 'renter_held'))
        AND t.kind = ANY (p_charge_kinds)
        AND t.created_at >= date_trunc('month', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'),
    (SELECT coalesce(sum(amount), 0) FROM ledger_holds WHERE renter_id = p_renter AND status = 'open')
  INTO jobs_today, settled, held;
END $$;
