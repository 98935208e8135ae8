// svc following a job (`jobs watch`, `jobs logs -f`, `submit --follow`) as a
// real subprocess against a real server, through a TCP proxy that cuts and
// resets its connections and is down for longer than a few retries: each
// resumes from the last event, loses and repeats no log line, and ends with
// the job's result and exit 0. A refusal of the server is not retried; its
// "try again later" is, no sooner than its Retry-After: a watch it cut because
// svc fell behind the job's events resumes from the cursor, and one refused
// while the account holds too many watches waits for one to end. On a
// terminal, Ctrl-C or SIGTERM stop the bar, restore the cursor and line wrap,
// and exit 130 or 143.
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { afterEach, describe, expect, it, vi, type MockInstance } from "vitest";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { startTestServer } from "../helpers/server.js";
import { seedJob, settleJob } from "../admin/helpers.js";
import { openSse } from "../jobs/watch-helpers.js";
import { useTsDaemonServer } from "../daemon/ts-harness.js";
import { realPython, tempDir, waitFor, writeExecutable } from "../daemon/helpers.js";
import { startProxy, type Proxy } from "./proxy.js";
import { SVC } from "./run-svc.js";
import { Code, ConnectError } from "@connectrpc/connect";
import { backoffMs, reconnectWindowMs, restoreOnSignal, resumable, retryAfterMs } from "../../src/cli/follow.js";
import { jobWatchHub, MAX_WATCHES_PER_ACCOUNT, TOO_MANY_WATCHES_RETRY_AFTER_SECONDS, Watcher } from "../../src/workers/job-watch.js";

interface Running {
  /** Its working folder. */
  home: string;
  child: ChildProcess;
  /** Whether it has ended already. */
  exited(): boolean;
  stdout(): string;
  stderr(): string;
  done: Promise<{ code: number | null; stdout: string; stderr: string }>;
}

/**
 * A server with the daemon harness for the tests of one describe block (the blocks run at the same
 * time: most of their time is spent waiting out outages and Retry-Afters), and what a test starts
 * against it, ended after each test: svc processes and a proxy.
 */
function useFollowServer() {
  const h = useTsDaemonServer();
  const children: ChildProcess[] = [];
  let proxy: Proxy | undefined;
  afterEach(async () => {
    for (const c of children.splice(0)) if (c.exitCode === null) c.kill("SIGKILL");
    await proxy?.close();
    proxy = undefined;
  });
  return {
    h,
    /** A proxy in front of this server, closed after the test. */
    async proxy(): Promise<Proxy> {
      proxy = await startProxy(h.port);
      return proxy;
    },
    /** Starts svc (not waited for); its config folder is empty, the environment gives the URL and key. */
    svc(args: string[], env: Record<string, string>): Running {
      const home = tempDir("svc-follow");
      const e: NodeJS.ProcessEnv = { ...process.env, SVC_CONFIG_DIR: path.join(home, "config"), NO_COLOR: "1", ...env };
      for (const k of ["SVC_PROFILE", "SVC_ROLE", "SVC_ADMIN_TOKEN", "SVC_RECONNECT_SECONDS"]) if (!env[k]) delete e[k];
      const child = spawn(process.execPath, [SVC, ...args], { env: e, cwd: home, stdio: ["ignore", "pipe", "pipe"] });
      children.push(child);
      let stdout = "";
      let stderr = "";
      child.stdout!.on("data", (d) => (stdout += d));
      child.stderr!.on("data", (d) => (stderr += d));
      const done = new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve) => child.on("close", (code) => resolve({ code, stdout, stderr })));
      return { home, child, exited: () => child.exitCode !== null || child.signalCode !== null, stdout: () => stdout, stderr: () => stderr, done };
    },
    /** `svc jobs watch` in a pseudo-terminal (script(1)); resolves with everything it drew and its exit code. */
    watchInTerminal(jobId: string, renterKey: string) {
      const home = tempDir("svc-tty");
      const cmd = `exec ${JSON.stringify(process.execPath)} ${JSON.stringify(SVC)} jobs watch ${jobId}`;
      const env: NodeJS.ProcessEnv = { ...process.env, SVC_URL: h.srv.url, SVC_KEY: renterKey, SVC_CONFIG_DIR: path.join(home, "config"), TERM: "xterm", COLUMNS: "100" };
      delete env.NO_COLOR;
      const child = spawn("script", ["-qfec", cmd, "/dev/null"], { env, cwd: home, stdio: ["pipe", "pipe", "pipe"] });
      children.push(child);
      let output = "";
      child.stdout!.on("data", (d) => (output += d));
      child.stderr!.on("data", (d) => (output += d));
      const done = new Promise<number | null>((resolve) => child.on("close", resolve));
      return { child, output: () => output, done };
    },
    /** A running llm-inference job of a fresh renter and provider, seeded (no daemon runs it), with one log line. */
    async seededJob(line: string) {
      const renter = await makeRenter(h.srv, 10_000);
      const provider = await makeProvider(h.srv);
      const job = await seedJob(h.srv, { renterId: renter.id, providerId: provider.id, status: "running", jobType: "llm-inference", cost: 100 });
      await h.srv.sql`INSERT INTO job_logs (job_id, attempt, level, message) VALUES (${job.id}, 1, 'info', ${line})`;
      return { renter, provider, job };
    },
    /** A running job on a daemon of its own, whose runner ticks until the test opens its gate. */
    async tickingJob() {
      const p = await makeProvider(h.srv);
      const renter = await makeRenter(h.srv, 10_000);
      const tick = tickingRunner();
      h.startDaemon(p.key, ["--runner", tick.runner]);
      await waitFor(async () => (await h.srv.sql`SELECT readiness_status FROM providers WHERE id = ${p.id}`)[0].readiness_status, 45_000, "daemon up");
      const job = await h.submit(renter, { job_type: "llm-inference", params: { prompt: "hi", max_tokens: 32 } });
      await waitFor(async () => (await h.job(job.job_id)).status === "running", 45_000, "running");
      return { renter, jobId: job.job_id, open: tick.open };
    },
  };
}

/** An llm-inference runner that logs "line N" every 0.3 s until `open()`, then "finished" and a text result. */
function tickingRunner(): { runner: string; open(): void } {
  const dir = tempDir("svc-tick");
  const gate = path.join(dir, "go");
  const file = writeExecutable(
    dir,
    "tick.py",
    `#!/usr/bin/env python3
import json, os, sys, time
json.load(sys.stdin)
i = 0
while not os.path.exists(${JSON.stringify(gate)}):
    i += 1
    print("line %d" % i, flush=True)
    time.sleep(0.3)
print("finished", flush=True)
json.dump({"response": "all done"}, open(os.environ["SVC_RESULT_FILE"], "w"))
`,
  );
  return { runner: `llm-inference=${realPython()} ${file}`, open: () => fs.writeFileSync(gate, "") };
}

/** waitFor, saying what the followers printed by the time it gave up; no waiting on for one that has ended. */
async function until(fn: () => boolean, ms: number, what: () => string, alive: Running[] = []): Promise<void> {
  try {
    await waitFor(() => fn() || alive.some((r) => r.exited()), ms, "it");
  } catch {
    throw new Error(`timed out waiting for ${what()}`);
  }
  if (!fn()) throw new Error(`ended before ${what()}`);
}

/** The "line N" numbers printed (as plain lines), in order. */
const lineNumbers = (text: string) => [...text.matchAll(/^(?:\S+\s+)?line (\d+)$/gm)].map((m) => Number(m[1]));
/** The last "line N" seen, plain or in JSON. */
const lastLine = (text: string) => Number([...text.matchAll(/line (\d+)/g)].at(-1)?.[1] ?? 0);

describe("svc following a job: when to resume", () => {
  const answered = (status: number | undefined, grpc: Code) => new Headers({ "grpc-status": String(grpc), ...(status ? { "x-svc-http-status": String(status) } : {}) });
  it("resumes a lost connection and the server's try-again-later, not its refusals", () => {
    // No answer from the server: the connection was cut, reset or refused.
    expect(resumable(new ConnectError("http/2 stream closed with error code CANCEL (0x8)", Code.Canceled))).toBe(true);
    expect(resumable(new ConnectError("read ECONNRESET", Code.Aborted))).toBe(true);
    expect(resumable(new ConnectError("connect ECONNREFUSED 127.0.0.1:8080", Code.Unavailable))).toBe(true);
    // The server's own answers: only shutting down, 503 (its database unreachable) and 429 are tried again.
    expect(resumable(new ConnectError("the server is shutting down", Code.Unavailable, answered(undefined, Code.Unavailable)))).toBe(true);
    expect(resumable(new ConnectError("database unavailable", Code.Unavailable, answered(503, Code.Unavailable)))).toBe(true);
    expect(resumable(new ConnectError("too many requests", Code.ResourceExhausted, answered(429, Code.ResourceExhausted)))).toBe(true);
    expect(resumable(new ConnectError("job not found", Code.NotFound, answered(404, Code.NotFound)))).toBe(false);
    expect(resumable(new ConnectError("invalid API key", Code.Unauthenticated, answered(401, Code.Unauthenticated)))).toBe(false);
    expect(resumable(new ConnectError("internal error", Code.Internal, answered(500, Code.Internal)))).toBe(false);
    expect(resumable(new ConnectError("internal error", Code.Internal, answered(undefined, Code.Internal)))).toBe(false);
    expect(resumable(new ConnectError("the client closed the connection", Code.Canceled, answered(undefined, Code.Canceled)))).toBe(false);
  });

  it("resumes the watch hub's 429s (a watcher cut for falling behind, too many watches open) after their Retry-After", () => {
    // As the gRPC client hands them over: the server's trailers, and what its headers said too.
    const cut = new ConnectError("this watcher fell behind the job's events; watch again from cursor 7", Code.ResourceExhausted, answered(429, Code.ResourceExhausted));
    cut.metadata.set("retry-after", "1");
    expect(resumable(cut)).toBe(true);
    expect(retryAfterMs(cut)).toBe(1_000);
    const twice = new ConnectError("at most 32 job watches may be open at once", Code.ResourceExhausted, answered(429, Code.ResourceExhausted));
    twice.metadata.append("x-svc-http-status", "429");
    twice.metadata.set("retry-after", "10");
    twice.metadata.append("retry-after", "10");
    expect(resumable(twice)).toBe(true);
    expect(retryAfterMs(twice)).toBe(10_000);
    // Without the server's status (an older server), resource_exhausted is a refusal, as before.
    expect(resumable(new ConnectError("this watcher fell behind", Code.ResourceExhausted, answered(undefined, Code.ResourceExhausted)))).toBe(false);
    expect(retryAfterMs(new ConnectError("read ECONNRESET", Code.Aborted))).toBe(0);
  });

  it("backs off up to 5 s, for SVC_RECONNECT_SECONDS (default 5 minutes)", () => {
    expect([0, 1, 2, 3, 4, 5, 10].map(backoffMs)).toEqual([250, 500, 1000, 2000, 4000, 5000, 5000]);
    expect(reconnectWindowMs({})).toBe(300_000);
    expect(reconnectWindowMs({ SVC_RECONNECT_SECONDS: "60" })).toBe(60_000);
    expect(reconnectWindowMs({ SVC_RECONNECT_SECONDS: "0" })).toBe(0);
    expect(reconnectWindowMs({ SVC_RECONNECT_SECONDS: "soon" })).toBe(300_000);
  });
});

describe("svc following a job on a terminal: restoring it", () => {
  it("restoreOnSignal: the display is stopped before the exit, and the handlers go away", () => {
    const calls: string[] = [];
    const before = process.listenerCount("SIGINT");
    const remove = restoreOnSignal(
      () => calls.push("stop"),
      (code) => calls.push(`exit ${code}`),
    );
    expect(process.listenerCount("SIGINT")).toBe(before + 1);
    process.emit("SIGTERM", "SIGTERM");
    expect(calls).toEqual(["stop", "exit 143"]);
    expect(process.listenerCount("SIGINT")).toBe(before);
    remove(); // twice is harmless
    const again = restoreOnSignal(
      () => calls.push("stop"),
      (code) => calls.push(`exit ${code}`),
    );
    process.emit("SIGINT", "SIGINT");
    expect(calls.slice(2)).toEqual(["stop", "exit 130"]);
    again();
  });
});

/** The terminal is left as it was: the last cursor-show after the last cursor-hide, line wrap likewise. */
function expectRestored(output: string) {
  expect(output).toMatch(/\x1b\[\?25l/); // the bar hid the cursor...
  expect(output.lastIndexOf("\x1b[?25h"), "cursor shown again").toBeGreaterThan(output.lastIndexOf("\x1b[?25l"));
  expect(output).toMatch(/\x1b\[\?7l/); // ...and turned line wrap off
  expect(output.lastIndexOf("\x1b[?7h"), "line wrap on again").toBeGreaterThan(output.lastIndexOf("\x1b[?7l"));
}

// Each svc run is a Node process of its own; the outages are 12 s, the Retry-After 10 s, and the
// server waits 5 s a page for a reader that fell behind. The three blocks below run at the same time,
// each on a server of its own (useFollowServer; three, not one a test: each holds connections to the
// database), their tests one after another (it.sequential).
describe.concurrent("svc following a job", { timeout: 240_000 }, () => {
  describe("across a restart of the server, on a terminal, and refused", () => {
    const f = useFollowServer();
    it.sequential("survives a restart of the server itself that takes 12 s: the lines it printed are the job's log, once each", async () => {
      const { renter, jobId, open } = await f.tickingJob();
      const watch = f.svc(["jobs", "watch", jobId], { SVC_URL: f.h.srv.url, SVC_KEY: renter.key });
      await until(() => lastLine(watch.stdout()) >= 3, 60_000, () => `lines: ${watch.stdout()}${watch.stderr()}`, [watch]);

      // The server drains (its streams end with "the server is shutting down"), stays away 12 s,
      // and a new process takes the same port and database.
      const old = f.h.srv;
      await old.app.close();
      await new Promise((r) => setTimeout(r, 12_000));
      f.h.srv = await startTestServer({ PORT: String(f.h.port), SVC_JOB_SWEEP_MS: "60000" }, old.databaseUrl);
      await old.sql.end();
      const mark = lastLine(watch.stdout());
      await until(() => lastLine(watch.stdout()) >= mark + 3, 60_000, () => `lines after the restart: ${watch.stdout()}${watch.stderr()}`, [watch]);
      open();

      const w = await watch.done;
      expect(w.code, w.stdout + w.stderr).toBe(0);
      expect(w.stdout).toMatch(/result: completed/);
      expect(w.stderr).toMatch(/reconnecting…/);
      // Exactly the lines the job's log holds, in its order: none lost, none twice.
      const stored = (await f.h.srv.sql<{ message: string }[]>`
        SELECT l.message FROM job_logs l JOIN jobs j ON j.id = l.job_id WHERE j.job_id = ${jobId} AND l.message LIKE 'line %' ORDER BY l.id`).map((r) => Number(r.message.slice(5)));
      expect(lineNumbers(w.stdout)).toEqual(stored);
      expect(new Set(stored).size).toBe(stored.length);
    });

    it.sequential("Ctrl-C stops the bar, restores the terminal and exits 130; SIGTERM likewise with 143", async () => {
      const { renter, jobId } = await f.tickingJob();

      const first = f.watchInTerminal(jobId, renter.key);
      await until(() => /\u2588|\u2591/.test(first.output()) && /line 2/.test(first.output()), 60_000, () => `the bar: ${first.output()}`);
      first.child.stdin!.write("\x03"); // the terminal's interrupt character: SIGINT to svc
      expect(await first.done, first.output()).toBe(130);
      expectRestored(first.output());

      const second = f.watchInTerminal(jobId, renter.key);
      await until(() => /\u2588|\u2591/.test(second.output()) && /line \d+/.test(second.output()), 60_000, () => `the bar: ${second.output()}`);
      const svcPid = Number(spawnSync("pgrep", ["-P", String(second.child.pid)], { encoding: "utf8" }).stdout.trim().split("\n")[0]);
      expect(svcPid).toBeGreaterThan(0);
      process.kill(svcPid, "SIGTERM");
      expect(await second.done, second.output()).toBe(143);
      expectRestored(second.output());
    });

    it.sequential("does not retry a refusal of the server: an unknown job exits 5 at once", async () => {
      const renter = await makeRenter(f.h.srv, 100);
      const proxy = await f.proxy();
      const started = Date.now();
      const r = await f.svc(["jobs", "watch", "job-0000000000000000"], { SVC_URL: proxy.url, SVC_KEY: renter.key }).done;
      expect(r.code, r.stderr).toBe(5);
      expect(r.stderr).toMatch(/HTTP 404/);
      expect(r.stderr).not.toMatch(/reconnect/);
      expect(proxy.accepted()).toBe(1);
      expect(Date.now() - started).toBeLessThan(20_000);
    });
  });

  describe("through a failing network, and from its submission", () => {
    const f = useFollowServer();
    it.sequential("resumes after a cut, a reset and a 12 s outage: no line lost or repeated, the result printed, exit 0", async () => {
      const { renter, jobId, open } = await f.tickingJob();
      const proxy = await f.proxy();
      const env = { SVC_URL: proxy.url, SVC_KEY: renter.key };
      const watch = f.svc(["jobs", "watch", jobId], env);
      const logs = f.svc(["jobs", "logs", "-f", jobId], env);
      const json = f.svc(["--json", "jobs", "watch", jobId], env);
      const all = [watch, logs, json];
      // Lines flow to every follower before, and again after, each failure.
      const flowing = async (what: string) => {
        const marks = all.map((r) => lastLine(r.stdout()));
        await until(() => all.every((r, i) => lastLine(r.stdout()) >= marks[i] + 2), 60_000, () => `lines after ${what}: ${all.map((r) => r.stdout() + r.stderr()).join("\n---\n")}`, all);
      };
      await flowing("the start");

      proxy.cut(); // the client reads "http/2 stream closed with error code CANCEL": Canceled
      await flowing("a cut");
      proxy.reset(); // ECONNRESET: Aborted
      await flowing("a reset");
      // One more follower that gives up after 2 s of outage (exit 4: unreachable).
      const impatient = f.svc(["jobs", "watch", jobId], { ...env, SVC_RECONNECT_SECONDS: "2" });
      await until(() => /job \S+ \(llm-inference\): running/.test(impatient.stdout()), 30_000, () => `the impatient follower: ${impatient.stdout()}${impatient.stderr()}`);
      await proxy.down(12_000); // longer than the five tries (about 8 s) svc used to make
      await flowing("a 12 s outage");
      open();

      const [w, l, j] = await Promise.all(all.map((r) => r.done));
      expect(w.code, w.stdout + w.stderr).toBe(0);
      expect(w.stdout).toMatch(/finished/);
      expect(w.stdout).toMatch(/result: completed/);
      expect(w.stdout).toMatch(/cost: \d+ halala/);
      expect(w.stdout).toMatch(/^all done$/m); // the text result
      expect(w.stderr).toMatch(/connection lost \(.*\); reconnecting…/);
      expect(w.stderr).toMatch(/reconnected/);
      // The snapshot of each resumed stream repeats no status line that has not changed.
      expect(w.stdout.match(/\): running/g)).toHaveLength(1);
      expect(l.code, l.stdout + l.stderr).toBe(0);
      expect(l.stdout).toMatch(/finished/);
      expect(l.stdout).not.toMatch(/result:/);
      expect(j.code, j.stdout + j.stderr).toBe(0);
      // Every line once, in order, none missing: the stream resumed at its cursor each time.
      for (const text of [w.stdout, l.stdout]) {
        const n = lineNumbers(text);
        expect(n.length).toBeGreaterThan(40);
        expect(n).toEqual(Array.from({ length: n.length }, (_, i) => i + 1));
      }
      // --json: one event per line, the API's JSON (proto names, 64-bit integers as numbers, documented nulls).
      const events = j.stdout.trim().split("\n").map((x) => JSON.parse(x));
      expect(events.filter((e) => e.snapshot).length).toBeGreaterThanOrEqual(4); // one per stream
      const jsonLines = events.filter((e) => e.log).map((e) => e.log);
      const ticks = jsonLines.map((x) => x.message).filter((m: string) => m.startsWith("line "));
      expect(ticks.length).toBeGreaterThan(40);
      expect(ticks).toEqual(Array.from({ length: ticks.length }, (_, i) => `line ${i + 1}`));
      expect(typeof jsonLines[0].seq).toBe("number");
      expect(events[0].snapshot.job).toMatchObject({ job_id: jobId, job_type: "llm-inference", status: "running" });
      expect(typeof events[0].snapshot.job.cost_halala).toBe("number");
      expect(JSON.stringify(events)).not.toMatch(/\$typeName|jobId|costHalala/);
      const outcome = events.at(-1).outcome;
      expect(outcome).toMatchObject({ status: "completed", error: null, output_format: "text" });
      expect(typeof outcome.cost_halala).toBe("number");

      const gaveUp = await impatient.done;
      expect(gaveUp.code, gaveUp.stdout + gaveUp.stderr).toBe(4);
      expect(gaveUp.stderr).toMatch(/gave up reconnecting after \d+ s/);
      expect(gaveUp.stderr).toMatch(/server unreachable/);
    });

    it.sequential("submit --follow resumes too; --json prints the submission and the events as the API's JSON", async () => {
      const p = await makeProvider(f.h.srv);
      const renter = await makeRenter(f.h.srv, 10_000);
      const tick = tickingRunner();
      f.h.startDaemon(p.key, ["--runner", tick.runner]);
      await waitFor(async () => (await f.h.srv.sql`SELECT readiness_status FROM providers WHERE id = ${p.id}`)[0].readiness_status, 45_000, "daemon up");
      const proxy = await f.proxy();
      const run = f.svc(["--json", "submit", "llm-inference", "--param", "prompt=2024", "--param", "max_tokens=64", "--follow", "--out", "answer.txt"], { SVC_URL: proxy.url, SVC_KEY: renter.key });
      await until(() => /"message":"line 3"/.test(run.stdout()), 60_000, () => `lines: ${run.stdout()}${run.stderr()}`, [run]);
      proxy.reset();
      await until(() => proxy.accepted() >= 2 && /"message":"line 8"/.test(run.stdout()), 60_000, () => `resumed: ${run.stdout()}${run.stderr()}`, [run]);
      tick.open();
      const r = await run.done;
      expect(r.code, r.stdout + r.stderr).toBe(0);
      const [first, ...events] = r.stdout.trim().split("\n").map((x) => JSON.parse(x));
      // The submission as POST /api/jobs/submit answers it.
      expect(first.submitted.job).toMatchObject({ job_type: "llm-inference", status: expect.any(String) });
      // The prompt stayed text (the type declares a string); max_tokens became a number (an integer).
      const spec = JSON.stringify((await f.h.job(first.submitted.job.job_id)).task_spec);
      expect(spec).toContain('"prompt":"2024"');
      expect(spec).toContain('"max_tokens":64');
      expect(typeof first.submitted.job.cost_halala).toBe("number");
      expect(first.submitted).not.toHaveProperty("$typeName");
      expect(events.at(-1).outcome).toMatchObject({ status: "completed", output_format: "text" });
      expect(fs.readFileSync(path.join(run.home, "answer.txt"), "utf8")).toBe("all done"); // --out: the text itself
    });
  });

  describe("the server holds back: cut for falling behind, and past too many watches", () => {
    const f = useFollowServer();
    it.sequential("resumes from its cursor when the server cuts it for falling behind the job's events: every line once, exit 0", async () => {
      const { renter, provider, job } = await f.seededJob("line 0");
      // The server (in this process) records why it ends each watcher, and its hub each watch svc asks for.
      const finish = vi.spyOn(Watcher.prototype, "finish");
      const watches = vi.spyOn(jobWatchHub(f.h.srv.app.sql, f.h.srv.app.deps.log), "watch");
      const run = f.svc(["jobs", "logs", "-f", job.jobId], { SVC_URL: f.h.srv.url, SVC_KEY: renter.key });
      const child = run.child;
      try {
        await until(() => run.stdout().includes("line 0"), 30_000, () => `the first line: ${run.stdout()}${run.stderr()}`, [run]);
        // The reader stops reading, as a full pipe or a suspended terminal job makes it.
        child.kill("SIGSTOP");
        const pad = "x".repeat(1000);
        const N = 9000;
        await f.h.srv.sql`
          INSERT INTO job_logs (job_id, attempt, level, message)
          SELECT ${job.id}, 1, 'info', 'line ' || g || ' ' || ${pad} FROM generate_series(1, ${N}) g`;
        // The server reads pages and waits up to 5 s each for its watchers to take them, then cuts this one.
        await waitFor(() => finish.mock.calls.some(([err]) => /fell behind/.test(err?.message ?? "")), 60_000, "the watcher cut for falling behind");
        const asked = watches.mock.calls.length;
        child.kill("SIGCONT");
        // It resumes (watches again from its cursor) while the job still runs; then the job ends.
        await waitFor(() => watches.mock.calls.length > asked, 60_000, "svc watching again after the cut");
        await settleJob(f.h.srv, job, renter.id, provider.id, 100, 40);
        const r = await Promise.race([run.done, new Promise<undefined>((resolve) => setTimeout(() => resolve(undefined), 60_000))]);
        expect(r, "svc was still running a minute after the job ended").toBeDefined();
        const nums = [...r!.stdout.matchAll(/line (\d+)/g)].map((m) => Number(m[1]));
        expect(r!.stderr).not.toMatch(/fell behind/);
        expect(r!.code, `${r!.stderr.slice(0, 600)} (printed ${nums.length}, the last ${nums.at(-1)})`).toBe(0);
        expect(nums).toEqual(Array.from({ length: N + 1 }, (_, i) => i));
      } finally {
        if (child.exitCode === null) child.kill("SIGCONT");
        finish.mockRestore();
        watches.mockRestore();
      }
    });

    it.sequential("waits the server's Retry-After while the account holds too many watches, asking again only then, and follows once one ends", async () => {
      const { renter, provider, job } = await f.seededJob("line 1");
      const url = `${f.h.srv.url}/api/jobs/${job.jobId}/events`;
      const held = await Promise.all(Array.from({ length: MAX_WATCHES_PER_ACCOUNT }, () => openSse(url, renter.headers)));
      const hub = jobWatchHub(f.h.srv.app.sql, f.h.srv.app.deps.log);
      let watches: MockInstance<typeof hub.watch> | undefined;
      try {
        await Promise.all(held.map((s) => s.until((es) => es.length >= 1)));
        // When this server's hub is asked for each of svc's watches: the server's clock, not when the
        // test sees svc's output (later, while the other tests of this file keep the process busy).
        const asked: number[] = [];
        const watch = hub.watch.bind(hub);
        watches = vi.spyOn(hub, "watch").mockImplementation((...args) => (asked.push(Date.now()), watch(...args)));
        const run = f.svc(["jobs", "logs", "-f", job.jobId], { SVC_URL: f.h.srv.url, SVC_KEY: renter.key });
        await until(() => /try again later \(at most 32 job watches/.test(run.stderr()), 30_000, () => `the refusal: ${run.stdout()}${run.stderr()}`, [run]);
        // A slot frees at once; svc asks again only after the Retry-After, not in a loop meanwhile.
        held.pop()!.cut();
        await until(() => run.stdout().includes("line 1"), 60_000, () => `the line after the wait: ${run.stdout()}${run.stderr()}`, [run]);
        expect(watches.mock.calls.length).toBe(2);
        expect(asked[1] - asked[0]).toBeGreaterThanOrEqual(TOO_MANY_WATCHES_RETRY_AFTER_SECONDS * 1000 - 1_000);
        await settleJob(f.h.srv, job, renter.id, provider.id, 100, 40);
        const r = await run.done;
        expect(r.code, r.stderr).toBe(0);
        expect(r.stdout.match(/line 1/g)).toHaveLength(1);
      } finally {
        for (const s of held) s.cut();
        watches?.mockRestore();
      }
    });
  });
});
