// The operator's receipt keys in a real browser against a real server: the
// server keys with their status (the current one listed), provider keys
// counted and paged; a rotation after its confirmation (dismissed: nothing
// rotates; a lost connection said in place) makes a new current key and
// retires the old one; a revocation asks for a reason in the form (none:
// refused there, nothing sent), then marks the key revoked in the database and
// the audit log, says how many receipts it signed again, and names a key that
// was revoked meanwhile as such; renters and providers have no such view.
import crypto from "node:crypto";
import type { Page } from "playwright-core";
import { describe, expect, it } from "vitest";
import { ADMIN_TOKEN } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { ed25519Signer, keyIdOf } from "../../src/shared/receipt.js";
import { shot, signedIn, useConsoleHarness } from "./browser.js";

const STEP_MS = 20_000;
const poll = <T,>(fn: () => Promise<T> | T) => expect.poll(fn, { timeout: STEP_MS, interval: 100 });
// The re-signing sweep off: the receipts a revocation signs again are the ones its answer counts.
const h = useConsoleHarness({ SVC_RECEIPT_RESIGN_SECONDS: "0" });
const api = client(h.srv);
const ADMIN = { "x-admin-token": ADMIN_TOKEN };

interface KeyRow {
  key_id: string;
  retired_at: Date | null;
  revoked_at: Date | null;
  revocation_reason: string | null;
}
const keyRows = () => h.srv.sql<KeyRow[]>`SELECT key_id, retired_at, revoked_at, revocation_reason FROM receipt_keys ORDER BY created_at, key_id`;
const currentInDb = async () => (await keyRows()).filter((k) => k.retired_at === null).map((k) => k.key_id);
/** The current key as the public listing says (which makes the first key when there is none yet). */
async function currentKeyId(): Promise<string> {
  const r = await api.get("/api/receipts/keys");
  expect(r.status, r.text).toBe(200);
  return (r.body.server_keys as { key_id: string; current: boolean }[]).find((k) => k.current)!.key_id;
}
const audit = (action: string, target: string) =>
  h.srv.sql<{ actor: string; details: Record<string, unknown> }[]>`SELECT actor, details FROM audit_log WHERE action = ${action} AND target_id = ${target} ORDER BY id`;

async function keysPage() {
  const { page, problems, ctx } = await signedIn(h, "admin", ADMIN_TOKEN);
  await page.goto(`${h.srv.url}/#/admin/receipt-keys`);
  await page.getByRole("heading", { name: "Receipt keys", level: 1 }).waitFor();
  return { page, problems, ctx };
}
const serverRow = (page: Page, keyId: string) => page.getByTestId("server-keys").locator(`tr[data-key="${keyId}"]`);
const statusOf = (page: Page, keyId: string) => serverRow(page, keyId).locator("td").nth(1).innerText();

/** `n` settled jobs (cancelled while queued: each gets its receipt at once), signed by the key current now. */
async function settledJobs(n: number) {
  const renter = await makeRenter(h.srv, 100_000);
  await makeProvider(h.srv); // a job is taken only while a provider is online
  const ids: string[] = [];
  for (let i = 0; i < n; i++) {
    const s = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 1 }, renter.headers);
    expect(s.status, s.text).toBe(201);
    const c = await api.post(`/api/jobs/${s.body.job.job_id}/cancel`, {}, renter.headers);
    expect(c.status, c.text).toBe(200);
    ids.push(s.body.job.job_id);
  }
  return ids;
}

describe("the operator's receipt keys", () => {
  it("list the server keys with the current one, and the provider keys counted, paged and by provider", async () => {
    const current = await currentKeyId();
    // 6 providers with 18 registered keys each: 108 keys, two pages of 100.
    const providers = [];
    for (let i = 0; i < 6; i++) providers.push(await makeProvider(h.srv));
    const rows = providers.flatMap((p) =>
      Array.from({ length: 18 }, () => {
        const publicKey = ed25519Signer(crypto.randomBytes(32)).publicKey;
        return { key_id: keyIdOf("prv", publicKey), provider_id: p.id, public_key: publicKey };
      }),
    );
    await h.srv.sql`INSERT INTO provider_keys ${h.srv.sql(rows)}`;

    const { page, problems } = await keysPage();
    await poll(() => statusOf(page, current)).toContain("current");
    expect(await serverRow(page, current).getByRole("button", { name: `Revoke ${current}` }).count()).toBe(1);

    const provider = page.getByRole("region", { name: "Provider keys" });
    await poll(() => provider.getByTestId("provider-keys-total").innerText()).toContain("108");
    expect(await provider.getByTestId("provider-keys").locator("tbody tr").count()).toBe(100);
    await poll(() => provider.getByRole("navigation", { name: "Pages" }).innerText()).toContain("1–100 of 108");
    await provider.getByRole("button", { name: "Next" }).click();
    await poll(() => provider.getByRole("navigation", { name: "Pages" }).innerText()).toContain("101–108 of 108");
    expect(await provider.getByTestId("provider-keys").locator("tbody tr").count()).toBe(8);

    const one = providers[2];
    await provider.getByLabel("Provider id").fill(String(one.id));
    await provider.getByLabel("Provider id").press("Enter");
    await poll(() => provider.getByTestId("provider-keys-total").innerText()).toContain("18");
    const shownKeys = await provider.getByTestId("provider-keys").locator("tbody tr").evaluateAll((trs) => trs.map((tr) => tr.getAttribute("data-key")));
    expect(shownKeys.sort()).toEqual(rows.filter((r) => r.provider_id === one.id).map((r) => r.key_id).sort());

    await provider.getByLabel("Provider id").fill("seven");
    await provider.getByLabel("Provider id").press("Enter");
    await poll(() => provider.getByRole("alert").innerText()).toContain("Provider id must be a whole number");
    expect(problems).toEqual([]);
  }, 60_000);

  it("rotate after a confirmation: a new current key, the old one retired; dismissed, nothing rotates; a lost connection is said in place", async () => {
    const before = await currentKeyId();
    const { page, problems, ctx } = await keysPage();
    await poll(() => statusOf(page, before)).toContain("current");

    await page.getByRole("button", { name: "Rotate key…" }).click();
    const confirm = page.getByRole("group", { name: "Confirm rotation" });
    expect(await confirm.innerText()).toMatch(/retired.*stays published/s);
    await confirm.getByRole("button", { name: "Keep the current key" }).click();
    expect(await confirm.count()).toBe(0);
    expect(await currentInDb()).toEqual([before]);

    await page.getByRole("button", { name: "Rotate key…" }).click();
    await ctx.setOffline(true);
    await page.getByRole("button", { name: "Yes, rotate the key" }).click();
    await poll(() => page.getByRole("region", { name: "Server keys" }).getByRole("alert").innerText()).toContain("Lost connection");
    await ctx.setOffline(false);
    expect(await currentInDb()).toEqual([before]);

    await page.getByRole("button", { name: "Yes, rotate the key" }).click();
    await poll(async () => (await currentInDb())[0]).not.toBe(before);
    const [after] = await currentInDb();
    expect(await currentKeyId()).toBe(after);
    await poll(() => page.getByRole("status").innerText()).toBe(`${after} is now the current key; ${before} is retired and stays published.`);
    await poll(() => statusOf(page, after)).toContain("current");
    await poll(() => statusOf(page, before)).toContain("retired");
    expect(await serverRow(page, before).locator("td").nth(3).innerText()).toMatch(/UTC$/);
    expect(await page.getByRole("region", { name: "Server keys" }).getByRole("alert").count()).toBe(0);
    const old = (await keyRows()).find((k) => k.key_id === before)!;
    expect(old.retired_at).not.toBeNull();
    expect(old.revoked_at).toBeNull();
    expect((await audit("receipts.rotate_key", after)).map((a) => [a.actor, a.details.retired_key_id])).toEqual([["admin", before]]);
    expect(problems.filter((p) => !/ERR_INTERNET_DISCONNECTED|Failed to fetch/.test(p))).toEqual([]);
  }, 60_000);

  it("revoke a key with the reason the form requires: revoked in the database and the audit log, its receipts signed again", async () => {
    const revoked = await currentKeyId();
    const jobs = await settledJobs(2);
    const { page, problems } = await keysPage();
    const sent: string[] = [];
    page.on("request", (req) => {
      if (req.url().endsWith("/svc.v1.ReceiptService/RevokeReceiptKey")) sent.push(req.postData() ?? "");
    });
    await serverRow(page, revoked).getByRole("button", { name: `Revoke ${revoked}` }).click();
    const form = page.getByRole("region", { name: `Revoke ${revoked}` });
    const says = await form.innerText();
    expect(says).toMatch(/verifiers .* refuse every receipt it signed/s);
    expect(says).toMatch(/signed again with the current key/);
    expect(says).toMatch(/This is the current key: a new key is made current/);

    // No reason, or only spaces: refused in the form, nothing sent.
    await form.getByRole("button", { name: "Revoke the key" }).click();
    await poll(() => form.getByRole("alert").innerText()).toContain("Give a reason");
    await form.getByLabel("Reason").fill("   ");
    await form.getByLabel("Reason").press("Enter");
    await poll(() => form.getByRole("alert").innerText()).toContain("Give a reason");
    expect(sent).toEqual([]);
    expect((await keyRows()).find((k) => k.key_id === revoked)!.revoked_at).toBeNull();

    await form.getByLabel("Reason").fill("seed in a leaked backup");
    await form.getByRole("button", { name: "Revoke the key" }).click();
    // The call's answer: the key revoked, then its receipts signed again (the page says so once both are done).
    await poll(() => page.getByRole("status").innerText()).toMatch(new RegExp(`^Revoked ${revoked}\\. `));
    const row = (await keyRows()).find((k) => k.key_id === revoked)!;
    expect(row.revoked_at).not.toBeNull();
    expect(row.revocation_reason).toBe("seed in a leaked backup");
    const [next] = await currentInDb();
    expect(next).not.toBe(revoked);
    expect(await page.getByRole("status").innerText()).toBe(
      `Revoked ${revoked}. 2 receipts signed again with ${next} now; every receipt it signed is signed by a key in force. ${next} is now the current key.`,
    );
    expect((await audit("receipts.revoke_key", revoked)).map((a) => [a.actor, a.details.reason, a.details.current_key_id])).toEqual([
      ["admin", "seed in a leaked backup", next],
    ]);
    // The two receipts it signed are served signed by the new key.
    const signatures = await h.srv.sql<{ key_id: string }[]>`
      SELECT s.key_id FROM receipt_signatures s JOIN jobs j ON j.id = s.job_id WHERE j.job_id = ANY(${h.srv.sql.array(jobs)}::text[])`;
    expect(signatures.map((s) => s.key_id)).toEqual([next, next]);

    expect(await form.count()).toBe(0);
    await poll(() => statusOf(page, revoked)).toContain("revoked");
    expect(await serverRow(page, revoked).getByTestId("revocation-reason").innerText()).toBe("seed in a leaked backup");
    expect(await serverRow(page, revoked).getByRole("button").count()).toBe(0);
    await poll(() => statusOf(page, next)).toContain("current");
    expect(sent).toHaveLength(1);
    await shot(page, "operator-receipt-keys");
    // A phone's width: the tables stack, nothing is wider than the screen.
    await page.setViewportSize({ width: 375, height: 800 });
    await poll(() => page.evaluate(() => document.documentElement.scrollWidth)).toBeLessThanOrEqual(375);
    await shot(page, "operator-receipt-keys-375");
    expect(problems).toEqual([]);
  }, 60_000);

  it("say so when the key was revoked meanwhile: its first reason kept, nothing audited again", async () => {
    const retired = await currentKeyId();
    expect((await api.post("/api/admin/receipts/keys/rotate", {}, ADMIN)).status).toBe(200);
    const { page, problems } = await keysPage();
    await poll(() => statusOf(page, retired)).toContain("retired");
    await serverRow(page, retired).getByRole("button", { name: `Revoke ${retired}` }).click();
    const form = page.getByRole("region", { name: `Revoke ${retired}` });
    expect(await form.innerText()).not.toContain("This is the current key");

    const elsewhere = await api.post(`/api/admin/receipts/keys/${retired}/revoke`, { reason: "revoked from the CLI" }, ADMIN);
    expect(elsewhere.status, elsewhere.text).toBe(200);
    await form.getByLabel("Reason").fill("another reason");
    await form.getByLabel("Reason").press("Enter");
    await poll(() => page.getByRole("status").innerText()).toMatch(new RegExp(`^${retired} was already revoked on .* UTC \\(revoked from the CLI\\); nothing changed\\.$`));
    expect((await keyRows()).find((k) => k.key_id === retired)!.revocation_reason).toBe("revoked from the CLI");
    expect(await audit("receipts.revoke_key", retired)).toHaveLength(1);
    await poll(() => statusOf(page, retired)).toContain("revoked");
    expect(problems).toEqual([]);
  }, 60_000);
});

describe("renters and providers", () => {
  it("have no receipt keys view", async () => {
    const renter = await makeRenter(h.srv, 0);
    const provider = await makeProvider(h.srv);
    for (const [role, key, home] of [["renter", renter.key, "Balance"], ["provider", provider.key, "Provider status"]] as const) {
      const { page, problems } = await signedIn(h, role, key);
      await page.goto(`${h.srv.url}/#/${role}/receipt-keys`);
      await page.getByRole("navigation", { name: "Main" }).waitFor();
      expect(await page.getByRole("navigation", { name: "Main" }).getByRole("link", { name: "Receipt keys" }).count()).toBe(0);
      await page.goto(`${h.srv.url}/#/admin/receipt-keys`);
      await page.getByRole("heading", { level: 1, name: home }).waitFor();
      expect(await page.getByRole("heading", { name: "Receipt keys" }).count()).toBe(0);
      expect(await page.getByRole("button", { name: "Rotate key…" }).count()).toBe(0);
      expect(problems).toEqual([]);
    }
    // The service refuses them too.
    expect((await api.post("/api/admin/receipts/keys/rotate", {}, renter.headers)).status).toBe(401);
  }, 60_000);
});
