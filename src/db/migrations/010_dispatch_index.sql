-- Placement at fleet scale. Finding the provider for a new job used to scan
-- every provider and sort them; with 100,000 providers that is the whole
-- table per submit. This index holds the providers that could take work, most
-- reliable first, so placement reads candidates in that order and stops after
-- a few (src/domain/dispatch/dispatch.ts placeJob). Its predicate is the state part of
-- availableSql (dispatch.ts); what depends on the clock (last heartbeat, run
-- window) and on the job (fit, free slot) is checked per candidate.
--
-- It is on providers, not provider_load: the busy counter changes with every
-- assignment, and indexing it would make each of those updates write index
-- entries (no HOT update) that every placement then has to step over. A
-- steady heartbeat leaves these columns as they are, so its update stays HOT.
CREATE INDEX providers_dispatch_idx ON providers (reliability_score DESC NULLS LAST, id)
  WHERE approval_status = 'approved' AND NOT is_paused AND status NOT IN ('suspended', 'offline', 'paused');
