// The console shows every time in UTC; its charts' time axes too. The same
// dashboard drawn in browsers set to different time zones must be the same
// picture: a day chart whose ticks followed the browser's zone would put
// each UTC day's figures under another day's label west of Greenwich.
import crypto from "node:crypto";
import type { Page } from "playwright-core";
import { describe, expect, it } from "vitest";
import { utcTickLabels } from "../../src/console/format.js";
import { ADMIN_TOKEN } from "../helpers/server.js";
import { useConsoleHarness, watchProblems } from "./browser.js";

const h = useConsoleHarness();

async function dashboardIn(timezoneId: string): Promise<{ page: Page; problems: string[] }> {
  const ctx = await h.context({ width: 1280, height: 900 }, { timezoneId, locale: "en-US" });
  await ctx.addInitScript((s) => sessionStorage.setItem("svc-console-session", s), JSON.stringify({ role: "admin", secret: ADMIN_TOKEN, label: "operator" }));
  const page = await ctx.newPage();
  const problems = watchProblems(page);
  await page.goto(h.srv.url + "/");
  await page.getByRole("img", { name: "Revenue per day (SAR)" }).locator("canvas").waitFor({ timeout: 45_000 });
  return { page, problems };
}

/** A digest of the chart's pixels, once two reads a moment apart agree (it is drawn after its data arrives). */
async function pixelsOf(page: Page, title: string): Promise<string> {
  const read = async () => {
    const png = await page.getByRole("img", { name: title }).locator("canvas").evaluate((c: HTMLCanvasElement) => c.toDataURL());
    return crypto.createHash("sha256").update(png).digest("hex");
  };
  let last = "";
  await expect
    .poll(async () => {
      const now = await read();
      const settled = now === last;
      last = now;
      return settled;
    }, { timeout: 30_000, interval: 300 })
    .toBe(true);
  return last;
}

describe("console charts", () => {
  it("label their ticks in UTC: days, or times of day with the day where it starts", () => {
    const at = (iso: string) => Date.parse(iso) / 1000;
    expect(utcTickLabels([at("2026-11-29T00:00:00Z"), at("2026-11-30T00:00:00Z")], 86_400)).toEqual(["29 Nov", "30 Nov"]);
    expect(utcTickLabels([at("2026-11-30T23:58:00Z"), at("2026-11-30T23:59:00Z"), at("2026-12-01T00:00:00Z")], 60)).toEqual([
      "23:58\n30 Nov",
      "23:59",
      "00:00\n1 Dec",
    ]);
    expect(utcTickLabels([at("2026-11-30T09:05:50Z"), at("2026-11-30T09:05:55Z"), at("2026-11-30T09:06:00Z"), at("2026-11-30T09:06:05Z")], 5)).toEqual([
      "09:05:50\n30 Nov",
      ":55",
      "09:06",
      ":05",
    ]);
  });

  it("draw their time axes in UTC whatever the browser's time zone", async () => {
    const utc = await dashboardIn("UTC");
    const west = await dashboardIn("America/Los_Angeles");
    const east = await dashboardIn("Asia/Kolkata");
    for (const title of ["Revenue per day (SAR)", "Jobs per day"]) {
      const base = await pixelsOf(utc.page, title);
      expect(await pixelsOf(west.page, title), `${title} in Los Angeles`).toBe(base);
      expect(await pixelsOf(east.page, title), `${title} in Kolkata`).toBe(base);
    }
    // The zones did reach the pages: their own clocks differ.
    const offsets = await Promise.all([utc, west, east].map(({ page }) => page.evaluate(() => new Date(2026, 0, 1).getTimezoneOffset())));
    expect(offsets).toEqual([0, 480, -330]);
    for (const { problems } of [utc, west, east]) expect(problems).toEqual([]);
  });
});
