// The Windows installer binary (public: no credential) is streamed from its file:
// a download costs a read buffer, not a copy of the file, however slowly its client
// reads, and a client that reads nothing for a while loses the connection.
import crypto from "node:crypto";
import fs from "node:fs";
import http2 from "node:http2";
import net from "node:net";
import path from "node:path";
import v8 from "node:v8";
import vm from "node:vm";
import { describe, expect, it } from "vitest";
import { rawFileTimeouts } from "../../src/http/rest.js";
import { makeProvider } from "../helpers/fixtures.js";
import { useTestServer } from "../helpers/server.js";
import { tempDir } from "./helpers.js";

v8.setFlagsFromString("--expose-gc");
const gc = vm.runInNewContext("gc") as () => void;

const MB = 1024 * 1024;
const SIZE = 24 * MB; // more than the socket buffers of a local connection hold
const file = crypto.randomBytes(SIZE);
const exe = path.join(tempDir("exe-stream"), "svc-setup.exe");
fs.writeFileSync(exe, file);

const srv = useTestServer({ SVC_WINDOWS_EXE_PATH: exe, SVC_JOB_SWEEP_MS: "60000" });

/** A raw HTTP/1.1 GET whose client reads nothing until told to. */
async function pausedDownload(pathname: string): Promise<net.Socket> {
  const s = net.connect(srv.port, "127.0.0.1");
  s.on("error", () => {});
  await new Promise<void>((r) => s.once("connect", () => r()));
  s.pause();
  s.write(`GET ${pathname} HTTP/1.1\r\nhost: x\r\n\r\n`);
  return s;
}

/** Reads what is left until the connection ends; the bytes received. */
function readToEnd(s: net.Socket, timeoutMs: number): Promise<number> {
  return new Promise((resolve, reject) => {
    let n = 0;
    const t = setTimeout(() => reject(new Error(`connection still open after ${timeoutMs} ms (${n} bytes read)`)), timeoutMs);
    s.on("data", (c: Buffer) => (n += c.length));
    s.once("close", () => {
      clearTimeout(t);
      resolve(n);
    });
    s.resume();
  });
}

const arrayBuffersMb = () => process.memoryUsage().arrayBuffers / MB;

describe("the Windows installer download", () => {
  it("is the whole file with its headers, on both routes", async () => {
    const r = await fetch(`${srv.url}/api/providers/download-windows-exe`);
    expect(r.status).toBe(200);
    expect(r.headers.get("content-type")).toBe("application/vnd.microsoft.portable-executable");
    expect(r.headers.get("content-disposition")).toBe('attachment; filename="svc-setup.exe"');
    expect(r.headers.get("content-length")).toBe(String(SIZE));
    expect(Buffer.from(await r.arrayBuffer()).equals(file)).toBe(true);
    const p = await makeProvider(srv);
    const i = await fetch(`${srv.url}/api/providers/installer?os=Windows`, { headers: p.headers });
    expect(i.status).toBe(200);
    expect(i.headers.get("content-length")).toBe(String(SIZE));
    expect(Buffer.from(await i.arrayBuffer()).equals(file)).toBe(true);
  });

  it("holds no copy of the file for clients that read nothing", async () => {
    gc();
    const before = arrayBuffersMb();
    const sockets: net.Socket[] = [];
    try {
      for (let i = 0; i < 8; i++) sockets.push(await pausedDownload("/api/providers/download-windows-exe"));
      await new Promise((r) => setTimeout(r, 1500));
      gc();
      // Eight stalled downloads together hold less than one file's size (a copy each before).
      expect(arrayBuffersMb() - before).toBeLessThan(SIZE / MB);
    } finally {
      for (const s of sockets) s.destroy();
    }
  });

  it("ends a download whose client reads nothing for the idle time", async () => {
    rawFileTimeouts.idleMs = 300;
    try {
      const s = await pausedDownload("/api/providers/download-windows-exe");
      await new Promise((r) => setTimeout(r, 1500));
      // What the socket buffers held when the server gave up, and no more.
      expect(await readToEnd(s, 5000)).toBeLessThan(SIZE);
    } finally {
      rawFileTimeouts.idleMs = 60_000;
    }
  });

  it("lets go of the file once an HTTP/2 client resets its download while the server waits on it", async () => {
    /** This process's descriptors open on the installer file. */
    const openOnFile = () =>
      fs.readdirSync("/proc/self/fd").filter((fd) => {
        try {
          return fs.readlinkSync(`/proc/self/fd/${fd}`) === exe;
        } catch {
          return false;
        }
      }).length;
    await expect.poll(openOnFile, { timeout: 10_000 }).toBe(0); // the downloads of the tests before have let go
    const session = http2.connect(srv.url);
    session.on("error", () => {});
    try {
      const req = session.request({ ":path": "/api/providers/download-windows-exe" });
      req.on("error", () => {});
      await new Promise((resolve) => req.once("data", resolve));
      req.pause(); // nothing more read: the server's writes fill the stream's window and wait
      expect(openOnFile()).toBe(1);
      await new Promise((r) => setTimeout(r, 300));
      req.close(http2.constants.NGHTTP2_CANCEL);
      await expect.poll(openOnFile, { timeout: 10_000 }).toBe(0);
    } finally {
      session.destroy();
    }
  });

  it("is refused over Connect, whose one message would carry the whole file", async () => {
    const r = await fetch(`${srv.url}/svc.v1.ProviderDownloadService/DownloadWindowsExe`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: "{}",
    });
    expect(r.status).toBe(501);
    expect(((await r.json()) as { message: string }).message).toMatch(/served over HTTP only: GET .*\/api\/providers\/download-windows-exe/);
  });
});
