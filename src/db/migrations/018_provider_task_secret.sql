-- Each provider's legacy daemon file carries a task-signing secret of its own
-- (derived from SVC_HMAC_SECRET, the provider id and task_secret_epoch, which
-- a key rotation bumps), so a secret leaked by one provider forges nothing for
-- another. legacy_task_secret says which secret the provider's legacy daemon
-- holds, as its readiness report last said: 'service' for files downloaded
-- before per-provider secrets (they keep working until they update),
-- 'provider' for files that carry the provider's own.
ALTER TABLE providers
  ADD COLUMN task_secret_epoch integer NOT NULL DEFAULT 0,
  ADD COLUMN legacy_task_secret text NOT NULL DEFAULT 'service' CHECK (legacy_task_secret IN ('service', 'provider'));
