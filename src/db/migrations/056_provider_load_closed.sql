-- An administrator's suspension or rejection of a provider closes its load row
-- too (provider_load.closed), in the transaction that records it. Every
-- assignment locks that row, so the two are ordered: an assignment already
-- holding it commits first (and the suspension's re-queue then finds its job),
-- and one that locks it afterwards sees `closed` on the row it locked, even if
-- its statement read the provider's status before the suspension committed.
ALTER TABLE provider_load ADD COLUMN closed boolean NOT NULL DEFAULT false;

UPDATE provider_load l SET closed = true
FROM providers p
WHERE p.id = l.provider_id AND (p.status = 'suspended' OR p.approval_status = 'rejected');
