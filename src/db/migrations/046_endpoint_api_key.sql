-- A serving job's endpoint secret. The daemon starts vLLM with a key of its
-- own making for each vllm_serve job (VLLM_API_KEY) and reports it with
-- endpoint-ready; the /v1 gateway sends it upstream as a Bearer token, so the
-- published port serves nobody who merely finds it. It is no use once the
-- attempt it was reported for is over, so it is forgotten then, whichever
-- path ends the attempt (completion, failure, cancel, timeout, re-queue, an
-- admin's hand): the trigger clears it when the job leaves pending/running or
-- moves to another attempt or provider. No read of a job shows it.
ALTER TABLE jobs ADD COLUMN endpoint_api_key text;

CREATE FUNCTION svc_forget_endpoint_api_key() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  NEW.endpoint_api_key := NULL;
  RETURN NEW;
END $$;

CREATE TRIGGER jobs_forget_endpoint_api_key
  BEFORE UPDATE OF status, attempt, provider_id ON jobs
  FOR EACH ROW
  WHEN (NEW.endpoint_api_key IS NOT NULL
        AND (NEW.status NOT IN ('pending', 'running') OR NEW.attempt IS DISTINCT FROM OLD.attempt
             OR NEW.provider_id IS DISTINCT FROM OLD.provider_id))
  EXECUTE FUNCTION svc_forget_endpoint_api_key();
