// One limit shared by two real server processes (`node --import tsx
// src/main.ts`, as deployed) on one database: renters/register is 5 per IP
// per hour, so 3 on one process and 3 on the other make the 6th a 429.
import { spawn, type ChildProcess } from "node:child_process";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { RATE_LIMITS } from "../../src/http/rate-limits.js";
import { client, uniqueEmail } from "../helpers/http.js";
import { ADMIN_TOKEN, HMAC_SECRET, freshDatabase } from "../helpers/server.js";

async function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const s = net.createServer().listen(0, "127.0.0.1", () => {
      const p = (s.address() as net.AddressInfo).port;
      s.close(() => resolve(p));
    });
  });
}

interface Proc {
  child: ChildProcess;
  url: string;
  output: () => string;
  exited: Promise<number | null>;
}

function startProcess(databaseUrl: string, port: number): Proc {
  const env = {
    ...process.env,
    DATABASE_URL: databaseUrl,
    SVC_ADMIN_TOKEN: ADMIN_TOKEN,
    SVC_HMAC_SECRET: HMAC_SECRET,
    PORT: String(port),
    HOST: "127.0.0.1",
    SVC_DATA_DIR: path.join(os.tmpdir(), "svc-test-data"),
    SVC_RATE_LIMITS: "on",
    SVC_TRUST_PROXY: "off",
    LOG_LEVEL: "warn",
  } as NodeJS.ProcessEnv;
  delete env.VITEST;
  delete env.SVC_RATE_LIMIT_OVERRIDES;
  delete env.REDIS_URL;
  const child = spawn(process.execPath, ["--import", "tsx", "src/main.ts"], { env, stdio: ["ignore", "pipe", "pipe"] });
  let output = "";
  child.stdout!.on("data", (d) => (output += d));
  child.stderr!.on("data", (d) => (output += d));
  const exited = new Promise<number | null>((resolve) => child.on("exit", (code) => resolve(code)));
  return { child, url: `http://127.0.0.1:${port}`, output: () => output, exited };
}

async function waitReady(p: Proc): Promise<void> {
  const deadline = Date.now() + 30_000;
  while (Date.now() < deadline && p.child.exitCode === null) {
    if (await fetch(`${p.url}/readyz`).then((r) => r.status === 200, () => false)) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`server process not ready: ${p.output()}`);
}

let db: Awaited<ReturnType<typeof freshDatabase>>;
let procs: Proc[] = [];

beforeAll(async () => {
  db = await freshDatabase();
  const [p1, p2] = [await freePort(), await freePort()];
  // Both start at once: migrations run under an advisory lock.
  procs = [startProcess(db.url, p1), startProcess(db.url, p2)];
  await Promise.all(procs.map(waitReady));
}, 60_000);

afterAll(async () => {
  for (const p of procs) p.child.kill("SIGTERM");
  const codes = await Promise.all(procs.map((p) => p.exited));
  await db?.drop();
  expect(codes).toEqual(procs.map(() => 0));
});

describe("two server processes", () => {
  it("share one limit: 3 registrations on one and 3 on the other make the 6th a 429 with Retry-After", async () => {
    expect(RATE_LIMITS.renter_register).toMatchObject({ points: 5, durationSec: 3600, per: "ip" });
    const [one, two] = procs.map((p) => client(p.url));
    const register = (api: typeof one) => api.post("/api/renters/register", { name: "R", email: uniqueEmail("procs") });
    const codes: number[] = [];
    for (let i = 0; i < 3; i++) codes.push((await register(one)).status);
    for (let i = 0; i < 2; i++) codes.push((await register(two)).status);
    const sixth = await register(two);
    codes.push(sixth.status);
    expect(codes).toEqual([201, 201, 201, 201, 201, 429]);
    const retry = Number(sixth.headers.get("retry-after"));
    expect(Number.isInteger(retry) && retry >= 1 && retry <= 3600).toBe(true);
    // And the first process agrees.
    expect((await register(one)).status).toBe(429);
    // Two processes, not one: distinct pids answer.
    expect(new Set(procs.map((p) => p.child.pid)).size).toBe(2);
  });
});
