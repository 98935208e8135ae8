// Profiles: where `svc login` keeps a base URL, a role and its credential.
// One JSON file in the user's config folder (folder 0700, file 0600, written
// atomically). The environment overrides a profile field by field, so
// scripts and CI need no file: SVC_URL, SVC_ROLE, SVC_KEY (renter or provider
// key), SVC_ADMIN_TOKEN, SVC_PROFILE (which profile).
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

export function readProfiles(env = process.env): ProfilesFile {
  try {
    return JSON.parse(fs.readFileSync(fileOf(env), "utf8")) as ProfilesFile;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return { profiles: {} };
    throw new Error(`cannot read ${fileOf(env)}: ${(err as Error).message}`);
  }
}

export function saveProfile(name: string, p: Profile, env = process.env): string {
  const dir = configDir(env);
  fs.mkdirSync(dir, { recursive: true, mode: 0o700 });
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

/** The profile in effect: --profile, else SVC_PROFILE, else the default one; then env overrides. */
export function resolveProfile(name: string | undefined, env = process.env): Profile & { name: string } {
  const all = readProfiles(env);
  const chosen = name ?? env.SVC_PROFILE ?? all.default ?? "default";
  const stored: Partial<Profile> = all.profiles[chosen] ?? {};
  if (name && !all.profiles[name] && !env.SVC_URL) throw new UsageError(`no profile named "${name}" (svc login --profile ${name})`);
  const role = (env.SVC_ROLE as Role | undefined) ?? stored.role ?? (env.SVC_ADMIN_TOKEN && !env.SVC_KEY ? "admin" : roleOfKey(env.SVC_KEY));
  const secret = role === "admin" ? (env.SVC_ADMIN_TOKEN ?? stored.secret) : (env.SVC_KEY ?? stored.secret);
  const url = env.SVC_URL ?? stored.url;
  if (!url || !role || !secret) throw new AuthMissing(`not logged in: run \`svc login\` (or set SVC_URL and SVC_KEY / SVC_ADMIN_TOKEN)`);
  if (!ROLES.includes(role)) throw new UsageError(`unknown role "${role}" (renter, provider or admin)`);
  return { name: chosen, url: url.replace(/\/+$/, ""), role, secret };
}

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
