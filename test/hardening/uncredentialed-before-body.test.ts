// A route counted per renter key (POST /api/jobs/submit, POST /api/renters/topup) takes its credential
// from headers or the query only (spec, Authentication), so a request that brings none there is refused
// before its body is read: a client cannot make the server read and parse 2 MiB it will refuse anyway.
// The refusal is the one authentication answers (and still counts against the client's address on the
// row, as a failed authentication does); a request with a credential is judged with its body as before.
import net from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { edgeTimeouts } from "../../src/http/edge.js";
import { makeRenter } from "../helpers/fixtures.js";
import { client } from "../helpers/http.js";
import { useTestServer, type TestServer } from "../helpers/server.js";

const SUBMIT_ROW = 3;
const originalRequestMs = edgeTimeouts.requestMs;
// A request whose body never arrives is answered 408 after this (the same module the in-process server reads).
beforeAll(() => {
  edgeTimeouts.requestMs = 4000;
});
afterAll(() => {
  edgeTimeouts.requestMs = originalRequestMs;
});
const srv = useTestServer({ SVC_RATE_LIMITS: "on", SVC_TRUST_PROXY: "on", SVC_RATE_LIMIT_OVERRIDES: `job_submit=${SUBMIT_ROW}/60` });

const sockets: net.Socket[] = [];
afterAll(() => {
  for (const s of sockets) s.destroy();
});

let ipCounter = 0;
const freshIp = () => `10.${(process.pid >> 8) & 255}.${process.pid & 255}.${++ipCounter}`;

interface Answer {
  status: number;
  headers: string;
  body: any;
}

/** An HTTP/1.1 POST that announces `length` bytes of body, sends its first few only, and never the rest. */
function stalledPost(server: TestServer, path: string, length: number, headers: Record<string, string>): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const sock = net.connect(server.port, "127.0.0.1");
    sockets.push(sock);
    let text = "";
    sock.on("error", () => {});
    sock.on("data", (d) => (text += d.toString()));
    // The answer is whole once the server closed the connection (or sent as much body as it announced).
    const done = () => {
      const at = text.indexOf("\r\n\r\n");
      if (at < 0) return reject(new Error(`no answer: ${JSON.stringify(text)}`));
      const head = text.slice(0, at);
      let body: unknown = text.slice(at + 4);
      try {
        body = JSON.parse(body as string);
      } catch {}
      resolve({ status: Number(head.split(" ")[1]), headers: head, body });
    };
    sock.on("close", done);
    const extra = Object.entries(headers).map(([k, v]) => `${k}: ${v}\r\n`).join("");
    sock.once("connect", () =>
      sock.write(`POST ${path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${length}\r\n${extra}\r\n{"job`),
    );
  });
}

describe("a request on a per-renter-key row with no credential in its headers", () => {
  it("is refused without its body (POST /api/jobs/submit, 2 MiB announced): the answer authentication gives, the connection closed", async () => {
    const r = await stalledPost(srv, "/api/jobs/submit", 2_000_000, { "x-forwarded-for": freshIp() });
    // Without a credential the body is never needed: no 408 for a body that did not come.
    expect(r.status, r.headers).toBe(400);
    expect(r.body).toEqual({ error: "API key required" });
    expect(r.headers).toMatch(/\r\nconnection: close/i);
  });

  it("on POST /api/renters/topup too", async () => {
    const r = await stalledPost(srv, "/api/renters/topup", 60_000, { "x-forwarded-for": freshIp() });
    expect(r.status, r.headers).toBe(400);
    expect(r.body).toEqual({ error: "API key required" });
  });

  it("still counts against its address on the row: past it, 429 with Retry-After, without the body either", async () => {
    const ip = freshIp();
    for (let i = 0; i < SUBMIT_ROW; i++) {
      const r = await stalledPost(srv, "/api/jobs/submit", 2_000_000, { "x-forwarded-for": ip });
      expect(r.status, r.headers).toBe(400);
    }
    const over = await stalledPost(srv, "/api/jobs/submit", 2_000_000, { "x-forwarded-for": ip });
    expect(over.status, over.headers).toBe(429);
    expect(over.headers).toMatch(/\r\nretry-after: \d+/i);
    expect(over.body).toEqual({ error: expect.stringContaining("rate limit exceeded") });
  });

  it("but one with a credential in its headers or query is judged with its body, as before", async () => {
    const renter = await makeRenter(srv, 10_000);
    // Its body is awaited: answered 408 once the request limit passed, not refused for a credential.
    const waited = await stalledPost(srv, "/api/renters/topup", 1_000, { "x-forwarded-for": freshIp(), "x-renter-key": renter.key });
    expect(waited.status, waited.headers).toBe(408);
    const api = client(srv);
    const viaQuery = await api.post(`/api/renters/topup?key=${renter.key}`, { amount_halala: 100 }, { "x-forwarded-for": freshIp() });
    expect(viaQuery.status, viaQuery.text).not.toBe(400);
    expect(viaQuery.status).not.toBe(401);
  });
});
