// login-email with email delivery configured (EMAIL_API_KEY): the first call
// mails a one-time code (202), the second call with the code issues a key.
// The email API is a local HTTP server that records what it was sent.
import http from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startTestServer, type TestServer } from "../helpers/server.js";
import { client, uniqueEmail } from "../helpers/http.js";

interface Sent {
  auth: string | undefined;
  body: { to: string[]; subject: string; text: string };
}

let srv: TestServer;
let api: ReturnType<typeof client>;
let mailer: http.Server;
const sent: Sent[] = [];
let failMail = false;

beforeAll(async () => {
  mailer = http.createServer((req, res) => {
    let raw = "";
    req.on("data", (c) => (raw += c));
    req.on("end", () => {
      if (req.url !== "/emails" || failMail) {
        res.writeHead(failMail ? 500 : 404).end();
        return;
      }
      sent.push({ auth: req.headers.authorization, body: JSON.parse(raw) });
      res.writeHead(200, { "content-type": "application/json" }).end('{"id":"mail-1"}');
    });
  });
  await new Promise<void>((r) => mailer.listen(0, "127.0.0.1", r));
  const mailUrl = `http://127.0.0.1:${(mailer.address() as AddressInfo).port}`;
  srv = await startTestServer({ EMAIL_API_KEY: "email-test-key", EMAIL_API_URL: mailUrl });
  api = client(srv.url);
});
afterAll(async () => {
  await srv?.close();
  await new Promise((r) => mailer?.close(r));
});

const codeIn = (s: Sent) => /\b(\d{6})\b/.exec(s.body.text)![1];

describe("login-email with one-time codes", () => {
  it("provider: 202 and a mailed code, then 200 with a working key; a used code does not work twice", async () => {
    const email = uniqueEmail("codes");
    const reg = await api.post("/api/providers/register", { name: "Coded", email, gpu_model: "L4", os: "linux" });
    expect(reg.status).toBe(200);

    const first = await api.post("/api/providers/login-email", { email });
    expect(first.status).toBe(202);
    expect(first.body.api_key ?? null).toBeNull();
    expect(first.body.message).toMatch(/code was sent/);
    const mail = sent.at(-1)!;
    expect(mail.auth).toBe("Bearer email-test-key");
    expect(mail.body.to).toEqual([email]);
    const code = codeIn(mail);

    const second = await api.post("/api/providers/login-email", { email, code });
    expect(second.status).toBe(200);
    expect(second.body.api_key).toMatch(/^svc-provider-/);
    expect(second.body.api_key).not.toBe(reg.body.api_key);
    expect((await api.get(`/api/providers/me?key=${second.body.api_key}`)).status).toBe(200);

    const again = await api.post("/api/providers/login-email", { email, code });
    expect(again.status).toBe(401);
  });

  it("renter: a wrong code is 401 and counts; after five wrong tries even the right code is refused", async () => {
    const email = uniqueEmail("codes-r");
    expect((await api.post("/api/renters/register", { name: "R", email })).status).toBe(201);
    expect((await api.post("/api/renters/login-email", { email })).status).toBe(202);
    const code = codeIn(sent.at(-1)!);
    const wrong = code === "000000" ? "000001" : "000000";
    const bad = await api.post("/api/renters/login-email", { email, code: wrong });
    expect(bad.status).toBe(401);
    expect(bad.body.error).toBe("wrong sign-in code");
    expect((await api.post("/api/renters/login-email", { email, code: "12ab" })).status).toBe(400);
    for (let i = 0; i < 4; i++) expect((await api.post("/api/renters/login-email", { email, code: wrong })).status).toBe(401);
    const locked = await api.post("/api/renters/login-email", { email, code });
    expect(locked.status).toBe(401);
    expect(locked.body.error).toMatch(/no valid sign-in code/);
  });

  it("503 when the email service fails; an unknown address is 404 and sends nothing", async () => {
    const email = uniqueEmail("codes-f");
    await api.post("/api/renters/register", { name: "R", email });
    failMail = true;
    try {
      const r = await api.post("/api/renters/login-email", { email });
      expect(r.status).toBe(503);
      expect(r.body.error).toMatch(/email delivery failed/);
    } finally {
      failMail = false;
    }
    const before = sent.length;
    expect((await api.post("/api/renters/login-email", { email: uniqueEmail("nobody") })).status).toBe(404);
    expect(sent.length).toBe(before);
  });
});
