// A page whose read the service answers "try again later" (429 with Retry-After, here the
// operator's rate-limit row run out) says so in place and reads again once that time has
// passed, without the operator doing anything: pages that are not refreshed on a timer too.
import { describe, expect, it } from "vitest";
import { makeRenter } from "../helpers/fixtures.js";
import { ADMIN_TOKEN } from "../helpers/server.js";
import { signedIn, useConsoleHarness } from "./browser.js";

const WINDOW_S = 6;
const h = useConsoleHarness({ SVC_RATE_LIMITS: "on", SVC_RATE_LIMIT_OVERRIDES: `admin=3/${WINDOW_S}` });

describe("a read the service asks to try again later", () => {
  it("is shown with the service's reason, then read again after its Retry-After", async () => {
    const r = await makeRenter(h.srv, 0);
    const { page, problems } = await signedIn(h, "admin", ADMIN_TOKEN);
    await page.goto(`${h.srv.url}/#/admin/renters`);
    // The renters page is read once: it is not refreshed on a timer.
    const row = page.locator(`tr[data-renter="${r.id}"]`);
    await row.waitFor({ timeout: 20_000 });
    // The operator's row runs out (the console's reads and these count on the same client IP).
    const refused = page.waitForResponse((res) => res.url().endsWith("/svc.v1.AdminService/ListRenters") && res.status() === 429, { timeout: 20_000 });
    for (let i = 0; i < 10; i++) {
      const res = await fetch(`${h.srv.url}/api/admin/renters`, { headers: { "x-admin-token": ADMIN_TOKEN } });
      if (res.status === 429) break;
    }
    await page.getByLabel("Status").selectOption("active");
    await refused;
    const alert = page.getByRole("alert").first();
    await expect.poll(() => alert.textContent(), { timeout: 5_000 }).toMatch(/rate limit exceeded/);
    // Once the row has room again, the page reads again by itself and shows the list.
    await expect.poll(() => row.count(), { timeout: (WINDOW_S + 10) * 1000, interval: 200 }).toBe(1);
    expect(await page.getByRole("alert").count()).toBe(0);
    expect(problems).toEqual([]);
  }, 60_000);
});
