// svc submit takes a parameter's JSON from a file (--param-json key=@FILE) or from standard input
// (key=@-), so that a custom_container's env values, a renter's secrets, never are on svc's command
// line, which every user of the host can read (ps, /proc/<pid>/cmdline). svc runs as a real
// subprocess whose argv is sampled while it runs; the job the server stored carries the values.
import { spawn } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { describe, expect, it } from "vitest";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { useTestServer } from "../helpers/server.js";
import { tempDir } from "../daemon/helpers.js";
import { cmdline } from "../daemon/procs.js";
import { findSecrets, rnd } from "../hardening/secret-search.js";
import { runSvc, SVC } from "./run-svc.js";

const srv = useTestServer();

/** svc as a subprocess with `input` on its stdin; its output, and every argv /proc showed for it while it ran. */
async function svcWatched(args: string[], env: Record<string, string>, input = "") {
  const home = tempDir("svc-secret-params");
  const childEnv: NodeJS.ProcessEnv = { ...process.env, SVC_CONFIG_DIR: path.join(home, "config"), NO_COLOR: "1", ...env };
  delete childEnv.SVC_ADMIN_TOKEN;
  const child = spawn(process.execPath, [SVC, ...args], { env: childEnv, cwd: home, stdio: ["pipe", "pipe", "pipe"] });
  let stdout = "";
  let stderr = "";
  child.stdout.on("data", (x) => (stdout += x));
  child.stderr.on("data", (x) => (stderr += x));
  let argv = "";
  const t = setInterval(() => (argv += cmdline(child.pid!) + "\n"), 5);
  child.stdin.end(input);
  const code = await new Promise<number | null>((r) => child.on("close", r));
  clearInterval(t);
  return { code, stdout, stderr, argv };
}

/** The job id in svc --json submit's answer. */
const jobIdOf = (stdout: string) => /"job_id":\s*"([^"]+)"/.exec(stdout)![1];

async function storedJob(jobId: string) {
  const [job] = await srv.sql`SELECT * FROM jobs WHERE job_id = ${jobId}`;
  return JSON.stringify(job);
}

// Each svc run starts a Node process: seconds each on a loaded machine.
describe("svc submit: secret parameters off the command line", { timeout: 120_000 }, () => {
  it("reads a custom_container's env from standard input (--param-json env=@-): never in svc's argv, no key in its output", async () => {
    const renter = await makeRenter(srv, 100_000);
    const p = await makeProvider(srv);
    const secret = `CLIENVSECRET${rnd()}`;
    const env = { SVC_URL: srv.url, SVC_KEY: renter.key };
    const args = ["--json", "submit", "custom_container", "--param-json", "env=@-", "--param-json", `command=["run"]`, "--provider", String(p.id), "-d", "1"];
    const run = await svcWatched(args, env, JSON.stringify({ API_TOKEN: secret }) + "\n");
    expect(run.code, run.stderr).toBe(0);
    expect(run.argv).toContain("env=@-");
    expect(findSecrets({ envValue: secret }, { "svc argv (ps)": run.argv })).toEqual([]);
    // Its output (the renter's own terminal) carries no key.
    expect(findSecrets({ renterKey: renter.key, providerKey: p.key }, { "svc output": run.stdout + run.stderr })).toEqual([]);
    const jobId = jobIdOf(run.stdout);
    expect(await storedJob(jobId)).toContain(secret);
  });

  it("reads one from a file (--param-json env=@FILE), beside values given on the command line", async () => {
    const renter = await makeRenter(srv, 100_000);
    const secret = `FILEENVSECRET${rnd()}`;
    const file = path.join(tempDir("svc-env-json"), "env.json");
    fs.writeFileSync(file, JSON.stringify({ HF_TOKEN: secret, OTHER: "x" }), { mode: 0o600 });
    const run = await svcWatched(["--json", "submit", "custom_container", "--param-json", `env=@${file}`, "-p", `command=["run"]`, "-d", "1"], { SVC_URL: srv.url, SVC_KEY: renter.key });
    expect(run.code, run.stderr).toBe(0);
    expect(findSecrets({ envValue: secret }, { "svc argv (ps)": run.argv })).toEqual([]);
    const stored = await storedJob(jobIdOf(run.stdout));
    expect(stored).toContain(secret);
    expect(stored).toContain('"run"');
  });

  it("says what is wrong with a file or standard input without repeating what it read", async () => {
    const renter = await makeRenter(srv);
    const env = { SVC_URL: srv.url, SVC_KEY: renter.key };
    const dir = tempDir("svc-env-bad");
    const notJson = path.join(dir, "env.txt");
    fs.writeFileSync(notJson, "API_TOKEN=NOTJSONSECRET\n");
    const bad = await runSvc(["submit", "custom_container", "--param-json", `env=@${notJson}`], { env });
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain(`--param-json env: ${notJson} does not hold one JSON value`);
    expect(bad.stderr).not.toContain("NOTJSONSECRET");
    const piped = await runSvc(["submit", "custom_container", "--param-json", "env=@-"], { env, input: "{STDINSECRET" });
    expect(piped.code).toBe(2);
    expect(piped.stderr).toContain("--param-json env: standard input does not hold one JSON value");
    expect(piped.stderr).not.toContain("STDINSECRET");
    const missing = await runSvc(["submit", "custom_container", "--param-json", `env=@${path.join(dir, "nope.json")}`], { env });
    expect(missing.code).toBe(2);
    expect(missing.stderr).toMatch(/cannot read it \(ENOENT\)/);
    const twice = await runSvc(["submit", "custom_container", "--param-json", "env=@-", "--param-json", "command=@-"], { env, input: "{}" });
    expect(twice.code).toBe(2);
    expect(twice.stderr).toMatch(/only one value can be read from standard input/);
    // The JSON given on the command line is as before: a value, not a file.
    const inline = await runSvc(["--json", "submit", "custom_container", "--param-json", 'env={"A":"@not-a-file"}', "--param-json", 'command=["run"]', "-d", "1"], { env: { ...env, SVC_KEY: (await makeRenter(srv, 100_000)).key } });
    expect(inline.code, inline.stderr).toBe(0);
    expect(await storedJob(jobIdOf(inline.stdout))).toContain("@not-a-file");
  });
});
