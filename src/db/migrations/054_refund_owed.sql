-- What a renter owes for gateway refunds (chargebacks) of money it had already
-- held for jobs or reserved for /v1 requests when the refund came
-- (src/domain/money/refund-debt.ts). The refund takes back what is free at
-- once; the rest is owed: every spend check counts it as reserved, and it is
-- taken back to the gateway as money comes free again (a job's hold released
-- or settled, a payment credited). payments.refund_shortfall_halala keeps what
-- each payment's refund could not take at once.
ALTER TABLE renters ADD COLUMN refund_owed_halala bigint NOT NULL DEFAULT 0 CHECK (refund_owed_halala >= 0);
