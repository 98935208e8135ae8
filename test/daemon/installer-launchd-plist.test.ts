// setup.sh on macOS (a fake `uname` saying Darwin, a fake `launchctl` recording its calls) against a real
// local HTTP server with real curl: the launchd agent it writes, for a HOME, an install prefix and a python3
// folder holding characters that are markup in XML (`&`, `<`, `>`, even a closing tag and a key of their own),
// is a plist that parses, each value exactly as on disk and no key but the installer's.
import http from "node:http";
import type { AddressInfo } from "node:net";
import fs from "node:fs";
import path from "node:path";
import { spawnSync } from "node:child_process";
import { afterEach, describe, expect, it } from "vitest";
import { realPython, run, tempDir, writeExecutable } from "./helpers.js";

const SETUP_SH = path.resolve("src/daemon/installers/setup.sh");
const KEY = "svc-provider-PLISTKEY";
const DAEMON = `API_KEY = "${KEY}"\n`;

const servers: http.Server[] = [];
afterEach(async () => {
  for (const s of servers.splice(0)) await new Promise((resolve) => s.close(resolve));
});

/** A server answering the daemon download with the daemon file, and the run mode's POST with `{}`. */
async function backend(): Promise<string> {
  const server = http.createServer((req, res) => {
    req.resume();
    res.writeHead(200, { "content-type": "text/plain" }).end(req.method === "POST" ? "{}" : DAEMON);
  });
  servers.push(server);
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

/** The plist as Python's plistlib reads it (as JSON), or its error. */
function readPlist(file: string): { ok: true; value: Record<string, unknown> } | { ok: false; error: string } {
  const r = spawnSync(realPython(), ["-c", "import json,plistlib,sys; print(json.dumps(plistlib.load(open(sys.argv[1],'rb'))))", file], { encoding: "utf8" });
  return r.status === 0 ? { ok: true, value: JSON.parse(r.stdout) } : { ok: false, error: r.stderr };
}

describe("setup.sh on macOS", { timeout: 60_000 }, () => {
  for (const runMode of ["always-on", "manual"] as const) {
    it(`writes a valid launchd plist whose values come back exactly, for paths with &, <, > and markup (${runMode})`, async () => {
      const url = await backend();
      const weird = path.join(tempDir("installfix-plist"), "a & b <c> d");
      const prefix = path.join(weird, "pre&fix");
      // A HOME that, unescaped, would close the <string> and add a key of its own.
      const home = path.join(weird, "home</string><key>Injected</key><string>x");
      // python3 itself found on PATH in a folder of that kind.
      const pyDir = path.join(weird, "py &amp; <bin>");
      const bin = path.join(weird, "bin");
      fs.mkdirSync(pyDir, { recursive: true });
      fs.mkdirSync(bin, { recursive: true });
      fs.symlinkSync(realPython(), path.join(pyDir, "python3"));
      writeExecutable(bin, "uname", `#!/bin/sh\n[ "$1" = -s ] && echo Darwin || echo "uname $*: not faked" >&2\n`);
      const calls = path.join(weird, "launchctl.calls");
      writeExecutable(bin, "launchctl", `#!/bin/sh\nprintf '%s\\n' "$*" >> '${calls.replaceAll("'", "'\\''")}'\n`);

      const script = path.join(weird, "setup.sh");
      fs.writeFileSync(script, fs.readFileSync(SETUP_SH, "utf8").replaceAll("{{API_KEY}}", KEY).replaceAll("{{BACKEND_URL}}", url));
      const env: Record<string, string | undefined> = { ...process.env, PATH: `${bin}:${pyDir}:${process.env.PATH}`, SVC_PREFIX: prefix, HOME: home };
      delete env.SVC_OS;
      delete env.SVC_RUN_MODE;
      const res = await run("sh", [script, "--run-mode", runMode], { env });
      expect(res.stderr).toBe("");
      expect(res.status).toBe(0);

      const installDir = prefix + path.join(home, ".svc-daemon");
      const plist = prefix + path.join(home, "Library/LaunchAgents/com.svc.daemon.plist");
      expect(fs.readFileSync(path.join(installDir, "svc_daemon.py"), "utf8")).toBe(DAEMON);
      const parsed = readPlist(plist);
      expect(parsed, `${parsed.ok ? "" : parsed.error}\n${fs.readFileSync(plist, "utf8")}`).toMatchObject({ ok: true });
      const atLoad = runMode !== "manual";
      expect(parsed.ok && parsed.value).toEqual({
        Label: "com.svc.daemon",
        ProgramArguments: [path.join(pyDir, "python3"), path.join(installDir, "svc_daemon.py")],
        WorkingDirectory: installDir,
        EnvironmentVariables: { PYTHONUNBUFFERED: "1", SVC_WORK_DIR: path.join(installDir, "work") },
        RunAtLoad: atLoad,
        KeepAlive: atLoad,
        ExitTimeOut: 60,
        StandardOutPath: path.join(installDir, "logs/daemon.log"),
        StandardErrorPath: path.join(installDir, "logs/daemon.log"),
      });
      // The agent an earlier install loaded is unloaded, then the new one loaded, from the file written.
      expect(fs.readFileSync(calls, "utf8")).toBe(`unload ${plist}\nload ${plist}\n`);
    });
  }
});
