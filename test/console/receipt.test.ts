// The job page's Receipt card in a real browser against a real server: what a
// settled job's signed receipt says (against the job row and its ledger
// transfers), the receipt file it downloads (the REST route's very bytes, which
// verifyReceipt and `svc receipt verify` accept), and its signatures checked in
// the browser with WebCrypto by the shared rules (src/shared/receipt-check.ts):
// verified with the provider's attestation; "does not verify" for a receipt
// changed on its way; a revoked key named as such; no claim at all where the
// browser has no Ed25519. The output the service serves now is hashed in the
// browser and checked against the receipt's output_sha256: it matches, does
// not match (changed in the database after signing), or there is none. A job
// that has not ended has no card, and one that ended before receipts were
// issued says so plainly.
import crypto from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { fromJson, type JsonValue } from "@bufbuild/protobuf";
import { ValueSchema } from "@bufbuild/protobuf/wkt";
import type { Page } from "playwright-core";
import { afterAll, describe, expect, it } from "vitest";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { client } from "../helpers/http.js";
import { ADMIN_TOKEN } from "../helpers/server.js";
import { openStream, type TestStream } from "../daemon/grpc-stream.js";
import { tempDir } from "../daemon/helpers.js";
import { seedJob, settleJob } from "../admin/helpers.js";
import { runSvc } from "../cli/run-svc.js";
import { attestationStatement, ed25519Signer, keyIdOf, verifyReceipt, type GpuFacts } from "../../src/shared/receipt.js";
import { shot, signedIn, useConsoleHarness } from "./browser.js";

const STEP_MS = 30_000;
// The job sweep slowed down: a run moved back in time below is not timed out under the test.
const h = useConsoleHarness({ SVC_JOB_SWEEP_MS: "60000" });
const api = () => client(h.srv.url);
const streams: TestStream[] = [];
afterAll(() => {
  for (const s of streams) s.cancel();
});

const GPU: GpuFacts = { model: "NVIDIA A100-SXM4-80GB", count: 1, vram_mib: 81920, driver_version: "550.54.15", uuids: ["GPU-a100-0001"] };

/**
 * A job completed over the daemon stream by a provider whose daemon key signed an attestation of its
 * result, so that its receipt carries one.
 */
async function attestedJob() {
  const renter = await makeRenter(h.srv, 10_000);
  const provider = await makeProvider(h.srv);
  const daemonKey = ed25519Signer(crypto.randomBytes(32));
  const keyId = keyIdOf("prv", daemonKey.publicKey);
  const s = openStream(h.srv.port, provider.key);
  streams.push(s);
  s.send({ case: "hello", value: { daemonVersion: "5.0.0", providerKey: daemonKey.publicKey } });
  await s.next("welcome");
  await expect.poll(async () => (await api().get(`/api/receipts/keys?key_id=${keyId}`)).body.provider_keys?.length, { timeout: STEP_MS }).toBe(1);
  const sub = await api().post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 2, provider_id: provider.id, params: { suite: "quick", iterations: 1 } }, renter.headers);
  expect(sub.status, sub.text).toBe(201);
  const jobId: string = sub.body.job.job_id;
  expect((await s.next("job", STEP_MS)).jobId).toBe(jobId);
  s.send({ case: "jobAccepted", value: { jobId } });
  const result = { scores: { cpu_matmul_gflops: 12.5 }, suite: "quick" };
  const statement = attestationStatement(jobId, result, GPU);
  s.send({
    case: "result",
    value: {
      jobId,
      success: true,
      result: fromJson(ValueSchema, result as JsonValue),
      attestation: { keyId, statement: statement as never, signature: daemonKey.signCanonical(statement) },
    },
  });
  expect((await s.next("resultAck", STEP_MS)).status).toBe("completed");
  s.cancel();
  return { renter, provider, jobId, keyId };
}

/**
 * A job the provider took over the legacy JSON protocol (no attestation), running; `complete` ends it.
 * `balance` and `minutes`: the renter's funds and the job's booked minutes.
 */
async function runningJob(balance = 10_000, minutes = 2) {
  const renter = await makeRenter(h.srv, balance);
  const provider = await makeProvider(h.srv);
  const sub = await api().post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: minutes, provider_id: provider.id }, renter.headers);
  expect(sub.status, sub.text).toBe(201);
  const jobId: string = sub.body.job.job_id;
  await api().get(`/api/providers/${provider.key}/jobs`);
  const complete = async () => {
    const done = await api().post("/api/providers/job-result", { api_key: provider.key, job_id: jobId, success: true, result: { scores: { gflops: 3.5 } } });
    expect(done.status, done.text).toBe(200);
  };
  return { renter, provider, jobId, complete };
}

/** The page's job, once shown. */
async function openJob(page: Page, route: string) {
  await page.goto(`${h.srv.url}/#/${route}`);
  await page.getByRole("progressbar", { name: "Job progress" }).waitFor({ timeout: STEP_MS });
}

/** The Receipt card's check, once it has one: its data-verified and its text. */
async function verification(page: Page) {
  const v = page.getByRole("region", { name: "Receipt" }).getByTestId("receipt-verification");
  await v.waitFor({ timeout: STEP_MS });
  return { verified: await v.getAttribute("data-verified"), text: (await v.textContent()) ?? "" };
}

/** The Receipt card's output check, once it has one: its data-output and its text. */
async function outputCheck(page: Page) {
  const o = page.getByRole("region", { name: "Receipt" }).getByTestId("receipt-output");
  await o.waitFor({ timeout: STEP_MS });
  return { output: await o.getAttribute("data-output"), text: (await o.textContent()) ?? "" };
}

/** SHA-256 (hex) of the bytes GET /api/jobs/{id}/output/result answers, as `headers` read them. */
async function servedOutputHash(jobId: string, headers: Record<string, string>) {
  const res = await fetch(`${h.srv.url}/api/jobs/${jobId}/output/result`, { headers });
  expect(res.status).toBe(200);
  return crypto.createHash("sha256").update(Buffer.from(await res.arrayBuffer())).digest("hex");
}

/** The receipt facts as the card shows them (dt: dd). */
const facts = (page: Page) =>
  page.getByTestId("receipt").evaluate((dl) => {
    const out: Record<string, string> = {};
    for (const dt of dl.querySelectorAll("dt")) out[dt.textContent ?? ""] = (dt.nextElementSibling as HTMLElement).innerText.replace(/\s*Copy(ied)?$/, "");
    return out;
  });

const sar = (halala: number) => `${(halala / 100).toFixed(2)} SAR`;

describe("the job page's receipt", () => {
  it("shows a completed job's receipt with the ledger's figures, verified with its attestation, and downloads the file svc receipt verify takes", async () => {
    const { renter, provider, jobId, keyId } = await attestedJob();
    const rest = await api().get(`/api/jobs/${jobId}/receipt`, renter.headers);
    expect(rest.status, rest.text).toBe(200);
    const receipt = rest.body.receipt;
    const [job] = await h.srv.sql<{ id: number; cost_halala: number; actual_cost_halala: number; provider_earned_halala: number; platform_fee_halala: number; actual_minutes: number }[]>`
      SELECT id, cost_halala, actual_cost_halala, provider_earned_halala, platform_fee_halala, actual_minutes FROM jobs WHERE job_id = ${jobId}`;
    const [ledger] = await h.srv.sql<{ held: number; provider: number; platform: number; refunded: number }[]>`
      SELECT coalesce(sum(t.amount) FILTER (WHERE c.kind = 'renter_held'), 0)::int AS held,
             coalesce(sum(t.amount) FILTER (WHERE t.kind = 'charge_provider'), 0)::int AS provider,
             coalesce(sum(t.amount) FILTER (WHERE t.kind = 'charge_platform'), 0)::int AS platform,
             coalesce(sum(t.amount) FILTER (WHERE d.kind = 'renter_held' AND c.kind = 'renter_available'), 0)::int AS refunded
      FROM ledger_transfers t JOIN ledger_accounts d ON d.id = t.debit_account_id JOIN ledger_accounts c ON c.id = t.credit_account_id
      WHERE t.job_id = ${job.id}`;
    // The job row and its ledger transfers agree, and a charge was made (the figures below are not all zero).
    expect(ledger).toEqual({
      held: Number(job.cost_halala),
      provider: Number(job.provider_earned_halala),
      platform: Number(job.platform_fee_halala),
      refunded: Number(job.cost_halala) - Number(job.actual_cost_halala),
    });
    expect(Number(job.actual_cost_halala)).toBeGreaterThan(0);

    const { page, problems } = await signedIn(h, "renter", renter.key);
    await openJob(page, `renter/jobs/${jobId}`);
    expect(await verification(page)).toEqual({
      verified: "true",
      text: expect.stringContaining(`Signature verified (key ${rest.body.signature.key_id})`),
    });
    expect((await verification(page)).text).toContain(`Provider attestation verified (provider #${provider.id}, key ${keyId})`);
    expect(await servedOutputHash(jobId, renter.headers)).toBe(receipt.output_sha256);
    expect(await outputCheck(page)).toEqual({ output: "match", text: expect.stringContaining("Output matches the receipt") });
    expect(rest.body.signature.key_id).toMatch(/^srv-[0-9a-f]{16}$/);
    const shown = await facts(page);
    expect(shown).toMatchObject({
      Receipt: receipt.receipt_id,
      "Signer key": rest.body.signature.key_id,
      Status: "completed",
      "End reason": "completed",
      Fault: "none",
      Held: sar(ledger.held),
      Charged: sar(ledger.provider + ledger.platform),
      "Provider's share": sar(ledger.provider),
      "Platform fee": sar(ledger.platform),
      Refunded: sar(ledger.refunded),
      Billed: `${Number(job.actual_minutes)} min at ${sar(receipt.billing.rate_halala_per_minute)}/min`,
      "Provider attestation": `attested by provider #${provider.id} (key ${keyId})`,
    });
    expect(shown.Issued).toMatch(/UTC$/);
    expect(shown).not.toHaveProperty("Uncovered"); // uncovered_halala is 0
    // The hashes shown short, whole in their title.
    const taskHash = page.getByTestId("receipt").locator(`code[title="${receipt.task_spec_sha256}"]`);
    expect(await taskHash.textContent()).toBe(`${receipt.task_spec_sha256.slice(0, 12)}…`);
    expect(await page.getByTestId("receipt").locator(`code[title="${receipt.output_sha256}"]`).count()).toBe(1);
    await page.context().grantPermissions(["clipboard-read", "clipboard-write"], { origin: h.srv.url });
    await page.getByRole("button", { name: "Copy output hash" }).click();
    await page.getByRole("button", { name: "Copy output hash" }).getByText("Copied").waitFor({ timeout: STEP_MS });
    expect(await page.evaluate(() => navigator.clipboard.readText())).toBe(receipt.output_sha256);
    await shot(page, "renter-job-receipt");

    // The download: the REST route's answer byte for byte, as <job>.receipt.json.
    const link = page.getByRole("link", { name: "Download receipt" });
    const [download] = await Promise.all([page.waitForEvent("download", { timeout: STEP_MS }), link.click()]);
    expect(download.suggestedFilename()).toBe(`${jobId}.receipt.json`);
    const dir = tempDir("console-receipt");
    const file = path.join(dir, download.suggestedFilename());
    await download.saveAs(file);
    const text = fs.readFileSync(file, "utf8");
    expect(text).toBe(rest.text);
    const keysText = (await api().get("/api/receipts/keys")).text;
    expect(verifyReceipt(JSON.parse(text), JSON.parse(keysText)).problems).toEqual([]);
    const keysFile = path.join(dir, "keys.json");
    fs.writeFileSync(keysFile, keysText);
    const cli = await runSvc(["receipt", "verify", file, "--keys", keysFile], { home: dir });
    expect(cli.code, cli.stdout + cli.stderr).toBe(0);
    expect(cli.stdout).toMatch(new RegExp(`of job ${jobId}: valid`));
    expect(problems).toEqual([]);

    // Its provider and an admin see the same card, verified.
    for (const [role, secret, route] of [["provider", provider.key, `provider/job/${jobId}`], ["admin", ADMIN_TOKEN, `admin/jobs/${jobId}`]] as const) {
      const other = await signedIn(h, role, secret);
      await openJob(other.page, route);
      expect((await verification(other.page)).verified, role).toBe("true");
      expect((await facts(other.page)).Receipt, role).toBe(receipt.receipt_id);
      expect((await outputCheck(other.page)).output, role).toBe("match");
      expect(other.problems, role).toEqual([]);
    }
  }, 240_000);

  it("shows the uncovered cost of a run that outlasted the renter's funds", async () => {
    // A benchmark (10 halala a minute) on a 1-halala hold, run 5 minutes by the clock, 25 halala in the wallet.
    const { renter, jobId, complete } = await runningJob(25, 0.01);
    await h.srv.sql`UPDATE jobs SET started_at = now() - interval '270 seconds', acked_at = coalesce(acked_at, now()) WHERE job_id = ${jobId}`;
    await complete();
    const billing = (await api().get(`/api/jobs/${jobId}/receipt`, renter.headers)).body.receipt.billing;
    expect(billing).toMatchObject({ billed_minutes: 5, charged_halala: 25, uncovered_halala: 25 });
    const { page, problems } = await signedIn(h, "renter", renter.key);
    await openJob(page, `renter/jobs/${jobId}`);
    expect((await verification(page)).verified).toBe("true");
    expect(await facts(page)).toMatchObject({
      Charged: sar(25),
      Billed: `5 min at ${sar(10)}/min`,
      Uncovered: `${sar(25)} (billed minutes the renter's funds did not cover)`,
    });
    expect(problems).toEqual([]);
  }, 120_000);

  it("says whether the output the service serves now matches the receipt: an output altered after signing does not, a removed one is missing", async () => {
    const { renter, jobId, complete } = await runningJob();
    await complete();
    const receipt = (await api().get(`/api/jobs/${jobId}/receipt`, renter.headers)).body.receipt;
    expect(receipt.output_sha256).toMatch(/^[0-9a-f]{64}$/);
    const { page, problems } = await signedIn(h, "renter", renter.key);
    await openJob(page, `renter/jobs/${jobId}`);
    let out = await outputCheck(page);
    expect(out.output).toBe("match");
    expect(out.text).toContain("Output matches the receipt");
    expect(out.text).toContain(receipt.output_sha256.slice(0, 12));

    // The stored result changed in the database after the receipt was signed: the receipt still verifies, the output does not match it.
    await h.srv.sql`UPDATE jobs SET result = ${h.srv.sql.json({ scores: { gflops: 99.5 } })} WHERE job_id = ${jobId}`;
    const altered = await servedOutputHash(jobId, renter.headers);
    expect(altered).not.toBe(receipt.output_sha256);
    await page.reload();
    await openJob(page, `renter/jobs/${jobId}`);
    out = await outputCheck(page);
    expect(out.output).toBe("mismatch");
    expect(out.text).toContain("Output does not match the receipt");
    expect(out.text).toContain(altered.slice(0, 12));
    expect(out.text).toContain(receipt.output_sha256.slice(0, 12));
    expect(out.text).not.toContain("Output matches");
    expect((await verification(page)).verified).toBe("true");
    await shot(page, "renter-job-receipt-output-changed");

    // The stored result removed: the service serves none where the receipt names one.
    await h.srv.sql`UPDATE jobs SET result = NULL WHERE job_id = ${jobId}`;
    await page.reload();
    await openJob(page, `renter/jobs/${jobId}`);
    out = await outputCheck(page);
    expect(out.output).toBe("none");
    expect(out.text).toContain("No output: the service serves none, but the receipt names one");
    expect(await page.getByTestId("receipt-output").getAttribute("class")).toContain("failed");
    expect(problems).toEqual([]);
  }, 120_000);

  it("says a job that stored no output has none, as its receipt records", async () => {
    const { renter, jobId } = await runningJob();
    const cancel = await api().post(`/api/jobs/${jobId}/cancel`, {}, renter.headers);
    expect(cancel.status, cancel.text).toBe(200);
    expect((await api().get(`/api/jobs/${jobId}/receipt`, renter.headers)).body.receipt.output_sha256).toBeNull();
    const { page, problems } = await signedIn(h, "renter", renter.key);
    await openJob(page, `renter/jobs/${jobId}`);
    const out = await outputCheck(page);
    expect(out.output).toBe("none");
    expect(out.text).toContain("No output: the receipt records none, and the service serves none.");
    expect(await page.getByTestId("receipt-output").getAttribute("class")).not.toContain("failed");
    expect((await verification(page)).verified).toBe("true");
    expect(problems).toEqual([]);
  }, 120_000);

  it("says a receipt changed on its way does not verify, and shows what it was sent", async () => {
    const { renter, jobId, complete } = await runningJob();
    await complete();
    const rest = (await api().get(`/api/jobs/${jobId}/receipt`, renter.headers)).body;
    const { page, problems } = await signedIn(h, "renter", renter.key);
    await page.route("**/svc.v1.ReceiptService/GetJobReceipt", async (route) => {
      const res = await route.fetch();
      const body = await res.json();
      body.receipt.billing.charged_halala += 100;
      await route.fulfill({ response: res, json: body });
    });
    await openJob(page, `renter/jobs/${jobId}`);
    const v = await verification(page);
    expect(v.verified).toBe("false");
    expect(v.text).toContain("Signature does not verify");
    expect(v.text).toContain("This receipt does not verify.");
    expect(v.text).toContain("the server's signature does not match the receipt");
    expect(v.text).not.toContain("Signature verified");
    expect((await facts(page)).Charged).toBe(sar(rest.receipt.billing.charged_halala + 100));
    expect((await facts(page))["Provider attestation"]).toMatch(/^none \(not_attested\): the result came without a provider signature/);
    await shot(page, "renter-job-receipt-changed");
    expect(problems).toEqual([]);
  }, 120_000);

  it("says a receipt signed by a revoked key proves nothing", async () => {
    const { renter, jobId, complete } = await runningJob();
    await complete();
    const { page, problems } = await signedIn(h, "renter", renter.key);
    // The keys as they would read had the key been revoked after the page fetched the receipt.
    await page.route("**/svc.v1.ReceiptService/ListReceiptKeys", async (route) => {
      const res = await route.fetch();
      const body = await res.json();
      for (const k of body.serverKeys ?? []) Object.assign(k, { revokedAt: "2026-01-02T03:04:05.000Z", revocationReason: "seed in a leaked backup" });
      await route.fulfill({ response: res, json: body });
    });
    await openJob(page, `renter/jobs/${jobId}`);
    const v = await verification(page);
    expect(v.verified).toBe("false");
    expect(v.text).toMatch(/Signed by a revoked key \(srv-[0-9a-f]{16}, revoked .*\): the signature proves nothing/);
    expect(v.text).toContain("seed in a leaked backup");
    expect(problems).toEqual([]);
  }, 120_000);

  it("claims nothing in a browser without Ed25519, and points to svc receipt verify", async () => {
    const { renter, jobId, complete } = await runningJob();
    await complete();
    const { page, problems } = await signedIn(h, "renter", renter.key);
    // WebCrypto as a browser without Ed25519 has it: the algorithm is not supported.
    // (As text: the test's compiled functions may call helpers the page does not have.)
    await page.addInitScript({
      content: `{
        const importKey = crypto.subtle.importKey.bind(crypto.subtle);
        crypto.subtle.importKey = (format, data, algorithm, ...rest) =>
          String(algorithm?.name ?? algorithm).toLowerCase() === "ed25519"
            ? Promise.reject(new DOMException("Unrecognized name.", "NotSupportedError"))
            : importKey(format, data, algorithm, ...rest);
      }`,
    });
    await openJob(page, `renter/jobs/${jobId}`);
    const v = await verification(page);
    expect(v.verified).toBe("unavailable");
    expect(v.text).toContain("Verification is not available in this browser");
    expect(v.text).toContain(`svc receipt verify ${jobId}.receipt.json`);
    expect(v.text).not.toMatch(/verified \(/);
    expect(await page.getByRole("link", { name: "Download receipt" }).getAttribute("download")).toBe(`${jobId}.receipt.json`);
    // SHA-256 is there: the output is still checked.
    expect((await outputCheck(page)).output).toBe("match");
    expect(problems).toEqual([]);
  }, 120_000);

  it("checks neither the signature nor the output in a page without WebCrypto, and points to svc receipt verify --output", async () => {
    const { renter, jobId, complete } = await runningJob();
    await complete();
    const { page, problems } = await signedIn(h, "renter", renter.key);
    // As a page served over plain HTTP from another host than localhost has it: no crypto.subtle.
    await page.addInitScript({ content: `Object.defineProperty(crypto, "subtle", { get: () => undefined });` });
    await openJob(page, `renter/jobs/${jobId}`);
    expect((await verification(page)).verified).toBe("unavailable");
    const out = await outputCheck(page);
    expect(out.output).toBe("unavailable");
    expect(out.text).toContain("Output not checked");
    expect(out.text).toContain(`svc receipt verify ${jobId}.receipt.json --output output.json`);
    expect(out.text).not.toMatch(/matches/);
    expect(problems).toEqual([]);
  }, 120_000);

  it("shows no receipt card while the job runs, and the card once it has completed", async () => {
    const { renter, jobId, complete } = await runningJob();
    const { page, problems } = await signedIn(h, "renter", renter.key);
    await openJob(page, `renter/jobs/${jobId}`);
    expect(await page.getByRole("progressbar", { name: "Job progress" }).getAttribute("data-status")).toBe("running");
    await page.getByRole("region", { name: "Output" }).waitFor({ timeout: STEP_MS });
    expect(await page.getByRole("region", { name: "Receipt" }).count()).toBe(0);
    expect(await page.getByTestId("receipt-note").textContent()).toBe("A signed receipt is issued when the job settles.");
    await complete();
    expect((await verification(page)).verified).toBe("true");
    expect(await page.getByTestId("receipt-note").count()).toBe(0);
    expect(problems).toEqual([]);
  }, 120_000);

  it("says plainly that a job which ended before receipts were issued has none", async () => {
    const renter = await makeRenter(h.srv, 10_000);
    const provider = await makeProvider(h.srv);
    // Settled through the ledger alone, as jobs were before receipts: no receipt was issued.
    const job = await seedJob(h.srv, { renterId: renter.id, providerId: provider.id, status: "running", jobType: "benchmark", cost: 100 });
    await settleJob(h.srv, job, renter.id, provider.id, 100, 40);
    expect((await api().get(`/api/jobs/${job.jobId}/receipt`, renter.headers)).status).toBe(404);
    const { page, problems } = await signedIn(h, "renter", renter.key);
    await openJob(page, `renter/jobs/${job.jobId}`);
    const card = page.getByRole("region", { name: "Receipt" });
    await expect.poll(() => card.locator(".empty").textContent(), { timeout: STEP_MS }).toBe("This job ended before receipts were issued: it has no receipt.");
    expect(await card.getByRole("alert").count()).toBe(0);
    expect(await card.getByRole("link", { name: "Download receipt" }).count()).toBe(0);
    expect(problems).toEqual([]);
  }, 120_000);
});
