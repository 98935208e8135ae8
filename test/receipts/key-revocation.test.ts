// Revoking a receipt key: the key is marked revoked (a current one is replaced
// as a rotation would), every receipt stored under it is signed again with the
// current key (documents unchanged) and served with that signature, the
// offline verifier refuses anything signed by a revoked key (a forgery with
// its leaked seed too), re-signing resumes where an interrupted run stopped,
// the keys listing says which keys are revoked, and svc revokes a key and
// verifies receipts accordingly.
import fs from "node:fs";
import path from "node:path";
import { beforeAll, beforeEach, describe, expect, it } from "vitest";
import { startTestServer, useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { receiptReads } from "./helpers.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { clearMarketplace } from "../helpers/isolation.js";
import { tempDir } from "../daemon/helpers.js";
import { runSvc } from "../cli/run-svc.js";
import { ed25519Signer, verifyReceipt } from "../../src/shared/receipt.js";
import { resignBatch, resignRevokedReceipts, revokeReceiptKey } from "../../src/domain/money/receipts.js";

let adminH: Record<string, string>;

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0", SVC_RECEIPT_RESIGN_SECONDS: "0" });
const api = client(srv);
beforeAll(async () => {
  adminH = { "x-admin-token": srv.config.adminToken };
});
beforeEach(() => clearMarketplace(srv));

const reads = receiptReads(api);
const keys = () => reads.keys<{ server_keys: any[]; provider_keys: any[] }>();
const receiptOf = reads.receiptOf;
const currentKeyId = async () => (await keys()).server_keys.find((k) => k.current).key_id as string;
/** A new current key, which has signed nothing yet (receipts of earlier tests stay under the keys before it). */
const freshKey = async () => {
  const r = await api.post("/api/admin/receipts/keys/rotate", {}, adminH);
  expect(r.status, r.text).toBe(200);
  return r.body.current.key_id as string;
};
const revoke = (keyId: string, body?: Record<string, unknown>, headers = adminH) =>
  api.post(`/api/admin/receipts/keys/${encodeURIComponent(keyId)}/revoke`, body, headers);

/** `n` settled jobs of one renter (cancelled while queued: each gets its receipt at once), and the renter. */
async function settledJobs(n: number) {
  const renter = await makeRenter(srv, 100_000);
  await makeProvider(srv, { online: true });
  const ids: string[] = [];
  for (let i = 0; i < n; i++) {
    const s = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 1, priority: 1 }, renter.headers);
    expect(s.status, s.text).toBe(201);
    const id = s.body.job.job_id as string;
    const c = await api.post(`/api/jobs/${id}/cancel`, {}, renter.headers);
    expect(c.status, c.text).toBe(200);
    ids.push(id);
  }
  return { renter, ids };
}

const storedRows = (ids: string[]) =>
  srv.sql`SELECT r.* FROM job_receipts r JOIN jobs j ON j.id = r.job_id WHERE j.job_id = ANY(${srv.sql.array(ids)}::text[]) ORDER BY r.job_id`;

describe("revoking the current key", () => {
  it("makes a new current key, re-signs the key's receipts (documents unchanged), and the verifier refuses the revoked key", async () => {
    const revokedId = await freshKey();
    const { renter, ids } = await settledJobs(3);
    const before = await Promise.all(ids.map((id) => receiptOf(id, renter.headers)));
    for (const f of before) expect(f.signature.key_id).toBe(revokedId);
    const rows = await storedRows(ids);

    expect((await revoke(revokedId, {}, renter.headers)).status).toBe(401);
    const r = await revoke(revokedId, { reason: "seed found in a leaked backup" });
    expect(r.status, r.text).toBe(200);
    expect(r.body.key).toMatchObject({ key_id: revokedId, current: false, revocation_reason: "seed found in a leaked backup" });
    expect(r.body.key.revoked_at).toEqual(expect.any(String));
    expect(r.body.key.retired_at).toEqual(expect.any(String));
    expect(r.body.current).toMatchObject({ current: true, revoked_at: null, retired_at: null });
    const newId = r.body.current.key_id as string;
    expect(newId).not.toBe(revokedId);
    expect(r.body).toMatchObject({ already_revoked: false, receipts_resigned: 3, resigning_done: true });
    expect(await currentKeyId()).toBe(newId);
    expect(await srv.sql`SELECT key_id FROM receipt_keys WHERE retired_at IS NULL`).toEqual([{ key_id: newId }]);

    // The stored receipts are what they were, byte for byte; each is served signed by the new key.
    expect(await storedRows(ids)).toEqual(rows);
    const published = await keys();
    for (const [i, id] of ids.entries()) {
      const now = await receiptOf(id, renter.headers);
      expect(now.receipt).toEqual(before[i].receipt);
      expect(now.receipt.signer.key_id).toBe(revokedId);
      expect(now.signature).toMatchObject({ algorithm: "Ed25519", key_id: newId });
      const v = verifyReceipt(now, published);
      expect(v.problems).toEqual([]);
      expect(v.checks.join("\n")).toMatch(new RegExp(`valid \\(key ${newId}.*re-signed.*${revokedId}`));
      // The copy signed by the revoked key no longer verifies, and says to fetch it again.
      const stale = verifyReceipt(before[i], published);
      expect(stale.ok).toBe(false);
      expect(stale.problems.join("\n")).toMatch(new RegExp(`server key ${revokedId} was revoked.*fetch the receipt again from the server`));
    }

    // Anyone holding the leaked seed can sign whatever they like under the revoked key: refused.
    const [{ seed }] = await srv.sql<{ seed: Buffer }[]>`SELECT seed FROM receipt_keys WHERE key_id = ${revokedId}`;
    const forged = structuredClone(before[0].receipt);
    forged.billing.charged_halala += 5000;
    const forgedFile = { receipt: forged, signature: { algorithm: "Ed25519", key_id: revokedId, value: ed25519Signer(seed).signCanonical(forged) } };
    // Before the revocation was published, it would have passed.
    const unrevoked = { server_keys: published.server_keys.map((k) => ({ ...k, revoked_at: null })) };
    expect(verifyReceipt(forgedFile, unrevoked).ok).toBe(true);
    const refused = verifyReceipt(forgedFile, published);
    expect(refused.ok).toBe(false);
    expect(refused.problems.join("\n")).toMatch(/was revoked/);
    // Nor may a receipt name a revoked signer that it was not issued under: the re-signature covers only the stored document.
    const resigned = await receiptOf(ids[0], renter.headers);
    expect(verifyReceipt({ receipt: forged, signature: resigned.signature }, published).ok).toBe(false);
    // A re-signed receipt whose signer is not published as revoked is not taken.
    const notRevoked = { server_keys: published.server_keys.map((k) => (k.key_id === revokedId ? { ...k, revoked_at: null } : k)) };
    expect(verifyReceipt(resigned, notRevoked).problems.join("\n")).toMatch(/is not the signer the receipt names/);

    // New receipts are signed by the new key alone.
    const { ids: later } = await settledJobs(1);
    const fresh = await receiptOf(later[0], adminH);
    expect(fresh.signature.key_id).toBe(newId);
    expect(fresh.receipt.signer.key_id).toBe(newId);
    expect(verifyReceipt(fresh, published).ok).toBe(true);

    // The keys listing: the revoked key with when and why, the others not revoked.
    const listed = published.server_keys.find((k) => k.key_id === revokedId);
    expect(listed).toMatchObject({ revoked_at: r.body.key.revoked_at, revocation_reason: "seed found in a leaked backup", current: false });
    expect(published.server_keys.find((k) => k.key_id === newId)).toMatchObject({ revoked_at: null, revocation_reason: null, current: true });
    expect((await api.get(`/api/receipts/keys?key_id=${revokedId}`)).body.server_keys).toEqual([listed]);

    // Audited as the rotation is, once.
    const audit = await srv.sql`SELECT * FROM audit_log WHERE action = 'receipts.revoke_key' AND target_id = ${revokedId}`;
    expect(audit).toHaveLength(1);
    expect(audit[0]).toMatchObject({ actor: "admin", target_type: "receipt_key", details: expect.objectContaining({ reason: "seed found in a leaked backup", current_key_id: newId }) });

    // Revoking it again answers its revocation as it stands: nothing changes, nothing is audited again.
    const again = await revoke(revokedId, { reason: "another reason" });
    expect(again.status, again.text).toBe(200);
    expect(again.body).toMatchObject({ already_revoked: true, resigning_done: true, receipts_resigned: 0 });
    expect(again.body.key).toEqual(r.body.key);
    expect(again.body.current.key_id).toBe(newId);
    expect(await srv.sql`SELECT 1 FROM audit_log WHERE action = 'receipts.revoke_key' AND target_id = ${revokedId}`).toHaveLength(1);
  });

  it("answers 404 for an unknown key, 400 for a key id or reason too long; the body is optional", async () => {
    await keys();
    const unknown = await revoke("srv-0000000000000000", {});
    expect(unknown.status).toBe(404);
    expect(unknown.body.error).toMatch(/receipt key srv-0000000000000000 not found/);
    expect((await revoke("x".repeat(65))).status).toBe(400);
    const id = await currentKeyId();
    const long = await revoke(id, { reason: "r".repeat(1001) });
    expect(long.status).toBe(400);
    expect(long.body.error).toMatch(/reason/);
    expect(await currentKeyId()).toBe(id);
    const bare = await api.call("POST", `/api/admin/receipts/keys/${id}/revoke`, undefined, adminH);
    expect(bare.status, bare.text).toBe(200);
    expect(bare.body.key).toMatchObject({ key_id: id, revocation_reason: null });
    expect(bare.body.current.key_id).not.toBe(id);
  });
});

describe("revoking a retired key, and a key that re-signed", () => {
  it("keeps the current key; receipts re-signed by a key revoked later are signed again", async () => {
    const a = await freshKey();
    const { renter, ids } = await settledJobs(2);
    const rot = await api.post("/api/admin/receipts/keys/rotate", {}, adminH);
    expect(rot.status, rot.text).toBe(200);
    const b = rot.body.current.key_id as string;

    // a is retired, not current: revoking it makes no new key.
    const r1 = await revoke(a, { reason: "leak" });
    expect(r1.status, r1.text).toBe(200);
    expect(r1.body).toMatchObject({ current: { key_id: b }, receipts_resigned: 2, resigning_done: true });
    expect(await currentKeyId()).toBe(b);
    for (const id of ids) expect((await receiptOf(id, renter.headers)).signature.key_id).toBe(b);

    // b, which re-signed them, is revoked too: they are signed again by the key that replaces it.
    const r2 = await revoke(b);
    expect(r2.status, r2.text).toBe(200);
    const c = r2.body.current.key_id as string;
    expect([a, b]).not.toContain(c);
    expect(r2.body).toMatchObject({ receipts_resigned: 2, resigning_done: true });
    const published = await keys();
    for (const id of ids) {
      const f = await receiptOf(id, renter.headers);
      expect(f.receipt.signer.key_id).toBe(a);
      expect(f.signature.key_id).toBe(c);
      expect(verifyReceipt(f, published).problems).toEqual([]);
    }
  });

  it("a revocation and rotations at once leave one current key, not revoked", async () => {
    await keys();
    const id = await currentKeyId();
    const replies = await Promise.all([revoke(id), ...[0, 1, 2].map(() => api.post("/api/admin/receipts/keys/rotate", {}, adminH))]);
    expect(replies.map((r) => r.status)).toEqual([200, 200, 200, 200]);
    const current = await srv.sql`SELECT key_id, revoked_at FROM receipt_keys WHERE retired_at IS NULL`;
    expect(current).toHaveLength(1);
    expect(current[0].revoked_at).toBeNull();
    const [k] = await srv.sql`SELECT retired_at, revoked_at FROM receipt_keys WHERE key_id = ${id}`;
    expect(k.revoked_at).not.toBeNull();
    expect(k.retired_at).not.toBeNull();
  });
});

describe("a settlement signing while the key is revoked", () => {
  it("the revocation waits for it, and its receipt is re-signed by the time the revocation answers", async () => {
    const keyId = await freshKey();
    const renter = await makeRenter(srv, 100_000);
    await makeProvider(srv);
    const s = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 1 }, renter.headers);
    expect(s.status, s.text).toBe(201);
    const jobId = s.body.job.job_id as string;

    // Receipts cannot be written for a while: a cancel reads the current key, signs, and waits to store its receipt.
    let release!: () => void;
    const released = new Promise<void>((resolve) => (release = resolve));
    let locked!: () => void;
    const holding = new Promise<void>((resolve) => (locked = resolve));
    const blocker = srv.sql.begin(async (tx) => {
      await tx`LOCK TABLE job_receipts IN SHARE MODE`;
      locked();
      await released;
    });
    await holding;
    const cancelling = api.post(`/api/jobs/${jobId}/cancel`, {}, renter.headers);
    await expect
      .poll(async () => (await srv.sql`SELECT 1 FROM pg_locks WHERE relation = 'job_receipts'::regclass AND NOT granted`).length)
      .toBeGreaterThan(0);

    let answered = false;
    const revoking = revoke(keyId).then((r) => ((answered = true), r));
    await new Promise((r) => setTimeout(r, 300));
    expect(answered).toBe(false);
    release();
    await blocker;
    expect((await cancelling).status).toBe(200);
    const r = await revoking;
    expect(r.status, r.text).toBe(200);
    expect(r.body).toMatchObject({ receipts_resigned: 1, resigning_done: true });
    // From the tables, before any read of the receipt could sign it.
    const [row] = await srv.sql`
      SELECT r.key_id, s.key_id AS resigned_by FROM job_receipts r JOIN jobs j ON j.id = r.job_id
      LEFT JOIN receipt_signatures s ON s.job_id = r.job_id
      WHERE j.job_id = ${jobId}`;
    expect(row).toEqual({ key_id: keyId, resigned_by: r.body.current.key_id });
    expect(verifyReceipt(await receiptOf(jobId, renter.headers), await keys()).problems).toEqual([]);
  });
});

describe("re-signing in batches", () => {
  it("resumes after an interruption where it stopped; a receipt read before the sweep reaches it is signed on the read", async () => {
    const keyId = await freshKey();
    const { renter, ids } = await settledJobs(7);
    const signatures = () => srv.sql<{ job_id: number; key_id: string; created_at: Date; value: string }[]>`
      SELECT s.* FROM receipt_signatures s JOIN jobs j ON j.id = s.job_id WHERE j.job_id = ANY(${srv.sql.array(ids)}::text[]) ORDER BY s.job_id`;
    // The revocation committed, then the process stopped after one batch of 3.
    await srv.sql.begin((tx) => revokeReceiptKey(tx, keyId, "interrupted"));
    expect(await resignBatch(srv.sql, keyId, 3)).toEqual({ resigned: 3, done: false });
    const first = await signatures();
    expect(first).toHaveLength(3);
    const [progress] = await srv.sql`SELECT resign_cursor, resigned_at FROM receipt_keys WHERE key_id = ${keyId}`;
    expect(progress).toEqual({ resign_cursor: first[2].job_id, resigned_at: null });

    // A renter reads a receipt the sweep has not reached: it is signed there and then.
    const current = await currentKeyId();
    const early = await receiptOf(ids[6], renter.headers);
    expect(early.signature.key_id).toBe(current);
    expect(verifyReceipt(early, await keys()).problems).toEqual([]);

    // The sweep carries on from the cursor: the 3 done are not signed again, the one signed on read is skipped.
    expect(await resignRevokedReceipts(srv.sql, { batch: 2 })).toEqual({ resigned: 3, done: true });
    const all = await signatures();
    expect(all).toHaveLength(7);
    expect(all.slice(0, 3)).toEqual(first);
    const [finished] = await srv.sql`SELECT resigned_at FROM receipt_keys WHERE key_id = ${keyId}`;
    expect(finished.resigned_at).not.toBeNull();
    // Nothing is left: a later sweep finds nothing to do.
    expect(await resignRevokedReceipts(srv.sql)).toEqual({ resigned: 0, done: true });

    const published = await keys();
    for (const id of ids) {
      const f = await receiptOf(id, renter.headers);
      expect(f.signature.key_id).toBe(current);
      expect(verifyReceipt(f, published).problems).toEqual([]);
    }
  });

  it("the server's periodic sweep finishes what a revocation left", async () => {
    const keyId = await freshKey();
    const { renter, ids } = await settledJobs(2);
    await srv.sql.begin((tx) => revokeReceiptKey(tx, keyId, null));
    expect(await srv.sql`SELECT 1 FROM receipt_signatures s JOIN jobs j ON j.id = s.job_id WHERE j.job_id = ANY(${srv.sql.array(ids)}::text[])`).toHaveLength(0);
    // Another process of the same database, with the sweep on.
    const other = await startTestServer({ SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0", SVC_RECEIPT_RESIGN_SECONDS: "1" }, srv.databaseUrl);
    try {
      await expect
        .poll(async () => (await srv.sql`SELECT resigned_at FROM receipt_keys WHERE key_id = ${keyId}`)[0].resigned_at, { timeout: 10_000 })
        .not.toBeNull();
    } finally {
      await other.close();
    }
    const rows = await srv.sql`SELECT 1 FROM receipt_signatures s JOIN jobs j ON j.id = s.job_id WHERE j.job_id = ANY(${srv.sql.array(ids)}::text[])`;
    expect(rows).toHaveLength(2);
    for (const id of ids) expect(verifyReceipt(await receiptOf(id, renter.headers), await keys()).problems).toEqual([]);
  });
});

// Each svc run starts a Node process: seconds each on a loaded machine.
describe("svc receipt revoke-key, and verify after a revocation", { timeout: 120_000 }, () => {
  it("revokes with the admin token; verify refuses the copy signed by the revoked key and takes the one fetched again", async () => {
    const keyId = await freshKey();
    const { renter, ids } = await settledJobs(1);
    const home = tempDir("svc-revoke-key");
    const stale = path.join(home, "stale.json");
    fs.writeFileSync(stale, (await api.get(`/api/jobs/${ids[0]}/receipt`, renter.headers)).text);

    const r = await runSvc(["--json", "receipt", "revoke-key", keyId, "--reason", "leaked"], { home, env: { SVC_URL: srv.url, SVC_ADMIN_TOKEN: srv.config.adminToken } });
    expect(r.code, r.stderr).toBe(0);
    expect(JSON.parse(r.stdout)).toMatchObject({
      key: { key_id: keyId, revocation_reason: "leaked", current: false },
      already_revoked: false,
      receipts_resigned: 1,
      resigning_done: true,
    });

    const keysFile = path.join(home, "keys.json");
    fs.writeFileSync(keysFile, (await api.get("/api/receipts/keys")).text);
    const refused = await runSvc(["receipt", "verify", stale, "--keys", keysFile], { home });
    expect(refused.code, refused.stderr).toBe(6);
    expect(refused.stdout).toMatch(new RegExp(`FAIL server key ${keyId} was revoked at .* \\(leaked\\): .*fetch the receipt again from the server \\(svc receipt get ${ids[0]}`));

    const fresh = path.join(home, "fresh.json");
    fs.writeFileSync(fresh, (await api.get(`/api/jobs/${ids[0]}/receipt`, renter.headers)).text);
    // From the server, by the ids the receipt names (its revoked signer's among them).
    const ok = await runSvc(["receipt", "verify", fresh, "--url", srv.url], { home });
    expect(ok.code, ok.stdout + ok.stderr).toBe(0);
    expect(ok.stdout).toMatch(new RegExp(`ok\\s+server signature: valid \\(key srv-[0-9a-f]{16}; re-signed: the receipt was issued under key ${keyId}, since revoked\\)`));
  });
});
