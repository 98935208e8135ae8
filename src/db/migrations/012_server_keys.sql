-- Keys the server generates for itself once and shares between its processes.
-- The stream's Ed25519 task-signing key lives here: it used to be derived from
-- SVC_HMAC_SECRET, which the legacy daemon file carries to every provider
-- (DESIGN §3), so any provider could have derived the signing key and forged
-- jobs for other providers' stream daemons.
CREATE TABLE server_keys (
  name       text PRIMARY KEY,
  secret     bytea NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now()
);
