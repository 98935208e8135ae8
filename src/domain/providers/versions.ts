// Daemon versions: semantic-version precedence (semver.org §11) and the
// update signals a heartbeat returns. min/latest come from config
// (SVC_DAEMON_MIN_VERSION, SVC_DAEMON_LATEST_VERSION).
import { DAEMON_MIN_RELEASE } from "../../shared/daemon-release.js";
import type { Db } from "../../db/index.js";

export interface Version {
  major: number;
  minor: number;
  patch: number;
  prerelease: (string | number)[];
}

const VERSION = /^v?(\d{1,9})(?:\.(\d{1,9}))?(?:\.(\d{1,9}))?(?:-([0-9A-Za-z.-]+))?(?:\+[0-9A-Za-z.-]+)?$/;

const parsed = new Map<string, Version | undefined>();

/** Parses "3.2.1", "v3.2", "3.2.1-beta.2+build"; undefined when it is not a version. */
export function parseVersion(text: string | undefined | null): Version | undefined {
  const key = text ?? "";
  if (parsed.has(key)) return parsed.get(key);
  const v = parse(key);
  if (parsed.size >= 1000) parsed.clear(); // daemons report few distinct versions
  parsed.set(key, v);
  return v;
}

function parse(text: string): Version | undefined {
  const m = VERSION.exec(text.trim());
  if (!m) return undefined;
  const prerelease = m[4] ? m[4].split(".").map((p) => (/^\d+$/.test(p) ? Number(p) : p)) : [];
  return { major: Number(m[1]), minor: Number(m[2] ?? 0), patch: Number(m[3] ?? 0), prerelease };
}

/** -1, 0 or 1 by semver precedence (build metadata ignored; a pre-release sorts before its release). */
export function compareVersions(a: Version, b: Version): number {
  for (const k of ["major", "minor", "patch"] as const) {
    if (a[k] !== b[k]) return a[k] < b[k] ? -1 : 1;
  }
  if (a.prerelease.length === 0 || b.prerelease.length === 0) {
    return a.prerelease.length === b.prerelease.length ? 0 : a.prerelease.length === 0 ? 1 : -1;
  }
  for (let i = 0; i < Math.max(a.prerelease.length, b.prerelease.length); i++) {
    const x = a.prerelease[i];
    const y = b.prerelease[i];
    if (x === undefined) return -1;
    if (y === undefined) return 1;
    if (x === y) continue;
    if (typeof x === "number" && typeof y === "number") return x < y ? -1 : 1;
    if (typeof x === "number") return -1; // numeric identifiers sort before alphanumeric ones
    if (typeof y === "number") return 1;
    return x < y ? -1 : 1;
  }
  return 0;
}

/**
 * The minimum daemon version that is given jobs (SVC_DAEMON_MIN_VERSION, set
 * at start). Below it a daemon may not verify this server's tasks (the field's
 * legacy line checks task_spec_hmac over a string; ours over the object), so
 * it only heartbeats until it has updated itself.
 */
export const daemonPolicy = { minVersion: DAEMON_MIN_RELEASE };

/** The rank the database keeps of a version (migration 020, svc_version_rank): major, minor, patch. */
export function versionRank(text: string): number | undefined {
  const v = parseVersion(text);
  if (!v || v.major >= 1e6 || v.minor >= 1e6 || v.patch >= 1e6) return undefined;
  return v.major * 1e12 + v.minor * 1e6 + v.patch;
}

/** The rank of SVC_DAEMON_MIN_VERSION: a daemon below it is not given jobs. */
export const minDaemonRank = () => versionRank(daemonPolicy.minVersion) ?? 0;

/**
 * Provider `alias`'s daemon can verify this server's tasks: it pinned no other task-signing key
 * (task-key.ts) and is not below the minimum version. One that cannot is heard but given no jobs
 * (dispatch.ts liveSql), and earns no uptime (heartbeat-write.ts coverageSet).
 */
export function verifiesTasksSql(db: Db, alias: string) {
  const a = db(alias);
  return db`(${a}.task_key_mismatch IS NULL AND (${a}.daemon_version_rank IS NULL OR ${a}.daemon_version_rank >= ${minDaemonRank()}))`;
}

/**
 * Provider `alias`'s daemon could verify this server's tasks but for its version: it pinned no
 * other key and is below the minimum (verifiesTasksSql's version part, the other way round).
 */
export function outdatedDaemonSql(db: Db, alias: string) {
  const a = db(alias);
  return db`(${a}.task_key_mismatch IS NULL AND ${a}.daemon_version_rank < ${minDaemonRank()})`;
}

/** Whether a reported daemon version is below the minimum given jobs (unknown: not below). */
export function belowMinimum(reported: string | null | undefined): boolean {
  const v = parseVersion(reported);
  const min = parseVersion(daemonPolicy.minVersion);
  return !!(v && min && compareVersions(v, min) < 0);
}

export interface UpdateSignals {
  updateAvailable: boolean;
  needsUpdate: boolean;
  latestVersion: string;
  minVersion: string;
  /** A newer release than the daemon's exists (said in the heartbeat's message only). */
  newerRelease: boolean;
}

/**
 * `needs_update` and `update_available`: the daemon is below the minimum (it
 * must update). The interface defines `update_available` so, and daemons act
 * on it (the legacy daemon updates itself when it is true): a daemon at or
 * above the minimum is only told, in the message, that a newer release
 * exists. A daemon that reports no parseable version gets no signal: nothing
 * is known to compare.
 */
export function updateSignals(reported: string | undefined | null, minVersion: string, latestVersion: string): UpdateSignals {
  const v = parseVersion(reported);
  const min = parseVersion(minVersion);
  const latest = parseVersion(latestVersion);
  const needsUpdate = !!(v && min && compareVersions(v, min) < 0);
  const newerRelease = !!(v && latest && compareVersions(v, latest) < 0);
  return { updateAvailable: needsUpdate, needsUpdate, latestVersion, minVersion, newerRelease };
}
