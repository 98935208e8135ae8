// The TypeScript daemon's version, compared by the server with
// SVC_DAEMON_MIN_VERSION / SVC_DAEMON_LATEST_VERSION.
export { DAEMON_RELEASE as DAEMON_VERSION } from "../../shared/daemon-release.js";
