-- Sub-halala accrual of /v1 token charges (src/domain/money/usage-billing.ts).
-- A request's exact cost is micro-halala (token prices are halala per million
-- tokens); the ledger moves whole halala. Per owner, what is below one halala
-- is carried here instead of being rounded away:
--   renter:   what its requests cost beyond the whole halala charged so far
--             (it owes it; charged once it reaches a halala);
--   provider: what its 75 % of the charges comes to beyond the whole halala
--             paid so far (it is owed it; paid once it reaches a halala).
-- These are not ledger entries and move no money: the ledger stays
-- whole-halala and balanced. Each row is changed only by v1_accrue, in the
-- charging transaction, after the renter's funds are locked.
CREATE TABLE v1_accruals (
  owner_kind  text NOT NULL CHECK (owner_kind IN ('renter', 'provider')),
  owner_id    bigint NOT NULL,
  micro       bigint NOT NULL DEFAULT 0 CHECK (micro >= 0 AND micro < 1000000),
  updated_at  timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (owner_kind, owner_id)
);

-- What a request cost exactly, in micro-halala (NULL: settled before this
-- migration, or released). cost_halala stays what was charged for it in whole
-- halala: its cost plus the renter's carry, rounded down, within the cap and
-- the balance. numeric: the product of a rate and a token count may pass bigint.
ALTER TABLE v1_usage ADD COLUMN cost_micro numeric CHECK (cost_micro >= 0);

-- Adds p_micro (>= 0) to an owner's carry, under the row's lock (taken, or the
-- row created, here): returns the whole halala of carry + p_micro and keeps
-- the rest (below one halala) as the new carry. One round trip, no lost update
-- between concurrent charges.
CREATE FUNCTION v1_accrue(p_kind text, p_owner bigint, p_micro numeric, OUT whole bigint, OUT carry bigint)
LANGUAGE plpgsql AS $$
DECLARE
  v_total numeric;
BEGIN
  IF p_micro IS NULL OR p_micro < 0 OR p_micro <> trunc(p_micro) THEN
    RAISE EXCEPTION 'v1_accrue: invalid amount %', p_micro;
  END IF;
  INSERT INTO v1_accruals (owner_kind, owner_id) VALUES (p_kind, p_owner) ON CONFLICT DO NOTHING;
  SELECT micro + p_micro INTO v_total FROM v1_accruals WHERE owner_kind = p_kind AND owner_id = p_owner FOR UPDATE;
  whole := div(v_total, 1000000);
  carry := v_total - whole::numeric * 1000000;
  UPDATE v1_accruals SET micro = carry, updated_at = now() WHERE owner_kind = p_kind AND owner_id = p_owner;
END $$;
