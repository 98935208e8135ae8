// Which server a saved key goes to: a profile's key is sent only to the server
// it was saved for (the same scheme, host and port). SVC_URL naming another
// server (a project's env file, a staging address) takes SVC_KEY or
// SVC_ADMIN_TOKEN with it; without one, svc says it is not logged in there
// rather than send the saved key.
import path from "node:path";
import { describe, expect, it } from "vitest";
import { resolveProfile, saveProfile } from "../../src/cli/profiles.js";
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
