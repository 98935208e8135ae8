-- Idempotency-Key claims: a request whose work calls outside the database (a
-- card top-up's gateway invoice) claims its key, committed, before that call.
-- A row with no response is a claim in flight: a duplicate is refused (409)
-- until it answers, or until claimed_until passes (its process died), when a
-- retry takes the key over. claim_token fences the claimer's own answer and
-- release against a takeover (src/domain/money/idempotency.ts).
ALTER TABLE idempotency_keys
  ADD COLUMN claim_token text,
  ADD COLUMN claimed_until timestamptz;

-- When the gateway voided a payment that was never credited (initiated or
-- failed): it is marked failed and a paid event arriving late for it credits
-- nothing (src/domain/money/payments.ts).
ALTER TABLE payments ADD COLUMN voided_at timestamptz;
