-- A provider's pause and its going offline are written on its load row too
-- (provider_load.away), as a suspension closes it (migration 056). Every
-- assignment reads the provider's availability on its statement's snapshot of
-- `providers` and then locks the provider's load row; a pause or the liveness
-- sweep's "offline" committed in between was not seen, and a job landed on a
-- provider that had already been told it was paused, or had already had its
-- work re-queued as silent. Now the change waits for the load row: an
-- assignment already holding it commits first (the pause is answered after
-- it; the sweep's re-queue then finds its job), and one that locks it
-- afterwards sees `away` on the row it locked, whatever its snapshot said.
--
-- `away` is true while the provider is paused (is_paused, or status paused) or
-- offline: the states availableSql (src/domain/dispatch/dispatch.ts) excludes
-- besides a suspension, which `closed` covers. It is kept by a trigger, so every path that
-- changes the provider's state keeps it (pause and resume, the liveness sweep,
-- heartbeats bringing a provider back online, an operator's decisions), and
-- none can leave a provider that takes work marked away. The trigger runs only
-- when that changes: a steady heartbeat's update does not run it.
ALTER TABLE provider_load ADD COLUMN away boolean NOT NULL DEFAULT false;

CREATE FUNCTION providers_load_away() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  UPDATE provider_load SET away = (NEW.is_paused OR NEW.status IN ('paused', 'offline'))
  WHERE provider_id = NEW.id;
  RETURN NULL;
END $$;

CREATE TRIGGER providers_load_away AFTER UPDATE OF status, is_paused ON providers FOR EACH ROW
  WHEN ((OLD.is_paused OR OLD.status IN ('paused', 'offline'))
        IS DISTINCT FROM (NEW.is_paused OR NEW.status IN ('paused', 'offline')))
  EXECUTE FUNCTION providers_load_away();

UPDATE provider_load l SET away = true
FROM providers p
WHERE p.id = l.provider_id AND (p.is_paused OR p.status IN ('paused', 'offline'));
