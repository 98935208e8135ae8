// The console's lists in a real browser: each says how many rows there are
// and pages through them ("1–100 of 101", previous and next), a filter goes
// back to the first page, an id filter that is not a number is refused in
// place (and a polled list does not wipe what is being typed), a filter the
// service refuses shows its reason without the previous rows, and provider
// preferences left blank keep their values.
import type { Page } from "playwright-core";
import { describe, expect, it } from "vitest";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { ADMIN_TOKEN } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { seedJob } from "../admin/helpers.js";
import { shot, useConsoleHarness, watchProblems } from "./browser.js";

const STEP_MS = 30_000;
const poll = <T,>(fn: () => Promise<T> | T) => expect.poll(fn, { timeout: STEP_MS, interval: 100 });
const h = useConsoleHarness();

async function signedIn(role: "renter" | "provider" | "admin", secret: string): Promise<{ page: Page; problems: string[] }> {
  const ctx = await h.context();
  await ctx.addInitScript((s) => sessionStorage.setItem("svc-console-session", s), JSON.stringify({ role, secret, label: "Lists" }));
  const page = await ctx.newPage();
  return { page, problems: watchProblems(page) };
}

const pages = (page: Page) => page.getByRole("navigation", { name: "Pages" });
const rangeOf = (page: Page) => pages(page).locator("span").first().textContent();
const jobIds = (page: Page) => page.locator("tr[data-job]").evaluateAll((trs) => trs.map((tr) => tr.getAttribute("data-job")!));

describe("the console's lists", () => {
  it("the operator pages to the 101st provider waiting for approval and approves it; a filter goes back to the first page", async () => {
    for (let i = 0; i < 101; i++) await makeProvider(h.srv, { approved: false, online: false });
    const { page, problems } = await signedIn("admin", ADMIN_TOKEN);
    await page.goto(`${h.srv.url}/#/admin/providers`);
    const rows = page.locator("tr[data-provider]");
    await poll(() => rangeOf(page)).toBe("1–100 of 101");
    expect(await rows.count()).toBe(100);
    expect(await pages(page).getByRole("button", { name: "Previous" }).isDisabled()).toBe(true);

    await pages(page).getByRole("button", { name: "Next" }).click();
    await poll(() => rangeOf(page)).toBe("101–101 of 101");
    expect(await rows.count()).toBe(1);
    await shot(page, "operator-providers-page-2");
    expect(await pages(page).getByRole("button", { name: "Next" }).isDisabled()).toBe(true);

    // Another filter starts at its first page.
    await page.getByLabel("Approval", { exact: true }).selectOption("");
    await poll(() => rangeOf(page)).toMatch(/^1–100 of \d+$/);
    await page.getByLabel("Approval", { exact: true }).selectOption("pending");
    await poll(() => rangeOf(page)).toBe("1–100 of 101");

    // Approving the one provider of the last page leaves it empty: the list goes back to the page before.
    await pages(page).getByRole("button", { name: "Next" }).click();
    await poll(() => rangeOf(page)).toBe("101–101 of 101");
    const last = await rows.first().getAttribute("data-provider");
    await rows.first().getByRole("button", { name: /^Approve / }).click();
    await poll(() => rangeOf(page)).toBe("1–100 of 100");
    expect(await rows.count()).toBe(100);
    expect((await h.srv.sql`SELECT approval_status FROM providers WHERE id = ${Number(last)}`)[0].approval_status).toBe("approved");
    expect(problems).toEqual([]);
  }, 180_000);

  it("a renter with more than 50 jobs pages to the older ones", async () => {
    const renter = await makeRenter(h.srv, 1_000_000);
    const seeded: string[] = [];
    for (let i = 0; i < 51; i++) seeded.push((await seedJob(h.srv, { renterId: renter.id, status: "queued", cost: 10 })).jobId);
    const { page, problems } = await signedIn("renter", renter.key);
    await page.goto(`${h.srv.url}/#/renter/jobs`);
    await poll(() => rangeOf(page)).toBe("1–50 of 51");
    const first = await jobIds(page);
    expect(first).toHaveLength(50);
    await pages(page).getByRole("button", { name: "Next" }).click();
    await poll(() => rangeOf(page)).toBe("51–51 of 51");
    const second = await jobIds(page);
    expect([...first, ...second].sort()).toEqual([...seeded].sort());
    // The oldest comes last.
    expect(second).toEqual([seeded[0]]);
    await page.getByLabel("Status").selectOption("queued");
    await poll(() => rangeOf(page)).toBe("1–50 of 51");
    expect(problems).toEqual([]);
  }, 120_000);

  it("the provider's earnings list pages through the jobs it served", async () => {
    const renter = await makeRenter(h.srv, 1_000_000);
    const provider = await makeProvider(h.srv);
    for (let i = 0; i < 51; i++) await seedJob(h.srv, { renterId: renter.id, providerId: provider.id, status: "running", cost: 10 });
    const { page, problems } = await signedIn("provider", provider.key);
    await page.goto(`${h.srv.url}/#/provider/earnings`);
    await poll(() => rangeOf(page)).toBe("1–50 of 51");
    await pages(page).getByRole("button", { name: "Next" }).click();
    await poll(() => rangeOf(page)).toBe("51–51 of 51");
    expect(await page.getByTestId("earnings-jobs").locator("tr[data-job]").count()).toBe(1);
    expect(problems).toEqual([]);
  }, 120_000);

  it("every operator list, and the renter's payments, say how many rows there are", async () => {
    const api = client(h.srv.url);
    const renter = await makeRenter(h.srv);
    expect((await api.post("/api/payments/topup", { amount_halala: 1_000, source_type: "sandbox" }, renter.headers)).status).toBe(201);
    const image = `ghcr.io/acme/lists:1.0@sha256:${"a".repeat(64)}`;
    expect((await api.post("/api/registry/requests", { image, reason: "lists" }, renter.headers)).status).toBe(201);
    const mine = await signedIn("renter", renter.key);
    await mine.page.goto(`${h.srv.url}/#/renter`);
    await poll(() => rangeOf(mine.page)).toBe("1–1 of 1");
    expect(mine.problems).toEqual([]);

    const count = async (table: string) => Number((await h.srv.sql`SELECT count(*)::int AS n FROM ${h.srv.sql(table)}`)[0].n);
    const { page, problems } = await signedIn("admin", ADMIN_TOKEN);
    for (const [path, table] of [["renters", "renters"], ["jobs", "jobs"], ["payments", "payments"], ["audit", "audit_log"], ["registry", "image_requests"]]) {
      await page.goto(`${h.srv.url}/#/admin/${path}`);
      const n = await count(table);
      expect(n, table).toBeGreaterThan(0);
      await poll(() => rangeOf(page)).toBe(`1–${Math.min(n, path === "registry" ? 50 : 100)} of ${n}`);
    }
    expect(problems).toEqual([]);
  }, 120_000);

  it("the operator's id filters refuse what is not a number instead of listing everything", async () => {
    const renter = await makeRenter(h.srv, 1_000_000);
    for (let i = 0; i < 3; i++) await seedJob(h.srv, { renterId: renter.id, status: "queued", cost: 10 });
    const { page, problems } = await signedIn("admin", ADMIN_TOKEN);
    await page.goto(`${h.srv.url}/#/admin/jobs`);
    await page.locator("tr[data-job]").first().waitFor({ timeout: STEP_MS });
    // The list reloads every 5 s: what is being typed stays in the field meanwhile.
    await page.getByLabel("Renter id").fill("abc");
    await page.waitForResponse((r) => r.url().endsWith("/svc.v1.AdminService/ListJobs"), { timeout: STEP_MS });
    await page.waitForTimeout(200);
    expect(await page.getByLabel("Renter id").inputValue()).toBe("abc");
    await page.getByLabel("Renter id").press("Enter");
    await poll(() => page.getByRole("alert").textContent()).toBe("Renter id must be a whole number, e.g. 42.");
    expect(await page.locator("tr[data-job]").count()).toBe(0);
    expect(await page.getByLabel("Renter id").getAttribute("aria-invalid")).toBe("true");
    await page.getByLabel("Renter id").fill(` ${renter.id} `);
    await page.getByLabel("Renter id").press("Enter");
    await poll(() => rangeOf(page)).toBe("1–3 of 3");
    expect(await page.getByRole("alert").count()).toBe(0);

    // Typed once the page has its first list, as on the jobs page above.
    const listed = page.waitForResponse((r) => r.url().endsWith("/svc.v1.AdminService/ListPayments"), { timeout: STEP_MS });
    await page.getByRole("link", { name: "Payments" }).click();
    await page.getByRole("heading", { name: "Payments", level: 1 }).waitFor({ timeout: STEP_MS });
    await listed;
    await page.getByLabel("Renter id").fill("12x");
    await page.getByLabel("Renter id").press("Enter");
    await poll(() => page.getByRole("alert").textContent()).toBe("Renter id must be a whole number, e.g. 42.");
    expect(await page.getByRole("table").count()).toBe(0);
    expect(problems).toEqual([]);
  }, 120_000);

  it("a filter or id the service refuses shows its reason alone, never the rows or figures of the one before", async () => {
    const renter = await makeRenter(h.srv, 123_456);
    for (let i = 0; i < 2; i++) await seedJob(h.srv, { renterId: renter.id, status: "queued", cost: 10 });
    const { page, problems } = await signedIn("admin", ADMIN_TOKEN);
    await page.goto(`${h.srv.url}/#/admin/jobs`);
    await page.locator("tr[data-job]").first().waitFor({ timeout: STEP_MS });
    await page.getByLabel("Job type").fill("nonsense");
    await page.getByLabel("Job type").press("Enter");
    await poll(() => page.getByRole("alert").textContent()).toMatch(/^job_type must be one of /);
    // Not the unfiltered list under the error, as if it were what the filter selects.
    expect(await page.locator("tr[data-job]").count()).toBe(0);
    expect(await pages(page).count()).toBe(0);

    // One renter's page, then (the address edited) one that does not exist: not the first one's balance.
    await page.goto(`${h.srv.url}/#/admin/renters/${renter.id}`);
    await poll(() => page.getByTestId("renter-balance").textContent()).toContain("1,234.56 SAR");
    await page.evaluate(() => (location.hash = "#/admin/renters/999999999"));
    await poll(() => page.getByRole("alert").first().textContent()).toMatch(/not found/i);
    expect(await page.getByTestId("renter-balance").count()).toBe(0);
    expect(problems).toEqual([]);
  }, 60_000);

  it("a provider preference left blank keeps its value", async () => {
    const provider = await makeProvider(h.srv);
    await h.srv.sql`UPDATE providers SET gpu_usage_cap_pct = 80, temp_limit_c = 83 WHERE id = ${provider.id}`;
    const { page, problems } = await signedIn("provider", provider.key);
    await page.goto(`${h.srv.url}/#/provider/settings`);
    await page.getByLabel("GPU usage cap (%)").fill("");
    await page.getByLabel("Temperature limit (°C)").fill("");
    await page.getByLabel("VRAM kept free (GB)").fill("2.5");
    await page.getByRole("button", { name: "Save preferences" }).click();
    await page.getByText("Saved.").waitFor({ timeout: STEP_MS });
    const [p] = await h.srv.sql`SELECT gpu_usage_cap_pct, temp_limit_c, vram_reserve_gb FROM providers WHERE id = ${provider.id}`;
    expect({ cap: p.gpu_usage_cap_pct, temp: p.temp_limit_c, vram: Number(p.vram_reserve_gb) }).toEqual({ cap: 80, temp: 83, vram: 2.5 });
    // The form shows what the service kept.
    expect(await page.getByLabel("GPU usage cap (%)").inputValue()).toBe("80");
    expect(await page.getByLabel("Temperature limit (°C)").inputValue()).toBe("83");
    expect(problems).toEqual([]);
  }, 60_000);
});
