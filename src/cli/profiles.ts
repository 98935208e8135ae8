// Profiles: where `svc login` keeps a base URL, a role and its credential.
// One JSON file in the user's config folder (folder 0700, file 0600, written
// atomically and durably, one save at a time: see saveProfile). The
// environment overrides a profile, so scripts and CI need no file: SVC_URL,
// SVC_KEY (renter or provider key: the role is its prefix's), SVC_ADMIN_TOKEN
// (the admin role, when SVC_KEY is not set), SVC_ROLE (the role, whatever the
// credential says), SVC_PROFILE (which profile).
import crypto from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

export type Role = "renter" | "provider" | "admin";
export const ROLES: readonly Role[] = ["renter", "provider", "admin"];

export interface Profile {
  url: string;
  role: Role;
  /** The renter or provider key, or the admin token. */
  secret: string;
}

interface ProfilesFile {
  default?: string;
  profiles: Record<string, Profile>;
}

export function configDir(env = process.env): string {
  if (env.SVC_CONFIG_DIR) return env.SVC_CONFIG_DIR;
  const base = env.XDG_CONFIG_HOME || path.join(os.homedir(), ".config");
  return path.join(base, "svc");
}

const fileOf = (env = process.env) => path.join(configDir(env), "profiles.json");

/** The saved profiles; a file that cannot be read or is not svc's JSON is a usage error that names it. */
export function readProfiles(env = process.env): ProfilesFile {
  const file = fileOf(env);
  let text: string;
  try {
    text = fs.readFileSync(file, "utf8");
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return { profiles: {} };
    throw new UsageError(`cannot read ${file}: ${(err as Error).message}`);
  }
  const broken = (why: string) => new UsageError(`${file} is not a valid profiles file (${why}): fix it, or remove it and run \`svc login\` again`);
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch (err) {
    throw broken((err as Error).message);
  }
  const profiles = (parsed as Partial<ProfilesFile> | null)?.profiles;
  if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed) || typeof profiles !== "object" || profiles === null || Array.isArray(profiles)) {
    throw broken('not an object with "profiles"');
  }
  return parsed as ProfilesFile;
}

function readProfilesOrNone(env: NodeJS.ProcessEnv): ProfilesFile {
  try {
    return readProfiles(env);
  } catch (err) {
    if (err instanceof UsageError) return { profiles: {} };
    throw err;
  }
}

/**
 * Makes the profiles' folder 0700 when it is svc's own: mkdirSync's mode applies only to a folder
 * it creates. Left as it is: a symlink (chmod would change its target, set up on purpose), a folder
 * of another user, and a SVC_CONFIG_DIR that holds other files than svc's (a folder shared with
 * something else is not svc's to lock down). The file itself is 0600 whatever the folder.
 */
function tightenDir(dir: string, env: NodeJS.ProcessEnv): void {
  if (process.platform === "win32") return;
  const st = fs.lstatSync(path.resolve(dir)); // resolved: no trailing slash, which would follow a symlink
  if (!st.isDirectory() || st.uid !== process.getuid?.() || (st.mode & 0o077) === 0) return;
  const ownFile = (name: string) => name === "profiles.json" || name === "profiles.json.lock" || OWN_TEMP.test(name);
  if (env.SVC_CONFIG_DIR && !fs.readdirSync(dir).every(ownFile)) return;
  fs.chmodSync(path.resolve(dir), 0o700);
}

/** svc's temp files beside profiles.json: a new file (.tmp) or a stale lock set aside (.stale); `<pid>.tmp` of an svc of before. */
const OWN_TEMP = /^profiles\.json(\.lock)?\.\d+(\.[0-9a-f]+)?\.(tmp|stale)$/;

/**
 * Saves profile `name` (the first one saved becomes the default) and returns the file's path.
 * Saves run one at a time (withLock): each reads the file, changes its profile and writes the whole
 * file, so two run at once (two logins) would otherwise keep only the last one's. The file is
 * replaced whole (writeDurably): a reader sees the old file or the new one, a crash leaves one of them.
 */
export function saveProfile(name: string, p: Profile, env = process.env): string {
  const dir = configDir(env);
  fs.mkdirSync(dir, { recursive: true, mode: 0o700 });
  tightenDir(dir, env);
  const file = fileOf(env);
  withLock(`${file}.lock`, () => {
    const all = readProfiles(env);
    all.profiles[name] = p;
    all.default ??= name;
    writeDurably(file, JSON.stringify(all, null, 2) + "\n");
  });
  return file;
}

/** O_NOFOLLOW where the platform has it (not Windows, which has no symlinks to fear here). */
const NOFOLLOW = fs.constants.O_NOFOLLOW ?? 0;
/** Opens a file svc creates: a new one (never one there, nor through a symlink planted at its path), 0600. */
const EXCLUSIVE = fs.constants.O_WRONLY | fs.constants.O_CREAT | fs.constants.O_EXCL | NOFOLLOW;

/** A name beside `file` no one else can have taken or guessed: pid and random bytes. */
const uniqueBeside = (file: string, suffix: string) => `${file}.${process.pid}.${crypto.randomBytes(8).toString("hex")}.${suffix}`;

/**
 * Replaces `file` with `text`, 0600 from its first byte: written into a temp file of its own beside it
 * (created exclusively, following no symlink: one planted in a shared folder redirects nothing),
 * synced to disk, renamed over `file` (atomic), and the folder synced so that the rename lasts
 * (where the platform allows it). A crash leaves the old file or the new one, never an empty one.
 */
function writeDurably(file: string, text: string): void {
  const tmp = uniqueBeside(file, "tmp");
  const fd = fs.openSync(tmp, EXCLUSIVE, 0o600);
  try {
    try {
      fs.fchmodSync(fd, 0o600); // whatever the umask
      const data = Buffer.from(text);
      for (let at = 0; at < data.length; ) at += fs.writeSync(fd, data, at);
      fs.fsyncSync(fd);
    } finally {
      fs.closeSync(fd);
    }
    fs.renameSync(tmp, file);
  } catch (err) {
    fs.rmSync(tmp, { force: true });
    throw err;
  }
  syncFolder(path.dirname(file));
}

/** fsync of a folder, so that a rename in it is on disk; not every platform or file system can (Windows, some network ones). */
function syncFolder(dir: string): void {
  let fd: number | undefined;
  try {
    fd = fs.openSync(dir, fs.constants.O_RDONLY);
    fs.fsyncSync(fd);
  } catch {
    // The rename is done; only its durability across a crash is left to the file system.
  } finally {
    if (fd !== undefined) fs.closeSync(fd);
  }
}

/** A lock older than this is one left behind: a save holds it for milliseconds. */
const STALE_LOCK_MS = 10_000;

/**
 * Runs `fn` holding the lock file `lock`: a file created exclusively (O_CREAT|O_EXCL, 0600) that
 * says who holds it ("<pid> <host> <token>"), removed after. Waits while another process holds it,
 * and sets aside a lock left behind (isStale): its process (on this host) is gone, or it is older
 * than STALE_LOCK_MS, as a save killed or a machine stopped while it saved leaves it.
 */
function withLock<T>(lock: string, fn: () => T): T {
  const token = `${process.pid} ${os.hostname()} ${crypto.randomBytes(8).toString("hex")}\n`;
  for (let waited = 0; ; waited++) {
    try {
      const fd = fs.openSync(lock, EXCLUSIVE, 0o600);
      try {
        fs.writeSync(fd, token);
      } finally {
        fs.closeSync(fd);
      }
      break;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== "EEXIST") throw err;
    }
    const held = lockHolder(lock);
    if (held && isStale(held)) setAside(lock, held);
    else sleepMs(Math.min(5 * 2 ** waited, 100) * (0.5 + Math.random()));
  }
  try {
    return fn();
  } finally {
    // Removed only while it is still this save's (not set aside by another as stale, then taken).
    if (lockHolder(lock)?.text === token) fs.rmSync(lock, { force: true });
  }
}

interface LockHolder {
  text: string;
  ino: number;
  mtimeMs: number;
}

/** What the lock file says and when it was written; undefined when there is none now. Read without following a symlink. */
function lockHolder(lock: string): LockHolder | undefined {
  let fd: number;
  try {
    fd = fs.openSync(lock, fs.constants.O_RDONLY | NOFOLLOW);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === "ENOENT") return undefined;
    // Not a file svc made (a symlink: ELOOP): judged by its age alone.
    const st = fs.lstatSync(lock, { throwIfNoEntry: false });
    return st && { text: "", ino: st.ino, mtimeMs: st.mtimeMs };
  }
  try {
    const st = fs.fstatSync(fd);
    const buf = Buffer.alloc(200);
    const n = fs.readSync(fd, buf, 0, buf.length, 0);
    return { text: buf.toString("utf8", 0, n), ino: st.ino, mtimeMs: st.mtimeMs };
  } finally {
    fs.closeSync(fd);
  }
}

function isStale(held: LockHolder): boolean {
  if (Date.now() - held.mtimeMs > STALE_LOCK_MS) return true;
  const [pid, host] = held.text.split(" ");
  // A holder of this host that is not running: gone without removing it. Another host's is judged by age.
  if (host !== os.hostname() || !/^\d+$/.test(pid)) return false;
  try {
    process.kill(Number(pid), 0);
    return false;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === "ESRCH";
  }
}

/**
 * Moves the stale lock `held` out of the way: renamed to a name of this process's (atomic: of two
 * that find it stale, one moves it), then removed if it is the one judged stale. If another process
 * set it aside and took the lock in between, what was moved is that live lock: it is put back
 * (link: only where no lock is now) and waited for as any other.
 */
function setAside(lock: string, held: LockHolder): void {
  const aside = uniqueBeside(lock, "stale");
  try {
    fs.renameSync(lock, aside);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return; // set aside by another already
    throw err;
  }
  // The same file, and not a new lock that reused its inode number: its text names its holder and a random token.
  const moved = lockHolder(aside);
  if (moved && (moved.ino !== held.ino || moved.text !== held.text)) {
    try {
      fs.linkSync(aside, lock);
    } catch {
      // A lock is there again: this one's holder will find its own gone, and leave that one be.
    }
  }
  fs.rmSync(aside, { force: true });
}

/** Blocks this thread for `ms` (svc saves synchronously; nothing else runs meanwhile). */
function sleepMs(ms: number): void {
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);
}

/**
 * The profile in effect: --profile, else SVC_PROFILE, else the default one; then the
 * environment. The role goes with the credential: SVC_KEY's prefix when SVC_KEY is set, admin
 * when only SVC_ADMIN_TOKEN is, the stored profile's otherwise (SVC_ROLE overrides all three);
 * a stored secret is used only for the role and the server (origin) it was saved with: SVC_URL
 * naming another server takes SVC_KEY / SVC_ADMIN_TOKEN, so a profile's key is never sent elsewhere.
 * SVC_URL, SVC_KEY, SVC_ADMIN_TOKEN or SVC_PROFILE set to the empty string counts as not set.
 */
export function resolveProfile(name: string | undefined, given = process.env): Profile & { name: string } {
  // An empty variable (`SVC_URL=` or `SVC_KEY=` in an env file) is unset: it hides nothing saved.
  const env = { ...given };
  for (const k of ["SVC_URL", "SVC_KEY", "SVC_ADMIN_TOKEN", "SVC_PROFILE"] as const) if (env[k] === "") delete env[k];
  // The environment alone (SVC_URL and a key or token, no --profile) needs no profiles file: one that is broken is not read.
  const envAlone = !name && env.SVC_URL !== undefined && (env.SVC_KEY !== undefined || env.SVC_ADMIN_TOKEN !== undefined);
  const all = envAlone ? readProfilesOrNone(env) : readProfiles(env);
  const chosen = name ?? env.SVC_PROFILE ?? all.default ?? "default";
  const stored: Partial<Profile> = all.profiles[chosen] ?? {};
  const named = name ?? env.SVC_PROFILE;
  if (named && !all.profiles[named] && !env.SVC_URL) {
    throw new UsageError(`no profile named "${named}"${name ? "" : ", which SVC_PROFILE names"} (svc login --profile ${named})`);
  }
  const role = roleInEffect(env, stored);
  const url = env.SVC_URL ?? stored.url;
  const savedFor = url !== undefined && sameOrigin(url, stored.url);
  const own = savedFor ? ownSecret(stored, role) : undefined;
  const secret = role === "admin" ? (env.SVC_ADMIN_TOKEN ?? own) : (env.SVC_KEY ?? own);
  if (!url || !role || !secret) {
    const elsewhere = stored.secret && !savedFor && stored.url ? ` (profile "${chosen}" holds a key for ${stored.url}, not for SVC_URL ${url})` : "";
    throw new AuthMissing(`not logged in${elsewhere}: run \`svc login\` (or set SVC_URL and SVC_KEY / SVC_ADMIN_TOKEN)`);
  }
  if (!ROLES.includes(role)) throw new UsageError(`unknown role "${role}" (renter, provider or admin)`);
  return { name: chosen, url: checkBaseUrl(url, env.SVC_URL ? "SVC_URL" : `the URL of profile "${chosen}"`), role, secret };
}

function roleInEffect(env: NodeJS.ProcessEnv, stored: Partial<Profile>): Role | undefined {
  if (env.SVC_ROLE) return env.SVC_ROLE as Role;
  if (env.SVC_KEY) {
    const role = roleOfKey(env.SVC_KEY) ?? (stored.role === "admin" ? undefined : stored.role);
    if (!role) throw new UsageError("SVC_KEY is neither a renter key (svc-renter-…) nor a provider key (svc-provider-…): set SVC_ROLE");
    return role;
  }
  if (env.SVC_ADMIN_TOKEN) return "admin";
  return stored.role;
}

const ownSecret = (stored: Partial<Profile>, role: Role | undefined) => (stored.role === role ? stored.secret : undefined);

/** Whether two base URLs name the same server (scheme, host and port); false when either is not a URL. */
function sameOrigin(a: string, b: string | undefined): boolean {
  if (b === undefined) return false;
  try {
    return new URL(a).origin === new URL(b).origin;
  } catch {
    return false;
  }
}

/** A server base URL as given (--url, SVC_URL, a profile): http:// or https://, without trailing slashes. */
export function checkBaseUrl(url: string, what: string): string {
  let parsed: URL | undefined;
  try {
    parsed = new URL(url);
  } catch {
    // Not a URL at all.
  }
  if (!parsed || (parsed.protocol !== "http:" && parsed.protocol !== "https:") || !parsed.host) {
    throw new UsageError(`${what} "${url}" is not an http:// or https:// URL${/^[\w.-]+(:\d+)?(\/.*)?$/.test(url) ? ` (did you mean http://${url}?)` : ""}`);
  }
  return url.replace(/\/+$/, "");
}

/** "a renter", "an admin": the article of a role (or a list of them: "a renter or admin"). */
export const withArticle = (word: string) => `${/^[aeiou]/i.test(word) ? "an" : "a"} ${word}`;

export function roleOfKey(key: string | undefined): Role | undefined {
  if (key?.startsWith("svc-renter-")) return "renter";
  if (key?.startsWith("svc-provider-")) return "provider";
  return undefined;
}

/** A key or token as it may be shown: its prefix and last four characters. */
export function maskSecret(secret: string): string {
  const prefix = /^svc-(renter|provider)-/.exec(secret)?.[0] ?? "";
  return `${prefix}…${secret.slice(-4)}`;
}

export class UsageError extends Error {}
export class AuthMissing extends Error {}
