// login-email with email delivery configured (EMAIL_API_KEY): the first call
// mails a one-time code (202), the second call with the code issues a key.
// The email API is a local HTTP server that records what it was sent.
import crypto from "node:crypto";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startTestServer, type TestServer } from "../helpers/server.js";
import { client, uniqueEmail } from "../helpers/http.js";
import { deleteSpentLoginCodes } from "../../src/domain/accounts/login.js";

interface Sent {
  auth: string | undefined;
  body: { to: string[]; subject: string; text: string };
}

let srv: TestServer;
let api: ReturnType<typeof client>;
let mailer: http.Server;
const sent: Sent[] = [];
let failMail = false;
/** The email API closes the connection without answering. */
let dropMail = false;
/** Milliseconds the email API waits before it answers. */
let mailDelayMs = 0;

beforeAll(async () => {
  mailer = http.createServer((req, res) => {
    let raw = "";
    req.on("data", (c) => (raw += c));
    req.on("end", () => {
      if (dropMail) {
        req.socket.destroy();
        return;
      }
      setTimeout(() => {
        if (req.url !== "/emails" || failMail) {
          res.writeHead(failMail ? 500 : 404).end();
          return;
        }
        sent.push({ auth: req.headers.authorization, body: JSON.parse(raw) });
        res.writeHead(200, { "content-type": "application/json" }).end('{"id":"mail-1"}');
      }, mailDelayMs);
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

  it("a new code ends the older unused ones: an earlier code no longer works, even after the new one is locked", async () => {
    const email = uniqueEmail("codes-a");
    expect((await api.post("/api/renters/register", { name: "R", email })).status).toBe(201);
    expect((await api.post("/api/renters/login-email", { email })).status).toBe(202);
    const first = codeIn(sent.at(-1)!);
    expect((await api.post("/api/renters/login-email", { email })).status).toBe(202);
    const second = codeIn(sent.at(-1)!);
    const wrong = ["000000", "000001", "000002"].find((c) => c !== first && c !== second)!;
    if (first !== second) expect((await api.post("/api/renters/login-email", { email, code: first })).status).toBe(401);
    // Lock the new code with wrong guesses: the older one does not come back to life.
    for (let i = 0; i < 5; i++) expect((await api.post("/api/renters/login-email", { email, code: wrong })).status).toBe(401);
    const old = await api.post("/api/renters/login-email", { email, code: first });
    expect(old.status).toBe(401);
    expect(old.body.error).toMatch(/no valid sign-in code/);
    // Of the two codes only the newest is still unexpired (and it is locked).
    const rows = await srv.sql<{ attempts: number }[]>`
      SELECT c.attempts FROM login_codes c JOIN renters r ON r.id = c.account_id
      WHERE c.role = 'renter' AND r.email = ${email} AND c.used_at IS NULL AND c.expires_at > now()`;
    expect(rows.map((r) => r.attempts)).toEqual([5]);
  });

  it("at most 5 codes per account per hour: the 6th request is 429 with Retry-After and mails nothing; another account is unaffected", async () => {
    const email = uniqueEmail("codes-b");
    const reg = await api.post("/api/providers/register", { name: "B", email, gpu_model: "L4", os: "linux" });
    expect(reg.status).toBe(200);
    for (let i = 0; i < 5; i++) expect((await api.post("/api/providers/login-email", { email })).status).toBe(202);
    const lastCode = codeIn(sent.at(-1)!);
    const before = sent.length;
    const sixth = await api.post("/api/providers/login-email", { email });
    expect(sixth.status).toBe(429);
    expect(sixth.body.error).toMatch(/at most 5 sign-in codes per hour/);
    const retry = Number(sixth.headers.get("retry-after"));
    expect(retry).toBeGreaterThan(3500);
    expect(retry).toBeLessThanOrEqual(3600);
    expect(sent.length).toBe(before);
    // The last code sent still works.
    expect((await api.post("/api/providers/login-email", { email, code: lastCode })).status).toBe(200);
    // Another account has its own allowance.
    const otherEmail = uniqueEmail("codes-b2");
    await api.post("/api/providers/register", { name: "B2", email: otherEmail, gpu_model: "L4", os: "linux" });
    expect((await api.post("/api/providers/login-email", { email: otherEmail })).status).toBe(202);
    // An hour later the account may ask again.
    await srv.sql`
      UPDATE login_codes SET created_at = created_at - interval '61 minutes', expires_at = expires_at - interval '61 minutes'
      WHERE role = 'provider' AND account_id = ${reg.body.provider_id}`;
    expect((await api.post("/api/providers/login-email", { email })).status).toBe(202);
  });

  it("at most 10 wrong guesses per account per hour across codes: then 429 with Retry-After, even for the right code", async () => {
    const email = uniqueEmail("codes-c");
    const reg = await api.post("/api/renters/register", { name: "C", email });
    expect(reg.status).toBe(201);
    const proven = async () => (await srv.sql<{ p: boolean }[]>`SELECT email_proven_at IS NOT NULL AS p FROM renters WHERE id = ${reg.body.renter_id}`)[0].p;
    const guessWrong = async (code: string, times: number) => {
      const wrong = code === "000000" ? "000001" : "000000";
      for (let i = 0; i < times; i++) {
        const r = await api.post("/api/renters/login-email", { email, code: wrong });
        expect(r.status).toBe(401);
        expect(r.body.error).toBe("wrong sign-in code");
      }
    };
    expect((await api.post("/api/renters/login-email", { email })).status).toBe(202);
    await guessWrong(codeIn(sent.at(-1)!), 5);
    expect((await api.post("/api/renters/login-email", { email })).status).toBe(202);
    await guessWrong(codeIn(sent.at(-1)!), 4);
    // Nine wrong so far; one more on a third code is the tenth.
    expect((await api.post("/api/renters/login-email", { email })).status).toBe(202);
    const third = codeIn(sent.at(-1)!);
    await guessWrong(third, 1);
    const locked = await api.post("/api/renters/login-email", { email, code: third });
    expect(locked.status).toBe(429);
    expect(locked.body.error).toMatch(/too many wrong sign-in codes/);
    const retry = Number(locked.headers.get("retry-after"));
    expect(retry).toBeGreaterThan(3000);
    expect(retry).toBeLessThanOrEqual(3600 + 10 * 60);
    // A fresh code does not reopen the hour.
    expect((await api.post("/api/renters/login-email", { email })).status).toBe(202);
    expect((await api.post("/api/renters/login-email", { email, code: codeIn(sent.at(-1)!) })).status).toBe(429);
    // Once the guesses are more than an hour old, the right code works.
    await srv.sql`
      UPDATE login_codes SET created_at = created_at - interval '2 hours', expires_at = expires_at - interval '2 hours'
      WHERE role = 'renter' AND account_id = ${reg.body.renter_id} AND attempts > 0`;
    expect(await proven()).toBe(false);
    const ok = await api.post("/api/renters/login-email", { email, code: codeIn(sent.at(-1)!) });
    expect(ok.status).toBe(200);
    expect(ok.body.api_key).toMatch(/^svc-renter-/);
    // The right code proves the account owns the address (what a managed-endpoint account needs).
    expect(await proven()).toBe(true);
  });

  const failingRequests = async (email: string, times: number) => {
    failMail = true;
    try {
      for (let i = 0; i < times; i++) {
        const r = await api.post("/api/renters/login-email", { email });
        expect(r.status).toBe(503);
        expect(r.body.error).toMatch(/email delivery failed/);
      }
    } finally {
      failMail = false;
    }
  };

  it("a code whose email failed does not end the code sent before it", async () => {
    const email = uniqueEmail("codes-g");
    expect((await api.post("/api/renters/register", { name: "G", email })).status).toBe(201);
    expect((await api.post("/api/renters/login-email", { email })).status).toBe(202);
    const first = codeIn(sent.at(-1)!);
    await failingRequests(email, 1);
    const ok = await api.post("/api/renters/login-email", { email, code: first });
    expect(ok.status).toBe(200);
    expect(ok.body.api_key).toMatch(/^svc-renter-/);
  });

  it("503 too when the email service closes the connection unanswered, and the earlier code still works", async () => {
    const email = uniqueEmail("codes-d");
    expect((await api.post("/api/renters/register", { name: "D", email })).status).toBe(201);
    expect((await api.post("/api/renters/login-email", { email })).status).toBe(202);
    const first = codeIn(sent.at(-1)!);
    dropMail = true;
    try {
      const r = await api.post("/api/renters/login-email", { email });
      expect(r.status).toBe(503);
      expect(r.body.error).toMatch(/email delivery failed/);
    } finally {
      dropMail = false;
    }
    expect((await api.post("/api/renters/login-email", { email, code: first })).status).toBe(200);
  });

  it("a code whose email failed does not count against the 5 codes an hour", async () => {
    const email = uniqueEmail("codes-g2");
    expect((await api.post("/api/renters/register", { name: "G2", email })).status).toBe(201);
    expect((await api.post("/api/renters/login-email", { email })).status).toBe(202);
    await failingRequests(email, 5);
    for (let i = 0; i < 4; i++) expect((await api.post("/api/renters/login-email", { email })).status).toBe(202);
    const sixth = await api.post("/api/renters/login-email", { email });
    expect(sixth.status).toBe(429);
    // The last code sent works.
    expect((await api.post("/api/renters/login-email", { email, code: codeIn(sent.at(-1)!) })).status).toBe(200);
  });

  it("concurrent code requests of one account send at most 5 codes an hour and leave one of them live", async () => {
    const email = uniqueEmail("codes-h");
    expect((await api.post("/api/renters/register", { name: "H", email })).status).toBe(201);
    const before = sent.length;
    mailDelayMs = 200;
    let answers: number[];
    try {
      answers = (await Promise.all(Array.from({ length: 8 }, () => api.post("/api/renters/login-email", { email })))).map((r) => r.status);
    } finally {
      mailDelayMs = 0;
    }
    expect(answers.filter((s) => s === 202)).toHaveLength(5);
    expect(answers.filter((s) => s === 429)).toHaveLength(3);
    const mine = sent.slice(before).filter((m) => m.body.to[0] === email);
    expect(mine).toHaveLength(5);
    // One live code, one of those mailed, and it signs in.
    const live = await srv.sql<{ code_hash: Buffer }[]>`
      SELECT c.code_hash FROM login_codes c JOIN renters r ON r.id = c.account_id
      WHERE c.role = 'renter' AND r.email = ${email} AND c.used_at IS NULL AND c.expires_at > now()`;
    expect(live).toHaveLength(1);
    const code = mine.map(codeIn).find((c) => crypto.createHash("sha256").update(c).digest().equals(live[0].code_hash));
    expect(code).toBeDefined();
    expect((await api.post("/api/renters/login-email", { email, code })).status).toBe(200);
  });

  it("a code left unsent by a process that stopped mid-send is never usable and stops counting after a minute", async () => {
    const email = uniqueEmail("codes-i");
    const reg = await api.post("/api/renters/register", { name: "I", email });
    expect(reg.status).toBe(201);
    const unsent = (age: string) => srv.sql`
      INSERT INTO login_codes (role, account_id, code_hash, expires_at, created_at)
      SELECT 'renter', ${reg.body.renter_id}, sha256('123456'), now() + interval '5 minutes', now() - ${age}::interval
      FROM generate_series(1, 5)`;
    await unsent("2 minutes");
    expect((await api.post("/api/renters/login-email", { email })).status).toBe(202);
    // Without the code just sent, the unsent ones' code does not sign in.
    await srv.sql`DELETE FROM login_codes WHERE role = 'renter' AND account_id = ${reg.body.renter_id} AND sent_at IS NOT NULL`;
    const r = await api.post("/api/renters/login-email", { email, code: "123456" });
    expect(r.status).toBe(401);
    expect(r.body.error).toMatch(/no valid sign-in code/);
    // Ones being sent now count.
    await unsent("0 seconds");
    expect((await api.post("/api/renters/login-email", { email })).status).toBe(429);
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

describe("retention of login codes", () => {
  /** A renter; its codes listed as "minutes since created:kind", newest first; `code` inserts one. */
  async function renterWithCodes() {
    const email = uniqueEmail("codes-ret");
    const reg = await api.post("/api/renters/register", { name: "Ret", email });
    expect(reg.status).toBe(201);
    const id: number = reg.body.renter_id;
    const codes = async () =>
      (await srv.sql<{ age: number; kind: string }[]>`
        SELECT round(extract(epoch FROM now() - created_at) / 60)::int AS age,
               CASE WHEN used_at IS NOT NULL THEN 'used' WHEN expires_at <= now() THEN 'expired' ELSE 'live' END AS kind
        FROM login_codes WHERE role = 'renter' AND account_id = ${id} ORDER BY created_at DESC, id DESC`).map((r) => `${r.age}:${r.kind}`);
    /** A sent code created `minutes` ago that lived its 10 minutes (or ended at once: `endedAfter` 0), used or not, with `attempts` wrong guesses. */
    const code = (minutes: number, o: { used?: boolean; endedAfter?: number; attempts?: number } = {}) => srv.sql`
      INSERT INTO login_codes (role, account_id, code_hash, attempts, created_at, sent_at, expires_at, used_at)
      VALUES ('renter', ${id}, sha256('123456'), ${o.attempts ?? 0}, now() - make_interval(mins => ${minutes}), now() - make_interval(mins => ${minutes}),
              now() - make_interval(mins => ${minutes}) + make_interval(mins => ${o.endedAfter ?? 10}),
              ${o.used ? srv.sql`now() - make_interval(mins => ${minutes - 1})` : null})`;
    return { email, id, codes, code };
  }

  it("deletes the codes created and expired over an hour ago, used or not; keeps those the hourly limits still count", async () => {
    const r = await renterWithCodes();
    // Out of the window: created and expired (or used) over an hour ago.
    await r.code(24 * 60, { used: true });
    await r.code(120, { attempts: 5 });
    await r.code(80, { used: true, attempts: 2 });
    await r.code(71, { endedAfter: 0 });
    // Within it: created, or expired with wrong guesses, in the last hour.
    await r.code(65, { attempts: 3 }); // created over an hour ago, expired 55 minutes ago: its guesses still count
    await r.code(50, { used: true });
    await r.code(30, { endedAfter: 0 });
    await r.code(5);
    expect(await deleteSpentLoginCodes(srv.sql)).toBeGreaterThanOrEqual(4);
    expect(await r.codes()).toEqual(["5:live", "30:expired", "50:used", "65:expired"]);
    // Nothing more to delete of this account's: a second sweep keeps them all.
    await deleteSpentLoginCodes(srv.sql);
    expect(await r.codes()).toEqual(["5:live", "30:expired", "50:used", "65:expired"]);
  });

  it("after a sweep the per-hour limit still refuses the 6th code of the hour, used and expired ones counted", async () => {
    const r = await renterWithCodes();
    await r.code(200, { used: true });
    await r.code(90);
    // Three codes of the hour already, one used, one ended by a newer one, and one still live.
    await r.code(40, { used: true });
    await r.code(20, { endedAfter: 0 });
    await r.code(2);
    await deleteSpentLoginCodes(srv.sql);
    expect(await r.codes()).toEqual(["2:live", "20:expired", "40:used"]);
    for (let i = 0; i < 2; i++) expect((await api.post("/api/renters/login-email", { email: r.email })).status).toBe(202);
    await deleteSpentLoginCodes(srv.sql);
    const sixth = await api.post("/api/renters/login-email", { email: r.email });
    expect(sixth.status).toBe(429);
    expect(sixth.body.error).toMatch(/at most 5 sign-in codes per hour/);
    // The oldest of the hour's codes comes out of the window in about 20 minutes.
    const retry = Number(sixth.headers.get("retry-after"));
    expect(retry).toBeGreaterThan(19 * 60);
    expect(retry).toBeLessThanOrEqual(20 * 60 + 1);
  });

  it("the wrong guesses of the hour still count after a sweep", async () => {
    const r = await renterWithCodes();
    // Ten wrong guesses on codes created over an hour ago that expired within it.
    await r.code(68, { attempts: 5 });
    await r.code(62, { attempts: 5 });
    await deleteSpentLoginCodes(srv.sql);
    expect((await r.codes()).length).toBe(2);
    const locked = await api.post("/api/renters/login-email", { email: r.email, code: "123456" });
    expect(locked.status).toBe(429);
    expect(locked.body.error).toMatch(/too many wrong sign-in codes/);
  });

  it("deletes a backlog larger than one batch", async () => {
    const r = await renterWithCodes();
    await srv.sql`
      INSERT INTO login_codes (role, account_id, code_hash, created_at, sent_at, expires_at)
      SELECT 'renter', ${r.id}, sha256('123456'), now() - make_interval(mins => 61 + g), now() - make_interval(mins => 61 + g), now() - make_interval(mins => 61 + g)
      FROM generate_series(1, 25000) g`;
    await r.code(3);
    expect(await deleteSpentLoginCodes(srv.sql)).toBeGreaterThanOrEqual(25_000);
    expect(await r.codes()).toEqual(["3:live"]);
  });
});
