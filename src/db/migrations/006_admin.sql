-- Admin area: the container registry, the shared rate-limit store, and the
-- indexes behind the admin lists and the dashboard.

-- A renter's request to run an image in custom_container jobs.
CREATE TABLE image_requests (
  id           bigserial PRIMARY KEY,
  image        text NOT NULL,
  renter_id    bigint NOT NULL REFERENCES renters(id),
  status       text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending','approved','rejected')),
  reason       text,
  review_note  text,
  scan_status  text CHECK (scan_status IN ('passed','pending')),
  created_at   timestamptz NOT NULL DEFAULT now(),
  reviewed_at  timestamptz
);
-- One open request per renter and image.
CREATE UNIQUE INDEX image_requests_open_key ON image_requests (renter_id, image) WHERE status = 'pending';
CREATE INDEX image_requests_status_idx ON image_requests (status, created_at DESC);
CREATE INDEX image_requests_renter_idx ON image_requests (renter_id, created_at DESC);

-- Images approved by an admin (the built-in list lives in src/domain/jobs/registry.ts).
CREATE TABLE approved_images (
  image        text PRIMARY KEY,
  description  text NOT NULL DEFAULT '',
  request_id   bigint REFERENCES image_requests(id),
  scan_status  text NOT NULL CHECK (scan_status IN ('passed','pending')),
  approved_at  timestamptz NOT NULL DEFAULT now()
);

-- rate-limiter-flexible's PostgreSQL store (src/http/rate-limits.ts): one row
-- per limited subject, `expire` in epoch milliseconds. UNLOGGED: counters are
-- hot, short-lived and not worth WAL; a crash merely resets them.
CREATE UNLOGGED TABLE rate_limits (
  key     varchar(255) PRIMARY KEY,
  points  integer NOT NULL DEFAULT 0,
  expire  bigint
);
CREATE INDEX rate_limits_expire_idx ON rate_limits (expire);

CREATE INDEX audit_log_target_idx ON audit_log (target_type, target_id, created_at DESC);
CREATE INDEX audit_log_action_idx ON audit_log (action, created_at DESC);
CREATE INDEX admin_jobs_status_idx ON jobs (status, submitted_at DESC);
CREATE INDEX admin_jobs_submitted_idx ON jobs (submitted_at DESC);
CREATE INDEX admin_ledger_kind_created_idx ON ledger_transfers (kind, created_at);
