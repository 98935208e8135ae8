// The installers' files and folders: the daemon file holds the provider key and the task-signing secret,
// and the work folder renters' tasks (task.json with their env) and kept results, so neither may be
// readable by other users of the machine, not even for a moment while being written. setup.sh is run
// from src (no server) with a curl that records the mode of the file it writes; setup-windows.ps1 is
// read, there being no PowerShell here.
import fs from "node:fs";
import path from "node:path";
import { describe, expect, it } from "vitest";
import { run, tempDir, writeExecutable } from "./helpers.js";

const SETUP_SH = path.resolve("src/daemon/installers/setup.sh");
const SETUP_PS1 = path.resolve("src/daemon/installers/setup-windows.ps1");

const mode = (file: string) => (fs.statSync(file).mode & 0o777).toString(8);

/** Runs setup.sh (--no-start, Linux) under umask 022 with a fake curl; the install's paths and the modes curl saw. */
async function install(root: string) {
  const bin = path.join(root, "bin");
  fs.mkdirSync(bin, { recursive: true });
  const modes = path.join(root, "curl-modes");
  const curlArgs = path.join(root, "curl-args");
  // curl as it creates its -o file (0666 less the umask): the mode right after it wrote the file; a 200 for -w.
  writeExecutable(
    bin,
    "curl",
    `#!/bin/sh\nprintf '%s\\n' "$*" >> '${curlArgs}'\nout=""; w=""\nwhile [ $# -gt 0 ]; do case "$1" in -o) out="$2"; shift 2 ;; -w) w=1; shift 2 ;; *) shift ;; esac; done\ncat >/dev/null\nif [ -n "$out" ] && [ "$out" != /dev/null ]; then printf 'API_KEY = "svc-provider-SECRETKEY"\\n' > "$out"; stat -c %a "$out" >> '${modes}'; fi\n[ -z "$w" ] || printf 200\nexit 0\n`,
  );
  const script = path.join(root, "setup.sh");
  fs.writeFileSync(script, fs.readFileSync(SETUP_SH, "utf8").replaceAll("{{API_KEY}}", "svc-provider-SECRETKEY").replaceAll("{{BACKEND_URL}}", "http://127.0.0.1:9"));
  const home = path.join(root, "home");
  const res = await run("sh", ["-c", `umask 022; exec sh '${script}' --no-start`], {
    env: { ...process.env, PATH: `${bin}:${process.env.PATH}`, SVC_PREFIX: root, SVC_OS: "Linux", HOME: home },
  });
  expect(res.status, res.stderr + res.stdout).toBe(0);
  const isRoot = process.getuid?.() === 0;
  // As the user: ${PREFIX}${HOME}/.svc-daemon.
  const installDir = isRoot ? path.join(root, "opt/svc-daemon") : path.join(root, home, ".svc-daemon");
  const unit = isRoot ? path.join(root, "etc/systemd/system/svc-daemon.service") : path.join(root, home, ".config/systemd/user/svc-daemon.service");
  return { installDir, unit, downloaded: fs.readFileSync(modes, "utf8").trim().split("\n"), curlArgs: fs.readFileSync(curlArgs, "utf8") };
}

describe("setup.sh", { timeout: 60_000 }, () => {
  it("writes the daemon file private from its first byte, and a private work folder; the unit stays readable", async () => {
    const root = tempDir("setup-modes");
    const { installDir, unit, downloaded } = await install(root);
    expect(downloaded, "the daemon file's mode as curl wrote it").toEqual(["600"]);
    expect({
      daemon: mode(path.join(installDir, "svc_daemon.py")),
      installDir: mode(installDir),
      work: mode(path.join(installDir, "work")),
      unit: mode(unit),
    }).toEqual({ daemon: "700", installDir: "700", work: "700", unit: "644" });
  });

  it("never puts the key in a command's arguments: curl reads it from stdin, the unit starts the daemon without it", async () => {
    const root = tempDir("setup-argv");
    const { installDir, unit, curlArgs } = await install(root);
    expect(curlArgs).toContain("/api/providers/download/daemon");
    expect(curlArgs).toContain("-H @-");
    expect(curlArgs).not.toContain("SECRETKEY");
    const execStart = fs.readFileSync(unit, "utf8").split("\n").find((l) => l.startsWith("ExecStart="));
    // python3 and the daemon file, nothing else: the key is in the file.
    expect(execStart?.split(" ").slice(1)).toEqual([`"${path.join(installDir, "svc_daemon.py")}"`]);
    expect(fs.readFileSync(unit, "utf8")).not.toMatch(/SECRETKEY|--key/);
  });

  it("makes the folders of an earlier install private", async () => {
    const root = tempDir("setup-again");
    const first = await install(root);
    fs.chmodSync(first.installDir, 0o755);
    fs.chmodSync(path.join(first.installDir, "work"), 0o755);
    const again = await install(root);
    expect({ installDir: mode(again.installDir), work: mode(path.join(again.installDir, "work")) }).toEqual({ installDir: "700", work: "700" });
  });
});

describe("setup-windows.ps1", () => {
  it("restricts an admin install's folder to SYSTEM and Administrators before anything is written into it", () => {
    const text = fs.readFileSync(SETUP_PS1, "utf8");
    const code = text.replace(/^\s*#.*$/gm, "");
    const at = (what: string) => {
      const i = code.indexOf(what);
      expect(i, what).toBeGreaterThan(-1);
      return i;
    };
    // Inheritance from %ProgramData% (Users: read & execute, create files) removed, explicit full control
    // for SYSTEM (S-1-5-18) and Administrators (S-1-5-32-544) only, by SID, inherited by what goes inside.
    const acl = at("& icacls.exe $InstallDir /inheritance:r /grant:r '*S-1-5-18:(OI)(CI)F' '*S-1-5-32-544:(OI)(CI)F'");
    expect(code.slice(code.lastIndexOf("if ($IsAdmin) {", acl), acl)).not.toContain("}");
    expect(code).toMatch(/icacls[^\n]*\n[\s\S]*\$LASTEXITCODE -ne 0\) \{ throw/);
    // The folder is made first; the work folder and the download come after.
    expect(at("New-Item -ItemType Directory -Force -Path $InstallDir")).toBeLessThan(acl);
    expect(at("New-Item -ItemType Directory -Force -Path $WorkDir")).toBeGreaterThan(acl);
    expect(at("-OutFile $Download")).toBeGreaterThan(acl);
    expect(at("Move-Item -Force -Path $Download -Destination $Daemon")).toBeGreaterThan(acl);
  });
});
