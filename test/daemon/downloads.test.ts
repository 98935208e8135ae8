// Installer scripts and the legacy daemon download: rendered for the caller
// with the backend URL and key filled in; the shell installer is
// shellcheck-clean and really installs a systemd unit / launchd agent that
// runs the daemon process directly.
import { spawnSync } from "node:child_process";
import crypto from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { HMAC_SECRET, startTestServer, useTestServer, type TestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { hasCommand, keyRedirector, run, tempDir, writeExecutable } from "./helpers.js";
import { providerTaskSecret } from "../../src/domain/accounts/provider-secret.js";

const srv = useTestServer({ SVC_DAEMON_LATEST_VERSION: "3.2.0", SVC_DAEMON_MIN_VERSION: "3.0.0" });
let provider: { id: number; key: string };
const api = () => client(srv.url);

beforeAll(async () => {
  provider = await makeProvider(srv);
});

describe("setup scripts", () => {
  it("serves the shell installer with the key and backend URL filled in", async () => {
    const r = await api().get(`/api/providers/setup?key=${provider.key}`);
    expect(r.status).toBe(200);
    expect(r.headers.get("content-type")).toMatch(/shellscript/);
    expect(r.text.startsWith("#!/bin/sh\n")).toBe(true);
    expect(r.text).toContain(`SVC_API_KEY='${provider.key}'`);
    expect(r.text).toContain(`SVC_BACKEND_URL='${srv.url}'`);
    expect(r.text).not.toContain("{{");
    const dir = tempDir("sh");
    const file = path.join(dir, "setup.sh");
    fs.writeFileSync(file, r.text);
    expect(spawnSync("sh", ["-n", file]).status).toBe(0);
    expect(spawnSync("bash", ["-n", file]).status).toBe(0);
  });

  // Never skipped: without shellcheck the test fails and says how to get it (.ci/run installs it).
  it("is shellcheck-clean", async () => {
    if (!hasCommand("shellcheck")) throw new Error("shellcheck is not installed: apt-get install -y shellcheck");
    const r = await api().get(`/api/providers/setup?key=${provider.key}`);
    const dir = tempDir("shellcheck");
    const file = path.join(dir, "setup.sh");
    fs.writeFileSync(file, r.text);
    const check = spawnSync("shellcheck", ["--shell=sh", "--severity=style", file], { encoding: "utf8" });
    expect(check.stdout + check.stderr).toBe("");
    expect(check.status).toBe(0);
  });

  it("installs a systemd unit that runs python3 with the daemon directly", async () => {
    const r = await api().get(`/api/providers/setup?key=${provider.key}`);
    const root = tempDir("install");
    const bin = tempDir("bin");
    const calls = path.join(root, "systemctl.calls");
    writeExecutable(bin, "systemctl", `#!/bin/sh\necho "$@" >> '${calls}'\n`);
    // curl as installed, its arguments recorded: the key must not be among them (`ps` shows them).
    const curlArgs = path.join(root, "curl.args");
    const curl = spawnSync("sh", ["-c", "command -v curl"], { encoding: "utf8" }).stdout.trim();
    expect(curl, "curl is installed").not.toBe("");
    writeExecutable(bin, "curl", `#!/bin/sh\necho "$@" >> '${curlArgs}'\nexec '${curl}' "$@"\n`);
    const script = path.join(root, "setup.sh");
    fs.writeFileSync(script, r.text);
    const res = await run("sh", [script], {
      env: { ...process.env, PATH: `${bin}:${process.env.PATH}`, SVC_PREFIX: root, SVC_OS: "Linux", HOME: path.join(root, "home") },
    });
    expect(res.stderr).not.toMatch(/svc setup:/);
    expect(res.status).toBe(0);
    const curlCalls = fs.readFileSync(curlArgs, "utf8");
    expect(curlCalls).toMatch(/download\/daemon/);
    expect(curlCalls).toMatch(/preferences/);
    expect(curlCalls).not.toContain(provider.key);
    const isRoot = process.getuid?.() === 0;
    const installDir = isRoot ? path.join(root, "opt/svc-daemon") : path.join(root, root, "home/.svc-daemon");
    const daemon = path.join(installDir, "svc_daemon.py");
    const served = fs.readFileSync(daemon, "utf8");
    expect(served).toContain(`API_KEY = "${provider.key}"`);
    expect((fs.statSync(daemon).mode & 0o777).toString(8)).toBe("700");
    const unitFile = isRoot ? path.join(root, "etc/systemd/system/svc-daemon.service") : path.join(root, root, "home/.config/systemd/user/svc-daemon.service");
    const unit = fs.readFileSync(unitFile, "utf8");
    const python3 = spawnSync("sh", ["-c", "command -v python3"], { encoding: "utf8" }).stdout.trim();
    expect(unit).toContain(`ExecStart="${python3}" "${daemon}"\n`);
    expect(unit).toMatch(/KillSignal=SIGTERM/);
    expect(unit).toMatch(/Restart=always/);
    expect(unit).not.toMatch(/npx|npm/);
    const log = fs.readFileSync(calls, "utf8");
    expect(log).toContain("daemon-reload");
    expect(log).toMatch(/^enable svc-daemon$/m);
    expect(log).toMatch(/^restart svc-daemon$/m);
  });

  it("downloads with python3 where curl is missing, the key in its environment", async () => {
    const r = await api().get(`/api/providers/setup?key=${provider.key}`);
    const root = tempDir("no-curl");
    // A PATH with every command of this one but curl and wget.
    const bin = tempDir("bin");
    for (const dir of (process.env.PATH ?? "").split(":")) {
      for (const name of fs.existsSync(dir) ? fs.readdirSync(dir) : []) {
        if (name === "curl" || name === "wget" || fs.existsSync(path.join(bin, name))) continue;
        fs.symlinkSync(path.join(dir, name), path.join(bin, name));
      }
    }
    writeExecutable(bin, "systemctl", "#!/bin/sh\n");
    const script = path.join(root, "setup.sh");
    fs.writeFileSync(script, r.text);
    const res = await run("sh", [script], { env: { ...process.env, PATH: bin, SVC_PREFIX: root, SVC_OS: "Linux", HOME: path.join(root, "home") } });
    expect(res.stderr).not.toMatch(/svc setup:/);
    expect(res.status).toBe(0);
    const isRoot = process.getuid?.() === 0;
    const daemon = isRoot ? path.join(root, "opt/svc-daemon/svc_daemon.py") : path.join(root, root, "home/.svc-daemon/svc_daemon.py");
    expect(fs.readFileSync(daemon, "utf8")).toContain(`API_KEY = "${provider.key}"`);
  });

  it("manual run mode installs the unit without enabling it", async () => {
    const r = await api().get(`/api/providers/setup?key=${provider.key}`);
    const root = tempDir("manual");
    const bin = tempDir("bin");
    const calls = path.join(root, "systemctl.calls");
    writeExecutable(bin, "systemctl", `#!/bin/sh\necho "$@" >> '${calls}'\n`);
    const script = path.join(root, "setup.sh");
    fs.writeFileSync(script, r.text);
    const res = await run("sh", [script, "--run-mode", "manual"], {
      env: { ...process.env, PATH: `${bin}:${process.env.PATH}`, SVC_PREFIX: root, SVC_OS: "Linux", HOME: path.join(root, "home") },
    });
    expect(res.status).toBe(0);
    expect(res.stdout).toMatch(/run mode manual/);
    // The run mode reached the service (the key sent in the body, on standard input).
    const [row] = await srv.sql<{ run_mode: string }[]>`SELECT run_mode FROM providers WHERE id = ${provider.id}`;
    expect(row.run_mode).toBe("manual");
    expect(fs.readFileSync(calls, "utf8")).not.toMatch(/enable/);

    const bad = spawnSync("sh", [script, "--run-mode", "sometimes"], { encoding: "utf8", env: { ...process.env, SVC_PREFIX: root } });
    expect(bad.status).toBe(2);
    expect(bad.stderr).toMatch(/always-on, manual or scheduled/);
  });

  it("installs a launchd agent on macOS (a valid plist running the daemon directly)", async () => {
    const r = await api().get(`/api/providers/download/setup?key=${provider.key}&os=mac`);
    expect(r.status).toBe(200);
    expect(r.headers.get("content-disposition")).toMatch(/svc-setup\.sh/);
    const root = tempDir("mac");
    const home = path.join(root, "home");
    const bin = tempDir("bin");
    const calls = path.join(root, "launchctl.calls");
    writeExecutable(bin, "launchctl", `#!/bin/sh\necho "$@" >> '${calls}'\n`);
    const script = path.join(root, "setup.sh");
    fs.writeFileSync(script, r.text);
    const res = await run("sh", [script], { env: { ...process.env, PATH: `${bin}:${process.env.PATH}`, SVC_OS: "Darwin", HOME: home } });
    expect(res.stderr).toBe("");
    expect(res.status).toBe(0);
    const plist = path.join(home, "Library/LaunchAgents/com.svc.daemon.plist");
    const parsed = JSON.parse(
      spawnSync("python3", ["-c", "import json,plistlib,sys; print(json.dumps(plistlib.load(open(sys.argv[1],'rb'))))", plist], { encoding: "utf8" }).stdout,
    );
    expect(parsed.Label).toBe("com.svc.daemon");
    expect(parsed.ProgramArguments[1]).toBe(path.join(home, ".svc-daemon/svc_daemon.py"));
    expect(parsed.ProgramArguments[0]).toMatch(/python3$/);
    expect(parsed.RunAtLoad).toBe(true);
    expect(parsed.KeepAlive).toBe(true);
    expect(fs.readFileSync(calls, "utf8")).toMatch(/^load /m);
  });

  // `curl ... | sh` runs what has arrived as it arrives: a download cut short must run nothing at all (curl -s
  // says nothing of the cut), not install half a daemon and exit 0.
  it("a script cut short in transit does nothing", { timeout: 120_000 }, async () => {
    const r = await api().get(`/api/providers/setup`, { "x-provider-key": provider.key });
    const root = tempDir("cut");
    const bin = tempDir("bin");
    writeExecutable(bin, "systemctl", `#!/bin/sh\necho "$@" >> '${path.join(root, "systemctl.calls")}'\n`);
    const env = { ...process.env, PATH: `${bin}:${process.env.PATH}`, SVC_PREFIX: root, SVC_OS: "Linux", HOME: path.join(root, "home") };
    const lines = r.text.split("\n");
    expect(lines.at(-1)).toBe("");
    for (let n = 1; n < lines.length - 1; n++) {
      const res = await run("sh", [], { env, input: lines.slice(0, n).join("\n") + "\n" });
      expect(fs.readdirSync(root), `the first ${n} lines, which ${res.status === 0 ? "exited 0" : `exited ${res.status}`}`).toEqual([]);
    }
    const whole = await run("sh", [], { env, input: r.text });
    expect(whole.status, whole.stderr).toBe(0);
    expect(fs.readFileSync(path.join(root, "systemctl.calls"), "utf8")).toMatch(/enable/);
  });

  it("the install command its header shows fails on a redirect, sending the key to no other host", async () => {
    const r = await api().get(`/api/providers/setup`, { "x-provider-key": provider.key });
    const shown = /^# +(.*\/api\/providers\/setup.*\| sh)$/m.exec(r.text)?.[1];
    expect(shown, "the command in the installer's header").toContain(srv.url);
    const dir = tempDir("setup-redirect");
    const redirector = await keyRedirector(path.join(dir, "ran-an-answer"));
    try {
      const cmd = shown!.replaceAll(srv.url, redirector.url);
      const ran = await run("sh", ["-c", cmd], { cwd: dir, env: { ...process.env, PK: provider.key } });
      expect(redirector.otherHostKeys, `keys the other host got from: ${cmd}`).toEqual([]);
      expect(ran.status, cmd).not.toBe(0);
      expect(ran.stderr).toMatch(/redirect/i);
      expect(fs.readdirSync(dir), "nothing either answer held ran").toEqual([]);
    } finally {
      await redirector.close();
    }
    // Not redirected, it installs.
    const root = tempDir("setup-shown");
    const bin = tempDir("bin");
    writeExecutable(bin, "systemctl", `#!/bin/sh\necho "$@" >> '${path.join(root, "systemctl.calls")}'\n`);
    const env = { ...process.env, PK: provider.key, PATH: `${bin}:${process.env.PATH}`, SVC_PREFIX: root, SVC_OS: "Linux", HOME: path.join(root, "home") };
    const installed = await run("sh", ["-c", shown!], { cwd: dir, env });
    expect(installed.status, installed.stderr).toBe(0);
    expect(fs.readFileSync(path.join(root, "systemctl.calls"), "utf8")).toMatch(/enable/);
  });

  it("an install refused the daemon fails saying why, with curl and without it", async () => {
    const p = await makeProvider(srv, { approved: false });
    const script = (await api().get(`/api/providers/setup`, p.headers)).text;
    const root = tempDir("refused");
    const bin = tempDir("bin");
    writeExecutable(bin, "systemctl", "#!/bin/sh\n");
    // The same PATH without curl (the python3 download).
    const noCurl = tempDir("bin-no-curl");
    for (const dir of [bin, ...(process.env.PATH ?? "").split(":")]) {
      for (const name of fs.existsSync(dir) ? fs.readdirSync(dir) : []) {
        if (name === "curl" || name === "wget" || fs.existsSync(path.join(noCurl, name))) continue;
        fs.symlinkSync(path.join(dir, name), path.join(noCurl, name));
      }
    }
    for (const PATH of [`${bin}:${process.env.PATH}`, noCurl]) {
      const res = await run("sh", [], { env: { ...process.env, PATH, SVC_PREFIX: root, SVC_OS: "Linux", HOME: path.join(root, "home") }, input: script });
      expect(res.status).toBe(1);
      // The server's own words: the file is served once the provider is approved.
      expect(res.stderr).toMatch(/svc setup: could not download the daemon .*: .*served once the provider is approved \(approval: pending\)/);
      expect(res.stderr).not.toContain("Traceback");
      expect(res.stdout).not.toMatch(/done/);
    }
  });

  // A service manager that keeps state: whether the unit is enabled, and a copy of the daemon file it runs.
  function statefulSystemctl(bin: string, state: string, daemon: string) {
    writeExecutable(
      bin,
      "systemctl",
      `#!/bin/sh
S='${state}'; D='${daemon}'
[ "$1" = --user ] && shift
verb=$1; shift
now=0
for a in "$@"; do [ "$a" = --now ] && now=1; done
start() { [ -e "$S/running" ] || cp "$D" "$S/running"; }
case "$verb" in
  daemon-reload) ;;
  enable) touch "$S/enabled"; [ $now = 0 ] || start ;;
  disable) rm -f "$S/enabled"; [ $now = 0 ] || rm -f "$S/running" ;;
  start) start ;;
  stop) rm -f "$S/running" ;;
  restart) cp "$D" "$S/running" ;;
  try-restart) [ ! -e "$S/running" ] || cp "$D" "$S/running" ;;
  is-active) [ -e "$S/running" ] ;;
  is-enabled) [ -e "$S/enabled" ] ;;
  *) echo "systemctl: unexpected $verb" >&2; exit 1 ;;
esac
`,
    );
  }

  it("run again after a key rotation, the running daemon is the new file; run again as manual, it no longer starts at boot", async () => {
    const p = await makeProvider(srv);
    const root = tempDir("rerun");
    const bin = tempDir("bin");
    const state = tempDir("systemd");
    const isRoot = process.getuid?.() === 0;
    const daemon = isRoot ? path.join(root, "opt/svc-daemon/svc_daemon.py") : path.join(root, root, "home/.svc-daemon/svc_daemon.py");
    statefulSystemctl(bin, state, daemon);
    const env = { ...process.env, PATH: `${bin}:${process.env.PATH}`, SVC_PREFIX: root, SVC_OS: "Linux", HOME: path.join(root, "home") };
    const install = async (key: string, args: string[] = []) => {
      const script = (await api().get(`/api/providers/setup`, { "x-provider-key": key })).text;
      const res = await run("sh", ["-s", "--", ...args], { env, input: script });
      expect(res.status, res.stderr).toBe(0);
    };
    // The key of the daemon file the service manager runs (the file is long: the key alone in a failure).
    const running = () => /^API_KEY = "(.*)"$/m.exec(fs.readFileSync(path.join(state, "running"), "utf8"))?.[1];

    await install(p.key);
    expect(running()).toBe(p.key);
    expect(fs.existsSync(path.join(state, "enabled"))).toBe(true);

    const rotated = await api().post("/api/providers/rotate-key", {}, p.headers);
    expect(rotated.status).toBe(200);
    const newKey: string = rotated.body.api_key;
    await install(newKey);
    expect(fs.readFileSync(daemon, "utf8")).toContain(`API_KEY = "${newKey}"`);
    // Not the old key, refused by the server from now on.
    expect(running()).toBe(newKey);

    await install(newKey, ["--run-mode", "manual"]);
    expect(fs.existsSync(path.join(state, "enabled")), "enabled at boot after a manual install").toBe(false);
  });

  it("serves the PowerShell installer that registers a scheduled task running python directly", async () => {
    const r = await api().get(`/api/providers/setup-windows?key=${provider.key}`);
    expect(r.status).toBe(200);
    expect(r.text).toContain(`$SvcApiKey = '${provider.key}'`);
    expect(r.text).toContain(`$SvcBackendUrl = '${srv.url}'`);
    expect(r.text).not.toContain("{{");
    expect(r.text).toMatch(/New-ScheduledTaskAction -Execute \$Python -Argument/);
    expect(r.text).toMatch(/Register-ScheduledTask/);
    expect(r.text).not.toMatch(/npx|npm/);
    // The daemon is fetched with the key in a header, not on its URL.
    expect(r.text).toContain("-Headers @{ 'x-provider-key' = $SvcApiKey }");
    // Its requests carrying the key follow no redirect (PowerShell would send the header on to another host).
    const keyed = r.text.split("\n").filter((l) => /^\s*Invoke-(WebRequest|RestMethod)/.test(l));
    expect(keyed.length).toBe(2);
    for (const line of keyed) expect(line).toContain(" -MaximumRedirection 0 ");
    expect(r.text).not.toMatch(/download\/daemon\?key=/);
    // Without PowerShell on this machine: brackets and quotes must balance.
    const code = r.text.replace(/^\s*#.*$/gm, "").replace(/'[^'\n]*'/g, "''");
    for (const [open, close] of [["{", "}"], ["(", ")"], ["[", "]"]]) {
      expect(code.split(open).length, `${open}${close}`).toBe(code.split(close).length);
    }
    expect((code.match(/"/g) ?? []).length % 2).toBe(0);
  });

  it("quotes the key as a literal of each language", async () => {
    const { renderSetupShell, renderSetupPowerShell } = await import("../../src/daemon/render.js");
    const tricky = "svc-provider-a'b$(touch /tmp/x)";
    const sh = renderSetupShell({ backendUrl: "http://h", apiKey: tricky });
    const out = spawnSync("sh", ["-c", `${sh.split("\n").find((l) => l.startsWith("SVC_API_KEY="))}; printf %s "$SVC_API_KEY"`], { encoding: "utf8" });
    expect(out.stdout).toBe(tricky);
    expect(renderSetupPowerShell({ backendUrl: "http://h", apiKey: tricky })).toContain(`$SvcApiKey = 'svc-provider-a''b$(touch /tmp/x)'`);
  });
});

describe("downloads", () => {
  it("download?platform= serves the installer for that platform as a file", async () => {
    const linux = await api().get(`/api/providers/download?key=${provider.key}&platform=linux`);
    expect(linux.status).toBe(200);
    expect(linux.headers.get("content-type")).toBe("application/octet-stream");
    expect(linux.headers.get("content-disposition")).toBe('attachment; filename="svc-setup.sh"');
    expect(linux.text).toContain(provider.key);
    const win = await api().get(`/api/providers/download?key=${provider.key}&platform=windows`);
    expect(win.headers.get("content-disposition")).toBe('attachment; filename="svc-setup.ps1"');
    expect(win.text).toContain("Register-ScheduledTask");
    // No platform: the one the provider registered with (linux).
    const dflt = await api().get(`/api/providers/download?key=${provider.key}`);
    expect(dflt.headers.get("content-disposition")).toBe('attachment; filename="svc-setup.sh"');
    const bad = await api().get(`/api/providers/download?key=${provider.key}&platform=beos`);
    expect(bad.status).toBe(400);
    expect(bad.body.error).toMatch(/platform/);
  });

  it("installer?os= answers per OS and needs os", async () => {
    const w = await api().get(`/api/providers/installer?key=${provider.key}&os=Windows`);
    expect(w.status).toBe(200);
    expect(w.headers.get("content-disposition")).toMatch(/svc-setup\.ps1/);
    const l = await api().get(`/api/providers/installer?key=${provider.key}&os=Linux`);
    expect(l.headers.get("content-disposition")).toMatch(/svc-setup\.sh/);
    const m = await api().get(`/api/providers/installer?key=${provider.key}&os=Mac`);
    expect(m.text.startsWith("#!/bin/sh")).toBe(true);
    const none = await api().get(`/api/providers/installer?key=${provider.key}`);
    expect(none.status).toBe(400);
    expect(none.body.error).toMatch(/os/);
  });

  it("download/daemon serves svc_daemon.py with URL, key, secret and version filled in", async () => {
    const r = await api().get(`/api/providers/download/daemon?key=${provider.key}`);
    expect(r.status).toBe(200);
    expect(r.headers.get("content-disposition")).toBe('attachment; filename="svc_daemon.py"');
    expect(r.text).toContain(`BACKEND_URL = "${srv.url}"`);
    expect(r.text).toContain(`API_KEY = "${provider.key}"`);
    // The provider's own task-signing secret, never the service's.
    expect(r.text).toContain(`HMAC_SECRET = "${providerTaskSecret(HMAC_SECRET, provider.id, 0)}"`);
    expect(r.text).not.toContain(HMAC_SECRET);
    expect(r.text).toContain(`DAEMON_VERSION = "3.2.0"`);
    const dir = tempDir("py");
    const file = path.join(dir, "svc_daemon.py");
    fs.writeFileSync(file, r.text);
    const compiled = spawnSync("python3", ["-m", "py_compile", file], { encoding: "utf8" });
    expect(compiled.stderr).toBe("");
    expect(compiled.status).toBe(0);
    // Its grammar is Python 3.8's, the oldest it supports (the interpreter here may be newer).
    const old = spawnSync("python3", ["-c", "import ast, sys; ast.parse(open(sys.argv[1]).read(), feature_version=(3, 8))", file], { encoding: "utf8" });
    expect(old.stderr).toBe("");
    expect(old.status).toBe(0);
    // Standard library only: every import resolves on a bare python3 (-S: no site-packages).
    const imports = spawnSync("python3", ["-S", "-c", `import sys; sys.argv=['x']; sys.path.insert(0, ${JSON.stringify(dir)}); import svc_daemon; print(svc_daemon.DAEMON_VERSION)`], { encoding: "utf8" });
    expect(imports.stderr).toBe("");
    expect(imports.stdout.trim()).toBe("3.2.0");

    const check = await api().get(`/api/providers/download/daemon?key=${provider.key}&check_only=true`);
    expect(check.status).toBe(200);
    expect(check.headers.get("content-type")).toBe("application/json");
    expect(check.body).toEqual({
      version: "3.2.0",
      min_version: "3.0.0",
      download_url: `${srv.url}/api/providers/download/daemon`,
      sha256: crypto.createHash("sha256").update(r.text).digest("hex"),
    });
    const f = await api().get(`/api/providers/download/daemon?key=${provider.key}&check_only=false`);
    expect(f.text).toBe(r.text);
    const bad = await api().get(`/api/providers/download/daemon?key=${provider.key}&check_only=maybe`);
    expect(bad.status).toBe(400);
    expect(bad.body.error).toMatch(/check_only/);
  });

  it("the key comes from the header too, and auth errors are the documented ones", async () => {
    const viaHeader = await api().get(`/api/providers/download/daemon`, { "x-provider-key": provider.key });
    expect(viaHeader.text).toContain(`API_KEY = "${provider.key}"`);
    expect((await api().get(`/api/providers/setup`)).status).toBe(400);
    expect((await api().get(`/api/providers/setup?key=svc-provider-nope`)).status).toBe(401);
    const renter = await makeRenter(srv);
    expect((await api().get(`/api/providers/setup?key=${renter.key}`)).status).toBe(403);
  });

  it("download-windows-exe is public and 404 with a clear message until a binary is configured", async () => {
    const r = await api().get(`/api/providers/download-windows-exe`);
    expect(r.status).toBe(404);
    expect(r.body.error).toMatch(/not built yet/);
    // The PowerShell command it suggests follows no redirect (Invoke-RestMethod would send the key header on).
    expect(r.body.error).toContain(`irm '${srv.url}/api/providers/setup-windows' -MaximumRedirection 0 -Headers @{ 'x-provider-key' = 'YOUR_KEY' } | iex`);
  });
});

describe("a configured Windows binary", () => {
  let withExe: TestServer;
  const exe = Buffer.from([0x4d, 0x5a, 0x90, 0x00, 0x03, 0x00, 0xff, 0x00]);
  beforeAll(async () => {
    const dir = tempDir("exe");
    fs.writeFileSync(path.join(dir, "svc-setup.exe"), exe);
    withExe = await startTestServer({ SVC_WINDOWS_EXE_PATH: path.join(dir, "svc-setup.exe") });
  });
  afterAll(() => withExe?.close());

  it("is served by download-windows-exe and by installer?os=Windows", async () => {
    const r = await fetch(`${withExe.url}/api/providers/download-windows-exe`);
    expect(r.status).toBe(200);
    expect(r.headers.get("content-disposition")).toBe('attachment; filename="svc-setup.exe"');
    expect(Buffer.from(await r.arrayBuffer())).toEqual(exe);
    const p = await makeProvider(withExe);
    const i = await fetch(`${withExe.url}/api/providers/installer?key=${p.key}&os=windows`);
    expect(Buffer.from(await i.arrayBuffer())).toEqual(exe);
  });
});
