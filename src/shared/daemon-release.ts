// The daemon release this server ships, in one place so that a release bumps
// the daemon and what the server expects together:
// - DAEMON_RELEASE: the TypeScript daemon's own version, the version of the
//   legacy daemon the server serves, and the default of SVC_DAEMON_LATEST_VERSION
//   (a heartbeat's message tells older daemons it is out);
// - DAEMON_MIN_RELEASE: the default of SVC_DAEMON_MIN_VERSION, the oldest
//   daemon still given jobs. It moves only when the wire or the task format
//   changes in a way older daemons cannot follow.
export const DAEMON_RELEASE = "5.5.0";
export const DAEMON_MIN_RELEASE = "5.0.0";
