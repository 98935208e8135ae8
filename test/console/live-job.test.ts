// The job page's live stream (src/console/live-job.ts) in a real browser:
// an answer that retrying cannot change ends the watch, and a tab that is not
// shown gives back its HTTP/1.1 connection (Chromium keeps six per host), so
// job tabs in the background do not stop the console loading in another tab,
// and a job tab shown again catches up from its cursor. A "try again later"
// (too many watches open) is shown and asked again only after its Retry-After.
// A long log is drawn a page of lines at a time.
//
// Headless Chromium shows every page (Page.setWebLifecycleState and window
// states do not change document.visibilityState or fire freeze there), so a
// tab is put in the background the way the browser tells the page: the
// visibility state it reads and the visibilitychange event, or the page
// lifecycle's freeze and resume events.
import type { BrowserContext, Page } from "playwright-core";
import { describe, expect, it } from "vitest";
import { client } from "../helpers/http.js";
import { makeRenter } from "../helpers/fixtures.js";
import { seedJob } from "../admin/helpers.js";
import { openSse } from "../jobs/watch-helpers.js";
import { MAX_WATCHES_PER_ACCOUNT, TOO_MANY_WATCHES_RETRY_AFTER_SECONDS } from "../../src/workers/job-watch.js";
import { useConsoleHarness, watchProblems } from "./browser.js";

const STEP_MS = 30_000;
const poll = <T,>(fn: () => Promise<T> | T, timeout = STEP_MS) => expect.poll(fn, { timeout, interval: 100 });
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

const h = useConsoleHarness();

/** A browser context (one connection pool) whose tabs are signed in as this renter. */
async function signedInContext(secret: string): Promise<BrowserContext> {
  const ctx = await h.context();
  await ctx.addInitScript((s) => sessionStorage.setItem("svc-console-session", s), JSON.stringify({ role: "renter", secret, label: "Renter" }));
  return ctx;
}

/** Counts the page's WatchJob requests. */
function countWatches(page: Page): () => number {
  let n = 0;
  page.on("request", (r) => {
    if (r.url().endsWith("/svc.v1.JobService/WatchJob")) n++;
  });
  return () => n;
}

type Away = "visibility" | "freeze";

/** Puts the tab out of view (or back): hidden and visibilitychange, or the lifecycle's freeze and resume. */
async function setShown(page: Page, shown: boolean, how: Away): Promise<void> {
  await page.evaluate(
    ([shown, how]) => {
      if (how === "visibility") {
        Object.defineProperty(document, "visibilityState", { configurable: true, get: () => (shown ? "visible" : "hidden") });
        Object.defineProperty(document, "hidden", { configurable: true, get: () => !shown });
        document.dispatchEvent(new Event("visibilitychange"));
      } else {
        document.dispatchEvent(new Event(shown ? "resume" : "freeze"));
      }
    },
    [shown, how] as const,
  );
}

const jobStatus = (page: Page) => page.getByRole("progressbar", { name: "Job progress" }).getAttribute("data-status", { timeout: STEP_MS });

describe("the job page's live stream", () => {
  it("stops on an unknown job, another renter's job or a refused key, with the service's message, and asks no more", async () => {
    const renter = await makeRenter(h.srv);
    const other = await makeRenter(h.srv, 1_000);
    const theirs = await seedJob(h.srv, { renterId: other.id, status: "queued", cost: 100 });

    const cases = [
      { secret: renter.key, jobId: "job-doesnotexist", shows: (p: Page) => p.getByRole("alert").filter({ hasText: "job not found" }) },
      { secret: renter.key, jobId: theirs.jobId, shows: (p: Page) => p.getByRole("alert").filter({ hasText: "this job belongs to another caller" }) },
      // A key the service refuses signs the tab out (checked below), as every other page does.
      { secret: "svc-renter-0000000000000000000000000000000000000000", jobId: theirs.jobId, shows: (p: Page) => p.getByRole("heading", { name: "Sign in to svc" }).or(p.getByRole("alert")) },
    ];
    const pages = await Promise.all(
      cases.map(async (c) => {
        const page = await (await signedInContext(c.secret)).newPage();
        const problems = watchProblems(page);
        const watches = countWatches(page);
        await page.goto(`${h.srv.url}/#/renter/jobs/${encodeURIComponent(c.jobId)}`);
        await c.shows(page).waitFor({ timeout: STEP_MS });
        return { page, problems, watches };
      }),
    );
    // Before, each retried with backoff (1 s, 2 s, …) for as long as the page stayed open.
    await sleep(4_000);
    for (const [i, p] of pages.entries()) {
      expect(p.watches(), `WatchJob requests for case ${i}`).toBe(1);
      expect(p.problems).toEqual([]);
    }
    await expect(pages[0].page.getByRole("alert").textContent()).resolves.toContain("job not found");
    await pages[2].page.getByRole("heading", { name: "Sign in to svc" }).waitFor({ timeout: 1_000 });
    expect(await pages[2].page.evaluate(() => sessionStorage.getItem("svc-console-session"))).toBeNull();
  }, 60_000);

  it("while the renter holds too many watches, says so and asks again only after the Retry-After, then follows the job", async () => {
    const renter = await makeRenter(h.srv, 1_000);
    const job = await seedJob(h.srv, { renterId: renter.id, status: "queued", cost: 100 });
    const url = `${h.srv.url}/api/jobs/${job.jobId}/events`;
    const held = await Promise.all(Array.from({ length: MAX_WATCHES_PER_ACCOUNT }, () => openSse(url, { "x-renter-key": renter.key })));
    try {
      await Promise.all(held.map((s) => s.until((es) => es.length >= 1)));
      const page = await (await signedInContext(renter.key)).newPage();
      const problems = watchProblems(page);
      const watches = countWatches(page);
      await page.goto(`${h.srv.url}/#/renter/jobs/${job.jobId}`);
      await page.getByRole("alert").filter({ hasText: "at most 32 job watches may be open at once" }).waitFor({ timeout: STEP_MS });
      const refusedAt = Date.now();
      // With a backoff of its own (1 s, 2 s, …) it would have asked three times by now.
      await sleep(4_000);
      expect(watches()).toBe(1);
      held.pop()!.cut();
      expect(await jobStatus(page)).toBe("queued");
      expect(Date.now() - refusedAt).toBeGreaterThanOrEqual(TOO_MANY_WATCHES_RETRY_AFTER_SECONDS * 1000 - 1_000);
      expect(watches()).toBe(2);
      expect(problems).toEqual([]);
    } finally {
      for (const s of held) s.cut();
    }
  }, 60_000);

  it("job tabs in the background give back their connections: a seventh tab loads, and a tab shown again catches up", async () => {
    const renter = await makeRenter(h.srv, 10_000);
    // Queued with no provider online: each stays queued, its WatchJob stream open.
    const jobs = await Promise.all(Array.from({ length: 7 }, () => seedJob(h.srv, { renterId: renter.id, status: "queued", cost: 100 })));
    const ctx = await signedInContext(renter.key);
    const open = async (jobId: string) => {
      const page = await ctx.newPage();
      const problems = watchProblems(page);
      const watches = countWatches(page);
      await page.goto(`${h.srv.url}/#/renter/jobs/${jobId}`, { timeout: STEP_MS });
      await poll(() => jobStatus(page)).toBe("queued");
      return { page, problems, watches };
    };

    // Six tabs, each put in the background once it shows its job (as a user opening the
    // next one would): half hidden, half frozen.
    const away: Away[] = ["visibility", "freeze", "visibility", "freeze", "visibility", "freeze"];
    const background = [];
    for (const [i, how] of away.entries()) {
      const tab = await open(jobs[i].jobId);
      await setShown(tab.page, false, how);
      background.push({ ...tab, how, watchesWhenHidden: tab.watches() });
    }

    // Six streams held open would leave no connection for this tab's page itself.
    const seventh = await open(jobs[6].jobId);
    // and it follows its job live.
    expect((await client(h.srv.url).post(`/api/jobs/${jobs[6].jobId}/cancel`, {}, renter.headers)).status).toBe(200);
    await poll(() => jobStatus(seventh.page)).toBe("cancelled");

    // A background tab does not follow its job, and asks nothing while away…
    for (const job of jobs.slice(0, 2)) expect((await client(h.srv.url).post(`/api/jobs/${job.jobId}/cancel`, {}, renter.headers)).status).toBe(200);
    await sleep(2_000);
    for (const b of background) {
      expect(await jobStatus(b.page)).toBe("queued");
      expect(b.watches()).toBe(b.watchesWhenHidden);
    }
    // …and catches up from its cursor once shown again, by either route.
    for (const b of background.slice(0, 2)) {
      await setShown(b.page, true, b.how);
      await poll(() => jobStatus(b.page)).toBe("cancelled");
      expect(b.watches()).toBe(b.watchesWhenHidden + 1);
    }
    // A tab shown again whose job did not change keeps following it.
    const third = background[2];
    await setShown(third.page, true, third.how);
    await poll(() => third.watches()).toBe(third.watchesWhenHidden + 1);
    expect((await client(h.srv.url).post(`/api/jobs/${jobs[2].jobId}/cancel`, {}, renter.headers)).status).toBe(200);
    await poll(() => jobStatus(third.page)).toBe("cancelled");

    for (const t of [...background, seventh]) expect(t.problems).toEqual([]);
  }, 120_000);
  it("draws a long log a page of lines at a time, not line by line, and goes on to the lines after it and the end", async () => {
    const r = await makeRenter(h.srv, 5_000);
    const job = await seedJob(h.srv, { renterId: r.id });
    const lines = 1_500;
    await h.srv.sql`
      INSERT INTO job_logs (job_id, attempt, level, message)
      SELECT ${job.id}, 1, 'info', 'line ' || g || ' of a long log, with words enough to make it eighty characters or so'
      FROM generate_series(1, ${lines}) g`;
    const ctx = await signedInContext(r.key);
    // Counts the changes made to the log's text: each is a redraw of the whole log.
    await ctx.addInitScript(() => {
      const w = window as never as { __logDraws: number };
      w.__logDraws = 0;
      new MutationObserver((records) => {
        for (const m of records) {
          const el = m.target.nodeType === Node.TEXT_NODE ? m.target.parentElement : m.target;
          if (el instanceof Element && el.closest("pre.logs")) w.__logDraws++;
        }
      }).observe(document, { subtree: true, childList: true, characterData: true });
    });
    const page = await ctx.newPage();
    const problems = watchProblems(page);
    const log = page.getByRole("region", { name: "Logs" }).locator("pre.logs");
    await page.goto(`${h.srv.url}/#/renter/jobs/${job.jobId}`);
    await poll(() => log.textContent()).toContain(`line ${lines} of a long log`);
    const draws = await page.evaluate(() => (window as never as { __logDraws: number }).__logDraws);
    // A line at a time, the page redraws the whole log for each line (quadratic: a full log froze the tab for minutes).
    expect(draws).toBeLessThan(lines / 10);

    await h.srv.sql`INSERT INTO job_logs (job_id, attempt, level, message) VALUES (${job.id}, 1, 'warn', 'one more line')`;
    await poll(() => log.textContent()).toMatch(/warn +one more line$/);
    expect((await client(h.srv.url).post(`/api/jobs/${job.jobId}/cancel`, {}, { "x-renter-key": r.key })).status).toBe(200);
    await poll(() => jobStatus(page)).toBe("cancelled");
    expect((await log.textContent())!.split("\n")).toHaveLength(lines + 1);
    expect(problems).toEqual([]);
  }, 120_000);
});
