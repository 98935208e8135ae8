// The console and the service's origin against content other parties control:
// a provider's job output (text, or "image" bytes in a format it names), its
// name and GPU model, a job's error, progress and log lines. None of it runs
// as script: the console renders it as text, and what the API serves of it is
// never a document or a script of this origin (nosniff on every answer, a
// sandbox CSP on raw bytes, only raster formats served as images), so the
// console's script-src 'self' cannot be turned against it.
import type { Page } from "playwright-core";
import { describe, expect, it } from "vitest";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { ADMIN_TOKEN } from "../helpers/server.js";
import { seedJob, settleJob } from "../admin/helpers.js";
import { useConsoleHarness } from "./browser.js";

const STEP_MS = 30_000;
const h = useConsoleHarness();

const b64 = (s: string) => Buffer.from(s).toString("base64");
const XSS = `<img src=x onerror="window.__xss=(window.__xss||0)+1"><svg onload="window.__xss=(window.__xss||0)+1"></svg><script>window.__xss=1</script>`;

/** A completed job (its renter and provider) whose stored result is `result`. */
async function completedJob(result: unknown) {
  const renter = await makeRenter(h.srv, 10_000);
  const provider = await makeProvider(h.srv);
  const job = await seedJob(h.srv, { renterId: renter.id, providerId: provider.id, status: "running", jobType: "image_generation", cost: 100 });
  await settleJob(h.srv, job, renter.id, provider.id, 100, 40);
  await h.srv.sql`UPDATE jobs SET result = ${h.srv.sql.json(result as never)} WHERE id = ${job.id}`;
  return { renter, provider, job };
}

async function signedIn(role: "renter" | "provider" | "admin", secret: string): Promise<Page> {
  const ctx = await h.context();
  await ctx.addInitScript((s) => sessionStorage.setItem("svc-console-session", s), JSON.stringify({ role, secret, label: role }));
  return ctx.newPage();
}

describe("raw job output on the service's origin", () => {
  it("is served with nosniff and a sandbox policy, and as an image only in a raster format, since its bytes are the provider's", async () => {
    const cases: [string, unknown][] = [
      ["text", `<html><body><script>window.__pwn=1</script>HTML from a provider</body></html>`],
      ["svg", { data: b64(`<svg xmlns="http://www.w3.org/2000/svg" onload="window.__pwn=1"><script>window.__pwn=1</script></svg>`), format: "svg" }],
      ["html", { data: b64(`<html><script>window.__pwn=1</script></html>`), format: "html" }],
      ["xml", { data: b64(`<html xmlns="http://www.w3.org/1999/xhtml"><script>window.__pwn=1</script></html>`), format: "xml" }],
    ];
    const report: Record<string, unknown> = {};
    const ctx = await h.context();
    for (const [name, result] of cases) {
      const { renter, job } = await completedJob(result);
      const url = `${h.srv.url}/api/jobs/${job.jobId}/output/raw?key=${renter.key}`;
      const res = await fetch(url);
      const page = await ctx.newPage();
      await page.goto(url).catch(() => undefined);
      const ran = await page.evaluate(() => (window as unknown as { __pwn?: number }).__pwn).catch(() => "no document");
      const contentType = await page.evaluate(() => document.contentType).catch(() => "no document");
      report[name] = {
        "content-type": res.headers.get("content-type"),
        "x-content-type-options": res.headers.get("x-content-type-options"),
        "content-disposition": res.headers.get("content-disposition"),
        "content-security-policy": res.headers.get("content-security-policy"),
        scriptRan: ran ?? false,
        documentType: contentType,
      };
      await page.close();
    }
    for (const r of Object.values(report) as Record<string, unknown>[]) {
      expect(r.scriptRan, "provider's output ran as script on the service origin").toBe(false);
      expect(r["x-content-type-options"]).toBe("nosniff");
      expect(r["content-security-policy"]).toBe("sandbox; default-src 'none'");
    }
    expect(report.text).toMatchObject({ "content-type": "text/plain; charset=utf-8" });
    // Not raster images: served as bytes, not as image/svg+xml or text/html.
    for (const name of ["svg", "html", "xml"]) expect(report[name]).toMatchObject({ "content-type": "application/octet-stream" });
  }, 120_000);

  it("cannot be loaded as a classic script by a page of the console (CSP 'self' gadget)", async () => {
    // The attacker is any renter (or provider): its own job's text output, readable with its own key in the query.
    const { renter, job } = await completedJob(`window.__gadget = "ran: " + typeof sessionStorage.getItem("svc-console-session");`);
    const victim = await makeRenter(h.srv, 0);
    const page = await signedIn("renter", victim.key);
    await page.goto(`${h.srv.url}/#/renter`);
    await page.getByRole("heading", { name: "Balance" }).waitFor({ timeout: STEP_MS });
    // What one markup injection into the console would let an attacker do: an inline script is refused by the CSP ...
    await page.evaluate(() => {
      const s = document.createElement("script");
      s.textContent = "window.__inline = 1";
      document.body.append(s);
    });
    // ... and a script from the service's own origin is refused too: the attacker's bytes there are text, nosniff.
    await page.evaluate((src) => {
      const s = document.createElement("script");
      s.src = src;
      document.body.append(s);
    }, `/api/jobs/${job.jobId}/output/raw?key=${renter.key}`);
    await page.waitForTimeout(1500);
    const w = await page.evaluate(() => ({ inline: (window as never as { __inline?: number }).__inline, gadget: (window as never as { __gadget?: string }).__gadget }));
    expect(w.inline).toBeUndefined();
    expect(w.gadget, "attacker output executed as script under the console's CSP").toBeUndefined();
  }, 60_000);
});

describe("strings other parties control, as the console renders them", () => {
  it("never run as script on the job, provider and operator pages", async () => {
    const renter = await makeRenter(h.srv, 10_000);
    const provider = await makeProvider(h.srv, { gpuModel: `NVIDIA ${XSS}` });
    await h.srv.sql`UPDATE providers SET name = ${XSS}, email = ${"x@x.test"}, rejection_reason = ${XSS} WHERE id = ${provider.id}`;
    const job = await seedJob(h.srv, { renterId: renter.id, providerId: provider.id, status: "running", jobType: "llm-inference", cost: 100 });
    await h.srv.sql`UPDATE jobs SET progress_phase = ${XSS}, progress_pct = 50, error = ${XSS} WHERE id = ${job.id}`;
    await h.srv.sql`INSERT INTO job_logs (job_id, attempt, level, message) VALUES (${job.id}, 1, 'info', ${XSS})`;
    const done = await completedJob({ response: XSS });
    const jsonJob = await completedJob({ result: XSS, html: XSS, data2: { nested: XSS } });

    const visits: [Page, string][] = [];
    const rp = await signedIn("renter", renter.key);
    visits.push([rp, `#/renter/jobs/${job.jobId}`]);
    const rp2 = await signedIn("renter", done.renter.key);
    visits.push([rp2, `#/renter/jobs/${done.job.jobId}`]);
    const rp3 = await signedIn("renter", jsonJob.renter.key);
    visits.push([rp3, `#/renter/jobs/${jsonJob.job.jobId}`]);
    const pp = await signedIn("provider", provider.key);
    visits.push([pp, "#/provider"]);
    const ap = await signedIn("admin", ADMIN_TOKEN);
    visits.push([ap, "#/admin"]);
    for (const [page, hash] of visits) {
      await page.goto(`${h.srv.url}/${hash}`);
      await page.waitForTimeout(2500);
      for (const sub of hash === "#/admin" ? ["#/admin/providers", `#/admin/jobs/${job.jobId}`] : []) {
        await page.evaluate((x) => (location.hash = x), sub);
        await page.waitForTimeout(2500);
      }
      const r = await page.evaluate(() => ({ xss: (window as never as { __xss?: number }).__xss, imgs: document.querySelectorAll("img[src=x]").length, text: document.body.innerText.includes("onerror") }));
      expect(r.xss).toBeUndefined();
      expect(r.imgs).toBe(0);
    }
  }, 120_000);
});
