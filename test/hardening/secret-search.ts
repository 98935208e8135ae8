// Looking for secrets where they must not be: the built server spawned as a
// subprocess at LOG_LEVEL=trace (its pino output captured byte for byte), local
// receivers standing in for the email API, the payment gateway and a renter's
// webhook, and a search for a secret's value and its obvious encodings in
// captured text (logs, answers, process lists).
import { spawn, type ChildProcess } from "node:child_process";
import crypto from "node:crypto";
import http from "node:http";
import path from "node:path";
import os from "node:os";

export const rnd = (n = 18) => crypto.randomBytes(n).toString("hex");

/** The forms a secret may take in a byte stream. */
export function encodings(secret: string): string[] {
  const forms = new Set<string>([
    secret,
    encodeURIComponent(secret),
    Buffer.from(secret).toString("base64"),
    Buffer.from(secret).toString("base64url"),
    Buffer.from(`${secret}:`).toString("base64"), // HTTP Basic (user name, empty password)
    JSON.stringify(secret).slice(1, -1),
  ]);
  // Partial masking (e.g. a mask that stops at an escape) leaves the tail: look for the last 16 chars.
  if (secret.length >= 28) forms.add(secret.slice(-16));
  return [...forms].filter((f) => f.length >= 8);
}

/** Every (secret name, form, where) found in `haystacks`. */
export function findSecrets(secrets: Record<string, string>, haystacks: Record<string, string>): string[] {
  const hits: string[] = [];
  for (const [name, value] of Object.entries(secrets)) {
    if (!value) continue;
    for (const form of encodings(value)) {
      for (const [where, text] of Object.entries(haystacks)) {
        const at = text.indexOf(form);
        if (at >= 0) hits.push(`${name} (${form === value ? "raw" : "encoded:" + form.slice(0, 12)}) in ${where}: …${text.slice(Math.max(0, at - 160), at + form.length + 60).replace(/\s+/g, " ")}…`);
      }
    }
  }
  return hits;
}

export interface Receiver {
  url: string;
  requests: { method: string; url: string; headers: http.IncomingHttpHeaders; body: string }[];
  close(): Promise<void>;
}

export async function receiver(answer: (req: { method: string; url: string; body: string }) => { status: number; body: unknown } = () => ({ status: 200, body: { ok: true } })): Promise<Receiver> {
  const requests: Receiver["requests"] = [];
  const server = http.createServer((req, res) => {
    let body = "";
    req.on("data", (d) => (body += d));
    req.on("end", () => {
      requests.push({ method: req.method!, url: req.url!, headers: req.headers, body });
      const a = answer({ method: req.method!, url: req.url!, body });
      res.writeHead(a.status, { "content-type": "application/json" });
      res.end(JSON.stringify(a.body));
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const port = (server.address() as import("node:net").AddressInfo).port;
  return {
    url: `http://127.0.0.1:${port}`,
    requests,
    close: () => new Promise((r) => { server.closeAllConnections(); server.close(() => r()); }),
  };
}

export interface SpawnedServer {
  url: string;
  port: number;
  proc: ChildProcess;
  output(): string;
  stop(): Promise<void>;
}

/** `node dist/src/main.js` with LOG_LEVEL=trace, stdout+stderr captured (not a TTY: plain JSON lines). */
export async function spawnServer(env: Record<string, string>): Promise<SpawnedServer> {
  let out = "";
  const proc = spawn(process.execPath, ["dist/src/main.js"], {
    cwd: path.resolve("."),
    env: {
      PATH: process.env.PATH,
      HOME: process.env.HOME,
      LOG_LEVEL: "trace",
      PORT: "0",
      HOST: "127.0.0.1",
      SVC_DATA_DIR: path.join(os.tmpdir(), "svc-secret-sweep-data"),
      SVC_RATE_LIMITS: "off",
      ...env,
    },
    stdio: ["ignore", "pipe", "pipe"],
  });
  proc.stdout!.on("data", (d) => (out += d));
  proc.stderr!.on("data", (d) => (out += d));
  const exited = new Promise<void>((r) => proc.on("exit", () => r()));
  const started = Date.now();
  let port = 0;
  while (!port) {
    const m = /"port":(\d+)[^\n]*listening/.exec(out);
    if (m) port = Number(m[1]);
    else if (proc.exitCode !== null) throw new Error(`server exited: ${out}`);
    else if (Date.now() - started > 60_000) throw new Error(`server did not start: ${out}`);
    else await new Promise((r) => setTimeout(r, 100));
  }
  return {
    url: `http://127.0.0.1:${port}`,
    port,
    proc,
    output: () => out,
    async stop() {
      if (proc.exitCode === null) proc.kill("SIGTERM");
      await Promise.race([exited, new Promise((r) => setTimeout(r, 15_000))]);
      if (proc.exitCode === null) proc.kill("SIGKILL");
    },
  };
}
