-- A daemon stream pushes its provider's settings (the DaemonSettings of
-- daemon.proto: pause, run mode and window, GPU cap, VRAM reserve,
-- temperature limit, approval) whenever they change. It learnt of a change by
-- reading its provider after every heartbeat, whoever had made it: a read per
-- beat of every stream, a sixth of a stream beat's cost in all, for changes
-- that come a few times a day. Every write that changes what a daemon is sent
-- now says so on svc_provider_settings (the provider's id), in its own
-- transaction, so a listener hears only committed changes, and the stream
-- reads its provider only then.
--
-- The condition mirrors settingsOf (src/services/daemon.ts), where a provider
-- is paused when is_paused is set or its status is 'paused': a status moving
-- between online and offline (every first beat, every liveness sweep) is not
-- a settings change and says nothing. A notice said too often costs a read; one
-- left out leaves a daemon on old settings, so any column that feeds the
-- settings is compared.
CREATE FUNCTION svc_notify_provider_settings() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('svc_provider_settings', NEW.id::text);
  RETURN NULL;
END $$;

CREATE TRIGGER providers_settings_notice
  AFTER UPDATE OF is_paused, status, run_mode, scheduled_start, scheduled_end, gpu_usage_cap_pct, vram_reserve_gb,
                  temp_limit_c, approval_status ON providers
  FOR EACH ROW
  WHEN ((OLD.is_paused OR OLD.status = 'paused', OLD.run_mode, OLD.scheduled_start, OLD.scheduled_end, OLD.gpu_usage_cap_pct,
         OLD.vram_reserve_gb, OLD.temp_limit_c, OLD.approval_status)
        IS DISTINCT FROM
        (NEW.is_paused OR NEW.status = 'paused', NEW.run_mode, NEW.scheduled_start, NEW.scheduled_end, NEW.gpu_usage_cap_pct,
         NEW.vram_reserve_gb, NEW.temp_limit_c, NEW.approval_status))
  EXECUTE FUNCTION svc_notify_provider_settings();
