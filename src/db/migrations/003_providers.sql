-- Provider side: liveness bookkeeping, heartbeat coverage (uptime), the daemon
-- event log, and the SQL forms of two rules the scheduler and the heartbeat
-- write path evaluate inside statements.

ALTER TABLE providers
  ADD COLUMN first_heartbeat_at  timestamptz,
  -- When status last changed (the sweep gives a resumed-but-silent provider one window).
  ADD COLUMN status_since        timestamptz NOT NULL DEFAULT now(),
  -- When uptime_percent and reliability_score were last recomputed.
  ADD COLUMN reputation_at       timestamptz,
  ADD COLUMN readiness_at        timestamptz,
  ADD COLUMN approved_at         timestamptz,
  ADD COLUMN suspended_reason    text,
  ADD COLUMN preload_requested_at timestamptz;

-- Heartbeats rewrite provider rows all day: leave room on each page so the
-- updates stay HOT (no index maintenance; nothing they change is indexed).
ALTER TABLE providers SET (fillfactor = 70);

-- Coverage of the current UTC hour accumulates on the row (see
-- src/domain/providers/heartbeat.ts); finished hours are filed in provider_uptime.
ALTER TABLE providers
  ADD COLUMN uptime_hour          timestamptz,
  ADD COLUMN uptime_hour_seconds  integer NOT NULL DEFAULT 0 CHECK (uptime_hour_seconds BETWEEN 0 AND 3600);

-- No index on last_heartbeat: every beat changes it, and an index on it would
-- make every heartbeat update a non-HOT one. The sweep scans the table.
CREATE INDEX providers_reputation_idx ON providers (reputation_at) WHERE first_heartbeat_at IS NOT NULL;

-- Heartbeat coverage of finished hours: seconds per provider per UTC hour
-- during which the provider was live (each heartbeat covers the time since
-- the previous one, at most the 120 s live window). uptime_percent is the
-- covered share of a sliding 24 h window (src/domain/providers/reputation.ts).
CREATE TABLE provider_uptime (
  provider_id      bigint NOT NULL REFERENCES providers(id) ON DELETE CASCADE,
  hour             timestamptz NOT NULL,
  covered_seconds  integer NOT NULL CHECK (covered_seconds BETWEEN 0 AND 3600),
  PRIMARY KEY (provider_id, hour)
);
CREATE INDEX provider_uptime_hour_idx ON provider_uptime (hour);

-- Seconds of live coverage a heartbeat batch adds: the gap since the previous
-- heartbeat (at most the 120 s live window) up to the batch's first beat,
-- plus the span of the batch itself. The one place this rule lives.
CREATE FUNCTION svc_heartbeat_credit(prev timestamptz, first_ts timestamptz, last_ts timestamptz)
RETURNS integer LANGUAGE sql IMMUTABLE AS $$
  SELECT CASE
    WHEN last_ts IS NULL OR (prev IS NOT NULL AND last_ts <= prev) THEN 0
    ELSE round(
      CASE WHEN prev IS NULL OR first_ts <= prev THEN 0
           ELSE least(extract(epoch FROM first_ts - prev), 120) END
      + extract(epoch FROM last_ts - greatest(first_ts, coalesce(prev, first_ts))))::integer
  END
$$;

-- Same rule as withinRunWindow in src/domain/providers/preferences.ts: always-on and
-- manual always; scheduled only inside [start, end) UTC, crossing midnight
-- when end < start; no valid window means outside.
CREATE FUNCTION svc_within_run_window(run_mode text, start_hhmm text, end_hhmm text, at timestamptz)
RETURNS boolean LANGUAGE sql IMMUTABLE AS $$
  SELECT CASE
    WHEN run_mode IS DISTINCT FROM 'scheduled' THEN true
    WHEN start_hhmm IS NULL OR end_hhmm IS NULL
      OR start_hhmm !~ '^([01][0-9]|2[0-3]):[0-5][0-9]$' OR end_hhmm !~ '^([01][0-9]|2[0-3]):[0-5][0-9]$'
      OR start_hhmm = end_hhmm THEN false
    ELSE (
      WITH w AS (
        SELECT split_part(start_hhmm, ':', 1)::int * 60 + split_part(start_hhmm, ':', 2)::int AS s,
               split_part(end_hhmm, ':', 1)::int * 60 + split_part(end_hhmm, ':', 2)::int AS e,
               extract(hour FROM at AT TIME ZONE 'UTC')::int * 60 + extract(minute FROM at AT TIME ZONE 'UTC')::int AS t
      )
      SELECT CASE WHEN s < e THEN t >= s AND t < e ELSE t >= s OR t < e END FROM w)
  END
$$;

-- What daemons report: crashes, errors, job lifecycle. Queryable per provider.
CREATE TABLE daemon_events (
  id                 bigserial PRIMARY KEY,
  provider_id        bigint NOT NULL REFERENCES providers(id) ON DELETE CASCADE,
  event_type         text NOT NULL,
  severity           text NOT NULL CHECK (severity IN ('info', 'warning', 'error', 'critical')),
  details            text,
  details_truncated  boolean NOT NULL DEFAULT false,
  details_length     integer NOT NULL DEFAULT 0,
  job_id             text,
  daemon_version     text,
  hostname           text,
  os_info            text,
  python_version     text,
  reported_at        timestamptz,
  created_at         timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX daemon_events_provider_idx ON daemon_events (provider_id, id DESC);
