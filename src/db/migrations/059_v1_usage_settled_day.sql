-- A renter's /v1 usage by day and by model (src/domain/money/daily-reports.ts) dates a settled
-- request by when it was charged (ended_at, the instant of its ledger transfers), as every other
-- money figure does, not by when its budget was reserved: a request that ran past midnight counts
-- on the day its money moved.
CREATE INDEX v1_usage_settled_idx ON v1_usage (renter_id, ended_at) WHERE state = 'settled';
