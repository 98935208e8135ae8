-- The providers that could be live (liveSql in src/domain/dispatch/dispatch.ts:
-- approved, neither suspended nor offline, no task-key mismatch; its heartbeat
-- and daemon version are checked per row). Why a queued job waits
-- (explainQueue, read on every poll of a queued job and for each page of
-- GET /api/jobs that holds one) counts the live providers that fit it, at
-- most 1,001 of them; with fewer live than that it read the whole table to
-- find them: 7 ms for 10,000 registered providers with none online, and ten
-- times that at 100,000. Most of a large fleet is offline at any moment, so
-- this index is small. Its columns change only when a provider's state does,
-- which already rewrites an index entry (providers_dispatch_idx's predicate
-- reads status too), so a steady heartbeat's update stays HOT.
CREATE INDEX providers_live_idx ON providers (id)
  WHERE approval_status = 'approved' AND status NOT IN ('suspended', 'offline') AND task_key_mismatch IS NULL;
