-- A provider whose daemon reports a version below SVC_DAEMON_MIN_VERSION is
-- not given jobs (the heartbeat's needs_update tells it why; it updates itself
-- through the update route). Dispatch compares this rank, kept by the
-- database from daemon_version: major, minor and patch, each below 10^6, as
-- one number (pre-release tags are not ranked: 5.0.0-rc.1 ranks as 5.0.0).
-- NULL when no parseable version was reported: nothing is known to compare.
CREATE FUNCTION svc_version_rank(v text) RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT CASE WHEN m IS NULL THEN NULL
              ELSE m[1]::bigint * 1000000000000 + coalesce(m[2], '0')::bigint * 1000000 + coalesce(m[3], '0')::bigint END
  FROM (SELECT regexp_match(btrim(v), '^v?(\d{1,6})(?:\.(\d{1,6}))?(?:\.(\d{1,6}))?') AS m) s
$$;

ALTER TABLE providers ADD COLUMN daemon_version_rank bigint GENERATED ALWAYS AS (svc_version_rank(daemon_version)) STORED;
