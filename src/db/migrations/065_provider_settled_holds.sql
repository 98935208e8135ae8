-- A provider's settled jobs by the time they settled, for its earnings by day
-- (GET /api/providers/earnings, src/domain/money/daily-reports.ts): the window's
-- settlements are read from this index, not every attempt the provider ever ended
-- (job_attempts has no (provider_id, ended_at) index since migration 034).
CREATE INDEX ledger_holds_provider_settled_idx ON ledger_holds (provider_id, closed_at) WHERE status = 'settled';
