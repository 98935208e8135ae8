// The daemon release this server ships: the TypeScript daemon's own version and
// the default of SVC_DAEMON_MIN_VERSION / SVC_DAEMON_LATEST_VERSION. One place,
// so that a release bumps the daemon and what the server expects together.
export const DAEMON_RELEASE = "5.0.0";
