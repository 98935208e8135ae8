// The TypeScript daemon's version, compared by the server with
// SVC_DAEMON_MIN_VERSION / SVC_DAEMON_LATEST_VERSION.
export const DAEMON_VERSION = "5.0.0";
