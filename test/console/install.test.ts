// The provider's Install page: the commands it shows are run as shown (sh,
// with stand-ins for python3 and npx that record how they were started), and
// none puts the provider key on a command line, where `ps` shows it to every
// user of the machine (for as long as a daemon runs). The Python
// daemon file, which has the key and the provider's task-signing secret baked
// in, is left readable by its owner only. The key itself is typed at a prompt
// that sets PK, so it is not kept in the shell's history either.
import { execFile, spawn } from "node:child_process";
import { promisify } from "node:util";
import fs from "node:fs";
import path from "node:path";
import type { Page } from "playwright-core";
import { describe, expect, it } from "vitest";
import { makeProvider } from "../helpers/fixtures.js";
import { keyRedirector, run as runTo, tempDir, writeExecutable } from "../daemon/helpers.js";
import { configFromArgs } from "../../src/daemon/ts/cli.js";
import { shot, useConsoleHarness, watchProblems } from "./browser.js";

const STEP_MS = 30_000;
const run = promisify(execFile);

const h = useConsoleHarness();

/** The command shown under a heading of the One-liners card. */
const command = (page: Page, title: RegExp) => page.locator(".cmd-block").filter({ has: page.getByRole("heading", { name: title }) }).locator("pre.cmd").textContent();

/** Runs sh with `script`, `input` on its standard input (what a provider types at a prompt). */
function sh(script: string, input: string, opts: { cwd: string; env: NodeJS.ProcessEnv }): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn("sh", ["-c", script], { ...opts, stdio: ["pipe", "ignore", "pipe"] });
    let stderr = "";
    child.stderr.on("data", (d) => (stderr += d));
    const timer = setTimeout(() => child.kill("SIGKILL"), STEP_MS);
    child.on("close", (code) => {
      clearTimeout(timer);
      if (code === 0) resolve();
      else reject(new Error(`sh exited ${code}: ${stderr}`));
    });
    child.stdin.end(input);
  });
}

/**
 * Runs `script` with sh in `dir`, `key` typed at its prompt, a stand-in for `program` first on the
 * PATH that records its arguments and SVC_API_KEY; curl runs as installed, its arguments recorded (`curlArgs`).
 */
async function runShown(dir: string, program: string, script: string, key: string): Promise<{ argv: string[]; envKey: string; curlArgs: string }> {
  const bin = tempDir("install-bin");
  const record = path.join(dir, `${program}.json`);
  writeExecutable(bin, program, `#!${process.execPath}\nrequire("node:fs").writeFileSync(${JSON.stringify(record)}, JSON.stringify({ argv: process.argv.slice(2), envKey: process.env.SVC_API_KEY ?? "" }));\n`);
  const curlRecord = path.join(dir, "curl.args");
  const curl = (await run("sh", ["-c", "command -v curl"])).stdout.trim();
  writeExecutable(bin, "curl", `#!/bin/sh\necho "$@" >> '${curlRecord}'\nexec '${curl}' "$@"\n`);
  const env: NodeJS.ProcessEnv = { ...process.env, PATH: `${bin}:${process.env.PATH}` };
  delete env.SVC_API_KEY;
  // A common default umask: the command must not rely on a stricter one.
  // Asynchronously: the test server answers the download from this very process.
  await sh(`umask 022\n${script}`, `${key}\n`, { cwd: dir, env });
  return { ...JSON.parse(fs.readFileSync(record, "utf8")), curlArgs: fs.existsSync(curlRecord) ? fs.readFileSync(curlRecord, "utf8") : "" };
}

describe("the provider's Install page", () => {
  it("shows commands that keep the provider key off command lines and the daemon file private", async () => {
    const p = await makeProvider(h.srv);
    const ctx = await h.context();
    await ctx.addInitScript((s) => sessionStorage.setItem("svc-console-session", s), JSON.stringify({ role: "provider", secret: p.key, label: "Rig" }));
    const page = await ctx.newPage();
    const problems = watchProblems(page);
    await page.goto(`${h.srv.url}/#/provider/install`);
    await page.getByRole("heading", { name: "Install the daemon" }).waitFor({ timeout: STEP_MS });

    // The key is shown masked until asked for; no command holds it: PK is set from a prompt.
    const keyShown = page.getByTestId("provider-key");
    expect(await keyShown.textContent()).toMatch(/^svc-provider-.{4}…$/);
    await page.getByRole("button", { name: "Show key" }).click();
    expect(await keyShown.textContent()).toBe(p.key);
    await shot(page, "provider-install");
    const bashKey = page.locator("pre.cmd").filter({ hasText: /read -r PK/ });
    expect(await bashKey.textContent()).toBe(`printf 'Provider key: '; IFS= read -r PK; export PK`);

    const all = await page.locator("pre.cmd:not([data-testid=provider-key])").allTextContents();
    expect(all).toHaveLength(6);
    for (const cmd of all) {
      expect(cmd).not.toContain("--key");
      expect(cmd).not.toContain(p.key);
    }

    // The Python daemon in the foreground: downloaded readable by its owner only, started without the key.
    const py = tempDir("install-py");
    const ran = await runShown(py, "python3", `${await bashKey.textContent()}\n${await command(page, /Python daemon/)}`, p.key);
    expect(ran.argv).toEqual(["svc_daemon.py", "--url", h.srv.url]);
    // curl fetched it with the key read from standard input, not from its arguments.
    expect(ran.curlArgs).toContain("/api/providers/download/daemon");
    expect(ran.curlArgs).not.toContain(p.key);
    const file = path.join(py, "svc_daemon.py");
    expect((fs.statSync(file).mode & 0o777).toString(8)).toBe("600");
    // …and the daemon takes the key baked into the file.
    const { stdout: loaded } = await run(
      "python3",
      ["-c", "import importlib.util, json, sys\nspec = importlib.util.spec_from_file_location('d', sys.argv[1])\nm = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(m)\nprint(json.dumps(m.load_config(['--url', sys.argv[2]])['key']))", file, h.srv.url],
      { encoding: "utf8", env: { ...process.env, SVC_API_KEY: "" }, timeout: STEP_MS },
    );
    expect(JSON.parse(loaded)).toBe(p.key);
    // A file left from an earlier download (made 0644) is made private too.
    fs.chmodSync(file, 0o644);
    await runShown(py, "python3", `${await bashKey.textContent()}\n${await command(page, /Python daemon/)}`, p.key);
    expect((fs.statSync(file).mode & 0o777).toString(8)).toBe("600");

    // The TypeScript daemon: the key in its environment, which the daemon reads.
    const ts = tempDir("install-ts");
    const npx = await runShown(ts, "npx", `${await bashKey.textContent()}\n${await command(page, /TypeScript stream daemon/)}`, p.key);
    expect(npx.argv).toEqual(["svc-daemon", "--", "--url", h.srv.url]);
    expect(npx.envKey).toBe(p.key);
    const cfg = await configFromArgs([...npx.argv.slice(2), "--docker", "none", "--nvidia-smi", path.join(ts, "no-nvidia-smi"), "--state-dir", path.join(ts, "state")], { SVC_API_KEY: npx.envKey }, () => {});
    expect(cfg.key).toBe(p.key);

    // Windows: PK is set the PowerShell way, from a prompt, which its one-liner reads.
    const windowsKey = page.locator("pre.cmd").filter({ hasText: /^\$env:PK = / });
    expect(await windowsKey.textContent({ timeout: 1_000 })).toBe(`$env:PK = Read-Host 'Provider key'`);
    await page.getByRole("button", { name: "Hide key" }).click();
    expect(await keyShown.textContent()).toMatch(/^svc-provider-.{4}…$/);
    expect(await command(page, /^Windows \(PowerShell\)/)).toBe(`irm "${h.srv.url}/api/providers/setup-windows" -MaximumRedirection 0 -Headers @{ 'x-provider-key' = $env:PK } | iex`);
    // The service installer is fetched the same way as the Python daemon (not run here: it installs a service).
    expect(await command(page, /^Linux or macOS, as a service/)).toBe(
      `SETUP=$(printf 'x-provider-key: %s\\n' "$PK" | curl -fsSL --max-redirs 0 -H @- "${h.srv.url}/api/providers/setup") && printf '%s\\n' "$SETUP" | sh`,
    );
    expect(problems).toEqual([]);
  }, 90_000);

  it("shows commands that fail on a redirected download, sending the key to no other host", async () => {
    const p = await makeProvider(h.srv);
    const ctx = await h.context();
    await ctx.addInitScript((s) => sessionStorage.setItem("svc-console-session", s), JSON.stringify({ role: "provider", secret: p.key, label: "Rig" }));
    const page = await ctx.newPage();
    await page.goto(`${h.srv.url}/#/provider/install`);
    await page.getByRole("heading", { name: "Install the daemon" }).waitFor({ timeout: STEP_MS });
    const readKey = await page.locator("pre.cmd").filter({ hasText: /read -r PK/ }).textContent();

    const dir = tempDir("install-redirect");
    const marker = path.join(dir, "ran-an-answer");
    const redirector = await keyRedirector(marker);
    try {
      for (const title of [/^Linux or macOS, as a service/, /Python daemon/]) {
        // The command as shown, against a backend whose downloads redirect to another host.
        const shown = (await command(page, title))!.replaceAll(h.srv.url, redirector.url);
        const bin = tempDir("install-redirect-bin");
        writeExecutable(bin, "python3", `#!/bin/sh
: > '${marker}.python3'
`);
        const ran = await runTo("sh", ["-c", `umask 022\n${readKey}\n${shown}`], { cwd: dir, input: `${p.key}\n`, env: { ...process.env, PATH: `${bin}:${process.env.PATH}` } });
        expect(redirector.otherHostKeys, `keys the other host got from: ${shown}`).toEqual([]);
        expect(ran.status, shown).not.toBe(0);
        expect(ran.stderr).toMatch(/redirect/i);
        expect(fs.readdirSync(dir), "nothing the command fetched ran, nor the daemon").toEqual([]);
      }
    } finally {
      await redirector.close();
    }
  }, 60_000);
});
