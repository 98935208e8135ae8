-- Money, part two: per-job holds, card payments and their gateway events, and
-- the transactional outbox of renter webhooks.

-- One row per job whose estimate is held. Settle and release close the hold
-- with a single conditional UPDATE (status = 'open'), so a retried result, a
-- cancel after a failure or a timeout racing a result close it only once.
CREATE TABLE ledger_holds (
  job_id           bigint PRIMARY KEY REFERENCES jobs(id),
  renter_id        bigint NOT NULL REFERENCES renters(id),
  amount           bigint NOT NULL CHECK (amount > 0),
  status           text NOT NULL DEFAULT 'open' CHECK (status IN ('open','settled','released')),
  provider_id      bigint REFERENCES providers(id),
  cost             bigint CHECK (cost >= 0 AND cost <= amount),
  provider_earned  bigint CHECK (provider_earned >= 0),
  platform_fee     bigint CHECK (platform_fee >= 0),
  created_at       timestamptz NOT NULL DEFAULT now(),
  closed_at        timestamptz,
  CHECK ((status = 'settled') = (cost IS NOT NULL)),
  CHECK (cost IS NULL OR cost = provider_earned + platform_fee)
);
CREATE INDEX ledger_holds_open_idx ON ledger_holds (renter_id) WHERE status = 'open';
CREATE INDEX ledger_transfers_payment_idx ON ledger_transfers (payment_id) WHERE payment_id IS NOT NULL;

-- Secret used to sign this renter's webhook deliveries (shown on PATCH /api/renters/me).
ALTER TABLE renters ADD COLUMN webhook_secret text;

CREATE TABLE payments (
  id                       bigserial PRIMARY KEY,
  payment_id               text NOT NULL UNIQUE,
  renter_id                bigint NOT NULL REFERENCES renters(id),
  amount_halala            bigint NOT NULL CHECK (amount_halala > 0),
  currency                 text NOT NULL DEFAULT 'SAR',
  status                   text NOT NULL DEFAULT 'initiated' CHECK (status IN ('initiated','paid','failed','refunded')),
  source_type              text NOT NULL CHECK (source_type IN ('creditcard','mada','applepay','sandbox')),
  description              text NOT NULL,
  -- The gateway's own id of the invoice (null for sandbox payments).
  gateway_id               text UNIQUE,
  checkout_url             text,
  refunded_halala          bigint NOT NULL DEFAULT 0 CHECK (refunded_halala >= 0),
  -- Part of a refund that could not be taken back because it was already spent or held.
  refund_shortfall_halala  bigint NOT NULL DEFAULT 0 CHECK (refund_shortfall_halala >= 0),
  failure_reason           text,
  created_at               timestamptz NOT NULL DEFAULT now(),
  confirmed_at             timestamptz,
  updated_at               timestamptz NOT NULL DEFAULT now(),
  CHECK (refunded_halala + refund_shortfall_halala <= amount_halala)
);
CREATE INDEX payments_renter_idx ON payments (renter_id, created_at DESC, id DESC);
CREATE INDEX payments_status_idx ON payments (status, created_at DESC);

-- Every verified gateway event, with what it did (audit and replay detection).
CREATE TABLE payment_events (
  id             bigserial PRIMARY KEY,
  payment_id     text,
  event_id       text,
  event_type     text NOT NULL,
  outcome        text NOT NULL,
  payload        jsonb NOT NULL,
  received_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX payment_events_payment_idx ON payment_events (payment_id, received_at);

-- Renter webhook deliveries, written in the transaction of the state change
-- that causes them and delivered later by src/workers/webhook-outbox.ts.
CREATE TABLE webhook_outbox (
  id               bigserial PRIMARY KEY,
  event_id         text NOT NULL UNIQUE,
  renter_id        bigint NOT NULL REFERENCES renters(id),
  event            text NOT NULL,
  url              text NOT NULL,
  body             text NOT NULL,
  status           text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending','delivered','dead')),
  attempts         integer NOT NULL DEFAULT 0,
  next_attempt_at  timestamptz NOT NULL DEFAULT now(),
  last_status      integer,
  last_error       text,
  created_at       timestamptz NOT NULL DEFAULT now(),
  delivered_at     timestamptz
);
CREATE INDEX webhook_outbox_due_idx ON webhook_outbox (next_attempt_at) WHERE status = 'pending';
CREATE INDEX webhook_outbox_renter_idx ON webhook_outbox (renter_id, created_at DESC);
