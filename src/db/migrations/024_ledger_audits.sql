-- Ledger audits (src/domain/money/ledger-audit.ts): each run's figures, kept
-- so that every process shows the last one on /metrics (svc_ledger_drift_halala)
-- whichever process ran it, and so the periodic run happens once per period
-- across processes (the elected one checks when the last run finished).
CREATE TABLE ledger_audits (
  id             bigserial PRIMARY KEY,
  trigger        text NOT NULL CHECK (trigger IN ('schedule', 'admin')),
  started_at     timestamptz NOT NULL,
  finished_at    timestamptz NOT NULL DEFAULT now(),
  ms             integer NOT NULL,
  drift_halala   bigint NOT NULL,
  discrepancies  integer NOT NULL,
  -- The figures and the first discrepancies, as the admin route answers them.
  report         jsonb NOT NULL
);
