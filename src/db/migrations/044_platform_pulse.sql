-- The platform's own pulse (src/domain/shared/platform-pulse.ts): every server
-- process writes `last_at` every few seconds; when it was not written for a
-- while (the database away, every process down), `up_since` moves to the
-- moment it was written again. A provider's silence counts against it only
-- once the platform has been up for a whole live window: providers are not
-- blamed for heartbeats the platform could not take. Seeded as up since
-- forever, so that a database migrated and served at once grants no grace.
CREATE TABLE platform_pulse (
  id        smallint PRIMARY KEY CHECK (id = 1),
  last_at   timestamptz NOT NULL,
  up_since  timestamptz NOT NULL
);
INSERT INTO platform_pulse (id, last_at, up_since) VALUES (1, now(), '-infinity');
