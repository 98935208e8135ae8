-- A login code is stored before its email is sent (so that concurrent requests
-- of one account see it against the hourly limit) and is usable only once the
-- email went out: sent_at is NULL while it is being sent. A code whose email
-- failed is deleted; one left behind by a process that stopped mid-send stops
-- counting after a minute (src/domain/accounts/login.ts).
ALTER TABLE login_codes ADD COLUMN sent_at timestamptz;
UPDATE login_codes SET sent_at = created_at;
