// The job page's Output card in a real browser, for every shape of image
// result the service accepts: base64 or a data: URL of it (services/jobs.ts
// imageBytes), with or without a `format` (JobOutcome.output_format: a `data`
// string whose format is not a short lowercase name is a PNG). Data that does
// not decode is said so in the card: the page never throws or waits forever.
// Only a raster format is offered for download under its own name and type; any
// other a provider names (html, svg, hta, exe …) is offered as binary, `.bin`.
import type { Page } from "playwright-core";
import { describe, expect, it } from "vitest";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { ADMIN_TOKEN } from "../helpers/server.js";
import { seedJob, settleJob } from "../admin/helpers.js";
import { shot, useConsoleHarness, watchProblems } from "./browser.js";

const STEP_MS = 30_000;
const h = useConsoleHarness();
/** A 1x1 PNG. */
const PNG_B64 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";

/** A completed image job whose stored result is `result`, and a renter's page on it. */
async function jobPage(result: unknown): Promise<{ page: Page; problems: string[]; jobId: string }> {
  const renter = await makeRenter(h.srv, 10_000);
  const provider = await makeProvider(h.srv);
  const job = await seedJob(h.srv, { renterId: renter.id, providerId: provider.id, status: "running", jobType: "image_generation", cost: 100 });
  await settleJob(h.srv, job, renter.id, provider.id, 100, 40);
  await h.srv.sql`UPDATE jobs SET result = ${h.srv.sql.json(result as never)} WHERE id = ${job.id}`;
  const ctx = await h.context();
  await ctx.addInitScript((s) => sessionStorage.setItem("svc-console-session", s), JSON.stringify({ role: "renter", secret: renter.key, label: "Renter" }));
  const page = await ctx.newPage();
  const problems = watchProblems(page);
  await page.goto(`${h.srv.url}/#/renter/jobs/${job.jobId}`);
  await page.getByRole("progressbar", { name: "Job progress" }).waitFor({ timeout: STEP_MS });
  return { page, problems, jobId: job.jobId };
}

/** The PNG is shown (decoded: 1 px wide) and offered as `<job>.png`. */
async function expectPng(page: Page, jobId: string, problems: string[]) {
  const img = page.getByTestId("output-image");
  await img.waitFor({ timeout: STEP_MS });
  await expect.poll(() => img.evaluate((el: HTMLImageElement) => el.complete && el.naturalWidth), { timeout: STEP_MS }).toBe(1);
  expect(await page.getByRole("link", { name: "Download PNG" }).getAttribute("download")).toBe(`${jobId}.png`);
  expect(problems).toEqual([]);
}

describe("the job page's output", () => {
  it("shows a PNG given as a data: URL", async () => {
    const { page, problems, jobId } = await jobPage({ data: `data:image/png;base64,${PNG_B64}`, format: "png" });
    await expectPng(page, jobId, problems);
  }, 60_000);

  it("shows data without a format, or with one that is not a lowercase name, as the PNG the service says it is", async () => {
    for (const result of [{ data: PNG_B64 }, { data: PNG_B64, format: "PNG" }]) {
      const { page, problems, jobId } = await jobPage(result);
      await expectPng(page, jobId, problems);
      // The service's raw output of it is the same PNG.
      const raw = await fetch(`${h.srv.url}/api/jobs/${jobId}/output/raw`, { headers: { "x-admin-token": ADMIN_TOKEN } });
      expect(raw.headers.get("content-type")).toBe("image/png");
    }
  }, 90_000);

  it("says so in the card when the image data does not decode, and the page goes on working", async () => {
    const { page, problems } = await jobPage({ data: "data:image/png;base64,not base64 at all!", format: "png" });
    const output = page.getByRole("region", { name: "Output" });
    await expect.poll(() => output.getByRole("alert").textContent(), { timeout: STEP_MS }).toBe("The PNG output cannot be read: its data is not base64.");
    expect(await output.getByText("Loading output…").count()).toBe(0);
    await shot(page, "renter-job-undecodable-output");
    expect(await page.getByTestId("output-image").count()).toBe(0);
    expect(await page.getByRole("progressbar", { name: "Job progress" }).getAttribute("data-status")).toBe("completed");
    expect(problems).toEqual([]);
  }, 60_000);

  it("offers an output in a format that is not a raster image as binary (.bin, application/octet-stream), never under the provider's file type", async () => {
    const b64 = (text: string) => Buffer.from(text).toString("base64");
    const offered: Record<string, { label: string | null; file: string; type: string }> = {};
    for (const [format, data] of [
      ["html", b64(`<html><script>alert(document.domain)</script></html>`)],
      ["svg", b64(`<svg xmlns="http://www.w3.org/2000/svg" onload="alert(1)"/>`)],
      ["hta", b64(`<script>new ActiveXObject("WScript.Shell").Run("calc")</script>`)],
      ["exe", b64("MZ\x90\x00")],
      ["jpeg", PNG_B64],
    ] as const) {
      const { page, problems } = await jobPage({ data, format });
      // The page again, recording the type of each object URL it makes (CSP connect-src keeps fetch off blob:).
      await page.addInitScript(() => {
        const make = URL.createObjectURL.bind(URL);
        const types: Record<string, string> = ((window as never as { __types: Record<string, string> }).__types = {});
        URL.createObjectURL = (b: Blob | MediaSource) => {
          const u = make(b);
          types[u] = (b as Blob).type;
          return u;
        };
      });
      await page.reload();
      const link = page.locator(".output a.button");
      await link.waitFor({ timeout: STEP_MS });
      const [download] = await Promise.all([page.waitForEvent("download", { timeout: STEP_MS }), link.click()]);
      const href = (await link.getAttribute("href"))!;
      const type = await page.evaluate((u) => (window as never as { __types?: Record<string, string> }).__types?.[u] ?? "", href);
      offered[format] = { label: await link.textContent(), file: download.suggestedFilename().replace(/^job-[0-9a-f]+/, ""), type };
      expect(problems).toEqual([]);
      await page.context().close();
    }
    const binary = { label: "Download binary", file: ".bin", type: "application/octet-stream" };
    expect(offered).toEqual({ html: binary, svg: binary, hta: binary, exe: binary, jpeg: { label: "Download JPEG", file: ".jpeg", type: "image/jpeg" } });
  }, 180_000);
});
