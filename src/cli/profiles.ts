// Profiles: where `svc login` keeps a base URL, a role and its credential.
// One JSON file in the user's config folder (folder 0700, file 0600, written
// atomically). The environment overrides a profile, so scripts and CI need no
// file: SVC_URL, SVC_KEY (renter or provider key: the role is its prefix's),
// SVC_ADMIN_TOKEN (the admin role, when SVC_KEY is not set), SVC_ROLE (the
// role, whatever the credential says), SVC_PROFILE (which profile).
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
  const ownFile = (name: string) => name === "profiles.json" || /^profiles\.json\.\d+\.tmp$/.test(name);
  if (env.SVC_CONFIG_DIR && !fs.readdirSync(dir).every(ownFile)) return;
  fs.chmodSync(path.resolve(dir), 0o700);
}

export function saveProfile(name: string, p: Profile, env = process.env): string {
  const dir = configDir(env);
  fs.mkdirSync(dir, { recursive: true, mode: 0o700 });
  tightenDir(dir, env);
  const all = readProfiles(env);
  all.profiles[name] = p;
  all.default ??= name;
  const file = fileOf(env);
  const tmp = `${file}.${process.pid}.tmp`;
  // Created 0600 before anything is written into it; renamed over the old file.
  fs.writeFileSync(tmp, JSON.stringify(all, null, 2) + "\n", { mode: 0o600 });
  fs.chmodSync(tmp, 0o600);
  fs.renameSync(tmp, file);
  return file;
}

/**
 * The profile in effect: --profile, else SVC_PROFILE, else the default one; then the
 * environment. The role goes with the credential: SVC_KEY's prefix when SVC_KEY is set, admin
 * when only SVC_ADMIN_TOKEN is, the stored profile's otherwise (SVC_ROLE overrides all three);
 * a stored secret is used only for the role and the server (origin) it was saved with: SVC_URL
 * naming another server takes SVC_KEY / SVC_ADMIN_TOKEN, so a profile's key is never sent elsewhere.
 * SVC_KEY or SVC_ADMIN_TOKEN set to the empty string counts as not set.
 */
export function resolveProfile(name: string | undefined, given = process.env): Profile & { name: string } {
  // An empty credential variable (`SVC_KEY=` in an env file) is unset: it hides no saved key.
  const env = { ...given };
  for (const k of ["SVC_KEY", "SVC_ADMIN_TOKEN"] as const) if (env[k] === "") delete env[k];
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
