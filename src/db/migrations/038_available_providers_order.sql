-- GET /api/renters/available-providers lists the available providers largest
-- VRAM first, then most reliable, then oldest, a page at a time, with their
-- count. The index it had sorted by VRAM only, NULLs first where the list
-- puts them last, so every call read every available provider, counted them
-- with a window over those rows and sorted them: 28 ms for the first page at
-- 10,000 online, growing with the fleet, on a route that needs no
-- credential. This index holds the list's order, so a page reads its own rows
-- (and the ones it skips); the count is a statement of its own. Its columns
-- are indexed already (VRAM by the index it replaces, the score by
-- providers_dispatch_idx), so the same updates as before stay HOT, a steady
-- heartbeat's among them.
DROP INDEX providers_available_idx;
CREATE INDEX providers_available_idx ON providers (gpu_vram_mib DESC NULLS LAST, reliability_score DESC NULLS LAST, id)
  WHERE status = 'online' AND NOT is_paused AND approval_status = 'approved';
