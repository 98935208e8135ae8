-- The retention sweep deletes daemon events and finished webhook deliveries past
-- their keeping (src/workers/retention.ts). daemon_events is written in time
-- order and never updated, so a BRIN index on created_at finds the old pages
-- for a few kilobytes; the outbox's finished rows are a partial index of their own.
CREATE INDEX daemon_events_created_brin ON daemon_events USING brin (created_at);
CREATE INDEX webhook_outbox_finished_idx ON webhook_outbox (created_at) WHERE status <> 'pending';
