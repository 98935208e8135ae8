// The reference page in a real browser (Debian's chromium, as the console's
// tests): Swagger UI renders an operation per route from /api/openapi.json,
// under its Content-Security-Policy, fetching nothing from another origin.
import { afterAll, beforeAll, expect, it } from "vitest";
import type { Browser } from "playwright-core";
import { launchBrowser } from "../console/browser.js";
import { useTestServer } from "../helpers/server.js";

let browser: Browser;
const srv = useTestServer();
beforeAll(async () => {
  browser = await launchBrowser();
});
afterAll(() => browser?.close());

it("renders every operation, with no console error and no request to another origin", async () => {
  const page = await browser.newPage();
  const errors: string[] = [];
  const elsewhere: string[] = [];
  page.on("console", (m) => {
    if (m.type() === "error") errors.push(m.text());
  });
  page.on("pageerror", (e) => errors.push(String(e)));
  page.on("response", (r) => {
    if (r.status() >= 400) errors.push(`${r.status()} ${r.url()}`);
  });
  page.on("request", (r) => {
    if (!r.url().startsWith(srv.url) && !r.url().startsWith("data:")) elsewhere.push(r.url());
  });
  await page.goto(`${srv.url}/api/docs`);
  await page.waitForSelector(".opblock", { timeout: 60_000 });
  const doc = await (await fetch(`${srv.url}/api/openapi.json`)).json();
  const operations = Object.values(doc.paths as Record<string, object>).reduce((n, ops) => n + Object.keys(ops).length, 0);
  expect(await page.locator(".opblock").count()).toBe(operations);
  expect(await page.locator(".info .title").innerText()).toContain("svc GPU compute marketplace");
  expect(errors).toEqual([]);
  expect(elsewhere).toEqual([]);
}, 120_000);
