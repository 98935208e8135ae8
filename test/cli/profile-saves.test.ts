// svc login's profiles file as real svc processes write it: logins run at once
// each keep their profile (a save reads, changes and writes the whole file, so
// without a lock the last one to write drops the others'); a save killed while
// it held the lock does not stop the next; the temp file is created with an
// exclusive create that follows no symlink, synced before it replaces the
// file, and the folder synced after (strace); an empty SVC_URL is unset.
import { spawn, spawnSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { describe, expect, it } from "vitest";
import { makeRenter } from "../helpers/fixtures.js";
import { useTestServer } from "../helpers/server.js";
import { hasCommand, tempDir, waitFor } from "../daemon/helpers.js";
import { runSvc, SVC } from "./run-svc.js";

const srv = useTestServer();

/**
 * A module preloaded into svc (NODE_OPTIONS=--require) that makes each read of a profiles.json
 * take SVCTEST_HOLD_MS longer, so that saves run at once overlap for sure: svc's own code is as
 * it is, only the file system is slower. With SVCTEST_READING set, it first creates that file
 * plus "." and the pid (a save has read the file).
 */
function slowReads(dir: string): string {
  const file = path.join(dir, "slow-profile-reads.cjs");
  fs.writeFileSync(
    file,
    `const fs = require("node:fs");
const read = fs.readFileSync;
fs.readFileSync = function (p, ...rest) {
  if (typeof p !== "string" || !p.endsWith("profiles.json")) return read.call(this, p, ...rest);
  try {
    return read.call(this, p, ...rest);
  } finally {
    if (process.env.SVCTEST_READING) fs.writeFileSync(process.env.SVCTEST_READING + "." + process.pid, "");
    Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, Number(process.env.SVCTEST_HOLD_MS));
  }
};
`,
  );
  return file;
}

const withPreload = (file: string) => `${process.env.NODE_OPTIONS ?? ""} --require ${file}`.trim();

describe("svc login's profiles file", { timeout: 240_000 }, () => {
  it("keeps every profile when logins run at once (svc processes, each saving its own)", async () => {
    const home = tempDir("svc-saves");
    const first = await makeRenter(srv);
    expect((await runSvc(["login", "--url", srv.url, "--name", "first"], { home, input: first.key + "\n" })).code).toBe(0);

    const renters = await Promise.all(Array.from({ length: 5 }, () => makeRenter(srv)));
    const env = { NODE_OPTIONS: withPreload(slowReads(home)), SVCTEST_HOLD_MS: "800" };
    const runs = await Promise.all(renters.map((r, i) => runSvc(["login", "--url", srv.url, "--name", `p${i}`], { home, env, input: r.key + "\n" })));
    for (const r of runs) expect(r.code, r.stderr).toBe(0);

    const saved = JSON.parse(fs.readFileSync(path.join(home, "config", "profiles.json"), "utf8"));
    expect(Object.keys(saved.profiles).sort()).toEqual(["first", "p0", "p1", "p2", "p3", "p4"]);
    renters.forEach((r, i) => expect(saved.profiles[`p${i}`]).toEqual({ url: srv.url, role: "renter", secret: r.key }));
    expect(saved.profiles.first.secret).toBe(first.key);
    expect(saved.default).toBe("first");
    // Nothing of the saves is left in the folder.
    expect(fs.readdirSync(path.join(home, "config"))).toEqual(["profiles.json"]);
  });

  it("is saved by the next login when a login was killed while it saved (its lock left behind)", async () => {
    const home = tempDir("svc-saves");
    const config = path.join(home, "config");
    const reading = path.join(home, "reading");
    const killed = await makeRenter(srv);
    // Killed once it has read the file, within its save.
    const child = spawn(process.execPath, [SVC, "login", "--url", srv.url, "--name", "killed"], {
      env: { ...process.env, SVC_CONFIG_DIR: config, NODE_OPTIONS: withPreload(slowReads(home)), SVCTEST_HOLD_MS: "60000", SVCTEST_READING: reading, NO_COLOR: "1" },
      stdio: ["pipe", "ignore", "ignore"],
    });
    child.stdin.end(killed.key + "\n");
    await waitFor(() => fs.existsSync(`${reading}.${child.pid}`), 60_000, "the login to read the profiles file");
    const ended = new Promise((resolve) => child.on("close", resolve));
    child.kill("SIGKILL");
    await ended;
    expect(fs.readdirSync(config)).toContain("profiles.json.lock");

    const next = await makeRenter(srv);
    const r = await runSvc(["login", "--url", srv.url, "--name", "next"], { home, input: next.key + "\n" });
    expect(r.code, r.stderr).toBe(0);
    const saved = JSON.parse(fs.readFileSync(path.join(config, "profiles.json"), "utf8"));
    expect(Object.keys(saved.profiles)).toEqual(["next"]);
    expect(fs.readdirSync(config)).toEqual(["profiles.json"]);
  });

  it("is written through an exclusively created 0600 temp file that follows no symlink, synced before the rename, its folder synced after", async () => {
    // Debian's strace (.ci/run installs it): without it this test fails, naming why, and never skips.
    expect(hasCommand("strace"), "strace is needed: apt-get install strace").toBe(true);
    expect(spawnSync("strace", ["-f", "-qq", "-e", "trace=fsync", "-o", "/dev/null", "true"]).status, "strace cannot trace here").toBe(0);
    const home = tempDir("svc-saves");
    const config = path.join(home, "config");
    const trace = path.join(home, "trace.txt");
    const renter = await makeRenter(srv);
    const child = spawn("strace", ["-f", "-qq", "-e", "trace=open,openat,fsync,fdatasync,rename,renameat,renameat2", "-o", trace, process.execPath, SVC, "login", "--url", srv.url], {
      env: { ...process.env, SVC_CONFIG_DIR: config, NO_COLOR: "1" },
      stdio: ["pipe", "ignore", "pipe"],
    });
    let stderr = "";
    child.stderr.on("data", (d) => (stderr += d));
    child.stdin.end(renter.key + "\n");
    expect(await new Promise((resolve) => child.on("close", resolve)), stderr).toBe(0);

    // The calls on the folder's files, in order, fds and paths as strace writes them (whatever the thread).
    const file = path.join(config, "profiles.json");
    const calls = fs
      .readFileSync(trace, "utf8")
      .split("\n")
      .map((l) => l.replace(/^\d+\s+/, ""))
      .filter((l) => /^(open|openat|fsync|fdatasync|rename|renameat2?)\(/.test(l) && !/= -1 E/.test(l));
    const opened = (pathRe: RegExp) => calls.findIndex((l) => /^open(at)?\(/.test(l) && pathRe.test(l));
    const esc = (s: string) => s.replace(/[.*+?^${}()|[\]\\/]/g, "\\$&");

    const tmpOpen = opened(new RegExp(`"${esc(file)}\\.[^"]+\\.tmp"`));
    expect(tmpOpen, calls.join("\n")).toBeGreaterThanOrEqual(0);
    const tmpCall = calls[tmpOpen];
    expect(tmpCall).toMatch(/O_CREAT/);
    expect(tmpCall).toMatch(/O_EXCL/);
    expect(tmpCall).toMatch(/O_NOFOLLOW/);
    expect(tmpCall).toMatch(/, 0600\) = \d+$/);
    const tmp = /"([^"]+)"/.exec(tmpCall)![1];
    const tmpFd = /= (\d+)$/.exec(tmpCall)![1];
    const synced = calls.findIndex((l, i) => i > tmpOpen && new RegExp(`^f(data)?sync\\(${tmpFd}\\)`).test(l));
    const renamed = calls.findIndex((l) => /^rename/.test(l) && l.includes(`"${tmp}"`) && l.includes(`"${file}"`));
    expect(synced, calls.join("\n")).toBeGreaterThan(tmpOpen);
    expect(renamed, calls.join("\n")).toBeGreaterThan(synced);
    const dirOpen = calls.findIndex((l, i) => i > renamed && /^open(at)?\(/.test(l) && l.includes(`"${config}"`));
    expect(dirOpen, calls.join("\n")).toBeGreaterThan(renamed);
    const dirFd = /= (\d+)$/.exec(calls[dirOpen])![1];
    expect(calls.findIndex((l, i) => i > dirOpen && new RegExp(`^f(data)?sync\\(${dirFd}\\)`).test(l)), calls.join("\n")).toBeGreaterThan(dirOpen);
    expect(fs.statSync(file).mode & 0o777).toBe(0o600);
  });
});

describe("an empty SVC_URL", { timeout: 120_000 }, () => {
  it("is unset: the saved profile's URL is used, not 'not logged in' (3)", async () => {
    const home = tempDir("svc-saves");
    const renter = await makeRenter(srv);
    expect((await runSvc(["login", "--url", srv.url], { home, input: renter.key + "\n" })).code).toBe(0);
    const envs: Record<string, string>[] = [{ SVC_URL: "" }, { SVC_URL: "", SVC_KEY: "" }, { SVC_URL: "", SVC_KEY: renter.key }];
    for (const env of envs) {
      const r = await runSvc(["balance"], { home, env });
      expect(r.stderr, JSON.stringify(env)).toBe("");
      expect(r.code, JSON.stringify(env)).toBe(0);
    }
    const who = await runSvc(["--json", "whoami"], { home, env: { SVC_URL: "" } });
    expect(JSON.parse(who.stdout)).toMatchObject({ profile: "default", url: srv.url, role: "renter" });
  });
});
