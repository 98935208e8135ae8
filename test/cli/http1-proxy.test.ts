// svc speaks gRPC, which needs HTTP/2. Put behind a proxy that speaks only HTTP/1.1 (the REST API
// passes through it, gRPC cannot), or pointed at a server that asks for HTTP/1.1, svc says that the
// server at its URL did not answer over HTTP/2 and exits 4 (a connection problem), instead of a bare
// "Protocol error"; it neither sends a submit or top-up again nor reconnects a watch for minutes,
// since the same URL answers the same way every time.
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import http from "node:http";
import http2 from "node:http2";
import https from "node:https";
import net from "node:net";
import path from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { makeRenter } from "../helpers/fixtures.js";
import { client } from "../helpers/http.js";
import { useTestServer } from "../helpers/server.js";
import { hasCommand, tempDir } from "../daemon/helpers.js";
import { runSvc } from "./run-svc.js";

const srv = useTestServer();

const closers: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const close of closers.splice(0)) await close();
});

/** Listens on 127.0.0.1, port 0; closed after the test. */
async function listening(server: net.Server): Promise<number> {
  const sockets = new Set<net.Socket>();
  server.on("connection", (s: net.Socket) => sockets.add(s.on("close", () => sockets.delete(s))));
  server.on("secureConnection", (s: net.Socket) => sockets.add(s.on("close", () => sockets.delete(s))));
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", () => resolve()));
  closers.push(async () => {
    for (const s of sockets) s.destroy();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  });
  return (server.address() as net.AddressInfo).port;
}

/** A reverse proxy to the test server that speaks HTTP/1.1 only, as many do by default. */
async function http1Proxy(): Promise<string> {
  const proxy = http.createServer((req, res) => {
    const up = http.request({ host: "127.0.0.1", port: srv.port, method: req.method, path: req.url, headers: req.headers }, (answer) => {
      res.writeHead(answer.statusCode ?? 502, answer.headers);
      answer.pipe(res);
    });
    up.on("error", () => res.destroy());
    req.pipe(up);
  });
  return `http://127.0.0.1:${await listening(proxy)}`;
}

const NOT_HTTP2 = (url: string) =>
  new RegExp(`^svc: the server at ${url.replace(/[.]/g, "\\.")} did not answer over HTTP/2 \\([^)]+\\): svc calls the service over gRPC, which needs HTTP/2; .*HTTP/1\\.1`);

describe("a server or proxy that does not speak HTTP/2", { timeout: 180_000 }, () => {
  it("through an HTTP/1.1-only proxy: svc names the problem and exits 4, for a call, login, a top-up and a watch", async () => {
    const url = await http1Proxy();
    const renter = await makeRenter(srv, 1_000);
    // The proxy carries the service's REST API: it is the HTTP/2 that it drops.
    expect((await client(url).get("/api/renters/balance", renter.headers)).status).toBe(200);

    const home = tempDir("svc-h1");
    const env = { SVC_URL: url, SVC_KEY: renter.key };
    const balance = await runSvc(["balance"], { home, env });
    expect(balance.stderr).toMatch(NOT_HTTP2(url));
    expect(balance.stderr.trim().split("\n")).toHaveLength(1);
    expect(balance.code).toBe(4);

    const login = await runSvc(["login", "--url", url], { home, input: renter.key + "\n" });
    expect(login.stderr).toMatch(NOT_HTTP2(url));
    expect(login.code).toBe(4);
    expect(fs.existsSync(path.join(home, "config", "profiles.json"))).toBe(false);

    // Not sent again: the same URL answers the same way, and nothing reached the service.
    const topup = await runSvc(["topup", "--sar", "5"], { home, env });
    expect(topup.stderr).toMatch(NOT_HTTP2(url));
    expect(topup.stderr.trim().split("\n")).toHaveLength(1);
    expect(topup.code).toBe(4);
    expect((await client(srv.url).get("/api/renters/balance", renter.headers)).body.balance_halala).toBe(1_000);

    // Not reconnected for SVC_RECONNECT_SECONDS.
    const watch = await runSvc(["jobs", "watch", "00000000-0000-4000-8000-000000000000"], { home, env: { ...env, SVC_RECONNECT_SECONDS: "60" }, limitMs: 50_000 });
    expect(watch.killed).toBeUndefined();
    expect(watch.stderr).toMatch(NOT_HTTP2(url));
    expect(watch.stderr.trim().split("\n")).toHaveLength(1);
    expect(watch.code).toBe(4);
  });

  it("an HTTP/2 server that asks for HTTP/1.1 (HTTP_1_1_REQUIRED) is named the same way, exit 4", async () => {
    const server = http2.createServer();
    server.on("stream", (stream) => {
      stream.on("error", () => {});
      stream.close(http2.constants.NGHTTP2_HTTP_1_1_REQUIRED);
    });
    const url = `http://127.0.0.1:${await listening(server)}`;
    const r = await runSvc(["balance"], { env: { SVC_URL: url, SVC_KEY: "svc-renter-0123456789abcdef" } });
    expect(r.stderr).toMatch(NOT_HTTP2(url));
    expect(r.code).toBe(4);
  });

  it("an https server or proxy whose TLS offers HTTP/1.1 only (no h2 in ALPN) is named the same way, exit 4", async () => {
    expect(hasCommand("openssl"), "openssl is needed to make the test's certificate").toBe(true);
    const dir = tempDir("svc-h1-tls");
    const [key, cert] = [path.join(dir, "key.pem"), path.join(dir, "cert.pem")];
    execFileSync("openssl", ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", key, "-out", cert, "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"], { stdio: "ignore" });
    const server = https.createServer({ key: fs.readFileSync(key), cert: fs.readFileSync(cert), ALPNProtocols: ["http/1.1"] }, (_req, res) => res.end("ok"));
    const url = `https://127.0.0.1:${await listening(server)}`;
    const r = await runSvc(["balance"], { env: { SVC_URL: url, SVC_KEY: "svc-renter-0123456789abcdef", NODE_EXTRA_CA_CERTS: cert } });
    expect(r.stderr).toMatch(NOT_HTTP2(url));
    expect(r.code).toBe(4);
  });
});
