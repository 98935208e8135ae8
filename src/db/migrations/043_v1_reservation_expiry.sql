-- When a /v1 request's price-cap reservation stops counting, on its row: job
-- submits count a renter's open, unexpired reservations against its available
-- funds (src/domain/jobs/submit.ts), so that a job's hold and a request in
-- flight cannot promise the same halala, and they do not know the gateway's
-- time limit. Reservations open now get the default limit (900 s + 60).
ALTER TABLE v1_usage ADD COLUMN expires_at timestamptz;
UPDATE v1_usage SET expires_at = created_at + interval '960 seconds' WHERE state = 'open';
