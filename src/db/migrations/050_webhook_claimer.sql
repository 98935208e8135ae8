-- Who holds a webhook delivery's claim: the application_name of the claiming
-- process's connections (src/db/index.ts, one per process). A claim reserves
-- a delivery for 60 s so that no other process sends it meanwhile; when the
-- claiming process died (killed, its machine gone), every other process had
-- to wait out those 60 s. A claim whose process has no connection left is
-- released at once (src/domain/notify/webhooks.ts releaseOrphanedClaims).
-- NULL: not claimed (never, or the claim ended: delivered, failed, rescheduled).
ALTER TABLE webhook_outbox ADD COLUMN claimed_by text;
CREATE INDEX webhook_outbox_claimed_idx ON webhook_outbox (claimed_by) WHERE status = 'pending' AND claimed_by IS NOT NULL;
