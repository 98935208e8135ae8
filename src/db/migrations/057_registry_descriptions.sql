-- An approved image's public description is the reviewer's (src/domain/jobs/registry.ts); approval
-- used to copy the renter's private request reason into it. Those copies are cleared: the listing
-- (GET /api/registry/images) shows an empty description until an operator approves the image again
-- with one.
UPDATE approved_images a SET description = ''
FROM image_requests r
WHERE r.id = a.request_id AND a.description <> '' AND a.description = coalesce(r.reason, '');
