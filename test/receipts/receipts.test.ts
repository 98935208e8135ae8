// Signed job receipts over real HTTP: one for each way a job ends, checked
// offline with the published public keys only; any change to the receipt, its
// signature or the output fails the check; a rotated key still verifies old
// receipts; a job never gets two receipts, also when its result races a
// cancel or the timeout sweep; receipts cannot be changed; who may read them.
import { beforeAll, beforeEach, describe, expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { receiptReads } from "./helpers.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { clearMarketplace, takeProvidersOffline } from "../helpers/isolation.js";
import { dispatchForProvider } from "../../src/domain/dispatch/dispatch.js";
import { heartbeatPipeline } from "../../src/domain/providers/heartbeat.js";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import { sweepJobs } from "../../src/workers/job-timeouts.js";
import { outputSha256, repeatedMemberName, sha256Hex, verifyReceipt, type PublishedKeys } from "../../src/shared/receipt.js";
import { canonicalJson } from "../../src/shared/task-signature.js";
import { PROVIDER_KEYS_COUNTED, PROVIDER_KEYS_OFFSET_MAX } from "../../src/domain/money/receipts.js";

let adminH: Record<string, string>;

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0" });
const api = client(srv);
beforeAll(async () => {
  adminH = { "x-admin-token": srv.config.adminToken };
});
beforeEach(() => clearMarketplace(srv));

const GPUS = [
  { index: 0, name: "NVIDIA H100 80GB HBM3", uuid: "GPU-11111111-2222-3333-4444-555555555555", vram_mib: 81559 },
  { index: 1, name: "NVIDIA H100 80GB HBM3", uuid: "GPU-66666666-7777-8888-9999-000000000000", vram_mib: 81559 },
];

/** An online provider whose heartbeat reported two GPUs with their UUIDs (legacy protocol). */
async function gpuProvider() {
  const p = await makeProvider(srv, { vramMib: 81559 });
  const hb = await api.post("/api/providers/heartbeat", {
    api_key: p.key,
    gpu_status: { gpu_name: "NVIDIA H100 80GB HBM3", gpu_vram_mib: 81559, gpu_count: 2, driver_version: "550.54.15", all_gpus: GPUS },
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
/** A legacy daemon's poll and its first report on the job (which confirms the pickup: the job is then billable). */
const pickUp = async (key: string) => {
  const jobId = (await api.get(`/api/providers/${key}/jobs`)).body.job?.job_id as string | undefined;
  if (jobId) await api.post(`/api/jobs/${jobId}/progress`, { api_key: key, progress_pct: 0, phase: "starting" });
  return jobId;
};
const result = (key: string, jobId: string, body: Record<string, unknown> = { success: true, result: { response: "done", tokens: 7 } }) =>
  api.post("/api/providers/job-result", { api_key: key, job_id: jobId, ...body });
const { keys, receiptOf } = receiptReads(api);

/** The receipt agrees with the job row and the ledger, and verifies with the published keys. */
async function checkAgainstBooks(jobId: string, file: any) {
  const [job] = await srv.sql`SELECT * FROM jobs WHERE job_id = ${jobId}`;
  const r = file.receipt;
  expect(r).toMatchObject({
    type: "svc.job-receipt",
    version: 1,
    job_id: jobId,
    renter_id: job.renter_id,
    provider_id: job.provider_id,
    job_type: job.job_type,
    status: job.status,
    end_reason: job.end_reason,
    fault: job.fault,
    task_spec_sha256: sha256Hex(canonicalJson(job.task_spec)),
    output_sha256: outputSha256(job.result),
    ended_at: job.completed_at.toISOString(),
    issued_at: job.completed_at.toISOString(),
  });
  const b = r.billing;
  expect(b).toMatchObject({
    rate_halala_per_minute: job.rate_halala_per_minute,
    billed_minutes: job.actual_minutes,
    held_halala: job.cost_halala,
    charged_halala: job.actual_cost_halala,
    provider_share_halala: job.provider_earned_halala,
    platform_share_halala: job.platform_fee_halala,
  });
  expect(b.charged_halala + b.refunded_halala).toBe(b.held_halala);
  expect(b.rate_halala_per_minute * b.billed_minutes).toBe(b.charged_halala + b.uncovered_halala);
  const attempts = await srv.sql`SELECT attempt, end_reason, fault, cost_halala FROM job_attempts WHERE job_id = ${job.id} ORDER BY attempt`;
  expect(r.attempts.map((a: any) => [a.attempt, a.end_reason, a.fault, a.charged_halala])).toEqual(
    attempts.map((a) => [a.attempt, a.end_reason, a.fault, a.cost_halala ?? 0]),
  );
  expect(b.provider_share_halala + b.platform_share_halala).toBe(b.charged_halala);
  const v = verifyReceipt(file, await keys());
  expect(v.problems).toEqual([]);
  expect(v.ok).toBe(true);
  expect(await ledgerProblems(srv.sql)).toEqual([]);
  return r;
}

describe("a receipt for each end of a job", () => {
  it("completed: the money, the attempt with its GPU facts, the output hash; no provider attestation on the legacy protocol", async () => {
    const renter = await makeRenter(srv, 10_000);
    const provider = await gpuProvider();
    const jobId = await submit(renter.headers);
    expect(await pickUp(provider.key)).toBe(jobId);
    expect((await result(provider.key, jobId)).status).toBe(200);

    const file = await receiptOf(jobId, renter.headers);
    expect(file.signature).toMatchObject({ algorithm: "Ed25519", key_id: file.receipt.signer.key_id });
    const r = await checkAgainstBooks(jobId, file);
    expect(r.status).toBe("completed");
    expect(r.billing.charged_halala).toBeGreaterThan(0);
    expect(r.billing.billed_minutes).toBe(1);
    expect(r.billing.billed_seconds).toBeGreaterThanOrEqual(0);
    expect(r.billing.billed_seconds).toBeLessThanOrEqual(60);
    expect(r.attempts).toEqual([
      expect.objectContaining({
        attempt: 1,
        provider_id: provider.id,
        status: "completed",
        end_reason: "completed",
        fault: "none",
        charged_halala: r.billing.charged_halala,
        gpu: { model: "NVIDIA H100 80GB HBM3", count: 2, vram_mib: 81559, driver_version: "550.54.15", uuids: GPUS.map((g) => g.uuid) },
      }),
    ]);
    expect(r.attempts[0].started_at).toEqual(expect.any(String));
    expect(r.provider_attestation).toMatchObject({ status: "none", reason: "not_attested" });
    expect(r.provider_attestation.detail).toMatch(/legacy JSON protocol/);

    // The output as the output route answers it, and as the bare result, both match its hash.
    const out = await api.get(`/api/jobs/${jobId}/output`, renter.headers);
    expect(verifyReceipt(file, await keys(), { value: out.body }).ok).toBe(true);
    expect(verifyReceipt(file, await keys(), { value: { response: "done", tokens: 7 } }).ok).toBe(true);
    expect(verifyReceipt(file, await keys(), { value: { response: "done", tokens: 8 } }).problems).toEqual([
      "the output does not match the receipt's output_sha256",
    ]);
    // The same answer on every read, and the provider and an admin read it too.
    expect(await receiptOf(jobId, renter.headers)).toEqual(file);
    expect(await receiptOf(jobId, { "x-provider-key": provider.key })).toEqual(file);
    expect(await receiptOf(jobId, adminH)).toEqual(file);
  });

  it("failed: the whole hold goes back and the receipt says so", async () => {
    const renter = await makeRenter(srv, 10_000);
    const provider = await gpuProvider();
    const jobId = await submit(renter.headers);
    await pickUp(provider.key);
    expect((await result(provider.key, jobId, { success: false, error: "CUDA out of memory" })).status).toBe(200);
    const r = await checkAgainstBooks(jobId, await receiptOf(jobId, renter.headers));
    expect(r).toMatchObject({ status: "failed", output_sha256: null });
    expect(r.billing).toMatchObject({ charged_halala: 0, billed_minutes: 0, billed_seconds: 0, refunded_halala: r.billing.held_halala });
    expect(r.attempts).toEqual([expect.objectContaining({ status: "failed", provider_id: provider.id })]);
    expect(r.provider_attestation).toMatchObject({ status: "none", reason: "no_result" });
  });

  it("cancelled while queued (no provider, no attempt) and while running", async () => {
    const renter = await makeRenter(srv, 10_000);
    const provider = await gpuProvider();
    await srv.sql`UPDATE providers SET gpu_count = 1, approved_gpu_count = 1 WHERE id = ${provider.id}`;
    const running = await submit(renter.headers);
    await pickUp(provider.key);
    const queued = await submit(renter.headers); // its one slot is busy: queued
    expect((await api.get(`/api/jobs/${queued}`, renter.headers)).body.status).toBe("queued");
    expect((await api.post(`/api/jobs/${queued}/cancel`, {}, renter.headers)).status).toBe(200);
    const q = await checkAgainstBooks(queued, await receiptOf(queued, renter.headers));
    expect(q).toMatchObject({ status: "cancelled", provider_id: null, attempts: [], output_sha256: null });
    expect(q.provider_attestation).toMatchObject({ status: "none", reason: "no_provider" });

    expect((await api.post(`/api/jobs/${running}/cancel`, {}, renter.headers)).status).toBe(200);
    const c = await checkAgainstBooks(running, await receiptOf(running, renter.headers));
    expect(c).toMatchObject({ status: "cancelled", provider_id: provider.id, end_reason: "renter_cancelled", fault: "renter" });
    expect(q).toMatchObject({ end_reason: "renter_cancelled", billing: { charged_halala: 0 } });
    expect(c.attempts).toEqual([expect.objectContaining({ status: "cancelled", gpu: expect.objectContaining({ uuids: GPUS.map((g) => g.uuid) }) })]);
  });

  it("taken back from its provider and cancelled in the queue: it reached one, and ended without a result", async () => {
    const renter = await makeRenter(srv, 10_000);
    const provider = await gpuProvider();
    await srv.sql`UPDATE providers SET gpu_count = 1, approved_gpu_count = 1 WHERE id = ${provider.id}`;
    const busy = await submit(renter.headers);
    await pickUp(provider.key);
    const jobId = await submit(renter.headers);
    expect((await api.post(`/api/jobs/${busy}/cancel`, {}, renter.headers)).status).toBe(200);
    await pickUp(provider.key);
    expect((await api.get(`/api/jobs/${jobId}`, renter.headers)).body.provider_id).toBe(provider.id);
    await srv.sql`UPDATE providers SET status = 'offline' WHERE id = ${provider.id}`; // nowhere to go back to
    const rq = await api.post(`/api/admin/jobs/${jobId}/requeue`, { reason: "moved" }, adminH);
    expect(rq.body.status, rq.text).toBe("queued");
    expect((await api.post(`/api/jobs/${jobId}/cancel`, {}, renter.headers)).status).toBe(200);
    const r = await checkAgainstBooks(jobId, await receiptOf(jobId, renter.headers));
    expect(r).toMatchObject({ status: "cancelled", provider_id: null, output_sha256: null });
    expect(r.attempts).toEqual([expect.objectContaining({ provider_id: provider.id })]);
    expect(r.provider_attestation).toMatchObject({ status: "none", reason: "no_result" });
  });

  it("timed out by the server's sweep", async () => {
    const renter = await makeRenter(srv, 10_000);
    const provider = await gpuProvider();
    const jobId = await submit(renter.headers, { max_duration_seconds: 60 });
    await pickUp(provider.key);
    await srv.sql`UPDATE jobs SET timeout_at = now() - interval '1 second' WHERE job_id = ${jobId}`;
    expect((await sweepJobs(srv.sql)).timedOut).toBe(1);
    const r = await checkAgainstBooks(jobId, await receiptOf(jobId, renter.headers));
    // The renter's fault (the limit it set): the time used is billed, and the receipt says so.
    expect(r).toMatchObject({ status: "failed", end_reason: "timeout", fault: "renter" });
    expect(r.billing.billed_minutes).toBe(1);
    expect(r.billing.charged_halala).toBeGreaterThan(0);
    expect(r.attempts[0]).toMatchObject({ end_reason: "timeout", fault: "renter", charged_halala: r.billing.charged_halala });
  });

  it("records each attempt of a re-queued job with the GPU of the provider that held it", async () => {
    const renter = await makeRenter(srv, 10_000);
    const first = await gpuProvider();
    const jobId = await submit(renter.headers);
    await pickUp(first.key);
    await takeProvidersOffline(srv); // the first provider leaves: the re-queued job waits for another
    const requeued = await api.post(`/api/admin/jobs/${jobId}/requeue`, {}, adminH);
    expect(requeued.body.status, requeued.text).toBe("queued");
    const second = await makeProvider(srv, { gpuModel: "NVIDIA GeForce RTX 4090" });
    await api.post("/api/providers/heartbeat", { api_key: second.key, gpu_status: { gpu_name: "NVIDIA GeForce RTX 4090", gpu_vram_mib: 24564, gpu_count: 1 } });
    await heartbeatPipeline(srv.app.deps).flush();
    await dispatchForProvider(srv.sql, second.id);
    expect(await pickUp(second.key)).toBe(jobId);
    expect((await result(second.key, jobId)).status).toBe(200);
    const file = await receiptOf(jobId, renter.headers);
    const r = await checkAgainstBooks(jobId, file);
    expect(r.attempts.map((a: any) => [a.attempt, a.provider_id, a.status, a.gpu?.model, a.gpu?.uuids])).toEqual([
      [1, first.id, "requeued", "NVIDIA H100 80GB HBM3", GPUS.map((g) => g.uuid)],
      [2, second.id, "completed", "NVIDIA GeForce RTX 4090", []],
    ]);
    // The former provider reads the receipt (its proof of how its attempt ended), not the job.
    expect(await receiptOf(jobId, { "x-provider-key": first.key })).toEqual(file);
    expect((await api.get(`/api/jobs/${jobId}`, { "x-provider-key": first.key })).status).toBe(403);
  });
});

describe("verification", () => {
  let file: any;
  let published: PublishedKeys;
  beforeEach(async () => {
    const renter = await makeRenter(srv, 10_000);
    const provider = await gpuProvider();
    const jobId = await submit(renter.headers);
    await pickUp(provider.key);
    await result(provider.key, jobId);
    file = await receiptOf(jobId, renter.headers);
    published = await keys();
  });

  /** Every path to a leaf of the receipt body (array items and object members). */
  function leaves(v: unknown, path: (string | number)[] = []): (string | number)[][] {
    if (v !== null && typeof v === "object") {
      const entries = Array.isArray(v) ? v.map((x, i) => [i, x] as const) : Object.entries(v);
      return entries.flatMap(([k, x]) => leaves(x, [...path, k]));
    }
    return [path];
  }
  const changed = (v: unknown) => (typeof v === "number" ? v + 1 : typeof v === "string" ? `${v}x` : typeof v === "boolean" ? !v : "x");

  it("fails when any field of the receipt changes", () => {
    expect(verifyReceipt(file, published).ok).toBe(true);
    const paths = leaves(file.receipt);
    expect(paths.length).toBeGreaterThan(30);
    for (const p of paths) {
      const copy = structuredClone(file);
      let o = copy.receipt;
      for (const k of p.slice(0, -1)) o = o[k];
      o[p.at(-1)!] = changed(o[p.at(-1)!]);
      expect(verifyReceipt(copy, published).ok, `changed ${p.join(".")}`).toBe(false);
    }
    // A member added or removed changes the signed bytes too.
    expect(verifyReceipt({ ...file, receipt: { ...file.receipt, note: "refund owed" } }, published).ok).toBe(false);
    const { issued_at: _, ...without } = file.receipt;
    expect(verifyReceipt({ ...file, receipt: without }, published).ok).toBe(false);
  });

  it("fails when the signature changes, names another key, or the key is not published", () => {
    const sig = Buffer.from(file.signature.value, "base64");
    sig[10] ^= 1;
    expect(verifyReceipt({ ...file, signature: { ...file.signature, value: sig.toString("base64") } }, published).ok).toBe(false);
    expect(verifyReceipt({ ...file, signature: { ...file.signature, key_id: "srv-0000000000000000" } }, published).ok).toBe(false);
    expect(verifyReceipt(file, { server_keys: [] }).ok).toBe(false);
    // A published key swapped under the same id is caught by the id (a hash of the key).
    const other = published.server_keys.map((k) => ({ ...k, public_key: Buffer.alloc(32, 7).toString("base64") }));
    expect(verifyReceipt(file, { server_keys: other }).ok).toBe(false);
  });

  it("fails when the output changes", async () => {
    const out = await api.get(`/api/jobs/${file.receipt.job_id}/output`, adminH);
    expect(verifyReceipt(file, published, { value: out.body }).ok).toBe(true);
    expect(verifyReceipt(file, published, { value: { ...out.body, response: "done!" } }).ok).toBe(false);
    expect(verifyReceipt(file, published, { value: "done" }).ok).toBe(false);
  });
});

describe("repeatedMemberName", () => {
  it("finds a name an object repeats, escapes decoded, at any depth, and nothing in arrays or values", () => {
    expect(repeatedMemberName('{"a":1,"b":{"c":2,"c":3}}')).toBe("c");
    expect(repeatedMemberName('{"a":1,"\\u0061":2}')).toBe("a");
    expect(repeatedMemberName('{"a":["a","a"],"b":"a","c":{"a":"\\"a\\":"}}')).toBeUndefined();
    expect(repeatedMemberName('[{"x":1},{"x":2}]')).toBeUndefined();
    expect(repeatedMemberName('{"x":{"y":1},"y":2,"z":[{"x":1}]}')).toBeUndefined();
  });
});

describe("key rotation", () => {
  it("signs new receipts with the new key; old receipts still verify with the published keys", async () => {
    const renter = await makeRenter(srv, 10_000);
    const provider = await gpuProvider();
    const before = await submit(renter.headers);
    await pickUp(provider.key);
    await result(provider.key, before);
    const old = await receiptOf(before, renter.headers);

    expect((await api.post("/api/admin/receipts/keys/rotate", {}, { "x-renter-key": renter.key })).status).toBe(401);
    const rot = await api.post("/api/admin/receipts/keys/rotate", {}, adminH);
    expect(rot.status, rot.text).toBe(200);
    expect(rot.body.retired_key_id).toBe(old.signature.key_id);
    expect(rot.body.current).toMatchObject({ algorithm: "Ed25519", current: true, retired_at: null });

    const after = await submit(renter.headers);
    await pickUp(provider.key);
    await result(provider.key, after);
    const fresh = await receiptOf(after, renter.headers);
    expect(fresh.signature.key_id).toBe(rot.body.current.key_id);
    expect(fresh.signature.key_id).not.toBe(old.signature.key_id);

    const published = await keys();
    const ids = published.server_keys.map((k: any) => [k.key_id, k.current, k.retired_at === null]);
    expect(ids).toEqual(expect.arrayContaining([[old.signature.key_id, false, false], [fresh.signature.key_id, true, true]]));
    expect(verifyReceipt(old, published).ok).toBe(true);
    expect(verifyReceipt(fresh, published).ok).toBe(true);
    // Checked with the current key alone, the old receipt does not verify: the retired key is what does it.
    expect(verifyReceipt(old, { server_keys: published.server_keys.filter((k: any) => k.current) }).ok).toBe(false);
    // The old receipt was not re-signed.
    expect(await receiptOf(before, renter.headers)).toEqual(old);
    const [audit] = await srv.sql`SELECT * FROM audit_log WHERE action = 'receipts.rotate_key' ORDER BY id DESC LIMIT 1`;
    expect(audit).toMatchObject({ target_id: fresh.signature.key_id });
  });

  it("rotations at once run one after the other: each answers, each retires the key the one before made", async () => {
    await keys(); // a current key exists
    for (let round = 0; round < 3; round++) {
      const replies = await Promise.all([0, 1, 2, 3].map(() => api.post("/api/admin/receipts/keys/rotate", {}, adminH)));
      expect(replies.map((r) => r.status)).toEqual([200, 200, 200, 200]);
      const made = new Set(replies.map((r) => r.body.current.key_id));
      const retired = replies.map((r) => r.body.retired_key_id);
      // A chain: every key made but the last was retired by exactly one later rotation.
      expect(made.size).toBe(4);
      expect(new Set(retired).size).toBe(4);
      expect(retired.filter((id) => made.has(id))).toHaveLength(3);
      const current = await srv.sql<{ key_id: string }[]>`SELECT key_id FROM receipt_keys WHERE retired_at IS NULL`;
      expect(current).toHaveLength(1);
      expect(made.has(current[0].key_id)).toBe(true);
    }
  });
});

describe("once per job, immutable", () => {
  it("the database refuses a second receipt and any change or removal", async () => {
    const renter = await makeRenter(srv, 10_000);
    await gpuProvider();
    const jobId = await submit(renter.headers);
    await api.post(`/api/jobs/${jobId}/cancel`, {}, renter.headers);
    const [row] = await srv.sql`SELECT r.* FROM job_receipts r JOIN jobs j ON j.id = r.job_id WHERE j.job_id = ${jobId}`;
    await expect(
      srv.sql`INSERT INTO job_receipts (job_id, receipt_id, key_id, document, signature, issued_at)
              VALUES (${row.job_id}, 'rcpt-second', ${row.key_id}, '{}', 'x', now())`,
    ).rejects.toThrow(/duplicate key/);
    await expect(srv.sql`UPDATE job_receipts SET document = '{}' WHERE job_id = ${row.job_id}`).rejects.toThrow(/immutable/);
    await expect(srv.sql`DELETE FROM job_receipts WHERE job_id = ${row.job_id}`).rejects.toThrow(/immutable/);
    const [again] = await srv.sql`SELECT * FROM job_receipts WHERE job_id = ${row.job_id}`;
    expect(again).toEqual(row);
  });

  it("issues exactly one receipt, matching the settled job, when a result races a cancel and the timeout sweep", async () => {
    const renter = await makeRenter(srv, 1_000_000);
    const provider = await gpuProvider();
    await srv.sql`UPDATE providers SET gpu_count = 40, approved_gpu_count = 40 WHERE id = ${provider.id}`;
    const ids: string[] = [];
    for (let i = 0; i < 18; i++) ids.push(await submit(renter.headers, { duration_minutes: 1 }));
    for (let i = 0; i < 18; i++) await pickUp(provider.key);
    const timedOut = ids.filter((_, i) => i % 3 === 2);
    await srv.sql`UPDATE jobs SET timeout_at = now() - interval '1 second' WHERE job_id = ANY(${srv.sql.array(timedOut)}::text[])`;
    const answers = await Promise.all(
      ids.flatMap((id, i) => [
        result(provider.key, id),
        i % 3 === 2 ? sweepJobs(srv.sql).then(() => ({ status: 200 })) : api.post(`/api/jobs/${id}/cancel`, {}, renter.headers),
      ]),
    );
    for (const a of answers) expect([200, 409]).toContain(a.status);
    const rows = await srv.sql`
      SELECT j.job_id, j.status, count(r.job_id)::int AS receipts, min(r.document) AS document
      FROM jobs j LEFT JOIN job_receipts r ON r.job_id = j.id WHERE j.job_id = ANY(${srv.sql.array(ids)}::text[]) GROUP BY j.job_id, j.status`;
    expect(rows).toHaveLength(18);
    const published = await keys();
    const ends = new Set<string>();
    for (const row of rows) {
      expect(row.receipts, row.job_id).toBe(1);
      expect(JSON.parse(row.document).status).toBe(row.status);
      ends.add(row.status);
      await checkAgainstBooks(row.job_id, await receiptOf(row.job_id, renter.headers));
    }
    expect(published.server_keys.length).toBeGreaterThan(0);
    expect(ends.has("completed")).toBe(true);
  }, 60_000);
});

describe("who reads a receipt", () => {
  it("its renter, its providers and admins; not another renter or provider; 404 until it settles", async () => {
    const renter = await makeRenter(srv, 10_000);
    const other = await makeRenter(srv, 10_000);
    const provider = await gpuProvider();
    const stranger = await makeProvider(srv, { online: false });
    const jobId = await submit(renter.headers);
    await pickUp(provider.key);
    const early = await api.get(`/api/jobs/${jobId}/receipt`, renter.headers);
    expect(early.status).toBe(404);
    expect(early.body.error).toMatch(/no receipt yet: the job is running/);
    await result(provider.key, jobId);
    expect((await api.get(`/api/jobs/${jobId}/receipt`, other.headers)).status).toBe(403);
    expect((await api.get(`/api/jobs/${jobId}/receipt`, { "x-provider-key": stranger.key })).status).toBe(403);
    expect((await api.get(`/api/jobs/${jobId}/receipt`)).status).toBe(400);
    expect((await api.get(`/api/jobs/no-such-job/receipt`, renter.headers)).status).toBe(404);
    expect((await api.get(`/api/jobs/${jobId}/receipt`, renter.headers)).status).toBe(200);
  });

  it("publishes keys without secrets and filters them", async () => {
    const k = await api.get("/api/receipts/keys?key_id=nope");
    expect(k.status).toBe(200);
    expect(k.body).toMatchObject({ server_keys: [], provider_keys: [], provider_keys_total: 0 });
    const all = await keys();
    for (const s of all.server_keys) expect(Object.keys(s).sort()).toEqual(["algorithm", "created_at", "current", "key_id", "public_key", "retired_at", "revocation_reason", "revoked_at"]);
    expect(JSON.stringify(all)).not.toMatch(/seed/);
    expect((await api.get("/api/receipts/keys?limit=0")).body.error).toMatch(/limit/);
    expect((await api.get("/api/receipts/keys?provider_id=0")).body.error).toMatch(/provider_id/);
  });

  it("counts provider keys only so far: PROVIDER_KEYS_COUNTED, or one past the page asked for", async () => {
    const p = await makeProvider(srv);
    const n = PROVIDER_KEYS_COUNTED + 5;
    await srv.sql`
      INSERT INTO provider_keys (key_id, provider_id, public_key)
      SELECT 'prv-count-' || ${p.id} || '-' || g, ${p.id}, 'count-' || ${p.id} || '-' || g FROM generate_series(1, ${n}) g`;
    const page = async (q: string) => (await api.get(`/api/receipts/keys?provider_id=${p.id}&${q}`)).body;
    // A first page: the count stops at the bound, which says that more follow.
    const first = await page("limit=1");
    expect(first.provider_keys).toHaveLength(1);
    expect(first.provider_keys_total).toBe(PROVIDER_KEYS_COUNTED);
    // A page at the last offset taken (PROVIDER_KEYS_OFFSET_MAX) is counted past its end: the total is exact there.
    const last = await page(`limit=10&offset=${PROVIDER_KEYS_OFFSET_MAX}`);
    expect(last.provider_keys).toHaveLength(5);
    expect(last.provider_keys_total).toBe(n);
    // A page that ends past the bound but short of the end: one past the page.
    expect((await page(`limit=2&offset=${PROVIDER_KEYS_COUNTED - 1}`)).provider_keys_total).toBe(PROVIDER_KEYS_COUNTED + 2);
    // Past the last offset: 400 naming the bound (provider-keys-offset.test.ts).
    expect((await page(`limit=1&offset=${PROVIDER_KEYS_OFFSET_MAX + 1}`)).error).toMatch(/offset .*10000/);
  });
});
