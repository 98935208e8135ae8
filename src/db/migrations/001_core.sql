-- Core schema: accounts (providers, renters, keys), jobs, the ledger, audit.

CREATE TABLE providers (
  id                      bigserial PRIMARY KEY,
  name                    text NOT NULL,
  email                   text NOT NULL,
  gpu_model               text NOT NULL,
  os                      text NOT NULL,
  phone                   text,
  resource_spec           jsonb,
  status                  text NOT NULL DEFAULT 'registered'
                            CHECK (status IN ('registered','connected','online','offline','paused','suspended')),
  approval_status         text NOT NULL DEFAULT 'pending'
                            CHECK (approval_status IN ('pending','approved','rejected')),
  rejection_reason        text,
  is_paused               boolean NOT NULL DEFAULT false,
  run_mode                text NOT NULL DEFAULT 'always-on' CHECK (run_mode IN ('always-on','manual','scheduled')),
  scheduled_start         text,
  scheduled_end           text,
  gpu_usage_cap_pct       integer NOT NULL DEFAULT 100 CHECK (gpu_usage_cap_pct BETWEEN 0 AND 100),
  vram_reserve_gb         double precision NOT NULL DEFAULT 0 CHECK (vram_reserve_gb BETWEEN 0 AND 16),
  temp_limit_c            integer NOT NULL DEFAULT 85 CHECK (temp_limit_c BETWEEN 50 AND 100),
  last_heartbeat          timestamptz,
  daemon_version          text,
  gpu_vram_mib            bigint,
  gpu_count               integer NOT NULL DEFAULT 0,
  gpu_compute_capability  text,
  gpu_cuda_version        text,
  gpu_driver_version      text,
  gpu_telemetry           jsonb,
  cached_models           text[] NOT NULL DEFAULT '{}',
  provider_ip             text,
  hostname                text,
  location                text,
  readiness_status        text,
  readiness_checks        jsonb,
  reliability_score       double precision,
  uptime_percent          double precision NOT NULL DEFAULT 0,
  total_earnings_halala   bigint NOT NULL DEFAULT 0,
  total_jobs              bigint NOT NULL DEFAULT 0,
  preload_model           text,
  created_at              timestamptz NOT NULL DEFAULT now(),
  updated_at              timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX providers_email_key ON providers (lower(email));
CREATE INDEX providers_available_idx ON providers (gpu_vram_mib DESC)
  WHERE status = 'online' AND NOT is_paused AND approval_status = 'approved';

CREATE TABLE renters (
  id                  bigserial PRIMARY KEY,
  name                text NOT NULL,
  email               text NOT NULL,
  organization        text,
  use_case            text,
  phone               text,
  webhook_url         text,
  status              text NOT NULL DEFAULT 'active' CHECK (status IN ('active','suspended')),
  total_spent_halala  bigint NOT NULL DEFAULT 0,
  total_jobs          bigint NOT NULL DEFAULT 0,
  created_at          timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX renters_email_key ON renters (lower(email));

CREATE TABLE renter_quota (
  renter_id                   bigint PRIMARY KEY REFERENCES renters(id),
  daily_jobs_limit            bigint NOT NULL CHECK (daily_jobs_limit >= 0),
  monthly_spend_limit_halala  bigint NOT NULL CHECK (monthly_spend_limit_halala >= 0),
  updated_at                  timestamptz NOT NULL DEFAULT now()
);

-- API keys are stored only as SHA-256 hashes; an account may hold several.
CREATE TABLE api_keys (
  id           bigserial PRIMARY KEY,
  key_hash     bytea NOT NULL UNIQUE,
  role         text NOT NULL CHECK (role IN ('provider','renter')),
  provider_id  bigint REFERENCES providers(id),
  renter_id    bigint REFERENCES renters(id),
  created_at   timestamptz NOT NULL DEFAULT now(),
  revoked_at   timestamptz,
  CHECK ((role = 'provider') = (provider_id IS NOT NULL) AND (role = 'renter') = (renter_id IS NOT NULL))
);

-- One-time login codes (login-email with email delivery configured).
CREATE TABLE login_codes (
  id          bigserial PRIMARY KEY,
  role        text NOT NULL,
  account_id  bigint NOT NULL,
  code_hash   bytea NOT NULL,
  attempts    integer NOT NULL DEFAULT 0,
  expires_at  timestamptz NOT NULL,
  used_at     timestamptz,
  created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX login_codes_account_idx ON login_codes (role, account_id, created_at DESC);

-- Double-entry ledger. Balances are kept on accounts and moved only by
-- transfers written in the same transaction (src/domain/money/ledger.ts).
CREATE TABLE ledger_accounts (
  id        bigserial PRIMARY KEY,
  kind      text NOT NULL CHECK (kind IN ('renter_available','renter_held','provider_earnings','platform_fees','gateway','adjustments')),
  owner_id  bigint,
  balance   bigint NOT NULL DEFAULT 0,
  -- A renter's funds can never go below zero: no overdraft, also under concurrency.
  CHECK (kind NOT IN ('renter_available','renter_held','provider_earnings','platform_fees') OR balance >= 0)
);
CREATE UNIQUE INDEX ledger_accounts_kind_owner ON ledger_accounts (kind, coalesce(owner_id, 0));
INSERT INTO ledger_accounts (kind, owner_id) VALUES ('platform_fees', NULL), ('gateway', NULL), ('adjustments', NULL);

CREATE TABLE ledger_transfers (
  id                 bigserial PRIMARY KEY,
  debit_account_id   bigint NOT NULL REFERENCES ledger_accounts(id),
  credit_account_id  bigint NOT NULL REFERENCES ledger_accounts(id),
  amount             bigint NOT NULL CHECK (amount > 0),
  kind               text NOT NULL,
  -- Makes each movement happen at most once (e.g. 'hold:job:42').
  idempotency_key    text NOT NULL UNIQUE,
  job_id             bigint,
  payment_id         text,
  memo               text,
  created_at         timestamptz NOT NULL DEFAULT now(),
  CHECK (debit_account_id <> credit_account_id)
);
CREATE INDEX ledger_transfers_job_idx ON ledger_transfers (job_id) WHERE job_id IS NOT NULL;
CREATE INDEX ledger_transfers_debit_idx ON ledger_transfers (debit_account_id, created_at);
CREATE INDEX ledger_transfers_credit_idx ON ledger_transfers (credit_account_id, created_at);

CREATE TABLE jobs (
  id                      bigserial PRIMARY KEY,
  job_id                  text NOT NULL UNIQUE,
  renter_id               bigint NOT NULL REFERENCES renters(id),
  provider_id             bigint REFERENCES providers(id),
  requested_provider_id   bigint,
  job_type                text NOT NULL,
  status                  text NOT NULL CHECK (status IN ('queued','pending','running','completed','failed','cancelled')),
  priority                integer NOT NULL DEFAULT 2 CHECK (priority BETWEEN 1 AND 3),
  duration_minutes        double precision NOT NULL,
  max_duration_seconds    bigint NOT NULL,
  rate_halala_per_minute  bigint NOT NULL,
  cost_halala             bigint NOT NULL CHECK (cost_halala > 0),
  actual_cost_halala      bigint,
  provider_earned_halala  bigint,
  platform_fee_halala     bigint,
  params                  jsonb,
  container_spec          jsonb NOT NULL DEFAULT '{}',
  gpu_requirements        jsonb,
  task_spec               jsonb NOT NULL DEFAULT '{}',
  task_spec_hmac          text NOT NULL DEFAULT '',
  model                   text,
  pricing_class           text NOT NULL DEFAULT 'standard',
  checkpoint_enabled      boolean NOT NULL DEFAULT false,
  prewarm_requested       boolean NOT NULL DEFAULT false,
  template_id             text,
  attempt                 integer NOT NULL DEFAULT 1,
  submitted_at            timestamptz NOT NULL DEFAULT now(),
  assigned_at             timestamptz,
  started_at              timestamptz,
  completed_at            timestamptz,
  timeout_at              timestamptz,
  result                  jsonb,
  error                   text,
  metrics                 jsonb,
  progress_pct            double precision,
  progress_phase          text,
  endpoint_url            text,
  updated_at              timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX jobs_renter_idx ON jobs (renter_id, submitted_at DESC);
CREATE INDEX jobs_provider_idx ON jobs (provider_id, status);
CREATE INDEX jobs_queue_idx ON jobs (priority, submitted_at) WHERE status = 'queued';

CREATE TABLE job_attempts (
  job_id        bigint NOT NULL REFERENCES jobs(id),
  attempt       integer NOT NULL,
  provider_id   bigint,
  status        text NOT NULL,
  assigned_at   timestamptz,
  started_at    timestamptz,
  ended_at      timestamptz,
  end_reason    text,
  cost_halala   bigint,
  PRIMARY KEY (job_id, attempt)
);

CREATE TABLE job_logs (
  id          bigserial PRIMARY KEY,
  job_id      bigint NOT NULL REFERENCES jobs(id),
  attempt     integer NOT NULL,
  level       text NOT NULL DEFAULT 'info',
  message     text NOT NULL,
  created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX job_logs_job_idx ON job_logs (job_id, attempt, id);

CREATE TABLE audit_log (
  id           bigserial PRIMARY KEY,
  actor        text NOT NULL,
  action       text NOT NULL,
  target_type  text NOT NULL,
  target_id    text NOT NULL,
  details      jsonb NOT NULL DEFAULT '{}',
  created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX audit_log_created_idx ON audit_log (created_at DESC);
