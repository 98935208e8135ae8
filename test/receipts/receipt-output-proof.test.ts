// A verifier written from docs/receipts.md alone (nothing from src/ is used to
// check), run against receipts of jobs ending each way, over the real HTTP
// server and PostgreSQL; and the output half of the proof: every output a
// receipt names (output_sha256) can be fetched as the bytes that were hashed,
// from GET /api/jobs/{id}/output/result, whatever the result holds and also
// for a failed job that stored one, while /output keeps the interface's shape
// (410 for failed jobs, job_id and status added, strings wrapped).
import crypto from "node:crypto";
import { beforeAll, beforeEach, describe, expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { clearMarketplace } from "../helpers/isolation.js";
import { heartbeatPipeline } from "../../src/domain/providers/heartbeat.js";
import { verifyReceipt } from "../../src/shared/receipt.js";

let adminH: Record<string, string>;
const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0" });
const api = client(srv);
beforeAll(() => {
  adminH = { "x-admin-token": srv.config.adminToken };
});
beforeEach(() => clearMarketplace(srv));

// ---- the verifier, from docs/receipts.md only ----
// RFC 8785: members sorted by UTF-16 code units, no whitespace, ECMAScript number form.
const canon = (v: any): string =>
  v === null || typeof v !== "object"
    ? JSON.stringify(v)
    : Array.isArray(v)
      ? `[${v.map(canon).join(",")}]`
      : `{${Object.keys(v).sort().map((k) => `${JSON.stringify(k)}:${canon(v[k])}`).join(",")}}`;
const sha = (s: string | Buffer) => crypto.createHash("sha256").update(s).digest("hex");
const ed25519 = (b64: string) =>
  crypto.createPublicKey({ key: Buffer.concat([Buffer.from("302a300506032b6570032100", "hex"), Buffer.from(b64, "base64")]), format: "der", type: "spki" });

/**
 * Steps 1-3 of "By hand", and step 4 when an output is given: the bytes GET /api/jobs/{id}/output/result
 * answered. Returns the problems found.
 */
function docsVerify(file: any, keys: any, outputBytes?: string): string[] {
  const problems: string[] = [];
  const { receipt, signature } = file;
  // 1.
  if (signature.key_id !== receipt.signer?.key_id) problems.push("step1: signer key id differs");
  const key = keys.server_keys.find((k: any) => k.key_id === signature.key_id);
  if (!key) problems.push("step1: no server key");
  else if (`srv-${sha(Buffer.from(key.public_key, "base64")).slice(0, 16)}` !== key.key_id) problems.push("step1: key id mismatch");
  // 2.
  else if (!crypto.verify(null, Buffer.from(canon(receipt), "utf8"), ed25519(key.public_key), Buffer.from(signature.value, "base64"))) {
    problems.push("step2: server signature");
  }
  // 3.
  const att = receipt.provider_attestation;
  if (att?.status === "attested") {
    const pk = (keys.provider_keys ?? []).find((k: any) => k.key_id === att.key_id);
    if (!pk || String(pk.provider_id) !== String(att.provider_id)) problems.push("step3: provider key");
    else if (`prv-${sha(Buffer.from(pk.public_key, "base64")).slice(0, 16)}` !== pk.key_id) problems.push("step3: provider key id");
    else if (!crypto.verify(null, Buffer.from(canon(att.statement), "utf8"), ed25519(pk.public_key), Buffer.from(att.signature, "base64"))) {
      problems.push("step3: attestation signature");
    }
    if (att.statement.job_id !== receipt.job_id || att.statement.output_sha256 !== receipt.output_sha256) problems.push("step3: statement not about this receipt");
  }
  // 4. "the SHA-256 (hex) of the bytes it answers must equal output_sha256"; parsed and canonicalised again, the same.
  if (outputBytes !== undefined) {
    if (sha(Buffer.from(outputBytes, "utf8")) !== receipt.output_sha256) problems.push("step4: output bytes do not match output_sha256");
    if (sha(canon(JSON.parse(outputBytes))) !== receipt.output_sha256) problems.push("step4: canonicalised output does not match output_sha256");
  }
  return problems;
}

// ---- fixtures (legacy protocol) ----
async function provider() {
  const p = await makeProvider(srv, { vramMib: 81559 });
  const hb = await api.post("/api/providers/heartbeat", {
    api_key: p.key,
    gpu_status: { gpu_name: "NVIDIA H100 80GB HBM3", gpu_vram_mib: 81559, gpu_count: 1, driver_version: "550.54.15" },
  });
  expect(hb.status, hb.text).toBe(200);
  await heartbeatPipeline(srv.app.deps).flush();
  return p;
}
const submit = async (headers: Record<string, string>, body: Record<string, unknown> = {}) => {
  const r = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 3, ...body }, headers);
  expect(r.status, r.text).toBe(201);
  return r.body.job.job_id as string;
};
const pickUp = async (key: string) => {
  const jobId = (await api.get(`/api/providers/${key}/jobs`)).body.job?.job_id as string | undefined;
  if (jobId) await api.post(`/api/jobs/${jobId}/progress`, { api_key: key, progress_pct: 0, phase: "starting" });
  return jobId;
};
const report = (key: string, jobId: string, body: Record<string, unknown>) => api.post("/api/providers/job-result", { api_key: key, job_id: jobId, ...body });
const keys = async () => (await api.get("/api/receipts/keys")).body;
const receiptOf = async (jobId: string, headers: Record<string, string>) => {
  const r = await api.get(`/api/jobs/${jobId}/receipt`, headers);
  expect(r.status, r.text).toBe(200);
  return r.body;
};
/** GET /output/result: 200, JSON, and its bytes. */
const storedOutput = async (jobId: string, headers: Record<string, string>) => {
  const r = await api.get(`/api/jobs/${jobId}/output/result`, headers);
  expect(r.status, r.text).toBe(200);
  expect(r.headers.get("content-type")).toMatch(/^application\/json/);
  return r.text;
};

describe("the documented by-hand procedure on every way a job ends", () => {
  it("completed, failed, cancelled queued and running, re-queued then completed: all verify with the docs alone", async () => {
    const renter = await makeRenter(srv, 100_000);
    const p = await provider();
    await srv.sql`UPDATE providers SET gpu_count = 1, approved_gpu_count = 1 WHERE id = ${p.id}`;
    const done = await submit(renter.headers);
    expect(await pickUp(p.key)).toBe(done);
    expect((await report(p.key, done, { success: true, result: { text: "é ü 😀 \u2028", n: 0.1, big: 1e21, neg: -5e-7 } })).status).toBe(200);
    const failed = await submit(renter.headers);
    await pickUp(p.key);
    expect((await report(p.key, failed, { success: false, error: "oom" })).status).toBe(200);
    const running = await submit(renter.headers);
    await pickUp(p.key);
    const queued = await submit(renter.headers);
    expect((await api.post(`/api/jobs/${queued}/cancel`, {}, renter.headers)).status).toBe(200);
    expect((await api.post(`/api/jobs/${running}/cancel`, {}, renter.headers)).status).toBe(200);
    const requeued = await submit(renter.headers);
    await pickUp(p.key);
    expect((await api.post(`/api/admin/jobs/${requeued}/requeue`, { reason: "moved" }, adminH)).status).toBe(200);
    await srv.sql`UPDATE providers SET status = 'online' WHERE id = ${p.id}`;
    const again = await pickUp(p.key);
    if (again === requeued) expect((await report(p.key, requeued, { success: true, result: { ok: true } })).status).toBe(200);
    else expect((await api.post(`/api/jobs/${requeued}/cancel`, {}, renter.headers)).status).toBe(200);

    const k = await keys();
    for (const id of [done, failed, queued, running, requeued]) {
      const file = await receiptOf(id, renter.headers);
      expect(docsVerify(file, k), id).toEqual([]);
      const b = file.receipt.billing;
      expect(b.provider_share_halala + b.platform_share_halala).toBe(b.charged_halala);
      expect(b.charged_halala + b.refunded_halala).toBe(b.held_halala);
    }
    // Step 4 on the completed job's output, as /output/result answers it.
    expect(docsVerify(await receiptOf(done, renter.headers), k, await storedOutput(done, renter.headers))).toEqual([]);
    // A job that stored no output has nothing to fetch: the failure (410, as /output) and the cancels.
    expect((await receiptOf(failed, renter.headers)).receipt.output_sha256).toBeNull();
    for (const id of [failed, queued, running]) expect((await api.get(`/api/jobs/${id}/output/result`, renter.headers)).status, id).toBe(410);
  });

  it("answers /output/result only once the job settled, and only to the job's output readers", async () => {
    const renter = await makeRenter(srv, 100_000);
    const other = await makeRenter(srv, 100_000);
    const p = await provider();
    const jobId = await submit(renter.headers);
    await pickUp(p.key);
    const early = await api.get(`/api/jobs/${jobId}/output/result`, renter.headers);
    expect(early.status, early.text).toBe(404);
    expect(early.body.error ?? early.text).toMatch(/no output yet: job is running/);
    expect((await report(p.key, jobId, { success: true, result: { ok: 1 } })).status).toBe(200);
    expect((await api.get(`/api/jobs/${jobId}/output/result`, other.headers)).status).toBe(403);
    expect(await storedOutput(jobId, adminH)).toBe('{"ok":1}');
  });
});

describe("step 4: the output a receipt names can be checked against what the server serves", () => {
  it("a string result: /output/result answers it as a JSON string that hashes to output_sha256; /output wraps it as {response}", async () => {
    const renter = await makeRenter(srv, 100_000);
    const p = await provider();
    const jobId = await submit(renter.headers);
    await pickUp(p.key);
    expect((await report(p.key, jobId, { success: true, result: "the answer is 42" })).status).toBe(200);
    const file = await receiptOf(jobId, renter.headers);
    const k = await keys();
    const bytes = await storedOutput(jobId, renter.headers);
    expect(bytes).toBe('"the answer is 42"');
    expect(docsVerify(file, k, bytes)).toEqual([]);
    expect(verifyReceipt(file, k, { value: JSON.parse(bytes) }).problems).toEqual([]);
    // The interface's shape stays: the string wrapped, job_id and status added (docs: hash that and it does not match).
    const out = await api.get(`/api/jobs/${jobId}/output`, renter.headers);
    expect(out.status).toBe(200);
    expect(out.body).toEqual({ response: "the answer is 42", job_id: jobId, status: "completed" });
    expect(sha(canon(out.body))).not.toBe(file.receipt.output_sha256);
    // The repo's verifier undoes the wrapping it documents: {response}, and {data} as an image job's is answered.
    expect(verifyReceipt(file, k, { value: out.body }).problems).toEqual([]);
    expect(verifyReceipt(file, k, { value: { data: "the answer is 42", job_id: jobId, status: "completed" } }).problems).toEqual([]);
  });

  it("a result object with members named status and job_id: /output replaces them, /output/result serves them as hashed", async () => {
    const renter = await makeRenter(srv, 100_000);
    const p = await provider();
    const jobId = await submit(renter.headers);
    await pickUp(p.key);
    const result = { status: "ok", job_id: "the model's own", answer: "42" };
    expect((await report(p.key, jobId, { success: true, result })).status).toBe(200);
    const file = await receiptOf(jobId, renter.headers);
    const k = await keys();
    const bytes = await storedOutput(jobId, renter.headers);
    expect(JSON.parse(bytes)).toEqual(result);
    expect(docsVerify(file, k, bytes)).toEqual([]);
    expect(verifyReceipt(file, k, { value: JSON.parse(bytes) }).problems).toEqual([]);
    // /output keeps the interface's shape: the job's id and status.
    const out = await api.get(`/api/jobs/${jobId}/output`, renter.headers);
    expect(out.status).toBe(200);
    expect(out.body).toEqual({ answer: "42", job_id: jobId, status: "completed" });
  });

  it("a failed job that stored a result: /output answers 410, /output/result answers the output the receipt names", async () => {
    // A renter-fault failure keeps the daemon's result (settlement endLocked stores it) and the receipt hashes it.
    const renter = await makeRenter(srv, 100_000);
    const p = await provider();
    const jobId = await submit(renter.headers);
    await pickUp(p.key);
    const r = await report(p.key, jobId, { success: false, error: "exit 1", fault: "renter", end_reason: "runtime_error", result: { partial: "half" } });
    expect(r.status, r.text).toBe(200);
    const file = await receiptOf(jobId, renter.headers);
    expect(file.receipt.status).toBe("failed");
    expect(file.receipt.output_sha256).not.toBeNull();
    // The interface: 410 for a failed job.
    const gone = await api.get(`/api/jobs/${jobId}/output`, renter.headers);
    expect(gone.status).toBe(410);
    expect(gone.body).toMatchObject({ status: "failed", job_id: jobId });
    expect((await api.get(`/api/jobs/${jobId}/output/json`, renter.headers)).status).toBe(410);
    // The output the receipt names, for its renter to check.
    const bytes = await storedOutput(jobId, renter.headers);
    const k = await keys();
    expect(docsVerify(file, k, bytes)).toEqual([]);
    expect(verifyReceipt(file, k, { value: JSON.parse(bytes) }).problems).toEqual([]);
  });
});
