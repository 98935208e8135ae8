-- The suspended renters, for the queue positions (src/domain/dispatch/dispatch.ts
-- queuePlaces), which leave their queued jobs out: read through this index, the
-- few suspended renters cost a few entries however many renters there are.
CREATE INDEX renters_suspended_idx ON renters (id) WHERE status = 'suspended';
