-- When a renter account proved it owns its email address: its first sign-in with
-- the code emailed there (login-email). Registration takes any address, so the
-- address alone proves nothing. The platform's managed-endpoint accounts are
-- named by email (SVC_V1_MANAGED_RENTERS) and act for every renter (public
-- vllm_serve jobs): only an account that proved the address holds that right,
-- not whoever registered it first. Where no email delivery is configured
-- (allowed outside production only), login-email is one step and counts.
ALTER TABLE renters ADD COLUMN email_proven_at timestamptz;
