// Which server a saved key goes to: a profile's key is sent only to the server
// it was saved for (the same scheme, host and port). SVC_URL naming another
// server (a project's env file, a staging address) takes SVC_KEY or
// SVC_ADMIN_TOKEN with it; without one, svc says it is not logged in there
// rather than send the saved key. A profile name that is not saved; the
// profiles folder's mode, and a profiles file svc cannot read. An empty
// SVC_URL (or SVC_PROFILE) is unset, as an empty SVC_KEY is. The file is
// written through a temp file of its own (a symlink planted at a temp path is
// never followed) under a lock that a save left behind by a dead svc does not hold.
import fs from "node:fs";
import path from "node:path";
import { describe, expect, it } from "vitest";
import os from "node:os";
import { spawnSync } from "node:child_process";
import { readProfiles, resolveProfile, saveProfile, UsageError } from "../../src/cli/profiles.js";
import { tempDir } from "../daemon/helpers.js";

const withProfile = () => {
  const env: NodeJS.ProcessEnv = { SVC_CONFIG_DIR: path.join(tempDir("svc-profiles"), "config") };
  saveProfile("default", { url: "https://svc.example.com", role: "renter", secret: "svc-renter-saved" }, env);
  return env;
};

describe("a saved profile's key", () => {
  it("goes to its own server, named by the profile or by SVC_URL (a trailing slash or the default port alike)", () => {
    const env = withProfile();
    expect(resolveProfile(undefined, env)).toMatchObject({ url: "https://svc.example.com", secret: "svc-renter-saved" });
    expect(resolveProfile(undefined, { ...env, SVC_URL: "https://svc.example.com/" }).secret).toBe("svc-renter-saved");
    expect(resolveProfile(undefined, { ...env, SVC_URL: "https://svc.example.com:443" }).secret).toBe("svc-renter-saved");
  });

  it("is not sent to another server that SVC_URL names: that takes SVC_KEY, else svc is not logged in there", () => {
    const env = withProfile();
    for (const other of ["https://staging.example.com", "http://svc.example.com", "https://svc.example.com:8443"]) {
      expect(() => resolveProfile(undefined, { ...env, SVC_URL: other })).toThrow(/not logged in \(profile "default" holds a key for https:\/\/svc\.example\.com, not for SVC_URL/);
    }
    expect(resolveProfile(undefined, { ...env, SVC_URL: "https://staging.example.com", SVC_KEY: "svc-renter-staging" })).toMatchObject({
      url: "https://staging.example.com",
      secret: "svc-renter-staging",
    });
  });
});

describe("a profile name that is not saved", () => {
  it("is refused by its name from --profile or SVC_PROFILE alike; with SVC_URL the environment stands for it", () => {
    const env = withProfile();
    expect(() => resolveProfile("lab", env)).toThrow(/^no profile named "lab" \(svc login --profile lab\)$/);
    expect(() => resolveProfile(undefined, { ...env, SVC_PROFILE: "lab" })).toThrow(/^no profile named "lab", which SVC_PROFILE names/);
    expect(() => resolveProfile(undefined, { ...env, SVC_PROFILE: "lab" })).toThrow(UsageError);
    expect(resolveProfile(undefined, { ...env, SVC_PROFILE: "default" }).secret).toBe("svc-renter-saved");
    const elsewhere = { ...env, SVC_PROFILE: "lab", SVC_URL: "https://lab.example.com", SVC_KEY: "svc-renter-lab" };
    expect(resolveProfile(undefined, elsewhere)).toMatchObject({ name: "lab", url: "https://lab.example.com", secret: "svc-renter-lab" });
  });
});

// README: the profiles' folder is 0700, the file 0600. mkdirSync's mode applies only to a folder it
// creates, so an existing one is tightened when it is svc's own, and left alone when it is not.
describe("the profiles folder", () => {
  const profile = { url: "https://svc.example.com", role: "renter" as const, secret: "svc-renter-saved" };
  const modeOf = (p: string) => fs.statSync(p).mode & 0o777;
  const existing = (dir: string, mode = 0o755) => {
    fs.mkdirSync(dir, { recursive: true });
    fs.chmodSync(dir, mode);
    return dir;
  };

  it("is tightened to 0700 when it already existed, at SVC_CONFIG_DIR or the default place", () => {
    const dir = existing(path.join(tempDir("svc-profiles"), "config"));
    const file = saveProfile("default", profile, { SVC_CONFIG_DIR: dir });
    expect(modeOf(file)).toBe(0o600);
    expect(modeOf(dir)).toBe(0o700);
    // Saved again over its own file: still only svc's files there.
    fs.chmodSync(dir, 0o750);
    saveProfile("other", profile, { SVC_CONFIG_DIR: dir });
    expect(modeOf(dir)).toBe(0o700);

    const xdg = tempDir("svc-profiles");
    const own = existing(path.join(xdg, "svc"));
    fs.writeFileSync(path.join(own, "notes.txt"), "svc's folder by name");
    saveProfile("default", profile, { XDG_CONFIG_HOME: xdg });
    expect(modeOf(own)).toBe(0o700);
  });

  it("is left alone when it is a symlink, or a SVC_CONFIG_DIR that holds other files", () => {
    const home = tempDir("svc-profiles");
    const target = existing(path.join(home, "dotfiles", "svc"));
    const link = path.join(home, "config");
    fs.symlinkSync(target, link);
    const file = saveProfile("default", profile, { SVC_CONFIG_DIR: link });
    expect(modeOf(file)).toBe(0o600);
    expect(modeOf(target)).toBe(0o755);

    const shared = existing(path.join(home, "project"));
    fs.writeFileSync(path.join(shared, "README"), "a folder of other things");
    saveProfile("default", profile, { SVC_CONFIG_DIR: shared + "/" });
    expect(modeOf(path.join(shared, "profiles.json"))).toBe(0o600);
    expect(modeOf(shared)).toBe(0o755);
  });
});

describe("a malformed profiles file", () => {
  it("is a usage error that names the file", () => {
    const dir = path.join(tempDir("svc-profiles"), "config");
    fs.mkdirSync(dir);
    fs.writeFileSync(path.join(dir, "profiles.json"), "{ not json");
    expect(() => resolveProfile(undefined, { SVC_CONFIG_DIR: dir })).toThrow(UsageError);
    expect(() => resolveProfile(undefined, { SVC_CONFIG_DIR: dir })).toThrow(`${path.join(dir, "profiles.json")} is not a valid profiles file`);
    // The environment alone does not need it.
    expect(resolveProfile(undefined, { SVC_CONFIG_DIR: dir, SVC_URL: "https://svc.example.com", SVC_KEY: "svc-renter-abc" })).toMatchObject({ role: "renter", secret: "svc-renter-abc" });
    expect(resolveProfile(undefined, { SVC_CONFIG_DIR: dir, SVC_URL: "https://svc.example.com", SVC_ADMIN_TOKEN: "t".repeat(20) })).toMatchObject({ role: "admin" });
    // A profile named on the command line still needs the file.
    expect(() => resolveProfile("work", { SVC_CONFIG_DIR: dir, SVC_URL: "https://svc.example.com", SVC_KEY: "svc-renter-abc" })).toThrow(UsageError);
  });
});

describe("an empty SVC_URL or SVC_PROFILE", () => {
  it("is unset, as an empty SVC_KEY is: the saved profile's URL and the default profile are used", () => {
    const env = withProfile();
    expect(resolveProfile(undefined, { ...env, SVC_URL: "" })).toMatchObject({ name: "default", url: "https://svc.example.com", secret: "svc-renter-saved" });
    expect(resolveProfile(undefined, { ...env, SVC_URL: "", SVC_KEY: "" })).toMatchObject({ url: "https://svc.example.com", secret: "svc-renter-saved" });
    expect(resolveProfile(undefined, { ...env, SVC_PROFILE: "" })).toMatchObject({ name: "default", secret: "svc-renter-saved" });
    // With a key of its own and no URL, the saved profile's URL is the one.
    expect(resolveProfile(undefined, { ...env, SVC_URL: "", SVC_KEY: "svc-renter-other" })).toMatchObject({ url: "https://svc.example.com", secret: "svc-renter-other" });
    // With no profile saved, it is not a URL given.
    const none = { SVC_CONFIG_DIR: path.join(tempDir("svc-profiles"), "config") };
    expect(() => resolveProfile(undefined, { ...none, SVC_URL: "", SVC_KEY: "svc-renter-abc" })).toThrow(/^not logged in/);
  });
});

describe("the profiles file's writes", () => {
  const profile = { url: "https://svc.example.com", role: "renter" as const, secret: "svc-renter-saved" };

  it("never follow a symlink planted at a temp file's path: the file it names is untouched, profiles.json is a file of svc's", () => {
    const home = tempDir("svc-profiles");
    const dir = path.join(home, "config");
    fs.mkdirSync(dir, { mode: 0o700 });
    const victim = path.join(home, "victim");
    fs.writeFileSync(victim, "someone else's\n", { mode: 0o644 });
    // The temp file's name of an svc of before (profiles.json.<pid>.tmp): anyone who could write
    // the folder could guess it.
    const planted = path.join(dir, `profiles.json.${process.pid}.tmp`);
    fs.symlinkSync(victim, planted);
    const file = saveProfile("default", profile, { SVC_CONFIG_DIR: dir });
    expect(fs.readFileSync(victim, "utf8")).toBe("someone else's\n");
    expect(fs.statSync(victim).mode & 0o777).toBe(0o644);
    expect(fs.lstatSync(file).isFile()).toBe(true);
    expect(fs.statSync(file).mode & 0o777).toBe(0o600);
    expect(readProfiles({ SVC_CONFIG_DIR: dir }).profiles.default).toEqual(profile);
    // Nothing of the save is left: no temp file, no lock (the planted link is not svc's to remove).
    expect(fs.readdirSync(dir).sort()).toEqual(["profiles.json", `profiles.json.${process.pid}.tmp`]);
  });

  /** A pid that no process has now: one of a process that has ended. */
  const deadPid = () => spawnSync(process.execPath, ["-e", ""]).pid!;

  it("go through a lock that a save left behind (its process gone, or its lock older than a save takes) does not hold", () => {
    const dir = path.join(tempDir("svc-profiles"), "config");
    const env = { SVC_CONFIG_DIR: dir };
    saveProfile("default", profile, env);
    const lock = path.join(dir, "profiles.json.lock");

    // An svc of this host killed while it saved.
    fs.writeFileSync(lock, `${deadPid()} ${os.hostname()} 0123456789abcdef\n`, { mode: 0o600 });
    saveProfile("second", profile, env);
    expect(Object.keys(readProfiles(env).profiles).sort()).toEqual(["default", "second"]);
    expect(fs.existsSync(lock)).toBe(false);

    // One of another host (a shared home folder), a minute old: a save takes milliseconds.
    fs.writeFileSync(lock, `4242 another-host.example 0123456789abcdef\n`, { mode: 0o600 });
    const minuteAgo = new Date(Date.now() - 60_000);
    fs.utimesSync(lock, minuteAgo, minuteAgo);
    saveProfile("third", profile, env);
    expect(Object.keys(readProfiles(env).profiles).sort()).toEqual(["default", "second", "third"]);
    expect(fs.existsSync(lock)).toBe(false);

    // The folder is still svc's own (only its files): tightened as before.
    fs.chmodSync(dir, 0o755);
    saveProfile("fourth", profile, env);
    expect(fs.statSync(dir).mode & 0o777).toBe(0o700);
  });
});
