// Debian's chromium driven by playwright-core. When the browser cannot be
// started the tests fail with the reason: they never skip.
import fs from "node:fs";
import path from "node:path";
import { chromium, type Browser, type BrowserContext, type BrowserContextOptions, type Page } from "playwright-core";
import { afterAll, beforeAll } from "vitest";
import { useTestServer, type TestServer } from "../helpers/server.js";

export const CHROMIUM = process.env.CHROMIUM_PATH || "/usr/bin/chromium";
/** Screenshots of the main pages (gitignored): the console's visual record of a run. */
export const SHOTS_DIR = path.resolve("test-artifacts/console");

export async function launchBrowser(): Promise<Browser> {
  if (!fs.existsSync(CHROMIUM)) {
    throw new Error(`no browser at ${CHROMIUM}: install Debian's chromium (apt-get install -y chromium) or set CHROMIUM_PATH`);
  }
  return chromium.launch({
    executablePath: CHROMIUM,
    args: ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run"],
  });
}

/** Collects what a page reports as broken: console errors (CSP refusals among them) and uncaught exceptions. */
export function watchProblems(page: Page): string[] {
  const problems: string[] = [];
  page.on("console", (m) => {
    // A 4xx answer is an error the page shows in place, and a request made while
    // the test has the browser offline fails by design: the tests check both on the page.
    const expected = /Failed to load resource: (the server responded with a status of 4\d\d|net::ERR_INTERNET_DISCONNECTED)/;
    if (m.type() === "error" && !expected.test(m.text())) problems.push(`console: ${m.text()}`);
  });
  page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
  return problems;
}

/**
 * A page in a new context of `h`, signed in as `role` with `secret` (the session the
 * sign-in page keeps in sessionStorage), and the list of what it reports as broken.
 */
export async function signedIn(h: ConsoleHarness, role: "renter" | "provider" | "admin", secret: string, label = role) {
  const ctx = await h.context();
  await ctx.addInitScript((s) => sessionStorage.setItem("svc-console-session", s), JSON.stringify({ role, secret, label }));
  const page = await ctx.newPage();
  return { page, problems: watchProblems(page), ctx };
}

export async function shot(page: Page, name: string): Promise<void> {
  fs.mkdirSync(SHOTS_DIR, { recursive: true });
  await page.screenshot({ path: path.join(SHOTS_DIR, `${name}.png`), fullPage: true });
}

export interface ConsoleHarness {
  /** The file's test server, started before its tests. */
  readonly srv: TestServer;
  /**
   * A new browser context, closed after the file's tests; throws the reason when the browser could not start.
   * `options`: more of the context's settings (its time zone, say).
   */
  context(viewport?: { width: number; height: number }, options?: BrowserContextOptions): Promise<BrowserContext>;
}

/**
 * A test server and a browser for one test file, started before its tests and closed after.
 * A browser that cannot start fails every test that asks for a context, with the reason.
 * `env`: the server's settings beside the tests' defaults (useTestServer).
 */
export function useConsoleHarness(env: Record<string, string> = {}): ConsoleHarness {
  const srv = useTestServer(env);
  let browser: Browser | undefined;
  let launchError: unknown;
  const contexts: BrowserContext[] = [];
  beforeAll(async () => {
    browser = await launchBrowser().catch((err) => {
      launchError = err;
      return undefined;
    });
  });
  // Registered after the server's: runs before it closes.
  afterAll(async () => {
    for (const c of contexts) await c.close().catch(() => {});
    await browser?.close();
  });
  return {
    srv,
    async context(viewport = { width: 1280, height: 900 }, options = {}) {
      if (!browser) throw launchError;
      const ctx = await browser.newContext({ ...options, viewport });
      contexts.push(ctx);
      return ctx;
    },
  };
}
