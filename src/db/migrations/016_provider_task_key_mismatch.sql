-- Set when a provider's stream daemon connects having pinned another task-signing key for this
-- server than the server's own (the server was replaced, or its database recreated): that
-- daemon refuses every task, so dispatch must not assign the provider any job (dispatch.ts
-- liveSql) until a daemon connects with the right key, which clears it. Holds the reason shown
-- to the provider and to admins.
ALTER TABLE providers ADD COLUMN task_key_mismatch text;
