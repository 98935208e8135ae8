// A key rotated in a tab while a request that carries the old key is still under way: that request's
// refusal (401, the old key is revoked) is not the new session's, and leaves the tab signed in with the
// new key. The request is held by the browser's request interception until the key is rotated, then
// sent on to the service, which refuses it.
import type { Route } from "playwright-core";
import { describe, expect, it } from "vitest";
import { makeProvider } from "../helpers/fixtures.js";
import { signedIn, useConsoleHarness } from "./browser.js";

const STEP_MS = 20_000;
const poll = <T,>(fn: () => Promise<T> | T) => expect.poll(fn, { timeout: STEP_MS, interval: 100 });
const h = useConsoleHarness();

describe("a key rotated while a request with the old key is under way", () => {
  it("keeps the tab signed in with the new key when that request is refused", async () => {
    const p = await makeProvider(h.srv);
    const { page, problems } = await signedIn(h, "provider", p.key);
    // The Settings page's read of the provider, sent with the old key, is held until the key is rotated.
    let held: Route | undefined;
    await page.route("**/svc.v1.ProviderService/GetMe", async (route) => {
      if (!held && route.request().headers()["x-provider-key"] === p.key) held = route;
      else await route.continue();
    });
    await page.goto(`${h.srv.url}/#/provider/settings`);
    await poll(() => held !== undefined).toBe(true);
    await page.getByRole("button", { name: "Rotate key…" }).click();
    await page.getByRole("button", { name: "Yes, rotate my key" }).click();
    const input = page.getByLabel("Your new API key (shown once)");
    await input.waitFor({ timeout: STEP_MS });
    const newKey = await input.inputValue();
    expect(newKey).toMatch(/^svc-provider-/);
    expect(await page.evaluate(() => sessionStorage.getItem("svc-console-session"))).toContain(newKey);

    // The held read goes on now: the service refuses its old key (revoked: 401 "invalid API key").
    const refused = page.waitForResponse((r) => r.url().endsWith("/svc.v1.ProviderService/GetMe"), { timeout: STEP_MS });
    await held!.continue();
    expect((await refused).status()).toBe(401);
    // Handled once the page shows its outcome: the refusal in place, or (as before) the sign-in page.
    await page.getByRole("heading", { name: "Sign in to svc" }).or(page.getByRole("alert")).first().waitFor({ timeout: STEP_MS });
    expect(await page.getByRole("heading", { name: "Sign in to svc" }).count()).toBe(0);
    expect(await page.evaluate(() => sessionStorage.getItem("svc-console-session"))).toContain(newKey);
    // The tab goes on with the new key: the Status page reads the provider with it.
    await page.getByRole("link", { name: "Status" }).click();
    await page.getByTestId("provider-status").waitFor({ timeout: STEP_MS });
    expect(await page.evaluate(() => sessionStorage.getItem("svc-console-session"))).toContain(newKey);
    expect(problems).toEqual([]);
  }, 60_000);
});
