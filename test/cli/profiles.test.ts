// Which server a saved key goes to: a profile's key is sent only to the server
// it was saved for (the same scheme, host and port). SVC_URL naming another
// server (a project's env file, a staging address) takes SVC_KEY or
// SVC_ADMIN_TOKEN with it; without one, svc says it is not logged in there
// rather than send the saved key. A profile name that is not saved; the
// profiles folder's mode, and a profiles file svc cannot read.
import fs from "node:fs";
import path from "node:path";
import { describe, expect, it } from "vitest";
import { resolveProfile, saveProfile, UsageError } from "../../src/cli/profiles.js";
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
