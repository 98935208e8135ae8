-- Revocation of receipt keys (src/domain/money/receipts.ts). A revoked key is
-- no longer trusted: its seed may have leaked, so anything it signed could be a
-- forgery. It is retired too (a revoked current key is replaced in the same
-- transaction). Every receipt stored under it is signed again with the current
-- key; the receipt itself is not changed (job_receipts stays immutable): its
-- new signature is kept beside it, in receipt_signatures.
--
-- Re-signing runs in batches after the revocation commits, in job id order:
-- resign_cursor is the last job a committed batch covered, so a run stopped
-- midway resumes there; resigned_at is set when a run found nothing left.
ALTER TABLE receipt_keys
  ADD COLUMN revoked_at timestamptz,
  ADD COLUMN revocation_reason text,
  ADD COLUMN resign_cursor bigint NOT NULL DEFAULT 0,
  ADD COLUMN resigned_at timestamptz,
  ADD CONSTRAINT receipt_keys_revoked_retired CHECK (revoked_at IS NULL OR retired_at IS NOT NULL);

-- A stored receipt's signatures by keys other than the one it was issued
-- under: made when that key (or a key that signed it since) was revoked.
CREATE TABLE receipt_signatures (
  job_id      bigint NOT NULL REFERENCES job_receipts(job_id),
  key_id      text NOT NULL REFERENCES receipt_keys(key_id),
  value       text NOT NULL,
  created_at  timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (job_id, key_id)
);
CREATE INDEX receipt_signatures_key_idx ON receipt_signatures (key_id, job_id);

-- A key's receipts, in the order re-signing walks them.
CREATE INDEX job_receipts_key_idx ON job_receipts (key_id, job_id);
