// Cross-process provider signals (LISTEN/NOTIFY). A change of what a daemon is
// sent as its settings is announced on SETTINGS_CHANNEL by a trigger on
// providers (migration 039), in the transaction that made it, whichever route
// or sweep wrote it. Payload: the provider's id.
export const SETTINGS_CHANNEL = "svc_provider_settings";
