// The in-container programs of the built-in job types fetch renter-chosen URLs (training's
// dataset_url, rendering's scene_url) from inside the provider's network, through one helper
// (container-scripts/svc_fetch.py). The server refuses a URL whose host is private as written; the
// helper checks where each hop really goes: a public URL that redirects to the cloud metadata
// address or a LAN address is not followed, a name is resolved once and the connection goes to the
// address that was checked, and a body over the cap is refused. The "internet" here is a local
// HTTP proxy (http_proxy), which plays every public host and records each URL asked of it.
import { spawn } from "node:child_process";
import fs from "node:fs";
import http from "node:http";
import type { AddressInfo } from "node:net";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CONTAINER_SCRIPTS } from "../../src/daemon/ts/executors/plan.js";
import { renderLegacyDaemon } from "../../src/daemon/render.js";
import { tempDir } from "./helpers.js";

const METADATA = "http://169.254.169.254/latest/meta-data/iam/security-credentials/provider-role";
const SECRET = "AKIA-PROVIDER-SECRET-CREDENTIAL";
/** Where each public host of the proxy's internet redirects, or what it answers. */
const REDIRECTS: Record<string, string> = {
  "to-metadata.example.com": METADATA,
  "to-decimal.example.com": "http://2852039166/latest/meta-data/",
  "to-mapped.example.com": "http://[::ffff:a9fe:a9fe]/latest/meta-data/",
  "to-lan.example.com": "http://192.168.1.1/admin",
  "to-internal-name.example.com": "http://metadata.google.internal/computeMetadata/v1/",
  "to-file.example.com": "file:///etc/passwd",
  "to-public.example.com": "http://data.example.org/lines.txt",
  "loop.example.com": "http://loop.example.com/again",
};
const requested: string[] = [];
let proxy: http.Server;
let proxyUrl = "";
let local: http.Server;
let localHits = 0;
let localPort = 0;

beforeAll(async () => {
  proxy = http.createServer((req, res) => {
    requested.push(req.url ?? "");
    const url = new URL(req.url ?? "/", "http://unknown");
    const to = REDIRECTS[url.hostname];
    if (to) return res.writeHead(302, { location: to }).end();
    if (url.hostname === "data.example.org") return res.writeHead(200, { "content-type": "text/plain" }).end("first line\n\n second line \n");
    if (url.hostname === "big.example.com") return res.writeHead(200, { "content-length": "5000" }).end("x".repeat(5000));
    if (url.hostname === "chunked.example.com") {
      // No Content-Length: cut by counting what arrives.
      res.writeHead(200, { "content-type": "application/octet-stream" });
      for (let i = 0; i < 5; i++) res.write("y".repeat(1000));
      return res.end();
    }
    // Anything else (the metadata service, a LAN host) answers what an attacker wants.
    res.writeHead(200, { "content-type": "text/plain" }).end(`${SECRET}\n`);
  });
  await new Promise<void>((r) => proxy.listen(0, "127.0.0.1", () => r()));
  proxyUrl = `http://127.0.0.1:${(proxy.address() as AddressInfo).port}`;
  local = http.createServer((_req, res) => {
    localHits++;
    res.end(`${SECRET}\n`);
  });
  await new Promise<void>((r) => local.listen(0, "127.0.0.1", () => r()));
  localPort = (local.address() as AddressInfo).port;
});
afterAll(() => {
  proxy.close();
  local.close();
});

const NO_PROXY_ENV = ["http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY", "no_proxy", "NO_PROXY"];

/** Runs python3 (async: the servers answer meanwhile); `viaProxy`: the proxy above is the internet, else no proxy at all. */
async function run(args: string[], opts: { viaProxy: boolean; env?: Record<string, string> }) {
  const env: Record<string, string | undefined> = { ...process.env, PYTHONDONTWRITEBYTECODE: "1", ...opts.env };
  for (const k of NO_PROXY_ENV) delete env[k];
  if (opts.viaProxy) Object.assign(env, { http_proxy: proxyUrl, HTTP_PROXY: proxyUrl, no_proxy: "", NO_PROXY: "" });
  return new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve) => {
    const child = spawn("python3", args, { env });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (d) => (stdout += d));
    child.stderr.on("data", (d) => (stderr += d));
    child.on("close", (code) => resolve({ code, stdout, stderr }));
  });
}

/** Runs `code` with `m` the globals of an in-container program (runpy, as the other program tests do). */
const script = (name: string, code: string, viaProxy = true) =>
  run(["-c", `import json, runpy, sys\nm = runpy.run_path(sys.argv[1], run_name="check")\n${code}`, path.join(CONTAINER_SCRIPTS, name)], { viaProxy });

/** Runs `code` with `f` the fetch helper itself. */
const helper = (code: string, viaProxy = true) =>
  run(["-c", `import json, sys\nsys.path.insert(0, sys.argv[1])\nimport svc_fetch as f\n${code}`, CONTAINER_SCRIPTS], { viaProxy });

/** fetch_bytes(url) in the helper: {"body"} or {"error"}. */
async function fetchVia(url: string, maxBytes = 1_000_000, viaProxy = true): Promise<{ body?: string; error?: string }> {
  const r = await helper(
    `try:\n    print(json.dumps({"body": f.fetch_bytes(${JSON.stringify(url)}, ${maxBytes}).decode()}))\nexcept f.FetchError as e:\n    print(json.dumps({"error": str(e)}))`,
    viaProxy,
  );
  if (r.code !== 0) throw new Error(r.stderr);
  return JSON.parse(r.stdout.trim().split("\n").pop()!);
}

describe("in-container downloads of renter URLs stay off the provider's own network", () => {
  it("training's dataset_url: a redirect to the metadata address is not followed", async () => {
    requested.length = 0;
    const r = await script("train.py", `print(json.dumps(m["load_lines"]("http://to-metadata.example.com/data.txt")))`);
    // The URL as the server took it (a public host) goes out as it should.
    expect(requested[0]).toBe("http://to-metadata.example.com/data.txt");
    expect(requested, `stdout: ${r.stdout}\nstderr: ${r.stderr}`).not.toContain(METADATA);
    expect(r.stdout).not.toContain(SECRET);
    expect(r.code).not.toBe(0);
    expect(r.stderr).toMatch(/dataset_url: 169\.254\.169\.254 is not fetched: its address 169\.254\.169\.254 is link-local/);
  });

  it("rendering's scene_url: a redirect to the metadata address is not followed, and no scene file is left", async () => {
    requested.length = 0;
    const out = tempDir("render-fetch");
    const r = await script("render.py", `print(json.dumps(m["blender_argv"]({"scene_url": "http://to-metadata.example.com/scene.blend"}, ${JSON.stringify(out)})))`);
    expect(requested[0]).toBe("http://to-metadata.example.com/scene.blend");
    expect(requested, `stdout: ${r.stdout}\nstderr: ${r.stderr}`).not.toContain(METADATA);
    expect(r.stderr).toMatch(/scene_url: 169\.254\.169\.254 is not fetched/);
    expect(fs.existsSync(path.join(out, "scene.blend"))).toBe(false);
  });

  it("fails the training program itself, before any model is loaded, with the reason in its output", async () => {
    requested.length = 0;
    const dir = tempDir("train-fetch");
    const task = path.join(dir, "task.json");
    fs.writeFileSync(task, JSON.stringify({ task_spec: { model: "m", inputs: { dataset_url: "http://to-lan.example.com/data.txt" } } }));
    const r = await run([path.join(CONTAINER_SCRIPTS, "train.py")], { viaProxy: true, env: { SVC_TASK_FILE: task, SVC_RESULT_FILE: path.join(dir, "result.json") } });
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/^dataset_url: 192\.168\.1\.1 is not fetched: its address 192\.168\.1\.1 is private$/m);
    expect(requested).not.toContain("http://192.168.1.1/admin");
  });

  it("checks every redirect's host: other spellings of an internal address, an internal name, another scheme", async () => {
    const cases: [string, RegExp][] = [
      ["to-decimal.example.com", /2852039166 is not fetched: its address 169\.254\.169\.254 is link-local/],
      ["to-mapped.example.com", /::ffff:a9fe:a9fe is not fetched: its address ::ffff:a9fe:a9fe is IPv4-mapped link-local/],
      ["to-internal-name.example.com", /metadata\.google\.internal is not fetched: it is an internal name/],
      ["to-file.example.com", /'file:\/\/\/etc\/passwd' is not an http\(s\) URL/],
      ["loop.example.com", /more than 5 redirects/],
    ];
    for (const [host, why] of cases) {
      requested.length = 0;
      const r = await fetchVia(`http://${host}/x`);
      expect(r.error, host).toMatch(why);
      expect(requested.every((u) => new URL(u).hostname.endsWith(".example.com")), `${host}: ${requested.join(", ")}`).toBe(true);
    }
  });

  it("follows a redirect to another public host and reads its lines", async () => {
    requested.length = 0;
    const r = await script("train.py", `print(json.dumps(m["load_lines"]("http://to-public.example.com/x")))`);
    expect(r.stderr).toBe("");
    expect(JSON.parse(r.stdout)).toEqual(["first line", "second line"]);
    expect(requested).toEqual(["http://to-public.example.com/x", "http://data.example.org/lines.txt"]);
  });

  it("sends the URL rebuilt from what was checked: no user info for a proxy to read differently", async () => {
    requested.length = 0;
    await fetchVia("http://user:pw@data.example.org/lines.txt#frag");
    expect(requested).toEqual(["http://data.example.org/lines.txt"]);
  });

  it("refuses a body over the cap, announced or not, and removes a partial file", async () => {
    expect((await fetchVia("http://big.example.com/f", 1000)).error).toMatch(/is 5000 bytes, over the 1000-byte limit/);
    expect((await fetchVia("http://chunked.example.com/f", 1000)).error).toMatch(/is over the 1000-byte limit/);
    expect((await fetchVia("http://chunked.example.com/f", 5000)).body).toBe("y".repeat(5000));
    const file = path.join(tempDir("fetch-cap"), "scene.blend");
    const r = await helper(`try:\n    f.fetch_to_file("http://chunked.example.com/f", ${JSON.stringify(file)}, 1000)\nexcept f.FetchError as e:\n    print(e)`);
    expect(r.stdout).toMatch(/over the 1000-byte limit/);
    expect(fs.existsSync(file)).toBe(false);
    // The caps the programs use (docs/jobs.md).
    const caps = await helper(
      `import runpy\nprint(json.dumps([runpy.run_path(sys.argv[1] + "/train.py")["MAX_DATASET_BYTES"], runpy.run_path(sys.argv[1] + "/render.py")["MAX_SCENE_BYTES"]]))`,
    );
    expect(JSON.parse(caps.stdout)).toEqual([256 * 1024 * 1024, 4 * 1024 * 1024 * 1024]);
  });

  it("without a proxy, refuses a host that resolves to a loopback or private address before connecting", async () => {
    localHits = 0;
    expect((await fetchVia(`http://localhost:${localPort}/`, 1000, false)).error).toMatch(/localhost is not fetched: it is an internal name/);
    expect((await fetchVia(`http://127.0.0.1:${localPort}/`, 1000, false)).error).toMatch(/its address 127\.0\.0\.1 is loopback/);
    // A public-looking name whose DNS answer is private (a resolver the test controls).
    const r = await helper(
      `import socket\nsocket.getaddrinfo = lambda host, port, *a, **k: [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.216.34", port)), (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]\n` +
        `try:\n    f.fetch_bytes("http://rebound.example.com:${localPort}/", 1000)\nexcept f.FetchError as e:\n    print(e)`,
      false,
    );
    expect(r.stdout).toMatch(/rebound\.example\.com resolves to 127\.0\.0\.1, which is loopback: not fetched/);
    expect(localHits).toBe(0);
  });

  it("without a proxy, connects to the address it checked, never to a second answer of the name's DNS", async () => {
    const r = await helper(
      `import socket
lookups, dialled = [], []
def lookup(host, port, *a, **k):
    lookups.append(host)
    ip = "93.184.216.34" if len(lookups) == 1 else "127.0.0.1"
    return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, port))]
class Dial(socket.socket):
    def connect(self, address):
        dialled.append(address[0])
        raise ConnectionRefusedError("refused by the test")
socket.getaddrinfo = lookup
socket.socket = Dial
try:
    f.fetch_bytes("http://rebinding.example.com/data.txt", 1000)
except f.FetchError as e:
    err = str(e)
print(json.dumps({"lookups": lookups, "dialled": dialled, "error": err}))`,
      false,
    );
    const out = JSON.parse(r.stdout) as { lookups: string[]; dialled: string[]; error: string };
    expect(out.lookups).toEqual(["rebinding.example.com"]);
    expect(out.dialled).toEqual(["93.184.216.34"]);
    expect(out.error).toMatch(/refused by the test/);
  });

  it("classifies addresses as the server does: IPv6 forms that lead to an internal IPv4 address are internal too", async () => {
    const addresses = {
      "169.254.169.254": false, "10.0.0.1": false, "172.16.5.4": false, "192.168.0.1": false, "100.64.0.1": false, "127.0.0.1": false,
      "0.0.0.0": false, "224.0.0.1": false, "255.255.255.255": false, "::1": false, "::": false, "fe80::1": false, "fd00::1": false,
      "ff02::1": false, "::ffff:10.0.0.1": false, "64:ff9b::a9fe:a9fe": false, "2002:a9fe:a9fe::1": false, "::169.254.169.254": false,
      "8.8.8.8": true, "2606:4700:4700::1111": true, "::ffff:8.8.8.8": true,
    };
    // (A JSON string is a Python string literal.)
    const r = await helper(`print(json.dumps({a: f.address_problem(a) is None for a in json.loads(${JSON.stringify(JSON.stringify(Object.keys(addresses)))})}))`);
    expect(JSON.parse(r.stdout)).toEqual(addresses);
  });

  it("ships with the programs in both daemons", async () => {
    expect(fs.existsSync(path.join(CONTAINER_SCRIPTS, "svc_fetch.py"))).toBe(true);
    const daemon = renderLegacyDaemon({ backendUrl: "http://127.0.0.1:1", apiKey: "k", hmacSecret: "s", daemonVersion: "5.0.0" });
    const scripts = JSON.parse(/^CONTAINER_SCRIPTS = (.*)$/m.exec(daemon)![1]) as Record<string, string>;
    expect(scripts["svc_fetch.py"]).toBe(fs.readFileSync(path.join(CONTAINER_SCRIPTS, "svc_fetch.py"), "utf8"));
  });
});
