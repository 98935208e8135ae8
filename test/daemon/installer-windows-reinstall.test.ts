// setup-windows.ps1 run again (after a key rotation, or to upgrade) must not leave the daemon it installed
// before running beside the new one: Unregister-ScheduledTask leaves a running instance running. There is no
// PowerShell here, so the script is read: the old daemon (the task's instance and any process running the
// daemon file) is stopped and waited for before the task is replaced, as setup.sh restarts the unit.
import fs from "node:fs";
import path from "node:path";
import { describe, expect, it } from "vitest";

const SETUP_PS1 = path.resolve("src/daemon/installers/setup-windows.ps1");

/** The script without its comments. */
const code = () => fs.readFileSync(SETUP_PS1, "utf8").replace(/^\s*#.*$/gm, "");

/** The body of `function NAME { ... }`, braces matched. */
function functionBody(text: string, name: string): string {
  const start = text.indexOf(`function ${name} {`);
  expect(start, `function ${name}`).toBeGreaterThan(-1);
  let depth = 0;
  for (let i = text.indexOf("{", start); i < text.length; i++) {
    if (text[i] === "{") depth++;
    else if (text[i] === "}" && --depth === 0) return text.slice(start, i + 1);
  }
  throw new Error(`function ${name} is not closed`);
}

describe("setup-windows.ps1 run again", () => {
  it("stops the daemon already running, and waits for it, before the task is replaced and started", () => {
    const text = code();
    const stop = functionBody(text, "Stop-Daemon");
    // The task's running instance...
    expect(stop).toMatch(/Get-ScheduledTask -TaskName \$TaskName[^\n]*\n[\s\S]*\.State -eq 'Running'[\s\S]*Stop-ScheduledTask -TaskName \$TaskName/);
    // ...and any process running this install's daemon file (one started by hand, or one the task left),
    // found by its command line, killed, and waited for; one that will not stop fails the install.
    expect(stop).toMatch(/Get-CimInstance -ClassName Win32_Process[\s\S]*\.CommandLine\.IndexOf\(\$Daemon,/);
    expect(stop).toMatch(/Stop-Process -Id \$proc\.ProcessId -Force/);
    expect(stop).toMatch(/Wait-Process -Id [^\n]*-Timeout \d+/);
    expect(stop).toMatch(/Get-Process -Id[\s\S]*throw "could not stop the daemon already running/);

    // Called once, outside its definition, before the task is unregistered, registered or started.
    const rest = text.replace(stop, "");
    const call = rest.indexOf("$WasRunning = Stop-Daemon\n");
    expect(call, "$WasRunning = Stop-Daemon").toBeGreaterThan(-1);
    expect(rest.split("Stop-Daemon").length - 1, "calls of Stop-Daemon").toBe(1);
    for (const cmd of ["Unregister-ScheduledTask", "Register-ScheduledTask", "Start-ScheduledTask"]) {
      const first = rest.search(new RegExp(`(^|[^-\\w])${cmd} `, "m"));
      expect(first, cmd).toBeGreaterThan(call);
    }
    // After the daemon file is in place: a failed download leaves the running daemon be.
    expect(rest.indexOf("Move-Item -Force -Path $Download -Destination $Daemon")).toBeLessThan(call);
  });

  it("in manual run mode starts the new daemon only where one was running, as systemctl try-restart", () => {
    const text = code();
    const manual = text.slice(text.indexOf("if ($RunMode -eq 'manual') {", text.indexOf("$WasRunning = Stop-Daemon")));
    const branch = manual.slice(0, manual.indexOf("} else {\n    Register-ScheduledTask"));
    expect(branch).toMatch(/Register-ScheduledTask[\s\S]*if \(\$WasRunning\) \{\s*Start-ScheduledTask -TaskName \$TaskName/);
    expect(branch.split("Start-ScheduledTask -TaskName $TaskName\n").length - 1, "Start-ScheduledTask calls in the manual branch").toBe(1);
  });
});
