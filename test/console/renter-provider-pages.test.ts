// The renter's and the provider's main actions in a real browser against a
// seeded server: cancelling a job (the page and the held funds follow), a
// top-up and a submit the service refuses (its reason shown in place, amounts in SAR), a lost
// connection, the live job view given back each time it is left, pause and
// resume, a key pasted as the Install page shortens it, the telemetry charts'
// samples (one per heartbeat), and a schedule preference that is kept.
import { describe, expect, it } from "vitest";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { client } from "../helpers/http.js";
import { seedJob } from "../admin/helpers.js";
import { signedIn, useConsoleHarness, watchProblems } from "./browser.js";

const STEP_MS = 20_000;
const poll = <T,>(fn: () => Promise<T> | T) => expect.poll(fn, { timeout: STEP_MS, interval: 100 });
const h = useConsoleHarness();

/** A Connect streaming request body: one JSON message in its envelope (flags 0, big-endian length). */
function envelope(msg: unknown): Uint8Array<ArrayBuffer> {
  const json = new TextEncoder().encode(JSON.stringify(msg));
  const out = new Uint8Array(5 + json.length);
  new DataView(out.buffer).setUint32(1, json.length);
  out.set(json, 5);
  return out;
}

describe("the renter's pages", () => {
  it("cancelling a queued job updates the job page and releases the held funds on the balance page", async () => {
    const r = await makeRenter(h.srv, 5_000);
    const job = await seedJob(h.srv, { renterId: r.id, cost: 300 });
    const { page, problems } = await signedIn(h, "renter", r.key);
    await page.goto(`${h.srv.url}/#/renter`);
    await poll(() => page.getByTestId("held").textContent()).toContain("3.00 SAR");
    await page.goto(`${h.srv.url}/#/renter/jobs/${job.jobId}`);
    await page.getByLabel("Cancel reason (optional)").fill("changed my mind");
    await page.getByLabel("Cancel reason (optional)").press("Enter");
    await poll(() => page.getByRole("progressbar", { name: "Job progress" }).getAttribute("data-status")).toBe("cancelled");
    expect(await page.getByRole("button", { name: "Cancel job" }).count()).toBe(0);
    await page.getByRole("link", { name: "Balance" }).click();
    await poll(() => page.getByTestId("held").textContent()).toContain("0.00 SAR");
    expect(problems).toEqual([]);
  }, 60_000);

  it("a top-up the service refuses shows its reason; Enter submits; offline says the connection is lost", async () => {
    const r = await makeRenter(h.srv, 0);
    const { page, problems, ctx } = await signedIn(h, "renter", r.key);
    await page.goto(`${h.srv.url}/#/renter`);
    const amount = page.getByLabel("Amount (SAR)");
    await amount.fill("100000000");
    await amount.press("Enter");
    await poll(() => page.getByRole("alert").first().textContent()).toMatch(/amount/i);
    await amount.fill("12.5");
    await amount.press("Enter");
    await poll(() => page.getByTestId("balance").textContent()).toContain("12.50 SAR");
    await ctx.setOffline(true);
    await amount.fill("1");
    await page.getByRole("button", { name: "Top up (sandbox)" }).click();
    await poll(() => page.getByRole("alert").first().textContent()).toContain("Lost connection");
    await ctx.setOffline(false);
    expect(problems.filter((p) => !/ERR_INTERNET_DISCONNECTED|Failed to fetch/.test(p))).toEqual([]);
  }, 60_000);

  it("the submit form shows the service's reason for a job it refuses (balance too low) and stays on the form", async () => {
    const r = await makeRenter(h.srv, 10);
    const { page, problems } = await signedIn(h, "renter", r.key);
    await page.goto(`${h.srv.url}/#/renter/submit`);
    await page.getByLabel("Duration (minutes)").fill("600");
    await page.getByRole("button", { name: "Submit job" }).click();
    await poll(() => page.getByRole("alert").first().textContent()).toMatch(/balance|funds|insufficient/i);
    expect(page.url()).toContain("#/renter/submit");
    expect(problems).toEqual([]);
  }, 60_000);

  it("a refusal for funds names its amounts in SAR, as the form and the balance page do: the hold is the form's estimate", async () => {
    const r = await makeRenter(h.srv, 100);
    const { page, problems } = await signedIn(h, "renter", r.key);
    await page.goto(`${h.srv.url}/#/renter/submit`);
    await page.getByLabel("Duration (minutes)").fill("600");
    const estimate = page.getByTestId("estimate");
    await poll(() => estimate.textContent()).toMatch(/Estimate: [\d,.]+ SAR/);
    const [, hold, rate] = /Estimate: ([\d,.]+ SAR) \(([\d,.]+ SAR) per minute\)/.exec((await estimate.textContent())!)!;
    await page.getByRole("button", { name: "Submit job" }).click();
    const alert = page.getByRole("alert").first();
    await poll(() => alert.textContent()).toMatch(/insufficient balance/);
    const said = (await alert.textContent())!;
    expect(said).toContain(`holds ${hold} (${rate}/min x 600 min)`);
    expect(said).toContain("1.00 SAR is available");
    expect(said).not.toMatch(/halala/);
    expect(problems).toEqual([]);
  }, 60_000);

  it("the submit form's longest run takes a whole number written as its number field allows (1e3, 1500.0), and says which field is wrong otherwise", async () => {
    const r = await makeRenter(h.srv, 100_000);
    await makeProvider(h.srv);
    const { page, problems } = await signedIn(h, "renter", r.key);
    const maxRun = () => page.getByLabel("Longest run (seconds, optional)");
    for (const [typed, seconds] of [["1e3", 1000], ["1500.0", 1500]] as const) {
      await page.goto(`${h.srv.url}/#/renter/submit`);
      await maxRun().fill(typed);
      await page.getByRole("button", { name: "Submit job" }).click();
      // The job's page, or what the form says instead.
      const alert = page.getByRole("alert");
      await poll(async () => ((await alert.count()) ? await alert.first().textContent() : page.url())).toMatch(/#\/renter\/jobs\/.+/);
      const jobId = decodeURIComponent(page.url().split("/").pop()!);
      const [row] = await h.srv.sql<{ max_duration_seconds: string }[]>`SELECT max_duration_seconds FROM jobs WHERE job_id = ${jobId}`;
      expect(Number(row.max_duration_seconds), typed).toBe(seconds);
    }
    // A value the field's own checks would stop (a fraction), submitted past them: named in place, nothing sent.
    await page.goto(`${h.srv.url}/#/renter/submit`);
    await maxRun().fill("1000.5");
    const submitted = { n: 0 };
    page.on("request", (req) => void (req.url().endsWith("/svc.v1.JobService/Submit") && submitted.n++));
    await page.locator("form.submit-form").evaluate((f) => f.dispatchEvent(new Event("submit", { cancelable: true })));
    await poll(() => page.getByRole("alert").first().textContent()).toBe("Longest run (seconds) must be a whole number of seconds, e.g. 3600.");
    expect(submitted.n).toBe(0);
    expect(page.url()).toContain("#/renter/submit");
    expect(problems).toEqual([]);
  }, 60_000);

  it("signed out because its key was rotated elsewhere, the sign-in page says why; a sign-out of its own says nothing", async () => {
    const r = await makeRenter(h.srv, 1_000);
    const { page, problems } = await signedIn(h, "renter", r.key);
    await page.goto(`${h.srv.url}/#/renter`);
    await poll(() => page.getByTestId("balance").textContent()).toContain("10.00 SAR");
    const rotated = await client(h.srv.url).post("/api/renters/rotate-key", undefined, r.headers);
    expect(rotated.status).toBe(200);
    // The next call with the old key is refused (401) and signs the tab out.
    await page.getByRole("link", { name: "Jobs" }).click();
    await page.getByRole("heading", { name: "Sign in to svc" }).waitFor({ timeout: STEP_MS });
    const why = page.getByRole("status").filter({ hasText: "session ended" });
    await poll(async () => ((await why.count()) ? await why.textContent() : "(nothing said)")).toBe("Your session ended: the API key it used is no longer valid (rotated, or revoked). Sign in again with your current key.");
    expect(await page.evaluate(() => sessionStorage.getItem("svc-console-session"))).toBeNull();
    // Signing in again clears it, and signing out by choice says nothing of the kind.
    await page.getByRole("region", { name: "Sign in with an API key" }).getByLabel("API key").fill(rotated.body.api_key);
    await page.getByRole("region", { name: "Sign in with an API key" }).getByRole("button", { name: "Sign in" }).click();
    await poll(() => page.getByTestId("balance").textContent()).toContain("10.00 SAR");
    await page.getByRole("button", { name: "Sign out" }).click();
    await page.getByRole("heading", { name: "Sign in to svc" }).waitFor();
    expect(await page.getByText("session ended").count()).toBe(0);
    // A wrong key typed on the sign-in page is that form's own error, not a session that ended.
    await page.getByRole("region", { name: "Sign in with an API key" }).getByLabel("API key").fill(r.key);
    await page.getByRole("region", { name: "Sign in with an API key" }).getByRole("button", { name: "Sign in" }).click();
    await page.getByRole("region", { name: "Sign in with an API key" }).getByRole("alert").waitFor({ timeout: STEP_MS });
    expect(await page.getByText("session ended").count()).toBe(0);
    expect(problems).toEqual([]);
  }, 60_000);

  it("the balance page follows funds that change elsewhere (a job submitted from the API), as the other pages do, without a reload", async () => {
    const r = await makeRenter(h.srv, 5_000);
    const { page, problems } = await signedIn(h, "renter", r.key);
    await page.goto(`${h.srv.url}/#/renter`);
    await poll(() => page.getByTestId("held").textContent()).toContain("0.00 SAR");
    await seedJob(h.srv, { renterId: r.id, cost: 300 });
    await poll(() => page.getByTestId("held").textContent()).toContain("3.00 SAR");
    await poll(() => page.getByTestId("available").textContent()).toContain("47.00 SAR");
    expect(problems).toEqual([]);
  }, 60_000);

  it("opening and leaving the live job view many times gives every watch back: a fresh one is still accepted", async () => {
    const r = await makeRenter(h.srv, 5_000);
    const job = await seedJob(h.srv, { renterId: r.id });
    const { page, problems } = await signedIn(h, "renter", r.key);
    await page.goto(`${h.srv.url}/#/renter/jobs`);
    await page.locator(`tr[data-job="${job.jobId}"]`).waitFor();
    for (let i = 0; i < 40; i++) {
      await page.evaluate((id) => (location.hash = `#/renter/jobs/${id}`), job.jobId);
      await page.getByRole("progressbar", { name: "Job progress" }).waitFor({ timeout: 15_000 });
      await page.evaluate(() => (location.hash = "#/renter/jobs"));
      await page.locator(`tr[data-job="${job.jobId}"]`).waitFor();
    }
    // The service's count of the renter's watches went back down: one from another client is accepted.
    const res = await fetch(`${h.srv.url}/svc.v1.JobService/WatchJob`, {
      method: "POST",
      headers: { "content-type": "application/connect+json", "x-renter-key": r.key, "connect-protocol-version": "1" },
      body: envelope({ jobId: job.jobId }),
      signal: AbortSignal.timeout(3000),
    });
    expect(res.status).toBe(200);
    const reader = res.body!.getReader();
    const first = await reader.read();
    await reader.cancel();
    expect(Buffer.from(first.value!).toString()).not.toMatch(/resource_exhausted|at most/);
    expect(problems).toEqual([]);
  }, 120_000);
});

describe("the provider's pages", () => {
  it("pause then resume update the button and the status in place", async () => {
    const p = await makeProvider(h.srv);
    const { page, problems } = await signedIn(h, "provider", p.key);
    await page.goto(`${h.srv.url}/#/provider`);
    await page.getByRole("button", { name: "Pause (take no new jobs)" }).click();
    await poll(() => page.getByRole("button", { name: /Resume/ }).count()).toBe(1);
    await poll(() => page.getByTestId("provider-status").textContent()).toContain("paused");
    await page.getByRole("button", { name: /Resume/ }).click();
    await poll(() => page.getByRole("button", { name: /Pause/ }).count()).toBe(1);
    expect(problems).toEqual([]);
  }, 60_000);

  it("signing in with the key as the Install page shows it (shortened) says the key is not whole, not that the connection is lost", async () => {
    const p = await makeProvider(h.srv);
    const { page, problems } = await signedIn(h, "provider", p.key);
    await page.goto(`${h.srv.url}/#/provider/install`);
    const shortened = (await page.getByTestId("provider-key").textContent())!;
    expect(shortened).toMatch(/^svc-provider-.{4}…$/);

    const ctx = await h.context();
    const signIn = await ctx.newPage();
    const problems2 = watchProblems(signIn);
    await signIn.goto(`${h.srv.url}/`);
    await signIn.getByRole("tab", { name: "Provider" }).click();
    const key = signIn.getByRole("textbox", { name: "API key" });
    await key.fill(shortened);
    await key.press("Enter");
    await poll(() => signIn.getByRole("alert").textContent()).toMatch(/not a whole API key/);
    expect(await signIn.getByRole("alert").textContent()).not.toMatch(/connection/i);
    // The operator's token likewise.
    await signIn.getByRole("tab", { name: "Operator" }).click();
    await signIn.getByRole("textbox", { name: "Admin token" }).fill("token…");
    await signIn.getByRole("textbox", { name: "Admin token" }).press("Enter");
    await poll(() => signIn.getByRole("alert").textContent()).toMatch(/not a whole admin token/);
    // The whole key, with spaces around it as pasted, signs in.
    await signIn.getByRole("tab", { name: "Provider" }).click();
    await key.fill(` ${p.key} `);
    await key.press("Enter");
    await poll(() => signIn.getByTestId("approval").count()).toBe(1);
    expect([...problems, ...problems2]).toEqual([]);
  }, 60_000);

  it("the GPU telemetry charts take a sample per heartbeat: a daemon that stopped sending adds none", async () => {
    const p = await makeProvider(h.srv);
    const beat = (minutesAgo: number, util: number) => h.srv.sql`
      UPDATE providers SET last_heartbeat = now() - make_interval(mins => ${minutesAgo}),
        gpu_telemetry = ${h.srv.sql.json({ gpu_util_pct: util, temp_c: 70, gpu_vram_mib: 24576, free_vram_mib: 20480 })}
      WHERE id = ${p.id}`;
    await beat(10, 90);
    const { page, problems } = await signedIn(h, "provider", p.key);
    let reads = 0;
    page.on("response", (r) => void (r.url().endsWith("/svc.v1.ProviderService/GetMe") && r.ok() && reads++));
    const telemetry = page.getByRole("region", { name: "GPU telemetry (while this page is open)" });
    await page.goto(`${h.srv.url}/#/provider`);
    // The page reads the provider every 5 s; the heartbeat it reads stays the one of 10 minutes ago.
    await poll(() => reads).toBeGreaterThanOrEqual(3);
    await poll(() => page.getByTestId("provider-status").count()).toBe(1);
    expect(await telemetry.getByText("Collecting samples from heartbeats…").count()).toBe(1);
    expect(await telemetry.getByRole("img").count()).toBe(0);

    // A heartbeat arrives: its reading is the second sample.
    await beat(0, 40);
    await poll(() => telemetry.getByRole("img", { name: "Utilisation (%)" }).count()).toBe(1);
    expect(problems).toEqual([]);
  }, 60_000);

  it("a schedule preference is saved and shown again after a reload", async () => {
    const p = await makeProvider(h.srv);
    const { page, problems } = await signedIn(h, "provider", p.key);
    await page.goto(`${h.srv.url}/#/provider/settings`);
    await page.getByLabel("Run mode").selectOption("scheduled");
    await page.getByLabel("Schedule start (HH:MM, UTC)").fill("22:00");
    await page.getByLabel("Schedule end (HH:MM, UTC)").fill("06:00");
    await page.getByRole("button", { name: "Save preferences" }).click();
    await poll(async () => (await page.getByRole("status").count()) + (await page.getByRole("alert").count())).toBeGreaterThan(0);
    expect(await page.getByRole("alert").count()).toBe(0);
    await page.reload();
    await poll(() => page.getByLabel("Run mode").inputValue()).toBe("scheduled");
    expect(await page.getByLabel("Schedule start (HH:MM, UTC)").inputValue()).toBe("22:00");
    expect(await page.getByLabel("Schedule end (HH:MM, UTC)").inputValue()).toBe("06:00");
    expect(problems).toEqual([]);
  }, 60_000);
});
