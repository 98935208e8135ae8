// svc's exit codes as a real subprocess against a real server: a failure
// inside the server is its answer (5, with its request id), not "server
// unreachable" (4), with or without the server's status header, while a connection closed or reset
// before the answer is (4); a 400 and an integer option out of its protobuf type's
// range are usage errors (2); so is a broken profiles file, a profile name
// that is not saved, and a file svc cannot write (--out); an empty SVC_KEY is
// unset, not a key that hides the saved profile's; Ctrl-C at
// `svc login`'s hidden prompt exits 130 as Ctrl-C does elsewhere.
import { spawn } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import path from "node:path";
import { Code, ConnectError } from "@connectrpc/connect";
import { afterEach, describe, expect, it, vi } from "vitest";
import { reportError } from "../../src/cli/output.js";
import { makeRenter } from "../helpers/fixtures.js";
import { client } from "../helpers/http.js";
import { ADMIN_TOKEN, useTestServer } from "../helpers/server.js";
import { hasCommand, tempDir } from "../daemon/helpers.js";
import { completedJob } from "./completed-job.js";
import { runSvc, SVC, type Run, type RunOptions } from "./run-svc.js";

const srv = useTestServer();

const svc = (args: string[], opts: RunOptions & { home: string }): Promise<Run> => runSvc(args, opts);

/**
 * A proxy in front of the server that passes its connections through until a request's HEADERS
 * frame (HTTP/2 frame type 1, after the client's 24-byte preface) comes from the client: then it
 * closes the connection (`how`: "close", a FIN) or resets it ("reset", an RST) without passing the
 * request on, so no answer comes back.
 */
async function dropAtRequest(how: "close" | "reset"): Promise<{ url: string; close(): Promise<void> }> {
  const sockets = new Set<net.Socket>();
  const server = net.createServer((c) => {
    const up = net.connect(srv.port, "127.0.0.1");
    sockets.add(c).add(up);
    const drop = () => {
      c.destroy();
      up.destroy();
    };
    c.on("error", drop).on("close", drop);
    up.on("error", drop).on("close", drop);
    up.pipe(c);
    let buf = Buffer.alloc(0);
    let preface = false;
    c.on("data", (chunk: Buffer) => {
      buf = Buffer.concat([buf, chunk]);
      if (!preface && buf.length >= 24) {
        up.write(buf.subarray(0, 24));
        buf = buf.subarray(24);
        preface = true;
      }
      while (preface && buf.length >= 9 && buf.length >= 9 + buf.readUIntBE(0, 3)) {
        const frame = buf.subarray(0, 9 + buf.readUIntBE(0, 3));
        buf = buf.subarray(frame.length);
        if (frame[3] === 1) {
          c.removeAllListeners("data");
          up.destroy();
          if (how === "reset") c.resetAndDestroy();
          else c.end();
          return;
        }
        up.write(frame);
      }
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", () => resolve()));
  return {
    url: `http://127.0.0.1:${(server.address() as net.AddressInfo).port}`,
    async close() {
      for (const s of sockets) s.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

/**
 * Runs `svc login` on a pseudo-terminal (python3's pty), waits for its prompt, types `keys`, and
 * returns how svc ended: its exit code, or "hung" when it has not ended 20 s later.
 */
function loginOnTerminal(home: string, keys: string): Promise<string> {
  const script = path.join(home, "login_on_pty.py");
  fs.writeFileSync(
    script,
    `import os, pty, select, sys, time
pid, fd = pty.fork()
if pid == 0:
    os.environ["SVC_CONFIG_DIR"] = ${JSON.stringify(path.join(home, "config"))}
    for k in ("SVC_URL", "SVC_KEY", "SVC_ADMIN_TOKEN", "SVC_PROFILE", "SVC_ROLE"): os.environ.pop(k, None)
    os.execv(${JSON.stringify(process.execPath)}, [${JSON.stringify(process.execPath)}, ${JSON.stringify(SVC)}, "login", "--url", ${JSON.stringify(srv.url)}])
out = b""
def read(seconds):
    global out
    end = time.time() + seconds
    while time.time() < end:
        r, _, _ = select.select([fd], [], [], 0.1)
        if r:
            try: out += os.read(fd, 1000)
            except OSError: return
while b"API key" not in out: read(0.2)
os.write(fd, ${JSON.stringify(keys)}.encode())
started = time.time()
while True:
    read(0.2)
    done, status = os.waitpid(pid, os.WNOHANG)
    if done: break
    if time.time() - started > 20:
        os.kill(pid, 9); os.waitpid(pid, 0); print("hung"); sys.exit(0)
print(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))
`,
  );
  const child = spawn("python3", [script], { stdio: ["ignore", "pipe", "inherit"] });
  let stdout = "";
  child.stdout.on("data", (d) => (stdout += d));
  return new Promise((resolve) => child.on("close", () => resolve(stdout.trim())));
}

describe("reportError", () => {
  afterEach(() => vi.restoreAllMocks());
  const report = (err: ConnectError) => {
    let written = "";
    vi.spyOn(process.stderr, "write").mockImplementation((s) => ((written += String(s)), true));
    return { code: reportError(err), written };
  };

  it("tells a server's answer without a status header (a server of before the header) from no answer", () => {
    // What the gRPC client makes of an answer: its trailers (grpc-status, the server's own) as metadata.
    const answered = new ConnectError("internal error", Code.Internal, { "grpc-status": "13", "x-request-id": "req-1" });
    expect(report(answered)).toEqual({ code: 5, written: "svc: internal error (gRPC internal, request id req-1)\n" });
    // No answer at all: no metadata.
    const lost = new ConnectError("connect ECONNREFUSED 127.0.0.1:9", Code.Unavailable);
    expect(report(lost)).toEqual({ code: 4, written: "svc: server unreachable: connect ECONNREFUSED 127.0.0.1:9 (gRPC unavailable)\n" });
    // A documented 4xx: its status, no request id.
    const refused = new ConnectError("job not found", Code.NotFound, { "grpc-status": "5", "x-svc-http-status": "404", "x-request-id": "req-2" });
    expect(report(refused)).toEqual({ code: 5, written: "svc: job not found (HTTP 404, gRPC not_found)\n" });
  });

  it("prints a request id once when it came in both the headers and the trailers (a stream that failed midway)", () => {
    // The client joins a value sent in both: "req-3, req-3".
    const midway = new ConnectError("internal error", Code.Internal, { "grpc-status": "13", "x-svc-http-status": "500", "x-request-id": "req-3" });
    midway.metadata.append("x-request-id", "req-3");
    midway.metadata.append("x-svc-http-status", "500");
    expect(report(midway)).toEqual({ code: 5, written: "svc: internal error (HTTP 500, gRPC internal, request id req-3)\n" });
  });
});

// Each svc run starts a Node process: seconds each on a loaded machine.
describe("svc exit codes", { timeout: 180_000 }, () => {
  it("a server's internal error exits 5 with the server's message and its request id, not 4 'server unreachable'", async () => {
    const home = tempDir("svc-exit");
    const renter = await makeRenter(srv);
    // GetRenterUsage then fails inside the server (an unexpected error, not a lost database).
    await srv.sql`ALTER TABLE v1_usage RENAME TO v1_usage_away`;
    let r: Run;
    try {
      r = await svc(["usage"], { home, env: { SVC_URL: srv.url, SVC_KEY: renter.key } });
    } finally {
      await srv.sql`ALTER TABLE v1_usage_away RENAME TO v1_usage`;
    }
    expect(r.stderr).toMatch(/^svc: internal error \(HTTP 500, gRPC internal, request id [\w.:-]+\)$/m);
    expect(r.stderr).not.toMatch(/unreachable/);
    expect(r.code).toBe(5);
    // No answer at all is still "unreachable" (4).
    const down = await svc(["usage"], { home, env: { SVC_URL: "http://127.0.0.1:9", SVC_KEY: renter.key } });
    expect(down.stderr).toMatch(/server unreachable/);
    expect(down.code).toBe(4);
  });

  it("a connection lost before the server answered (closed or reset) is 'server unreachable' (4), not the server's refusal (5)", async () => {
    const home = tempDir("svc-exit");
    const renter = await makeRenter(srv);
    for (const how of ["close", "reset"] as const) {
      const proxy = await dropAtRequest(how);
      try {
        const r = await svc(["balance"], { home, env: { SVC_URL: proxy.url, SVC_KEY: renter.key } });
        expect(r.stderr, how).toMatch(/^svc: server unreachable: /m);
        expect(r.code, `${how}: ${r.stderr}`).toBe(4);
      } finally {
        await proxy.close();
      }
    }
  });

  it("an integer option outside its protobuf type's range is a usage error naming the option (2), not 'server unreachable' (4)", async () => {
    const home = tempDir("svc-exit");
    const renter = await makeRenter(srv, 10_000);
    const env = { SVC_URL: srv.url, SVC_KEY: renter.key };
    const cases: [string[], RegExp, Record<string, string>?][] = [
      [["jobs", "ls", "--limit", "3000000000"], /--limit must be an integer from -2147483648 to 2147483647/],
      [["jobs", "ls", "--offset", "-2147483649"], /--offset must be an integer from -2147483648 to 2147483647/],
      [["submit", "benchmark", "--duration", "1", "--priority", "4294967297"], /--priority must be an integer from/],
      [["submit", "benchmark", "--duration", "1", "--provider", "99999999999999999999"], /--provider must be an integer from -9007199254740991 to 9007199254740991/],
      [["submit", "benchmark", "--duration", "1", "--max-duration", "1e30"], /--max-duration must be an integer$/m],
      [["admin", "approve", "99999999999999999999"], /provider_id must be an integer from/, { SVC_URL: srv.url, SVC_ADMIN_TOKEN: ADMIN_TOKEN }],
    ];
    for (const [args, message, caseEnv] of cases) {
      const r = await svc(args, { home, env: caseEnv ?? env });
      expect(r.stderr, args.join(" ")).toMatch(message);
      expect(r.stderr, args.join(" ")).not.toMatch(/unreachable/);
      expect(r.code, args.join(" ")).toBe(2);
    }
    // Nothing was submitted.
    expect((await srv.sql`SELECT count(*)::int AS n FROM jobs WHERE renter_id = ${renter.id}`)[0].n).toBe(0);
  });

  it("a 400 (a value the server refuses) is a usage error: 2, with the server's message", async () => {
    const home = tempDir("svc-exit");
    const renter = await makeRenter(srv);
    const r = await svc(["jobs", "ls", "--limit", "0"], { home, env: { SVC_URL: srv.url, SVC_KEY: renter.key } });
    expect(r.stderr).toMatch(/limit must be an integer between 1 and 200 \(HTTP 400, gRPC invalid_argument\)/);
    expect(r.code).toBe(2);
  });

  it("a URL that serves no API (the /api prefix, the console) is a usage error asking for the base URL (2), not a bare 'HTTP 404' (5)", async () => {
    const home = tempDir("svc-exit");
    const renter = await makeRenter(srv);
    for (const url of [`${srv.url}/api`, `${srv.url}/console`]) {
      const r = await svc(["balance"], { home, env: { SVC_URL: url, SVC_KEY: renter.key } });
      expect(r.stderr, url).toBe(
        "svc: the service's API is not served at this URL (HTTP 404, gRPC unimplemented): give the service's base URL (--url, SVC_URL or the profile's), e.g. http://localhost:8080, without /api\n",
      );
      expect(r.code, url).toBe(2);
    }
    // login says the same, and saves nothing.
    const login = await svc(["login", "--url", `${srv.url}/api`], { home, input: renter.key + "\n" });
    expect(login.stderr).toMatch(/^svc: the service's API is not served at this URL .*without \/api$/m);
    expect(login.code).toBe(2);
    expect(fs.existsSync(path.join(home, "config", "profiles.json"))).toBe(false);
    // At the base URL, the same call is answered.
    const ok = await svc(["balance"], { home, env: { SVC_URL: srv.url, SVC_KEY: renter.key } });
    expect(ok.code, ok.stderr).toBe(0);
  });

  it("a malformed profiles file is a usage error that names the file (2), not a refusal (5)", async () => {
    const home = tempDir("svc-exit");
    const file = path.join(home, "config", "profiles.json");
    fs.mkdirSync(path.dirname(file), { recursive: true });
    for (const text of ['{"profiles": {"default": ', "[]", '{"profiles": null}']) {
      fs.writeFileSync(file, text);
      const r = await svc(["whoami"], { home });
      expect(r.stderr, text).toContain(`svc: ${file} is not a valid profiles file`);
      expect(r.stderr, text).toMatch(/remove it and run `svc login` again/);
      expect(r.stderr, text).not.toMatch(/\n\s+at /);
      expect(r.code, text).toBe(2);
    }
  });

  it("a file svc cannot write (--out into a missing folder) is a usage error naming it (2), not the server's refusal (5)", async () => {
    const { env, jobId } = await completedJob(srv);
    const home = tempDir("svc-exit");
    const missing = path.join(home, "no-such-folder", "out.txt");
    for (const args of [["jobs", "output", jobId, "--out", missing], ["receipt", "get", jobId, "-o", missing]]) {
      const r = await svc(args, { home, env });
      expect(r.stderr, args.join(" ")).toBe(`svc: cannot write ${missing}: no such file or directory (ENOENT)\n`);
      expect(r.code, args.join(" ")).toBe(2);
    }
    // Watching the completed job: its result is said first, then what svc could not do with it.
    const watched = await svc(["jobs", "watch", jobId, "--out", missing], { home, env });
    expect(watched.stdout).toMatch(/^result: completed/m);
    expect(watched.stdout).toMatch(/^cost: /m);
    expect(watched.stderr).toContain(`svc: cannot write ${missing}: no such file or directory (ENOENT)`);
    expect(watched.code).toBe(2);
  });

  it("a profile name that is not saved is a usage error (2) whether --profile or SVC_PROFILE names it, not 'not logged in' (3)", async () => {
    const home = tempDir("svc-exit");
    const renter = await makeRenter(srv);
    const login = await svc(["login", "--url", srv.url], { home, input: renter.key + "\n" });
    expect(login.code, login.stderr).toBe(0);
    const flag = await svc(["--profile", "lab", "balance"], { home });
    const variable = await svc(["balance"], { home, env: { SVC_PROFILE: "lab" } });
    for (const r of [flag, variable]) {
      expect(r.stderr).toMatch(/^svc: no profile named "lab"/);
      expect(r.code).toBe(2);
    }
    // A saved one works either way.
    expect((await svc(["balance"], { home, env: { SVC_PROFILE: "default" } })).code).toBe(0);
  });

  it("an empty SVC_KEY or SVC_ADMIN_TOKEN is unset: the saved profile's key is used, not 'not logged in' (3)", async () => {
    const home = tempDir("svc-exit");
    const renter = await makeRenter(srv);
    const login = await svc(["login", "--url", srv.url], { home, input: renter.key + "\n" });
    expect(login.code, login.stderr).toBe(0);
    const envs: Record<string, string>[] = [{ SVC_KEY: "" }, { SVC_ADMIN_TOKEN: "" }, { SVC_KEY: "", SVC_ADMIN_TOKEN: "" }, { SVC_URL: srv.url, SVC_KEY: "" }];
    for (const env of envs) {
      const r = await svc(["balance"], { home, env });
      expect(r.stderr, JSON.stringify(env)).toBe("");
      expect(r.code, JSON.stringify(env)).toBe(0);
    }
  });

  it.skipIf(!hasCommand("python3"))("Ctrl-C at login's hidden prompt exits 130; Ctrl-D there is no key given (2)", async () => {
    // The terminal is raw while the key is read: Ctrl-C reaches svc as a byte, not a signal.
    expect(await loginOnTerminal(tempDir("svc-exit"), "svc-renter-abc\x03")).toBe("130");
    expect(await loginOnTerminal(tempDir("svc-exit"), "\x04")).toBe("2");
  });
});
