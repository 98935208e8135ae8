-- Usage a serving endpoint reported beyond what the gateway can see delivered
-- (src/domain/token-pricing.ts bounds). prompt_tokens and completion_tokens
-- stay the billed figures; the reported ones are kept beside them (NULL when the
-- gateway counted the tokens itself), and overstated_tokens is what went
-- unbilled. The partial index serves the reliability read (reputation.ts):
-- overstated requests of a provider in a window, a small set.
ALTER TABLE v1_usage
  ADD COLUMN reported_prompt_tokens     bigint,
  ADD COLUMN reported_completion_tokens bigint,
  ADD COLUMN overstated_tokens          bigint NOT NULL DEFAULT 0;
CREATE INDEX v1_usage_overstated_idx ON v1_usage (provider_id, ended_at) WHERE overstated_tokens > 0;
