// The operator's actions on renters, providers and jobs in a real browser: suspending
// (with the reason asked for; a renter's jobs stopped too when ticked) and
// unsuspending a renter or a provider from the list (from the renter's own page, its
// jobs listed there follow), a
// balance adjustment that a double submit makes once (a refusal's amounts in SAR), a quota where a blank
// field keeps its limit, re-queueing a stuck job from its page, and the
// dashboard's heartbeats without a unit beside a figure the daemon did not send.
import type { Page } from "playwright-core";
import { describe, expect, it } from "vitest";
import { ADMIN_TOKEN } from "../helpers/server.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { seedJob } from "../admin/helpers.js";
import { shot, signedIn, useConsoleHarness } from "./browser.js";

const STEP_MS = 20_000;
const poll = <T,>(fn: () => Promise<T> | T) => expect.poll(fn, { timeout: STEP_MS, interval: 100 });
const h = useConsoleHarness();

const renterStatus = async (id: number) => (await h.srv.sql<{ status: string }[]>`SELECT status FROM renters WHERE id = ${id}`)[0].status;
const audit = (action: string, target: string | number) =>
  h.srv.sql<{ details: Record<string, unknown> }[]>`SELECT details FROM audit_log WHERE action = ${action} AND target_id = ${String(target)} ORDER BY id`;
const alertText = (page: Page) => page.getByRole("alert").first().textContent();

describe("the operator's renters", () => {
  it("are suspended from the list with the reason asked for, and unsuspended; dismissing the question suspends nothing", async () => {
    const r = await makeRenter(h.srv, 0);
    const { page, problems } = await signedIn(h, "admin", ADMIN_TOKEN);
    await page.goto(`${h.srv.url}/#/admin/renters`);
    const row = page.locator(`tr[data-renter="${r.id}"]`);
    await row.waitFor();
    const suspend = row.getByRole("button", { name: "Suspend Renter", exact: true });

    // The question dismissed: nothing is asked of the service.
    const asked: string[] = [];
    page.once("dialog", (d) => {
      asked.push(d.type());
      void d.dismiss();
    });
    await suspend.click();
    expect(asked).toEqual(["prompt"]);
    expect(await renterStatus(r.id)).toBe("active");

    // A reason the service refuses (too long) is shown in the row.
    page.once("dialog", (d) => void d.accept("x".repeat(1001)));
    await suspend.click();
    await poll(() => row.getByRole("alert").textContent()).toMatch(/reason/i);
    expect(await renterStatus(r.id)).toBe("active");

    page.once("dialog", (d) => void d.accept("  chargeback on invoice 17  "));
    await suspend.click();
    await poll(() => row.textContent()).toContain("suspended");
    await shot(page, "operator-renters");
    expect(await row.getByRole("alert").count()).toBe(0);
    expect(await renterStatus(r.id)).toBe("suspended");
    expect((await audit("renter.suspend", r.id)).map((a) => a.details.reason)).toEqual(["chargeback on invoice 17"]);

    // Keyboard: the button is reached and pressed without the mouse.
    await row.getByRole("button", { name: "Unsuspend Renter", exact: true }).focus();
    await page.keyboard.press("Enter");
    await poll(() => suspend.count()).toBe(1);
    expect(await renterStatus(r.id)).toBe("active");
    expect(problems).toEqual([]);
  }, 60_000);

  it("are suspended with their jobs stopped when \"stop its jobs\" is ticked, and the row says how many", async () => {
    const r = await makeRenter(h.srv, 1_000);
    await seedJob(h.srv, { renterId: r.id, cost: 100 });
    await seedJob(h.srv, { renterId: r.id, cost: 100 });
    const { page, problems } = await signedIn(h, "admin", ADMIN_TOKEN);
    await page.goto(`${h.srv.url}/#/admin/renters`);
    const row = page.locator(`tr[data-renter="${r.id}"]`);
    await row.waitFor();
    const asked: string[] = [];
    page.once("dialog", (d) => {
      asked.push(d.message());
      void d.accept("abuse report");
    });
    await row.getByRole("checkbox", { name: "Stop Renter's jobs when suspending" }).check();
    await row.getByRole("button", { name: "Suspend Renter", exact: true }).click();
    await poll(() => row.getByRole("status").textContent()).toBe("2 jobs stopped.");
    expect(asked[0]).toMatch(/cancelled now/);
    expect(await renterStatus(r.id)).toBe("suspended");
    expect((await h.srv.sql<{ status: string }[]>`SELECT status FROM jobs WHERE renter_id = ${r.id}`).map((j) => j.status)).toEqual(["cancelled", "cancelled"]);
    expect((await audit("renter.suspend", r.id)).map((a) => [a.details.stop_jobs, a.details.jobs_stopped])).toEqual([[true, 2]]);
    expect(problems).toEqual([]);
  }, 60_000);

  it("suspended with their jobs stopped from their own page, list those jobs as stopped there", async () => {
    const r = await makeRenter(h.srv, 1_000);
    const job = await seedJob(h.srv, { renterId: r.id, cost: 100 });
    const { page, problems } = await signedIn(h, "admin", ADMIN_TOKEN);
    await page.goto(`${h.srv.url}/#/admin/renters/${r.id}`);
    const latest = page.getByRole("region", { name: "Latest jobs" });
    const status = latest.locator(`tr[data-job="${job.jobId}"] .badge`);
    await poll(() => status.textContent()).toBe("queued");
    page.once("dialog", (d) => void d.accept("abuse report"));
    await page.getByRole("checkbox", { name: "Stop Renter's jobs when suspending" }).check();
    await page.getByRole("button", { name: "Suspend Renter", exact: true }).click();
    await poll(() => page.getByRole("status").first().textContent()).toBe("1 job stopped.");
    await poll(() => status.textContent()).toBe("cancelled");
    expect(problems).toEqual([]);
  }, 60_000);

  it("get a balance adjustment once for a double submit, and a debit beyond the available funds shows the service's reason", async () => {
    const r = await makeRenter(h.srv, 1_000);
    const { page, problems } = await signedIn(h, "admin", ADMIN_TOKEN);
    await page.goto(`${h.srv.url}/#/admin/renters`);
    await page.locator(`tr[data-renter="${r.id}"]`).getByRole("link", { name: "Renter" }).click();
    await poll(() => page.getByTestId("renter-balance").textContent()).toContain("10.00 SAR");

    const adjust = page.getByRole("region", { name: "Adjust balance" });
    const sent: string[] = [];
    page.on("request", (req) => {
      if (req.url().endsWith("/svc.v1.AdminService/AdjustBalance")) sent.push((req.postDataJSON() as { idempotencyKey?: string }).idempotencyKey ?? "");
    });
    await adjust.getByLabel("Amount (SAR)").fill("12.5");
    await adjust.getByLabel("Reason").fill("goodwill credit");
    // Two submits before the page can disable its button (a double click, or Enter pressed twice).
    await adjust.locator("form").evaluate((f: HTMLFormElement) => {
      f.requestSubmit();
      f.requestSubmit();
    });
    await poll(() => adjust.getByRole("status").textContent()).toBe("Credited 12.50 SAR.");
    await poll(() => page.getByTestId("renter-balance").textContent()).toContain("22.50 SAR");
    expect(sent).toHaveLength(2);
    expect(sent[0]).not.toBe("");
    expect(sent[1]).toBe(sent[0]);
    expect((await audit("renter.adjust_balance", r.id)).map((a) => [a.details.amount_halala, a.details.reason])).toEqual([[1250, "goodwill credit"]]);
    expect(await adjust.getByLabel("Amount (SAR)").inputValue()).toBe("");

    // The same adjustment made again on purpose is a new one (a new key): it moves money again.
    await adjust.getByLabel("Amount (SAR)").fill("12.5");
    await adjust.getByLabel("Reason").fill("goodwill credit");
    await adjust.getByRole("button", { name: "Adjust balance" }).click();
    await poll(() => page.getByTestId("renter-balance").textContent()).toContain("35.00 SAR");
    expect(new Set(sent).size).toBe(2);

    // A debit beyond what is available: the service's reason, and the balance as it was.
    await adjust.getByLabel("Amount (SAR)").fill("-1000");
    await adjust.getByLabel("Reason").fill("reverse a mistaken credit");
    await adjust.getByLabel("Reason").press("Enter");
    await poll(() => alertText(page)).toMatch(/available/i);
    // In SAR, as the form asks for the amount and the page shows the balance.
    expect(await alertText(page)).toContain("(available 35.00 SAR)");
    expect(await alertText(page)).not.toMatch(/halala/);
    await shot(page, "operator-renter");
    expect(await page.getByTestId("renter-balance").textContent()).toContain("35.00 SAR");
    expect(problems).toEqual([]);
  }, 60_000);

  it("get a quota set from their page; a blank field keeps its limit, and both blank is refused in place", async () => {
    const r = await makeRenter(h.srv, 0);
    const { page, problems } = await signedIn(h, "admin", ADMIN_TOKEN);
    await page.goto(`${h.srv.url}/#/admin/renters/${r.id}`);
    const quota = page.getByRole("region", { name: "Quota" });
    const facts = page.getByTestId("renter-facts");
    await poll(() => facts.textContent()).toContain("at most 500");

    await quota.getByRole("button", { name: "Save quota" }).click();
    await poll(() => quota.getByRole("alert").textContent()).toContain("Give a daily job limit, a monthly spend limit or both.");

    await quota.getByLabel("Jobs per UTC day").fill("3");
    await quota.getByRole("button", { name: "Save quota" }).click();
    await poll(() => facts.textContent()).toContain("at most 3");
    await poll(() => quota.getByRole("status").textContent()).toBe("Quota saved.");
    expect(await quota.getByRole("alert").count()).toBe(0);

    await quota.getByLabel("Spend per UTC month (SAR)").fill("250.5");
    await quota.getByLabel("Spend per UTC month (SAR)").press("Enter");
    await poll(() => facts.textContent()).toContain("250.50 SAR");
    const [q] = await h.srv.sql`SELECT daily_jobs_limit, monthly_spend_limit_halala FROM renter_quota WHERE renter_id = ${r.id}`;
    expect([Number(q.daily_jobs_limit), Number(q.monthly_spend_limit_halala)]).toEqual([3, 25_050]);
    expect(problems).toEqual([]);
  }, 60_000);
});

describe("the operator's job page", () => {
  it("re-queues a stuck running job with the reason given, and the live status shows its new attempt; a lost connection is said in place", async () => {
    const renter = await makeRenter(h.srv, 10_000);
    const provider = await makeProvider(h.srv);
    const running = await seedJob(h.srv, { renterId: renter.id, providerId: provider.id, status: "running" });
    await h.srv.sql`UPDATE jobs SET started_at = now(), progress_pct = 42 WHERE id = ${running.id}`;
    const { page, problems, ctx } = await signedIn(h, "admin", ADMIN_TOKEN);
    await page.goto(`${h.srv.url}/#/admin/jobs/${running.jobId}`);
    const progress = page.getByRole("progressbar", { name: "Job progress" });
    await poll(() => progress.getAttribute("data-status")).toBe("running");
    const attempt = page.getByTestId("facts").locator("dt:text-is('Attempt') + dd");
    const first = Number(await attempt.textContent());

    await ctx.setOffline(true);
    await page.getByRole("button", { name: "Requeue" }).click();
    await poll(() => alertText(page)).toContain("Lost connection");
    await ctx.setOffline(false);
    expect((await h.srv.sql`SELECT status FROM jobs WHERE id = ${running.id}`)[0].status).toBe("running");

    await page.getByLabel("Requeue reason (optional)").fill("provider stuck");
    await page.getByLabel("Requeue reason (optional)").press("Enter");
    // A new attempt: back in the queue, and placed again at once when a provider is free (this one is).
    await poll(() => attempt.textContent()).toBe(String(first + 1));
    expect(["queued", "pending"]).toContain(await progress.getAttribute("data-status"));
    expect(await page.getByRole("alert").count()).toBe(0);
    expect((await audit("job.requeue", running.jobId)).map((a) => a.details.reason)).toEqual(["provider stuck"]);
    expect(problems.filter((p) => !/ERR_INTERNET_DISCONNECTED|Failed to fetch/.test(p))).toEqual([]);
  }, 60_000);

  it("offers Requeue to the operator only, and only for a pending or running job", async () => {
    const renter = await makeRenter(h.srv, 10_000);
    const provider = await makeProvider(h.srv);
    const pending = await seedJob(h.srv, { renterId: renter.id, providerId: provider.id, status: "pending" });
    const queued = await seedJob(h.srv, { renterId: renter.id });
    const admin = await signedIn(h, "admin", ADMIN_TOKEN);
    await admin.page.goto(`${h.srv.url}/#/admin/jobs/${pending.jobId}`);
    await admin.page.getByRole("button", { name: "Requeue" }).waitFor();
    await admin.page.goto(`${h.srv.url}/#/admin/jobs/${queued.jobId}`);
    await poll(() => admin.page.getByRole("progressbar", { name: "Job progress" }).getAttribute("data-status")).toBe("queued");
    expect(await admin.page.getByRole("button", { name: "Requeue" }).count()).toBe(0);
    const own = await signedIn(h, "renter", renter.key);
    await own.page.goto(`${h.srv.url}/#/renter/jobs/${pending.jobId}`);
    await poll(() => own.page.getByRole("progressbar", { name: "Job progress" }).getAttribute("data-status")).toBe("pending");
    expect(await own.page.getByRole("button", { name: "Requeue" }).count()).toBe(0);
    expect([...admin.problems, ...own.problems]).toEqual([]);
  }, 60_000);
});

describe("the operator's dashboard", () => {
  it("shows a heartbeat's figures with their units, and a dash alone for one the daemon did not send", async () => {
    const silent = await makeProvider(h.srv);
    const reporting = await makeProvider(h.srv);
    await h.srv.sql`UPDATE providers SET gpu_telemetry = ${h.srv.sql.json({ gpu_util_pct: 57, temp_c: 64 })} WHERE id = ${reporting.id}`;
    const { page, problems } = await signedIn(h, "admin", ADMIN_TOKEN);
    await page.goto(`${h.srv.url}/#/admin`);
    const table = page.getByRole("region", { name: "Recent heartbeats" });
    const cells = async (id: number) =>
      (await table.locator("tbody tr", { hasText: new RegExp(`#${id}(?!\\d)`) }).first().locator("td").allInnerTexts()).slice(-2);
    await poll(() => cells(reporting.id)).toEqual(["57%", "64 °C"]);
    expect(await cells(silent.id)).toEqual(["—", "—"]);
    expect(await table.locator("tbody").innerText()).not.toMatch(/—\s*(%|°C)/);
    expect(problems).toEqual([]);
  }, 60_000);
});

describe("the operator's providers", () => {
  it("are suspended from the list with the reason asked for; dismissing the question suspends nothing", async () => {
    const p = await makeProvider(h.srv);
    const providerStatus = async () => (await h.srv.sql<{ status: string }[]>`SELECT status FROM providers WHERE id = ${p.id}`)[0].status;
    const before = await providerStatus();
    const { page, problems } = await signedIn(h, "admin", ADMIN_TOKEN);
    await page.goto(`${h.srv.url}/#/admin/providers`);
    await page.getByLabel("Approval", { exact: true }).selectOption("approved");
    const row = page.locator(`tr[data-provider="${p.id}"]`);
    await row.waitFor();
    const suspend = row.getByRole("button", { name: "Suspend Rig", exact: true });

    const asked: string[] = [];
    page.once("dialog", (d) => {
      asked.push(d.type());
      void d.dismiss();
    });
    await suspend.click();
    expect(asked).toEqual(["prompt"]);
    expect(await providerStatus()).toBe(before);

    page.once("dialog", (d) => void d.accept("  fake GPU telemetry  "));
    await suspend.click();
    await poll(() => row.getByRole("button", { name: "Unsuspend Rig", exact: true }).count()).toBe(1);
    expect(await providerStatus()).toBe("suspended");
    expect((await audit("provider.suspend", p.id)).map((a) => a.details.reason)).toEqual(["fake GPU telemetry"]);
    expect(problems).toEqual([]);
  }, 60_000);
});
