// setup.sh against a real local HTTP server (real curl, and python3 where curl is missing): the systemd unit
// it writes for install paths with characters systemd treats specially (spaces, `%`, `$`), and where the
// provider key goes when the daemon download answers with a redirect.
import http from "node:http";
import type { AddressInfo } from "node:net";
import fs from "node:fs";
import path from "node:path";
import { spawnSync } from "node:child_process";
import { afterEach, describe, expect, it } from "vitest";
import { hasCommand, realPython, run, tempDir } from "./helpers.js";

const SETUP_SH = path.resolve("src/daemon/installers/setup.sh");
const KEY = "svc-provider-INSTALLERKEY";
const DAEMON = `API_KEY = "${KEY}"\n`;

interface Seen {
  host: string;
  url: string;
  key: string | undefined;
}

const servers: http.Server[] = [];
afterEach(async () => {
  for (const s of servers.splice(0)) await new Promise((resolve) => s.close(resolve));
});

/** An HTTP server on host recording each request; handle answers it (the daemon file by default). */
async function serve(host: string, seen: Seen[], handle?: (req: http.IncomingMessage, res: http.ServerResponse) => boolean): Promise<string> {
  const server = http.createServer((req, res) => {
    seen.push({ host, url: req.url ?? "", key: req.headers["x-provider-key"] as string | undefined });
    req.resume();
    if (handle?.(req, res)) return;
    res.writeHead(200, { "content-type": "text/plain" }).end(req.method === "POST" ? "{}" : DAEMON);
  });
  servers.push(server);
  await new Promise<void>((resolve) => server.listen(0, host, resolve));
  return `http://${host}:${(server.address() as AddressInfo).port}`;
}

/** A folder of links to every command on PATH but curl and wget (the python3 download). */
function pathWithoutCurl(): string {
  const bin = tempDir("inst-nocurl");
  for (const dir of (process.env.PATH ?? "").split(":")) {
    for (const name of fs.existsSync(dir) ? fs.readdirSync(dir) : []) {
      if (name === "curl" || name === "wget" || fs.existsSync(path.join(bin, name))) continue;
      fs.symlinkSync(path.join(dir, name), path.join(bin, name));
    }
  }
  return bin;
}

/** Runs setup.sh rendered for backend (--no-start, Linux). */
async function install(backend: string, opts: { prefix: string; home: string; path: string }) {
  const script = path.join(tempDir("inst-script"), "setup.sh");
  fs.writeFileSync(script, fs.readFileSync(SETUP_SH, "utf8").replaceAll("{{API_KEY}}", KEY).replaceAll("{{BACKEND_URL}}", backend));
  return run("sh", [script, "--no-start"], { env: { ...process.env, PATH: opts.path, SVC_PREFIX: opts.prefix, SVC_OS: "Linux", HOME: opts.home } });
}

/** Splits a unit file value into words as systemd does (quotes, C escapes), resolving `%%`; other specifiers throw. */
function unitWords(value: string): string[] {
  const words: string[] = [];
  let i = 0;
  const escapes: Record<string, string> = { n: "\n", t: "\t", "\\": "\\", '"': '"', "'": "'", s: " " };
  while (i < value.length) {
    while (i < value.length && /\s/.test(value[i])) i++;
    if (i >= value.length) break;
    let word = "";
    let quote = "";
    for (; i < value.length; i++) {
      const c = value[i];
      if (c === "\\") {
        const next = value[++i];
        if (!(next in escapes)) throw new Error(`unsupported escape \\${next} in ${value}`);
        word += escapes[next];
      } else if (quote) {
        if (c === quote) quote = "";
        else word += c;
      } else if (c === '"' || c === "'") quote = c;
      else if (/\s/.test(c)) break;
      else word += c;
    }
    if (quote) throw new Error(`unterminated quote in ${value}`);
    words.push(specifiers(word));
  }
  return words;
}

function specifiers(word: string): string {
  return word.replace(/%(.?)/g, (_, c: string) => {
    if (c === "%") return "%";
    throw new Error(`specifier %${c} in ${word}`);
  });
}

/** ExecStart's program and arguments as the service manager runs them: in the arguments `$$` is a dollar, `$NAME` /
 * `${NAME}` a variable. */
function execArgv(value: string): string[] {
  const [program, ...args] = unitWords(value);
  return [program, ...args.map((w) =>
    w.replace(/\$(\$|\{?[A-Za-z_])?/g, (m, c: string | undefined) => {
      if (c === "$") return "$";
      throw new Error(`environment variable reference ${m} in ${w}`);
    }),
  )];
}

describe("setup.sh", { timeout: 60_000 }, () => {
  it("writes a systemd unit that runs python3 with the daemon and sets the work folder, for paths with spaces, % and $", async () => {
    const seen: Seen[] = [];
    const backend = await serve("127.0.0.1", seen);
    const weird = path.join(tempDir("inst-unit"), "my dir %h $HOME 100%");
    const prefix = path.join(weird, "prefix");
    const home = path.join(weird, "home");
    // python3 itself found in a folder of that kind, on PATH.
    const pyDir = path.join(weird, "py bin");
    fs.mkdirSync(pyDir, { recursive: true });
    fs.symlinkSync(realPython(), path.join(pyDir, "python3"));
    const res = await install(backend, { prefix, home, path: `${pyDir}:${process.env.PATH}` });
    expect(res.status, res.stderr).toBe(0);
    const isRoot = process.getuid?.() === 0;
    const installDir = isRoot ? path.join(prefix, "opt/svc-daemon") : prefix + path.join(home, ".svc-daemon");
    const unitFile = isRoot ? path.join(prefix, "etc/systemd/system/svc-daemon.service") : prefix + path.join(home, ".config/systemd/user/svc-daemon.service");
    expect(fs.readFileSync(path.join(installDir, "svc_daemon.py"), "utf8")).toBe(DAEMON);

    const unit = fs.readFileSync(unitFile, "utf8");
    const values = (key: string) => unit.split("\n").filter((l) => l.startsWith(`${key}=`)).map((l) => l.slice(key.length + 1));
    expect(values("ExecStart").map(execArgv)).toEqual([[path.join(pyDir, "python3"), path.join(installDir, "svc_daemon.py")]]);
    expect(values("Environment").flatMap(unitWords)).toEqual(["PYTHONUNBUFFERED=1", `SVC_WORK_DIR=${path.join(installDir, "work")}`]);
    // WorkingDirectory= takes the rest of the line as the path, no quotes.
    expect(values("WorkingDirectory").map((v) => specifiers(v.trim()))).toEqual([installDir]);

    // systemd's own reading of the file, where it is installed: the command it would run is executable, and
    // each Environment= assignment is valid.
    if (hasCommand("systemd-analyze")) {
      const verify = spawnSync("systemd-analyze", ["verify", "--man=no", unitFile], { encoding: "utf8" });
      expect(verify.stderr).toBe("");
      expect(verify.status).toBe(0);
    }
  });

  for (const downloader of ["curl", "python3"] as const) {
    it(`sends the key on a redirect within the server's origin, and never to another one (${downloader})`, async () => {
      const seen: Seen[] = [];
      const other = await serve("127.0.0.2", seen);
      let target = `${other}/daemon.py`;
      const backend = await serve("127.0.0.1", seen, (req, res) => {
        if (req.url === "/api/providers/download/daemon") {
          res.writeHead(302, { location: target }).end();
          return true;
        }
        return false;
      });
      const root = tempDir("inst-redirect");
      const PATH = downloader === "curl" ? process.env.PATH! : pathWithoutCurl();
      const refused = await install(backend, { prefix: root, home: path.join(root, "home"), path: PATH });
      expect(seen.filter((s) => s.key !== undefined && s.host !== "127.0.0.1"), "requests to the other host with the key").toEqual([]);
      expect(refused.status).toBe(1);
      expect(refused.stderr).toContain(`svc setup: could not download the daemon from ${backend}: HTTP 302: redirected to ${other}/daemon.py`);
      expect(refused.stdout).not.toMatch(/done/);

      // The same server's own path (relative): followed, with the key.
      seen.length = 0;
      target = "/files/daemon.py";
      const followed = await install(backend, { prefix: root, home: path.join(root, "home"), path: PATH });
      expect(followed.status, followed.stderr).toBe(0);
      expect(seen.filter((s) => s.url.startsWith("/api/providers/download/daemon") || s.url === target)).toEqual([
        { host: "127.0.0.1", url: "/api/providers/download/daemon", key: KEY },
        { host: "127.0.0.1", url: target, key: KEY },
      ]);
    });
  }
});
