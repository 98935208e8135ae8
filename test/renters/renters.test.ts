// Renter endpoints beyond register/login: PATCH me (webhook_url rules),
// balance, the non-production topup with Idempotency-Key, and key rotation.
import { describe, expect, it } from "vitest";
import { startTestServer, useTestServer } from "../helpers/server.js";
import { client, uniqueEmail } from "../helpers/http.js";
import { makeRenter } from "../helpers/fixtures.js";

const srv = useTestServer();
const api = client(srv);

const BALANCE_FIELDS = [
  "balance_halala", "balance_sar", "held_halala", "held_sar", "available_halala", "total_spent_halala", "total_spent_sar", "total_jobs",
];

describe("balance", () => {
  it("answers all eight fields, SAR = halala / 100, with the key in the header or the query", async () => {
    const r = await makeRenter(srv, 12_345);
    const byHeader = await api.get("/api/renters/balance", r.headers);
    expect(byHeader.status).toBe(200);
    expect(Object.keys(byHeader.body).sort()).toEqual([...BALANCE_FIELDS].sort());
    expect(byHeader.body).toEqual({
      balance_halala: 12_345, balance_sar: 123.45, held_halala: 0, held_sar: 0, available_halala: 12_345,
      total_spent_halala: 0, total_spent_sar: 0, total_jobs: 0,
    });
    const byQuery = await api.get(`/api/renters/balance?key=${r.key}`);
    expect(byQuery.body).toEqual(byHeader.body);
  });

  it("400 without a key, 401 with an unknown key, 403 with a provider key", async () => {
    expect((await api.get("/api/renters/balance")).status).toBe(400);
    const bad = await api.get("/api/renters/balance", { "x-renter-key": "svc-renter-nope" });
    expect(bad.status).toBe(401);
    expect(bad.body.error).toMatch(/invalid API key/);
    const prov = await api.post("/api/providers/register", { name: "p", email: uniqueEmail("p"), gpu_model: "A100", os: "linux" });
    expect((await api.get("/api/renters/balance", { "x-provider-key": prov.body.api_key })).status).toBe(403);
  });
});

describe("topup (non-production)", () => {
  it("credits amount_halala or amount_sar and answers the documented fields", async () => {
    const r = await makeRenter(srv);
    const a = await api.post("/api/renters/topup", { amount_halala: 500 }, r.headers);
    expect(a.status).toBe(200);
    expect(a.body).toEqual({ success: true, topped_up_halala: 500, topped_up_sar: 5, new_balance_halala: 500, new_balance_sar: 5 });
    const b = await api.post("/api/renters/topup", { amount_sar: 12.34 }, r.headers);
    expect(b.body).toEqual({ success: true, topped_up_halala: 1234, topped_up_sar: 12.34, new_balance_halala: 1734, new_balance_sar: 17.34 });
    const c = await api.post("/api/renters/topup", { amount_sar: 0.1 }, r.headers);
    expect(c.body.topped_up_halala).toBe(10);
    expect((await api.get("/api/renters/balance", r.headers)).body.balance_halala).toBe(1744);
  });

  it("400 for both, neither, fractions of a halala, non-positive, too large and wrong types", async () => {
    const r = await makeRenter(srv);
    const cases: [unknown, RegExp][] = [
      [{ amount_halala: 100, amount_sar: 1 }, /exactly one of amount_halala or amount_sar/],
      [{}, /exactly one of amount_halala or amount_sar/],
      [{ amount_sar: 1.005 }, /amount_sar must be a number with at most two decimals/],
      [{ amount_halala: 12.5 }, /amount_halala/],
      [{ amount_halala: 0 }, /amount_halala must be an integer between 1 and/],
      [{ amount_halala: -5 }, /amount_halala must be an integer between 1 and/],
      [{ amount_sar: -1 }, /amount_sar must be between/],
      [{ amount_halala: 10_000_001 }, /amount_halala must be an integer between/],
      [{ amount_halala: "lots" }, /amount_halala/],
    ];
    for (const [body, msg] of cases) {
      const res = await api.post("/api/renters/topup", body, r.headers);
      expect(res.status, JSON.stringify(body)).toBe(400);
      expect(res.body.error, JSON.stringify(body)).toMatch(msg);
    }
    expect((await api.get("/api/renters/balance", r.headers)).body.balance_halala).toBe(0);
  });

  it("Idempotency-Key: the same key and body replay the first answer once; another body is 409", async () => {
    const r = await makeRenter(srv);
    const h = { ...r.headers, "idempotency-key": "topup-1" };
    const first = await api.post("/api/renters/topup", { amount_halala: 700 }, h);
    expect(first.status).toBe(200);
    const again = await Promise.all([1, 2, 3].map(() => api.post("/api/renters/topup", { amount_halala: 700 }, h)));
    for (const a of again) {
      expect(a.status).toBe(200);
      expect(a.body).toEqual(first.body);
    }
    const other = await api.post("/api/renters/topup", { amount_halala: 701 }, h);
    expect(other.status).toBe(409);
    expect(other.body.error).toMatch(/Idempotency-Key/);
    const otherShape = await api.post("/api/renters/topup", { amount_sar: 7 }, h);
    expect(otherShape.status).toBe(409);
    expect((await api.get("/api/renters/balance", r.headers)).body.balance_halala).toBe(700);
    // Keys are per renter: another renter's same key is a fresh request.
    const r2 = await makeRenter(srv);
    const theirs = await api.post("/api/renters/topup", { amount_halala: 700 }, { ...r2.headers, "idempotency-key": "topup-1" });
    expect(theirs.status).toBe(200);
    expect(theirs.body.new_balance_halala).toBe(700);
    // A failed request does not burn its key.
    const bad = await api.post("/api/renters/topup", { amount_halala: 0 }, { ...r.headers, "idempotency-key": "k2" });
    expect(bad.status).toBe(400);
    const good = await api.post("/api/renters/topup", { amount_halala: 1 }, { ...r.headers, "idempotency-key": "k2" });
    expect(good.status).toBe(200);
    expect((await api.post("/api/renters/topup", { amount_halala: 1 }, { ...r.headers, "idempotency-key": "x".repeat(256) })).status).toBe(400);
  });

  it("concurrent first uses of one key credit once", async () => {
    const r = await makeRenter(srv);
    const h = { ...r.headers, "idempotency-key": "race" };
    const all = await Promise.all(Array.from({ length: 8 }, () => api.post("/api/renters/topup", { amount_halala: 300 }, h)));
    expect(all.map((a) => a.status)).toEqual(Array(8).fill(200));
    expect((await api.get("/api/renters/balance", r.headers)).body.balance_halala).toBe(300);
  });
});

describe("PATCH /api/renters/me", () => {
  it("updates profile fields, sets and clears webhook_url with a signing secret", async () => {
    const r = await makeRenter(srv);
    const a = await api.patch("/api/renters/me", { organization: "Lab", phone: "+966500000000", webhook_url: "https://hooks.example.com/svc" }, r.headers);
    expect(a.status).toBe(200);
    expect(a.body.success).toBe(true);
    expect(a.body.renter).toMatchObject({ id: r.id, organization: "Lab", phone: "+966500000000", webhook_url: "https://hooks.example.com/svc", use_case: null });
    expect(a.body.webhook_secret).toMatch(/^whsec_/);
    const same = await api.patch("/api/renters/me", { name: "Renamed" }, r.headers);
    expect(same.body.renter.name).toBe("Renamed");
    expect(same.body.renter.organization).toBe("Lab");
    expect(same.body.webhook_secret).toBe(a.body.webhook_secret);
    const rotated = await api.patch("/api/renters/me", { rotate_webhook_secret: true }, r.headers);
    expect(rotated.body.webhook_secret).toMatch(/^whsec_/);
    expect(rotated.body.webhook_secret).not.toBe(a.body.webhook_secret);
    const cleared = await api.patch("/api/renters/me", { webhook_url: "", organization: "" }, r.headers);
    expect(cleared.body.renter.webhook_url).toBeNull();
    expect(cleared.body.renter.organization).toBeNull();
    expect(cleared.body.webhook_secret).toBeNull();
    const me = await api.get("/api/renters/me", r.headers);
    expect(me.body.renter.name).toBe("Renamed");
    expect(me.body.renter.webhook_url).toBeNull();
  });

  it("400 for bad webhook URLs and an empty name; http and loopback are fine outside production", async () => {
    const r = await makeRenter(srv);
    for (const [url, msg] of [
      ["not a url", /webhook_url must be an absolute URL/],
      ["ftp://example.com/x", /webhook_url must use https or http/],
      ["https://user:pw@example.com/", /webhook_url must not contain credentials/],
      ["https://example.com/" + "a".repeat(2000), /at most 2000/],
    ] as const) {
      const res = await api.patch("/api/renters/me", { webhook_url: url }, r.headers);
      expect(res.status, url).toBe(400);
      expect(res.body.error).toMatch(msg);
    }
    expect((await api.patch("/api/renters/me", { name: "  " }, r.headers)).status).toBe(400);
    expect((await api.patch("/api/renters/me", { name: 5 }, r.headers)).status).toBe(400);
    const local = await api.patch("/api/renters/me", { webhook_url: "http://127.0.0.1:9/hook" }, r.headers);
    expect(local.status).toBe(200);
    expect((await api.patch("/api/renters/me", {}, {})).status).toBe(400);
  });

  it("register takes webhook_url, validates it and answers its signing secret once", async () => {
    const ok = await api.post("/api/renters/register", { name: "W", email: uniqueEmail("w"), webhook_url: "https://example.com/h" });
    expect(ok.status).toBe(201);
    expect(ok.body.webhook_secret).toMatch(/^whsec_/);
    const plain = await api.post("/api/renters/register", { name: "W", email: uniqueEmail("w") });
    expect(plain.body).not.toHaveProperty("webhook_secret");
    const bad = await api.post("/api/renters/register", { name: "W", email: uniqueEmail("w"), webhook_url: "gopher://x" });
    expect(bad.status).toBe(400);
    expect(bad.body.error).toMatch(/webhook_url/);
  });
});

describe("rotate-key", () => {
  it("me answers the documented 500 {error: \"failed to fetch renter data\"} when its reads fail", async () => {
    const r = await makeRenter(srv);
    expect((await api.get("/api/renters/me", r.headers)).status).toBe(200);
    await srv.sql`ALTER TABLE renter_quota RENAME TO renter_quota_unavailable`;
    try {
      const res = await api.get("/api/renters/me", r.headers);
      expect(res.status).toBe(500);
      expect(res.body).toEqual({ error: "failed to fetch renter data" });
    } finally {
      await srv.sql`ALTER TABLE renter_quota_unavailable RENAME TO renter_quota`;
    }
    expect((await api.get("/api/renters/me", r.headers)).status).toBe(200);
  });

  it("issues a new key and every earlier key stops at once", async () => {
    const r = await makeRenter(srv, 100);
    const login = await api.post("/api/renters/login-email", { email: (await api.get("/api/renters/me", r.headers)).body.renter.email });
    const rot = await api.post("/api/renters/rotate-key", undefined, r.headers);
    expect(rot.status).toBe(200);
    expect(rot.body).toEqual({ success: true, message: expect.any(String), api_key: expect.stringMatching(/^svc-renter-/), renter_id: r.id, webhook_secret: null });
    expect((await api.get("/api/renters/balance", r.headers)).status).toBe(401);
    expect((await api.get("/api/renters/balance", { "x-renter-key": login.body.api_key })).status).toBe(401);
    const now = await api.get("/api/renters/balance", { "x-renter-key": rot.body.api_key });
    expect(now.status).toBe(200);
    expect(now.body.balance_halala).toBe(100);
    expect((await api.post("/api/renters/rotate-key", undefined, r.headers)).status).toBe(401);
  });

  it("replaces the webhook's signing secret too, which the revoked key could read, and says to check the webhook's address", async () => {
    const r = await makeRenter(srv);
    // Whoever holds the leaked key points the webhook at its own server and learns the secret.
    const set = await api.patch("/api/renters/me", { webhook_url: "http://127.0.0.1:9/hook" }, r.headers);
    expect(set.status, set.text).toBe(200);
    const learned: string = set.body.webhook_secret;
    expect(learned).toMatch(/^whsec_/);
    const rot = await api.post("/api/renters/rotate-key", undefined, r.headers);
    expect(rot.status, rot.text).toBe(200);
    expect(rot.body.webhook_secret).toMatch(/^whsec_/);
    expect(rot.body.webhook_secret).not.toBe(learned);
    expect(rot.body.message).toMatch(/webhook_secret.*webhook_url/);
    const [row] = await srv.sql<{ webhook_url: string; webhook_secret: string }[]>`SELECT webhook_url, webhook_secret FROM renters WHERE id = ${r.id}`;
    // The address stays (the owner's own webhook keeps working once its receiver has the new secret).
    expect(row).toEqual({ webhook_url: "http://127.0.0.1:9/hook", webhook_secret: rot.body.webhook_secret });
  });
});

describe("SVC_ALLOW_TOPUP=off outside production", () => {
  const off = useTestServer({ SVC_ALLOW_TOPUP: "off" });

  it("the direct top-up's refusal names the setting, not production", async () => {
    const r = await makeRenter(off);
    const res = await client(off).post("/api/renters/topup", { amount_halala: 100 }, r.headers);
    expect(res.status).toBe(403);
    expect(res.body.error).toBe("direct topup is disabled on this server (SVC_ALLOW_TOPUP=off); use POST /api/payments/topup");
  });
});

describe("production", () => {
  const prod = useTestServer({ NODE_ENV: "production" });

  it("refuses the direct topup with a pointer to the payments flow", async () => {
    const r = await makeRenter(prod);
    const res = await client(prod.url).post("/api/renters/topup", { amount_halala: 100 }, r.headers);
    expect(res.status).toBe(403);
    expect(res.body.error).toMatch(/disabled in production.*SVC_ALLOW_TOPUP.*\/api\/payments\/topup/);
  });

  it("requires https webhooks that do not point at private or loopback hosts", async () => {
    const r = await makeRenter(prod);
    const p = client(prod.url);
    for (const url of ["http://example.com/h", "https://127.0.0.1/h", "https://10.1.2.3/h", "https://[::1]/h", "https://localhost/h", "https://192.168.1.1/h", "https://169.254.169.254/latest"]) {
      const res = await p.patch("/api/renters/me", { webhook_url: url }, r.headers);
      expect(res.status, url).toBe(400);
    }
    const ok = await p.patch("/api/renters/me", { webhook_url: "https://hooks.example.com/x" }, r.headers);
    expect(ok.status).toBe(200);
  });
});

describe("production with SVC_ALLOW_TOPUP", () => {
  it("allows the direct topup when explicitly enabled", async () => {
    const prod = await startTestServer({ NODE_ENV: "production", SVC_ALLOW_TOPUP: "on" });
    try {
      const r = await makeRenter(prod);
      const res = await client(prod.url).post("/api/renters/topup", { amount_halala: 100 }, r.headers);
      expect(res.status).toBe(200);
    } finally {
      await prod.close();
    }
  });
});
