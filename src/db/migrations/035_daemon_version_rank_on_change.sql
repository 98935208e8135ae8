-- daemon_version_rank (migration 020) was a stored generated column, and
-- PostgreSQL computes every stored generated column again on each UPDATE of
-- its row, whatever the update sets. So the rank's regexp ran for every
-- provider in every heartbeat write: a third of the telemetry batch's time in
-- the database. The rank is now a plain column kept by triggers that compute
-- it only when a row is inserted or its daemon_version written with another
-- value. A direct write of the rank is put back to the version's rank, so it
-- stays derived as before.
ALTER TABLE providers ALTER COLUMN daemon_version_rank DROP EXPRESSION;

CREATE FUNCTION providers_version_rank() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  NEW.daemon_version_rank := svc_version_rank(NEW.daemon_version);
  RETURN NEW;
END $$;

CREATE TRIGGER providers_version_rank_insert BEFORE INSERT ON providers
  FOR EACH ROW EXECUTE FUNCTION providers_version_rank();

-- The WHEN clause is evaluated without calling the function: an update that
-- leaves both columns as they were (a steady heartbeat) costs no regexp.
CREATE TRIGGER providers_version_rank_update BEFORE UPDATE OF daemon_version, daemon_version_rank ON providers
  FOR EACH ROW
  WHEN (NEW.daemon_version IS DISTINCT FROM OLD.daemon_version OR NEW.daemon_version_rank IS DISTINCT FROM OLD.daemon_version_rank)
  EXECUTE FUNCTION providers_version_rank();
