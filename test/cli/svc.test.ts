// svc, the command-line client, as a real subprocess against a real server,
// with a provider served by the TypeScript stream daemon whose --runner
// program reports progress and writes a PNG.
import { spawn } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { describe, expect, it } from "vitest";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { ADMIN_TOKEN } from "../helpers/server.js";
import { seedJob, settleJob } from "../admin/helpers.js";
import { useTsDaemonServer } from "../daemon/ts-harness.js";
import { tempDir, waitFor, writeExecutable } from "../daemon/helpers.js";
import { runSvc, SVC, type Run, type RunOptions } from "./run-svc.js";

const PNG_MAGIC = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);
// A 1x1 PNG.
const PNG_B64 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";

type Harness = ReturnType<typeof useTsDaemonServer>;

/** Runs svc with a config folder of its own; `input` goes to its stdin. */
const svc = (args: string[], opts: RunOptions & { home: string }): Promise<Run> => runSvc(args, { ...opts, env: { NO_COLOR: "", ...opts.env } });

/** A runner that paces itself, reports progress and logs, and answers a PNG (or fails when asked). */
function imageRunner(): string {
  const dir = tempDir("svc-runner");
  return writeExecutable(
    dir,
    "draw.py",
    `#!/usr/bin/env python3
import json, os, sys, time
job = json.load(sys.stdin)
params = job["task_spec"].get("inputs") or job["task_spec"].get("params") or {}
time.sleep(1)
print("SVC_PROGRESS 10 loading", flush=True)
print("loading the model", flush=True)
time.sleep(0.5)
if "fail" in json.dumps(job["task_spec"]):
    print("out of memory", file=sys.stderr, flush=True)
    sys.exit(3)
print("SVC_PROGRESS 60 drawing", flush=True)
print("drawing", flush=True)
time.sleep(0.5)
print("SVC_PROGRESS 100 done", flush=True)
json.dump({"data": "${PNG_B64}", "format": "png"}, open(os.environ["SVC_RESULT_FILE"], "w"))
`,
  );
}

async function providerWithDaemon(h: Harness) {
  const p = await makeProvider(h.srv);
  h.startDaemon(p.key, ["--runner", `image_generation=python3 ${imageRunner()}`]);
  await waitFor(async () => (await h.srv.sql`SELECT readiness_status FROM providers WHERE id = ${p.id}`)[0].readiness_status, 45_000, "daemon up");
  return p;
}

describe("svc", () => {
  it("stops quietly with 0 when its reader has gone (`svc … | head`)", async () => {
    const child = spawn(process.execPath, [SVC, "--help"], { stdio: ["ignore", "pipe", "pipe"] });
    child.stdout.destroy(); // closed before svc writes: its write fails with EPIPE
    let stderr = "";
    child.stderr.on("data", (d) => (stderr += d));
    const code = await new Promise<number | null>((resolve) => child.on("close", resolve));
    expect(stderr).toBe("");
    expect(code).toBe(0);
  });
});

// Each svc run is a Node process of its own, and most of a test's time is spent starting them. The
// two blocks below run at the same time, each on a server of its own (two, not one a test: each
// holds connections to the database, and the runs keep two cores busy), their tests one after
// another (it.sequential).
describe.concurrent("svc", { timeout: 180_000 }, () => {
  describe("a renter's jobs and their output, logging in, and admin reject", () => {
    const h = useTsDaemonServer();
    it.sequential("a renter logs in, tops up, submits with --follow: exit 0, the PNG written, the cost shown", async () => {
      const home = tempDir("svc-home");
      const renter = await makeRenter(h.srv);
      const provider = await providerWithDaemon(h);

      const login = await svc(["login", "--url", h.srv.url], { home, input: renter.key + "\n" });
      expect(login.code, login.stderr).toBe(0);
      expect(login.stdout).toMatch(/logged in as renter/);
      expect(login.stdout).not.toContain(renter.key);
      expect(login.stdout).toContain(`…${renter.key.slice(-4)}`);
      const file = path.join(home, "config", "profiles.json");
      expect(fs.statSync(file).mode & 0o777).toBe(0o600);
      expect(JSON.parse(fs.readFileSync(file, "utf8")).profiles.default).toMatchObject({ url: h.srv.url, role: "renter" });

      const topup = await svc(["topup", "--sar", "25"], { home });
      expect(topup.code, topup.stderr).toBe(0);
      expect(topup.stdout).toMatch(/paid, 25\.00 SAR added; balance 2500 halala/);

      const run = await svc(["submit", "image_generation", "--param", "prompt=a red square", "--param", "steps=20", "--duration", "2", "--follow"], { home });
      expect(run.code, run.stdout + run.stderr).toBe(0);
      expect(run.stdout).toMatch(/submitted job-\S+: pending/);
      expect(run.stdout).toMatch(/progress: 60% drawing/);
      expect(run.stdout).toMatch(/loading the model/);
      expect(run.stdout).toMatch(/result: completed/);
      const cost = /cost: (\d+) halala \((\d+\.\d\d) SAR\)/.exec(run.stdout);
      expect(cost, run.stdout).not.toBeNull();
      expect(Number(cost![1])).toBeGreaterThan(0);
      const written = /output: written to (\S+\.png)/.exec(run.stdout)![1];
      expect(fs.readFileSync(written).subarray(0, 8).equals(PNG_MAGIC)).toBe(true);
      // Not a terminal: plain lines, no bar and no colour.
      expect(run.stdout).not.toMatch(/\u2588|\x1b\[/);

      // --json answers are the API's JSON (as the REST routes write them): proto field names,
      // 64-bit integers as numbers, documented nulls present, no "$typeName". The balance shows the charge.
      const bal = await svc(["--json", "balance"], { home });
      expect(bal.code).toBe(0);
      expect(JSON.parse(bal.stdout)).toMatchObject({ balance_halala: 2500 - Number(cost![1]), held_halala: 0 });
      const ls = await svc(["--json", "jobs", "ls"], { home });
      const listed = JSON.parse(ls.stdout);
      expect(listed.jobs[0]).toMatchObject({ job_type: "image_generation", status: "completed", queue_reason: null });
      expect(typeof listed.jobs[0].cost_halala).toBe("number");
      expect(ls.stdout).not.toMatch(/\$typeName|"jobId"|"costHalala"/);
      const rest = await h.api().get("/api/jobs", renter.headers);
      expect(Object.keys(listed.jobs[0]).sort()).toEqual(Object.keys(rest.body.jobs[0]).sort());
      const table = await svc(["jobs", "ls"], { home });
      expect(table.stdout).toMatch(/^JOB\s+TYPE\s+STATUS\s+PROGRESS\s+COST \(halala\)\s+SUBMITTED$/m);
      const jobId = listed.jobs[0].job_id as string;
      const logs = await svc(["jobs", "logs", jobId], { home });
      expect(logs.stdout).toMatch(/loading the model[\s\S]*drawing/);
      const out = await svc(["jobs", "output", jobId, "--out", "again.png"], { home });
      expect(out.code, out.stderr).toBe(0);
      expect(fs.readFileSync(path.join(home, "again.png")).subarray(0, 8).equals(PNG_MAGIC)).toBe(true);
      // Environment overrides stand in for a profile.
      const env = await svc(["--json", "whoami"], { home: tempDir("svc-empty"), env: { SVC_URL: h.srv.url, SVC_KEY: renter.key } });
      expect(JSON.parse(env.stdout)).toMatchObject({ role: "renter", url: h.srv.url });
      expect(env.stdout).not.toContain(renter.key);
      // /v1 usage by day and model, on the generated client (no /v1 requests yet: 14 empty days).
      const usage = await svc(["--json", "usage"], { home });
      expect(usage.code, usage.stderr).toBe(0);
      expect(JSON.parse(usage.stdout)).toMatchObject({ days: expect.arrayContaining([expect.objectContaining({ requests: 0, cost_halala: 0 })]) });
      expect(JSON.parse(usage.stdout).days).toHaveLength(14);
      // The provider's earnings by day come from the server's report (its ledger credits): 75% of the charge.
      const earned = await svc(["--json", "provider", "earnings"], { home: tempDir("svc-provider"), env: { SVC_URL: h.srv.url, SVC_KEY: provider.key } });
      expect(earned.code, earned.stderr).toBe(0);
      const report = JSON.parse(earned.stdout);
      expect(report.total_earned_halala).toBe(Math.floor((Number(cost![1]) * 75) / 100));
      expect(report.days.at(-1)).toMatchObject({ jobs: 1, earned_halala: report.total_earned_halala });
    });

    it.sequential("--json --follow prints one JSON event per line; a failing job exits 1", async () => {
      const home = tempDir("svc-home");
      const renter = await makeRenter(h.srv, 10_000);
      await providerWithDaemon(h);
      const env = { SVC_URL: h.srv.url, SVC_KEY: renter.key };
      const run = await svc(["--json", "submit", "image_generation", "--param", "prompt=fail please", "--follow"], { home, env });
      expect(run.code, run.stdout + run.stderr).toBe(1);
      const lines = run.stdout.trim().split("\n").map((l) => JSON.parse(l));
      const [first, ...events] = lines;
      expect(first.submitted.job.status).toBeDefined();
      expect(Object.keys(events[0])).toContain("snapshot");
      const outcome = events.at(-1).outcome;
      // The runner's own failure: the stream daemon reports it as the renter's (runtime_error).
      expect(outcome).toMatchObject({ status: "failed", end_reason: "runtime_error", fault: "renter" });
      expect(outcome.cost_halala).toBeGreaterThanOrEqual(0);
      expect(outcome).toMatchObject({ output_path: null, output_format: null }); // documented nulls are there
      expect(outcome.error).toBeTruthy();

      const plain = await svc(["jobs", "watch", first.submitted.job.job_id], { home, env });
      expect(plain.code).toBe(1);
      expect(plain.stdout).toMatch(/result: failed/);
    });

    it.sequential("login: a key on stdin wins over SVC_KEY and SVC_ADMIN_TOKEN, which stand in only when stdin gives none; a URL without its scheme is a usage error", async () => {
      const a = await makeRenter(h.srv);
      const b = await makeRenter(h.srv);
      const saved = (home: string) => JSON.parse(fs.readFileSync(path.join(home, "config", "profiles.json"), "utf8")).profiles.default;

      const overKey = tempDir("svc-home");
      const r1 = await svc(["login", "--url", h.srv.url], { home: overKey, input: a.key + "\n", env: { SVC_KEY: b.key } });
      expect(r1.code, r1.stderr).toBe(0);
      expect(saved(overKey)).toMatchObject({ role: "renter", secret: a.key });

      const overToken = tempDir("svc-home");
      const r2 = await svc(["login", "--url", h.srv.url], { home: overToken, input: a.key + "\n", env: { SVC_ADMIN_TOKEN: ADMIN_TOKEN } });
      expect(r2.code, r2.stderr).toBe(0);
      expect(saved(overToken)).toMatchObject({ role: "renter", secret: a.key });

      const fromEnv = tempDir("svc-home");
      const r3 = await svc(["login", "--url", h.srv.url], { home: fromEnv, input: "", env: { SVC_KEY: b.key } });
      expect(r3.code, r3.stderr).toBe(0);
      expect(saved(fromEnv)).toMatchObject({ role: "renter", secret: b.key });

      const noScheme = await svc(["login", "--url", "localhost:18080"], { home: tempDir("svc-home"), input: a.key + "\n" });
      expect(noScheme.code).toBe(2);
      expect(noScheme.stderr).toMatch(/--url "localhost:18080" is not an http:\/\/ or https:\/\/ URL \(did you mean http:\/\/localhost:18080\?\)/);
      expect(noScheme.stderr).not.toMatch(/unreachable|Invalid URL/);
      const badEnv = await svc(["balance"], { home: tempDir("svc-home"), env: { SVC_URL: "127.0.0.1:9", SVC_KEY: a.key } });
      expect(badEnv.code).toBe(2);
      expect(badEnv.stderr).toMatch(/SVC_URL "127.0.0.1:9"/);
    });

    it.sequential("jobs output of a text job: its text, to stdout or to --out FILE, as submit --follow --out writes it", async () => {
      const home = tempDir("svc-home");
      const renter = await makeRenter(h.srv, 10_000);
      const provider = await makeProvider(h.srv);
      const job = await h.submit(renter, { job_type: "llm-inference", params: { prompt: "hi", max_tokens: 32 } });
      expect(job.provider_id).toBe(provider.id);
      await h.api().get(`/api/providers/${provider.key}/jobs`);
      const done = await h.api().post("/api/providers/job-result", { api_key: provider.key, job_id: job.job_id, success: true, result: { response: "hello, world" } });
      expect(done.status, done.text).toBe(200);
      const env = { SVC_URL: h.srv.url, SVC_KEY: renter.key };

      const printed = await svc(["jobs", "output", job.job_id], { home, env });
      expect(printed.code, printed.stderr).toBe(0);
      expect(printed.stdout).toBe("hello, world\n");
      const saved = await svc(["jobs", "output", job.job_id, "--out", "answer.txt"], { home, env });
      expect(saved.code, saved.stderr).toBe(0);
      expect(saved.stdout).toMatch(/written to .*answer\.txt \(12 bytes\)/);
      expect(fs.readFileSync(path.join(home, "answer.txt"), "utf8")).toBe("hello, world");
      const shown = JSON.parse((await svc(["--json", "jobs", "show", job.job_id], { home, env })).stdout);
      expect(shown).toMatchObject({ job_id: job.job_id, status: "completed", provider_id: provider.id });
      const json = await svc(["--json", "jobs", "output", job.job_id], { home, env });
      expect(JSON.parse(json.stdout)).toMatchObject({ response: "hello, world", job_id: job.job_id, status: "completed" });
      // The same file as a followed job's --out.
      const watched = await svc(["jobs", "watch", job.job_id, "--out", "watched.txt"], { home, env });
      expect(watched.code, watched.stderr).toBe(0);
      expect(fs.readFileSync(path.join(home, "watched.txt"), "utf8")).toBe("hello, world");
    });

    it.sequential("admin reject wants --reason (the server refuses one without)", async () => {
      const home = tempDir("svc-home");
      const pending = await makeProvider(h.srv, { approved: false });
      const env = { SVC_URL: h.srv.url, SVC_ADMIN_TOKEN: ADMIN_TOKEN };
      const bare = await svc(["admin", "reject", String(pending.id)], { home, env });
      expect(bare.code).toBe(2);
      expect(bare.stderr).toMatch(/required option '--reason <text>' not specified/);
      const given = await svc(["admin", "reject", String(pending.id), "--reason", "no GPU in the photos"], { home, env });
      expect(given.code, given.stderr).toBe(0);
      expect((await h.srv.sql`SELECT approval_status, rejection_reason FROM providers WHERE id = ${pending.id}`)[0]).toMatchObject({
        approval_status: "rejected",
        rejection_reason: "no GPU in the photos",
      });
    });
  });

  describe("refusals, a terminal, credentials, and an image's file name", () => {
    const h = useTsDaemonServer();
    it.sequential("a bad key exits 3 with the server's message; usage errors exit 2; an unreachable server exits 4", async () => {
      const home = tempDir("svc-home");
      const bad = await svc(["login", "--url", h.srv.url], { home, input: "svc-renter-not-a-real-key\n" });
      expect(bad.code).toBe(3);
      expect(bad.stderr).toMatch(/invalid API key \(HTTP 401, gRPC unauthenticated\)/);
      expect(bad.stderr).not.toMatch(/\n\s+at /); // no stack trace
      expect(fs.existsSync(path.join(home, "config", "profiles.json"))).toBe(false);
      const badAdmin = await svc(["admin", "dashboard"], { home, env: { SVC_URL: h.srv.url, SVC_ADMIN_TOKEN: "wrong-token" } });
      expect(badAdmin.code).toBe(3);
      expect(badAdmin.stderr).toMatch(/invalid admin token/);
      expect((await svc(["submit"], { home, env: { SVC_URL: h.srv.url, SVC_KEY: "svc-renter-x" } })).code).toBe(2);
      expect((await svc(["submit", "benchmark", "--priority", "high"], { home, env: { SVC_URL: h.srv.url, SVC_KEY: "svc-renter-x" } })).code).toBe(2);
      const down = await svc(["balance"], { home, env: { SVC_URL: "http://127.0.0.1:9", SVC_KEY: "svc-renter-x" } });
      expect(down.code).toBe(4);
      expect(down.stderr).toMatch(/unreachable/);
      // Operators: an admin profile lists pending providers and approves one.
      const pending = await makeProvider(h.srv, { approved: false });
      const adminEnv = { SVC_URL: h.srv.url, SVC_ADMIN_TOKEN: ADMIN_TOKEN };
      const list = await svc(["--json", "admin", "providers", "--pending"], { home, env: adminEnv });
      expect(JSON.parse(list.stdout).providers.map((p: { id: number }) => p.id)).toContain(pending.id);
      const approve = await svc(["admin", "approve", String(pending.id)], { home, env: adminEnv });
      expect(approve.code, approve.stderr).toBe(0);
      const status = await svc(["--json", "provider", "status"], { home, env: { SVC_URL: h.srv.url, SVC_KEY: pending.key } });
      expect(JSON.parse(status.stdout).provider).toMatchObject({ id: pending.id, approval_status: "approved" });
      // The job list, by renter and type, with its total.
      const lister = await makeRenter(h.srv, 10_000);
      for (const jobType of ["training", "rendering", "training"]) await seedJob(h.srv, { renterId: lister.id, status: "queued", jobType });
      const jobs = await svc(["admin", "jobs", "--renter", String(lister.id), "--type", "training", "--limit", "1"], { home, env: adminEnv });
      expect(jobs.code, jobs.stderr).toBe(0);
      expect(jobs.stdout).toMatch(/training/);
      expect(jobs.stdout).not.toMatch(/rendering/);
      expect(jobs.stdout).toMatch(/1-1 of 2/);
      const jobsJson = JSON.parse((await svc(["--json", "admin", "jobs", "--renter", String(lister.id), "--offset", "1"], { home, env: adminEnv })).stdout);
      expect(jobsJson.total).toBe(3);
      expect(jobsJson.jobs).toHaveLength(2);
      const badRenter = await svc(["admin", "jobs", "--renter", "x"], { home, env: adminEnv });
      expect(badRenter.stderr).toMatch(/--renter must be an integer/);
    });

    it.sequential("draws the progress bar in a real terminal: it reaches 100% and leaves the cursor shown", async () => {
      const home = tempDir("svc-home");
      const renter = await makeRenter(h.srv, 10_000);
      await providerWithDaemon(h);
      const r = await h.api().post("/api/jobs/submit", { job_type: "image_generation", duration_minutes: 1, params: { prompt: "tty" } }, renter.headers);
      expect(r.status).toBe(201);
      const jobId = r.body.job.job_id;
      // script(1) gives svc a pseudo-terminal as stdout; the typescript file is not needed.
      const cmd = `${JSON.stringify(process.execPath)} ${JSON.stringify(SVC)} jobs watch ${jobId}`;
      const run = await new Promise<Run>((resolve) => {
        const env: NodeJS.ProcessEnv = { ...process.env, SVC_URL: h.srv.url, SVC_KEY: renter.key, SVC_CONFIG_DIR: path.join(home, "config"), TERM: "xterm", COLUMNS: "100" };
        delete env.NO_COLOR;
        const child = spawn("script", ["-qfec", cmd, "/dev/null"], { env, cwd: home, stdio: ["ignore", "pipe", "pipe"] });
        let stdout = "";
        let stderr = "";
        child.stdout.on("data", (d) => (stdout += d));
        child.stderr.on("data", (d) => (stderr += d));
        child.on("close", (code) => resolve({ code, stdout, stderr }));
      });
      expect(run.code, run.stdout + run.stderr).toBe(0);
      expect(run.stdout).toMatch(/\u2588{10,}/); // the bar was drawn
      expect(run.stdout).toMatch(/100% \| done/);
      expect(run.stdout).toMatch(/\x1b\[\?25l/); // cursor hidden while drawing...
      const lastShow = run.stdout.lastIndexOf("\x1b[?25h");
      expect(lastShow).toBeGreaterThan(run.stdout.lastIndexOf("\x1b[?25l")); // ...and shown again
      expect(run.stdout).toMatch(/result: .*completed/);
      expect(run.stdout).toMatch(/output: written to .*\.png/);
    });

    it.sequential("SVC_KEY and SVC_ADMIN_TOKEN bring their own role over a stored profile's; tables say their money's unit", async () => {
      const home = tempDir("svc-home");
      const renter = await makeRenter(h.srv, 1_234);
      const provider = await makeProvider(h.srv);
      expect((await svc(["login", "--url", h.srv.url], { home, input: renter.key })).code).toBe(0);

      // A provider key in SVC_KEY is a provider's, whatever the stored profile's role.
      const who = await svc(["--json", "whoami"], { home, env: { SVC_KEY: provider.key } });
      expect(who.code, who.stderr).toBe(0);
      expect(JSON.parse(who.stdout)).toMatchObject({ role: "provider", key: `svc-provider-…${provider.key.slice(-4)}` });
      const status = await svc(["--json", "provider", "status"], { home, env: { SVC_KEY: provider.key } });
      expect(status.code, status.stderr).toBe(0);
      expect(JSON.parse(status.stdout).provider).toMatchObject({ id: provider.id, today_earnings_halala: 0, active_job: null });
      await h.srv.sql`UPDATE providers SET supported_job_types = '{benchmark,training}' WHERE id = ${provider.id}`;
      const human = await svc(["provider", "status"], { home, env: { SVC_KEY: provider.key } });
      expect(human.code, human.stderr).toBe(0);
      expect(human.stdout).toMatch(/^job types\s+benchmark, training$/m);

      // SVC_ADMIN_TOKEN alone is an admin's.
      const dash = await svc(["admin", "dashboard"], { home, env: { SVC_ADMIN_TOKEN: ADMIN_TOKEN } });
      expect(dash.code, dash.stderr).toBe(0);
      expect(dash.stdout).toMatch(/^total renter balance\s+\d+ halala \(\d+\.\d\d SAR\)$/m);
      expect(dash.stdout).toMatch(/^total revenue\s+\d+ halala \(\d+\.\d\d SAR\)$/m);
      const renters = await svc(["admin", "renters"], { home, env: { SVC_ADMIN_TOKEN: ADMIN_TOKEN } });
      expect(renters.code, renters.stderr).toBe(0);
      expect(renters.stdout).toMatch(/^ID\s+NAME\s+EMAIL\s+STATUS\s+BALANCE \(halala\)$/m);
      expect(renters.stdout).toMatch(/\s1234$/m);
      const dashJson = JSON.parse((await svc(["--json", "admin", "dashboard"], { home, env: { SVC_ADMIN_TOKEN: ADMIN_TOKEN } })).stdout);
      expect(typeof dashJson.stats.total_renter_balance_halala).toBe("number");
      expect(Array.isArray(dashJson.gpu_breakdown)).toBe(true);

      // Without them, the stored renter profile is a renter's: an operator command is a usage error that says so.
      const refused = await svc(["admin", "dashboard"], { home });
      expect(refused.code).toBe(2);
      expect(refused.stderr).toMatch(/this command is for an admin profile; the credential in effect \(profile "default"\) is a renter's/);
    });

    it.sequential("jobs output and jobs watch name an image file by its format only when that is a raster format; any other is <job_id>.bin", async () => {
      const b64 = (text: string) => Buffer.from(text).toString("base64");
      const written: Record<string, string[]> = {};
      for (const [format, data] of [["html", b64("<script>alert(1)</script>")], ["hta", b64("<script>1</script>")], ["exe", b64("MZ")], ["desktop", b64("[Desktop Entry]")], ["jpeg", PNG_B64]]) {
        const renter = await makeRenter(h.srv, 10_000);
        const provider = await makeProvider(h.srv);
        const job = await seedJob(h.srv, { renterId: renter.id, providerId: provider.id, status: "running", jobType: "image_generation", cost: 100 });
        await settleJob(h.srv, job, renter.id, provider.id, 100, 40);
        await h.srv.sql`UPDATE jobs SET result = ${h.srv.sql.json({ data, format })} WHERE id = ${job.id}`;
        const env = { SVC_URL: h.srv.url, SVC_KEY: renter.key };
        for (const args of [["jobs", "output", job.jobId], ["jobs", "watch", job.jobId]]) {
          const home = tempDir("svc-outname");
          const r = await svc(args, { home, env });
          expect(r.code, r.stderr).toBe(0);
          const files = fs.readdirSync(home).filter((f) => f.startsWith("job-"));
          expect(files).toHaveLength(1);
          expect(fs.readFileSync(path.join(home, files[0]))).toEqual(Buffer.from(data, "base64"));
          (written[format] ??= []).push(files[0].slice(job.jobId.length));
        }
      }
      expect(written).toEqual({ html: [".bin", ".bin"], hta: [".bin", ".bin"], exe: [".bin", ".bin"], desktop: [".bin", ".bin"], jpeg: [".jpeg", ".jpeg"] });
    });
  });
});
