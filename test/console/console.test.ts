// The web console end to end in a real browser (Debian chromium): a renter
// signs up, tops up, submits an image job that a TypeScript stream daemon
// runs with a --runner program, watches the progress bar to done and sees
// the PNG; the provider sees the job in its earnings; an operator approves a
// pending provider and sees the dashboard change. Screenshots of each main
// page go to test-artifacts/console/ (gitignored). Then: a key rotated in one
// tab is kept where that tab's session was (not in another tab's remembered
// session), and the dashboard's chart keeps its labels right as its data changes.
import path from "node:path";
import type { Page } from "playwright-core";
import { afterAll, describe, expect, it } from "vitest";
import { ADMIN_TOKEN } from "../helpers/server.js";
import { client, uniqueEmail } from "../helpers/http.js";
import { makeProvider } from "../helpers/fixtures.js";
import { FIXTURES, start, tempDir, waitFor, writeExecutable, type Spawned } from "../daemon/helpers.js";
import { shot, useConsoleHarness, watchProblems } from "./browser.js";
import { writeRunner } from "./runner.js";

const STEP_MS = 45_000;
/** Polls until the assertion holds; generous, for a loaded CI machine (no timing is asserted). */
const poll = <T,>(fn: () => Promise<T> | T) => expect.poll(fn, { timeout: STEP_MS, interval: 100 });

const h = useConsoleHarness();
let daemon: Spawned | undefined;
const shared = { jobId: "", providerKey: "", providerId: 0 };
const runDir = tempDir("console");
const { runner, release } = writeRunner(runDir);

async function newPage(width = 1280): Promise<Page> {
  const ctx = await h.context({ width, height: 900 });
  const page = await ctx.newPage();
  // Read at the end of each test through `assertNoProblems`.
  (page as Page & { problems?: string[] }).problems = watchProblems(page);
  return page;
}

function assertNoProblems(page: Page) {
  expect((page as Page & { problems?: string[] }).problems ?? []).toEqual([]);
}

function startDaemon(key: string): Spawned {
  const dir = tempDir("console-daemon");
  const smi = writeExecutable(
    dir,
    "nvidia-smi",
    `#!/bin/sh\ncase "$1" in\n  --query-gpu=*) cat '${path.join(FIXTURES, "nvidia-smi-query-2gpu.csv")}' ;;\n  -L) echo 'GPU 0: NVIDIA GeForce RTX 4090 (UUID: GPU-5c7e4b6a)' ;;\n  *) cat '${path.join(FIXTURES, "nvidia-smi.txt")}' ;;\nesac\n`,
  );
  return start(
    process.execPath,
    [
      "bin/svc-daemon.js", "--url", h.srv.url, "--docker", "none", "--nvidia-smi", smi,
      "--state-dir", path.join(dir, "state"), "--heartbeat-seconds", "1", "--stop-grace-seconds", "1",
      "--runner", `image_generation=${process.execPath} ${runner}`,
    ],
    { env: { SVC_API_KEY: key } },
  );
}

// When the browser cannot start, every test below fails with the reason (none is skipped).
afterAll(async () => {
  if (daemon) {
    daemon.kill("SIGKILL");
    await daemon.exited;
  }
});

describe("web console", () => {
  it("is served at / with a self-only Content-Security-Policy, and the job rules come from the server", async () => {
    const res = await fetch(h.srv.url + "/");
    expect(res.status).toBe(200);
    const csp = res.headers.get("content-security-policy") ?? "";
    expect(csp).toContain("default-src 'self'");
    expect(csp).toContain("script-src 'self'");
    expect(csp).toContain("connect-src 'self'");
    expect(csp).not.toMatch(/unsafe-inline|unsafe-eval|https?:/);
    const html = await res.text();
    const js = /src="(\/console\/app\.js\?v=[\w-]+)"/.exec(html)?.[1];
    expect(js).toBeDefined();
    const bundle = await fetch(h.srv.url + js);
    expect(bundle.status).toBe(200);
    expect(bundle.headers.get("content-security-policy")).toBe(csp);
    expect(bundle.headers.get("content-encoding")).toBe("gzip");
    // Nothing the browser runs comes from elsewhere.
    expect(await bundle.text()).not.toMatch(/https?:\/\/(cdn|fonts|unpkg)/);

    const rules = await client(h.srv.url).get("/api/job-types");
    expect(rules.status).toBe(200);
    const image = rules.body.job_types.find((t: { job_type: string }) => t.job_type === "image_generation");
    expect(image.rate_halala_per_minute).toBe(20);
    const steps = image.params.find((p: { name: string }) => p.name === "steps");
    expect(steps).toMatchObject({ type: "integer", minimum: 5, maximum: 100, default_value: 30, required: false });
    expect(image.params.find((p: { name: string }) => p.name === "prompt")).toMatchObject({ type: "string", required: false, default_value: expect.any(String), max_length: 4000 });
    expect(rules.body.duration_minutes).toMatchObject({ minimum: 0.01, maximum: 1440, default_value: 10 });

    // The form's estimate comes from the server's rule (EstimateJob), validated as submit validates.
    const est = await client(h.srv.url).get("/api/job-types/image_generation/estimate?duration_minutes=2.51");
    expect(est.body).toEqual({ job_type: "image_generation", duration_minutes: 2.51, rate_halala_per_minute: 20, estimate_halala: 51 });
    expect((await client(h.srv.url).get("/api/job-types/benchmark/estimate")).body).toMatchObject({ duration_minutes: 10, estimate_halala: 100 });
    const badType = await client(h.srv.url).get("/api/job-types/mining/estimate?duration_minutes=1");
    expect(badType.status).toBe(400);
    expect(badType.body.error).toMatch(/job_type/);
    const badMinutes = await client(h.srv.url).get("/api/job-types/benchmark/estimate?duration_minutes=5000");
    expect(badMinutes.status).toBe(400);
    expect(badMinutes.body.error).toMatch(/duration_minutes/);
  });

  it("a renter signs up, tops up, submits a job, watches it to done and sees the PNG", async () => {
    // The provider whose stream daemon runs image jobs with the --runner program.
    const p = await makeProvider(h.srv, { online: false });
    shared.providerKey = p.key;
    shared.providerId = p.id;
    daemon = startDaemon(p.key);
    await waitFor(async () => (await h.srv.sql`SELECT readiness_status FROM providers WHERE id = ${p.id}`)[0].readiness_status, STEP_MS, "daemon up").catch((err) => {
      throw new Error(`${err.message}: ${daemon!.output()}`);
    });

    const page = await newPage();
    await page.goto(h.srv.url + "/");
    await page.getByLabel("Name", { exact: true }).fill("Lab One");
    const email = uniqueEmail("console");
    await page.getByLabel("Email").first().fill(email);
    await page.getByRole("button", { name: "Create renter account" }).click();
    const key = await page.getByLabel("Your new API key").inputValue();
    expect(key).toMatch(/^svc-renter-/);
    await page.getByRole("button", { name: "Continue to the console" }).click();

    // The key is kept for the tab only: not in localStorage, not in the URL.
    expect(await page.evaluate(() => JSON.stringify(localStorage))).not.toContain(key);
    expect(await page.evaluate(() => sessionStorage.getItem("svc-console-session"))).toContain(key);
    expect(page.url()).not.toContain(key);

    await poll(() => page.getByTestId("balance").textContent()).toContain("0.00 SAR");
    await page.getByRole("button", { name: "Top up (sandbox)" }).isVisible();
    await page.getByLabel("Amount (SAR)").fill("5");
    await page.getByRole("button", { name: "Top up (sandbox)" }).click();
    await poll(() => page.getByTestId("balance").textContent()).toContain("5.00 SAR");
    await poll(() => page.getByRole("cell", { name: "sandbox" }).count()).toBe(1);
    await shot(page, "renter-balance");
    // What a renter owes for a refunded payment is shown only while it owes it.
    expect(await page.getByTestId("refund-owed").count()).toBe(0);
    await h.srv.sql`UPDATE renters SET refund_owed_halala = 150 WHERE email = ${email}`;
    await page.reload();
    await poll(() => page.getByTestId("refund-owed").textContent()).toContain("1.50 SAR");
    await h.srv.sql`UPDATE renters SET refund_owed_halala = 0 WHERE email = ${email}`;

    // A server error is shown in place with the server's message.
    await page.getByRole("link", { name: "New job" }).first().click();
    await page.getByLabel("Job type").selectOption("image_generation");
    await page.getByLabel("prompt (optional)", { exact: true }).fill("a red square");
    await page.getByLabel("steps (optional)").fill("4");
    await page.getByLabel("Duration (minutes)").fill("1");
    await poll(() => page.getByTestId("estimate").textContent()).toContain("0.20 SAR");
    await page.getByLabel("steps (optional)").evaluate((el: HTMLInputElement) => el.removeAttribute("min"));
    await page.getByRole("button", { name: "Submit job" }).click();
    await poll(() => page.getByRole("alert").textContent()).toContain("params.steps must be an integer between 5 and 100");
    await page.getByLabel("steps (optional)").fill("20");
    await shot(page, "renter-submit");
    await page.getByRole("button", { name: "Submit job" }).click();

    // The job page follows the job over the WatchJob server stream (Connect, HTTP/1.1), not by polling.
    const rpcs: string[] = [];
    page.on("request", (r) => {
      const m = /\/svc\.v1\.JobService\/(\w+)$/.exec(r.url());
      if (m) rpcs.push(m[1]);
    });
    await page.waitForURL(/#\/renter\/jobs\/.+/, { timeout: STEP_MS });
    shared.jobId = decodeURIComponent(page.url().split("/").pop()!);
    const bar = page.getByRole("progressbar", { name: "Job progress" });
    // The runner reports 40% and waits: the bar must show it while running.
    await poll(() => bar.getAttribute("aria-valuenow")).toBe("40");
    expect(await bar.getAttribute("data-status")).toBe("running");
    await poll(() => page.getByTestId("facts").textContent()).toMatch(/Started\d/);
    await poll(() => page.getByLabel("Job log").textContent()).toContain("drawing: a red square");
    await shot(page, "renter-job-running");
    release();
    await poll(() => bar.getAttribute("data-status")).toBe("completed");
    expect(await bar.getAttribute("aria-valuenow")).toBe("100");
    expect(rpcs).toContain("WatchJob");
    expect(rpcs.filter((m) => m === "GetLogs" || m === "GetHistory")).toEqual([]);

    const img = page.getByTestId("output-image");
    await img.waitFor({ timeout: STEP_MS });
    await poll(() => img.evaluate((el: HTMLImageElement) => el.complete && el.naturalWidth)).toBe(64);
    expect(await page.getByRole("link", { name: "Download PNG" }).getAttribute("download")).toBe(`${shared.jobId}.png`);
    await poll(() => page.getByTestId("cost").textContent()).toContain("Charged0.20 SAR");
    await shot(page, "renter-job-done");

    await page.getByRole("link", { name: "Jobs" }).first().click();
    await poll(() => page.locator(`tr[data-job="${shared.jobId}"]`).textContent()).toContain("completed");
    await shot(page, "renter-jobs");

    // Key rotation: the new key is shown once and used from then on; the old one stops at once.
    await page.getByRole("link", { name: "Usage & key" }).click();
    await page.getByText("No /v1 requests yet.").waitFor({ timeout: STEP_MS });
    await page.getByRole("button", { name: "Rotate key…" }).click();
    await page.getByRole("button", { name: "Yes, rotate my key" }).click();
    const rotated = await page.getByLabel("Your new API key (shown once)").inputValue();
    expect(rotated).toMatch(/^svc-renter-/);
    expect(rotated).not.toBe(key);
    expect(await page.evaluate(() => sessionStorage.getItem("svc-console-session"))).toContain(rotated);
    expect((await client(h.srv.url).get("/api/renters/balance", { "x-renter-key": key })).status).toBe(401);
    await shot(page, "renter-usage-key");

    // Sign-out forgets the key.
    await page.getByRole("button", { name: "Sign out" }).click();
    expect(await page.evaluate(() => sessionStorage.getItem("svc-console-session"))).toBeNull();
    await page.getByRole("heading", { name: "Sign in to svc" }).waitFor();

    // Back by email (one step here: no email service is configured), remembered this time.
    await page.getByRole("region", { name: "Sign in with email" }).getByLabel("Email").fill(email);
    await page.getByRole("region", { name: "Sign in with email" }).getByRole("checkbox", { name: "Remember me on this device" }).check();
    await page.getByRole("button", { name: "Sign in with email" }).click();
    await poll(() => page.getByTestId("balance").textContent()).toContain("4.80 SAR");
    expect(await page.evaluate(() => localStorage.getItem("svc-console-session"))).toContain("svc-renter-");
    await page.getByRole("button", { name: "Sign out" }).click();
    expect(await page.evaluate(() => localStorage.getItem("svc-console-session") ?? sessionStorage.getItem("svc-console-session"))).toBeNull();
    assertNoProblems(page);
  }, 240_000);

  it("the provider signs in with its key and sees the job in its earnings", async () => {
    expect(shared.jobId, "the renter test ran first").not.toBe("");
    const page = await newPage();
    await page.goto(h.srv.url + "/");
    await page.getByRole("tab", { name: "Provider" }).click();
    await page.getByRole("textbox", { name: "API key" }).fill(shared.providerKey);
    await page.getByRole("textbox", { name: "API key" }).press("Enter");
    await poll(() => page.getByTestId("approval").textContent()).toContain("approved");
    await poll(() => page.getByTestId("provider-status").textContent()).toContain("online");
    // What its daemon declared it runs: the built-in benchmark and its --runner type (no docker).
    // (the status page reloads every 5 s; the declaration is written a moment after its heartbeat)
    await poll(() => page.getByTestId("job-types").textContent()).toMatch(/benchmark, image_generation/);
    // Telemetry charts fill from heartbeats sampled while the page is open.
    await page.getByRole("img", { name: "Temperature (°C)" }).waitFor({ timeout: STEP_MS });
    await shot(page, "provider-status");

    // A lost connection is shown, retried, and cleared once the service answers again.
    await page.context().setOffline(true);
    const banner = page.getByRole("status").filter({ hasText: "Lost connection to the service" });
    await banner.waitFor({ timeout: STEP_MS });
    await page.context().setOffline(false);
    await banner.waitFor({ state: "detached", timeout: STEP_MS });

    await page.getByRole("link", { name: "Earnings" }).click();
    // Scoped to the earnings table: until the new page renders, the status page's job table holds the same row.
    const row = page.getByTestId("earnings-jobs").locator(`tr[data-job="${shared.jobId}"]`);
    await poll(() => row.textContent()).toContain("completed");
    // 75% of the 20 halala charged, rounded down.
    expect(await row.textContent()).toContain("0.15 SAR");
    await poll(() => page.getByTestId("window-earnings").textContent()).toBe("0.15 SAR");
    await page.getByRole("img", { name: "Earned per day (SAR)" }).waitFor();
    await shot(page, "provider-earnings");

    // Preferences and pause go to the service.
    await page.getByRole("link", { name: "Settings" }).click();
    await page.getByLabel("Temperature limit (°C)").fill("77");
    await page.getByRole("button", { name: "Save preferences" }).click();
    await page.getByText("Saved.").waitFor({ timeout: STEP_MS });
    expect((await h.srv.sql`SELECT temp_limit_c FROM providers WHERE id = ${shared.providerId}`)[0].temp_limit_c).toBe(77);
    await page.getByRole("link", { name: "Status" }).click();
    await page.getByRole("button", { name: "Pause (take no new jobs)" }).click();
    await page.getByRole("button", { name: "Resume (take jobs again)" }).waitFor({ timeout: STEP_MS });
    expect((await h.srv.sql`SELECT is_paused FROM providers WHERE id = ${shared.providerId}`)[0].is_paused).toBe(true);
    await page.getByRole("button", { name: "Resume (take jobs again)" }).click();
    await page.getByRole("button", { name: "Pause (take no new jobs)" }).waitFor({ timeout: STEP_MS });

    await page.getByRole("link", { name: "Install" }).click();
    expect(await page.getByTestId("provider-key").textContent()).not.toContain(shared.providerKey);
    await page.getByRole("button", { name: "Show key" }).click();
    expect(await page.getByTestId("provider-key").textContent()).toBe(shared.providerKey);

    // Key rotation (a leaked key): the old key stops at once, the console goes on with the new one,
    // and the Install page shows it.
    await page.getByRole("link", { name: "Settings" }).click();
    await page.getByRole("button", { name: "Rotate key…" }).click();
    await page.getByRole("button", { name: "Yes, rotate my key" }).click();
    const rotated = await page.getByLabel("Your new API key (shown once)").inputValue();
    expect(rotated).toMatch(/^svc-provider-/);
    expect(rotated).not.toBe(shared.providerKey);
    expect((await client(h.srv.url).get("/api/providers/me", { "x-provider-key": shared.providerKey })).status).not.toBe(200);
    await page.getByRole("link", { name: "Install", exact: true }).first().click();
    await page.getByRole("button", { name: "Show key" }).click();
    expect(await page.getByTestId("provider-key").textContent()).toBe(rotated);
    assertNoProblems(page);
  }, 120_000);

  it("an operator approves a pending provider and sees the dashboard figures change", async () => {
    const api = client(h.srv.url);
    const reg = await api.post("/api/providers/register", { name: "Pending Rig", email: uniqueEmail("pending"), gpu_model: "NVIDIA H100 80GB HBM3", os: "linux" });
    expect(reg.status).toBe(200);
    const pendingKey = { "x-provider-key": reg.body.api_key as string };
    const beat = () => api.post("/api/providers/heartbeat", { gpu_status: { gpu_name: "NVIDIA H100 80GB HBM3", gpu_vram_mib: 81559, temp_c: 41, gpu_util_pct: 3 } }, pendingKey);
    expect((await beat()).status).toBe(403);

    // A 375 px wide screen, keyboard only for the sign-in.
    const page = await newPage(375);
    await page.goto(h.srv.url + "/");
    await page.getByRole("tab", { name: "Renter" }).focus();
    await page.keyboard.press("ArrowRight");
    await page.keyboard.press("ArrowRight");
    expect(await page.getByRole("tab", { name: "Operator" }).getAttribute("aria-selected")).toBe("true");
    // The operator's token is kept for the tab only: no "Remember me" is offered.
    expect(await page.getByRole("checkbox", { name: "Remember me on this device" }).count()).toBe(0);
    await page.getByLabel("Admin token").fill("wrong-token");
    await page.keyboard.press("Enter");
    await poll(() => page.getByRole("alert").textContent()).toContain("invalid admin token");
    await page.getByLabel("Admin token").fill(ADMIN_TOKEN);
    await page.keyboard.press("Enter");

    const online = page.getByTestId("online-now");
    await poll(() => online.textContent()).toContain("Online now1");
    expect(await page.evaluate(() => localStorage.length)).toBe(0);
    await poll(() => page.getByTestId("total-providers").textContent()).toContain("2");
    await poll(() => page.getByTestId("completed-jobs").textContent()).toContain("1");
    await poll(() => page.getByTestId("revenue").textContent()).toContain("0.20 SAR");
    // Nothing is wider than the screen.
    expect(await page.evaluate(() => document.documentElement.scrollWidth)).toBeLessThanOrEqual(375);
    await shot(page, "operator-dashboard-375");

    await page.getByRole("button", { name: "Menu" }).click();
    await page.getByRole("link", { name: "Providers" }).click();
    const row = page.locator(`tr[data-provider="${reg.body.provider_id}"]`);
    await row.waitFor({ timeout: STEP_MS });
    // It has not heartbeated, so its daemon declared no job types: it is offered any.
    expect(await row.textContent()).toContain("any job type");
    expect(await page.evaluate(() => document.documentElement.scrollWidth)).toBeLessThanOrEqual(375);
    await shot(page, "operator-providers-375");
    await row.getByRole("button", { name: "Approve Pending Rig" }).click();
    await poll(() => page.getByText("No provider waits for approval.").count()).toBe(1);

    // Approved, its heartbeats are taken: it is online now.
    expect((await beat()).status).toBe(200);
    await page.getByRole("button", { name: "Menu" }).click();
    await page.getByRole("link", { name: "Dashboard" }).click();
    await poll(() => online.textContent()).toContain("Online now2");

    await page.setViewportSize({ width: 1280, height: 900 });
    await page.getByRole("img", { name: "Providers by GPU model" }).waitFor();
    await page.getByRole("img", { name: "Revenue per day (SAR)" }).waitFor();
    await shot(page, "operator-dashboard");

    await page.getByRole("link", { name: "Audit" }).click();
    await poll(() => page.getByRole("cell", { name: /provider.*approve|approve/ }).count()).toBeGreaterThan(0);
    await shot(page, "operator-audit");

    // A renter asks for an image; the operator sees its private reason and approves it with a public description.
    const renter = await api.post("/api/renters/register", { name: "Image Asker", email: uniqueEmail("asker") });
    const image = `ghcr.io/acme/prep:1.0@sha256:${"e".repeat(64)}`;
    const asked = await api.post("/api/registry/requests", { image, reason: "for customer Jane" }, { "x-renter-key": renter.body.api_key });
    expect(asked.status, asked.text).toBe(201);
    await page.getByRole("link", { name: "Registry" }).click();
    await poll(() => page.getByRole("cell", { name: "for customer Jane" }).count()).toBe(1);
    await page.getByLabel(`Public description of ${image}`).fill("Data preparation tools");
    await page.getByRole("row", { name: /acme\/prep:1\.0/ }).getByRole("button", { name: "Approve" }).click();
    await poll(async () => (await api.get("/api/registry/images")).body.images.find((i: { image: string }) => i.image === image)?.description).toBe("Data preparation tools");
    assertNoProblems(page);
  }, 120_000);
});

/** A page of a new context whose tab is signed in as `role` with `secret` (not remembered). */
async function signedInPage(role: "renter" | "provider" | "admin", secret: string): Promise<Page> {
  const ctx = await h.context();
  await ctx.addInitScript((s) => sessionStorage.setItem("svc-console-session", s), JSON.stringify({ role, secret, label: role }));
  return ctx.newPage();
}

describe("a key rotated in the console", () => {
  /** Rotates the provider key of the tab on its Settings page; returns the new key. */
  async function rotate(tab: Page): Promise<string> {
    await tab.goto(`${h.srv.url}/#/provider/settings`);
    await tab.reload();
    await tab.getByRole("button", { name: "Rotate key…" }).click({ timeout: STEP_MS });
    await tab.getByRole("button", { name: "Yes, rotate my key" }).click();
    const input = tab.getByLabel("Your new API key (shown once)");
    await input.waitFor({ timeout: STEP_MS });
    const key = await input.inputValue();
    expect(key).toMatch(/^svc-provider-/);
    return key;
  }

  it("is kept where the tab's own session was: not over another tab's remembered session, and in localStorage when remembered", async () => {
    const rig = await makeProvider(h.srv);
    const other = await makeProvider(h.srv);
    const ctx = await h.context();
    // Tab B: another provider signed in with "remember me" on this device.
    const tabB = await ctx.newPage();
    await tabB.goto(`${h.srv.url}/`);
    const remembered = JSON.stringify({ role: "provider", secret: other.key, label: "Other" });
    await tabB.evaluate((s) => localStorage.setItem("svc-console-session", s), remembered);
    // Tab A: a provider signed in for this tab only.
    const tabA = await ctx.newPage();
    await tabA.goto(`${h.srv.url}/`);
    await tabA.evaluate((s) => sessionStorage.setItem("svc-console-session", s), JSON.stringify({ role: "provider", secret: rig.key, label: "Rig" }));
    const newKey = await rotate(tabA);
    expect(await tabA.evaluate(() => sessionStorage.getItem("svc-console-session"))).toContain(newKey);
    // The other tab's remembered session is left as it was.
    expect(await tabA.evaluate(() => localStorage.getItem("svc-console-session"))).toBe(remembered);

    // Tab B's own session, remembered, follows its rotation on this device.
    const otherKey = await rotate(tabB);
    const stored = await tabB.evaluate(() => localStorage.getItem("svc-console-session"));
    expect(stored).toContain(otherKey);
    expect(stored).not.toContain(newKey);
  }, 90_000);
});

describe("the operator dashboard's chart of providers by GPU model", () => {
  it("keeps each bar's label right when the models' order changes on a refresh", async () => {
    await makeProvider(h.srv, { gpuModel: "NVIDIA Chart Alpha" });
    await makeProvider(h.srv, { gpuModel: "NVIDIA Chart Beta" });
    const page = await signedInPage("admin", ADMIN_TOKEN);
    // Records the axis labels the canvas draws, with where.
    await page.addInitScript(() => {
      const w = window as never as { __drawn: [string, number][] };
      w.__drawn = [];
      const fill = CanvasRenderingContext2D.prototype.fillText;
      CanvasRenderingContext2D.prototype.fillText = function (text: string, x: number, y: number, max?: number) {
        w.__drawn.push([String(text), x]);
        return max === undefined ? fill.call(this, text, x, y) : fill.call(this, text, x, y, max);
      };
    });
    await page.goto(`${h.srv.url}/#/admin`);
    await page.getByRole("img", { name: "Providers by GPU model" }).waitFor({ timeout: STEP_MS });
    /** The labels of these two models as drawn last, left to right. */
    const order = () =>
      page.evaluate(() => {
        const seen = new Map<string, number>();
        for (const [t, x] of (window as never as { __drawn: [string, number][] }).__drawn) if (/^Chart /.test(t)) seen.set(t, x);
        return [...seen.entries()].sort((a, b) => a[1] - b[1]).map(([t]) => t);
      });
    await poll(order).toEqual(["Chart Alpha", "Chart Beta"]);
    const total = page.getByTestId("total-providers").locator(".stat-value");
    const before = Number(await total.textContent());
    // Two more Beta rigs: the service now lists Beta (3) before Alpha (1).
    await makeProvider(h.srv, { gpuModel: "NVIDIA Chart Beta" });
    await makeProvider(h.srv, { gpuModel: "NVIDIA Chart Beta" });
    await page.evaluate(() => ((window as never as { __drawn: unknown[] }).__drawn.length = 0));
    // The dashboard reloads every 10 s: it has the new figures, and the chart is drawn again with them,
    // the 3-provider bar (first) labelled Beta.
    await poll(async () => Number(await total.textContent())).toBe(before + 2);
    await poll(order).toEqual(["Chart Beta", "Chart Alpha"]);
  }, 90_000);
});
