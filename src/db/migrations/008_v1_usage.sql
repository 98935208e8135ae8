-- One row per /v1 chat completion (src/domain/money/usage-billing.ts). While the
-- request runs the row is `open` and reserves its price cap against the
-- renter's available funds (no money moves, so concurrent requests cannot
-- together spend more than the balance); it then becomes `settled` (tokens,
-- cost and the ledger charge, in one transaction) or `released` (nothing
-- charged), exactly once.
CREATE TABLE v1_usage (
  request_id              text PRIMARY KEY,
  renter_id               bigint NOT NULL REFERENCES renters(id),
  provider_id             bigint REFERENCES providers(id),
  job_id                  bigint REFERENCES jobs(id),
  model                   text NOT NULL,
  stream                  boolean NOT NULL DEFAULT false,
  state                   text NOT NULL DEFAULT 'open' CHECK (state IN ('open','settled','released')),
  reserved_halala         bigint NOT NULL CHECK (reserved_halala >= 0),
  prompt_tokens           bigint NOT NULL DEFAULT 0,
  completion_tokens       bigint NOT NULL DEFAULT 0,
  -- True when the upstream sent no usage (stream cut) and the gateway counted the tokens.
  usage_estimated         boolean NOT NULL DEFAULT false,
  -- What was charged; `shortfall_halala` is what the tokens cost beyond the price cap or the balance.
  cost_halala             bigint NOT NULL DEFAULT 0 CHECK (cost_halala >= 0),
  shortfall_halala        bigint NOT NULL DEFAULT 0 CHECK (shortfall_halala >= 0),
  provider_earned_halala  bigint NOT NULL DEFAULT 0,
  platform_fee_halala     bigint NOT NULL DEFAULT 0,
  created_at              timestamptz NOT NULL DEFAULT now(),
  ended_at                timestamptz
);
CREATE INDEX v1_usage_renter_idx ON v1_usage (renter_id, created_at DESC);
CREATE INDEX v1_usage_open_idx ON v1_usage (renter_id, created_at) WHERE state = 'open';
