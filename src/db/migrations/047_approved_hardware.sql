-- The hardware an admin approved a provider with. Heartbeats report a
-- provider's GPU count and memory, and dispatch placed on what they claimed:
-- an approved provider reporting 1,024 GPUs of 16 TB took one job per claimed
-- GPU and every job asking for more memory than real cards have. Placement now
-- counts at most what was approved (the figures its telemetry showed when an
-- admin approved it, src/domain/providers/approval.ts, or, approved before it
-- reported any, its first report); a provider reporting more is shown as such
-- and needs approving again. NULL: not reported yet (no cap until it is).
ALTER TABLE providers ADD COLUMN approved_gpu_count integer, ADD COLUMN approved_vram_mib bigint;

-- Providers approved already keep what they report now.
UPDATE providers SET approved_gpu_count = greatest(gpu_count, 1), approved_vram_mib = gpu_vram_mib
WHERE approval_status = 'approved' AND gpu_vram_mib IS NOT NULL;
