// Provider attestations over the real daemon stream (gRPC), and the REST
// report, with the receipts that carry them (real server and PostgreSQL): an
// attestation is kept only with the result it came with, for the attempt that
// result ends; a statement with no output attests nothing; a statement is
// exactly the documented members, its gpu exactly the GPU facts, each of its
// type and within bounds, anything else refused as a 400 naming the field.
import crypto from "node:crypto";
import { afterEach, describe, expect, it } from "vitest";
import { fromJson, type JsonValue } from "@bufbuild/protobuf";
import { ValueSchema } from "@bufbuild/protobuf/wkt";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { openStream, type TestStream } from "../daemon/grpc-stream.js";
import { useTsDaemonServer } from "../daemon/ts-harness.js";
import { attestationStatement, ed25519Signer, keyIdOf, verifyReceipt, type GpuFacts } from "../../src/shared/receipt.js";

const h = useTsDaemonServer();
const streams: TestStream[] = [];
// Before the harness's own afterEach (hooks after a test run last-registered first): it waits for the
// server's stream subscriptions to end before it clears the marketplace, up to 5 s.
afterEach(() => {
  for (const s of streams.splice(0)) s.cancel();
});

const GPU: GpuFacts = { model: "NVIDIA A100-SXM4-80GB", count: 1, vram_mib: 81920, driver_version: "550.54.15", uuids: ["GPU-a100-0001"] };
const newKey = () => ed25519Signer(crypto.randomBytes(32));

async function setup() {
  const p = await makeProvider(h.srv);
  const renter = await makeRenter(h.srv, 10_000);
  const key = newKey();
  const s = openStream(h.port, p.key);
  streams.push(s);
  s.send({ case: "hello", value: { daemonVersion: "5.0.0", providerKey: key.publicKey } });
  await s.next("welcome");
  await expect.poll(async () => (await h.srv.sql`SELECT 1 FROM provider_keys WHERE provider_id = ${p.id}`).length).toBe(1);
  const job = await h.submit(renter, { job_type: "benchmark", params: { suite: "quick", iterations: 1 } });
  const assigned = await s.next("job");
  expect(assigned.jobId).toBe(job.job_id);
  s.send({ case: "jobAccepted", value: { jobId: job.job_id, attempt: assigned.attempt } });
  await expect.poll(async () => (await h.job(job.job_id)).status).toBe("running");
  return { p, renter, key, s, jobId: job.job_id, attempt: assigned.attempt };
}
const signed = (key: ReturnType<typeof newKey>, statement: Record<string, unknown>) => ({
  keyId: keyIdOf("prv", key.publicKey),
  statement: statement as never,
  signature: key.signCanonical(statement),
});
/** The stream's answer to a report: its error, or its resultAck, whichever comes. */
async function answer(s: TestStream, before: number): Promise<{ error?: any; ack?: string }> {
  for (let i = 0; i < 200; i++) {
    for (const m of s.received.slice(before)) {
      if (m.kind.case === "error") return { error: m.kind.value };
      if (m.kind.case === "resultAck") return { ack: m.kind.value.status };
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error("no answer to the report");
}
const receiptOf = async (jobId: string, headers: Record<string, string>) => {
  const r = await h.api().get(`/api/jobs/${jobId}/receipt`, headers);
  expect(r.status, r.text).toBe(200);
  return r.body;
};
const publishedKeys = async () => (await h.api().get("/api/receipts/keys")).body;
/** The attempts of a job that hold a kept attestation. */
const keptFor = async (jobId: string) =>
  (await h.srv.sql<{ attempt: number }[]>`
    SELECT a.attempt FROM job_attestations a JOIN jobs j ON j.id = a.job_id WHERE j.job_id = ${jobId} ORDER BY a.attempt`).map((r) => r.attempt);
const value = (v: unknown) => fromJson(ValueSchema, v as JsonValue);

describe("an attestation is kept only with the result it came with", { timeout: 60_000 }, () => {
  it("a report the server refuses keeps no attestation: the job then cancelled says no_result, not attested", async () => {
    const { renter, key, s, jobId, attempt } = await setup();
    // A failure report with no output, its attestation valid (null output), refused by the server (a fault
    // that is not one of the reported faults): 400, the job keeps running.
    s.send({
      case: "result",
      value: { jobId, attempt, success: false, error: "x", fault: "bogus", attestation: signed(key, attestationStatement(jobId, null, GPU) as never) as never },
    });
    const err = await s.next("error");
    expect(err.message).toMatch(/fault must be one of/);
    expect((await h.job(jobId)).status).toBe("running");
    expect(await keptFor(jobId)).toEqual([]);
    // The renter cancels: the job ended without any result from its provider.
    expect((await h.api().post(`/api/jobs/${jobId}/cancel`, {}, renter.headers)).status).toBe(200);
    const file = await receiptOf(jobId, renter.headers);
    expect(file.receipt.status).toBe("cancelled");
    expect(file.receipt.provider_attestation).toMatchObject({ status: "none", reason: "no_result" });
  });

  it("a result for another attempt is refused and keeps nothing; the result of the attempt it names keeps it for that attempt", async () => {
    const { renter, key, s, jobId, attempt } = await setup();
    const out = { suite: "quick", score: 3 };
    const attestation = signed(key, attestationStatement(jobId, out, GPU) as never) as never;
    let before = s.received.length;
    s.send({ case: "result", value: { jobId, attempt: attempt + 1, success: true, result: value(out), attestation } });
    const stale = await answer(s, before);
    expect(stale.error?.message).toMatch(/attempt/);
    expect(await keptFor(jobId)).toEqual([]);
    expect((await h.job(jobId)).status).toBe("running");
    before = s.received.length;
    s.send({ case: "result", value: { jobId, attempt, success: true, result: value(out), attestation } });
    expect(await answer(s, before)).toEqual({ ack: "completed" });
    expect(await keptFor(jobId)).toEqual([attempt]);
    const file = await receiptOf(jobId, renter.headers);
    expect(file.receipt.provider_attestation).toMatchObject({ status: "attested", statement: { job_id: jobId, output_sha256: file.receipt.output_sha256 } });
    expect(verifyReceipt(file, await publishedKeys()).problems).toEqual([]);
    // A report after the job ended (409) changes nothing kept.
    before = s.received.length;
    s.send({ case: "result", value: { jobId, attempt, success: false, error: "late", fault: "renter", endReason: "runtime_error", attestation: signed(key, attestationStatement(jobId, null, GPU) as never) as never } });
    expect((await answer(s, before)).error?.message).toMatch(/already completed/);
    const [row] = await h.srv.sql`SELECT a.statement FROM job_attestations a JOIN jobs j ON j.id = a.job_id WHERE j.job_id = ${jobId}`;
    expect(row.statement.output_sha256).toBe(file.receipt.output_sha256);
  });

  it("over REST too: a refused report keeps no attestation, a taken one does", async () => {
    const { p, renter, key, jobId, attempt } = await setup();
    const out = { suite: "quick" };
    const att = signed(key, attestationStatement(jobId, out, GPU) as never);
    const body = (extra: Record<string, unknown>) => ({
      api_key: p.key,
      job_id: jobId,
      result: out,
      attestation: { key_id: att.keyId, statement: att.statement, signature: att.signature },
      ...extra,
    });
    const refused = await h.api().post("/api/providers/job-result", body({ success: false, error: "x", fault: "bogus" }));
    expect(refused.status, refused.text).toBe(400);
    const stale = await h.api().post("/api/providers/job-result", body({ success: true, attempt: attempt + 1 }));
    expect(stale.status, stale.text).toBe(409);
    expect(await keptFor(jobId)).toEqual([]);
    const taken = await h.api().post("/api/providers/job-result", body({ success: true, attempt }));
    expect(taken.status, taken.text).toBe(200);
    expect(await keptFor(jobId)).toEqual([attempt]);
    expect((await receiptOf(jobId, renter.headers)).receipt.provider_attestation.status).toBe("attested");
  });

  it("a failure taken without output, its statement about no output: the receipt says no_result, not attested", async () => {
    const { renter, key, s, jobId, attempt } = await setup();
    const before = s.received.length;
    s.send({
      case: "result",
      value: { jobId, attempt, success: false, error: "exit 1", fault: "renter", endReason: "runtime_error", attestation: signed(key, attestationStatement(jobId, null, GPU) as never) as never },
    });
    expect(await answer(s, before)).toEqual({ ack: "failed" });
    const file = await receiptOf(jobId, renter.headers);
    expect(file.receipt.output_sha256).toBeNull();
    expect(file.receipt.provider_attestation).toMatchObject({ status: "none", reason: "no_result" });
  });

  it("a failure taken with its output: attested, and the output the receipt names verifies from /output/result", async () => {
    const { renter, key, s, jobId, attempt } = await setup();
    const out = { partial: "half", status: "crashed" };
    const before = s.received.length;
    s.send({
      case: "result",
      value: { jobId, attempt, success: false, error: "exit 1", fault: "renter", endReason: "runtime_error", result: value(out), attestation: signed(key, attestationStatement(jobId, out, GPU) as never) as never },
    });
    expect(await answer(s, before)).toEqual({ ack: "failed" });
    const file = await receiptOf(jobId, renter.headers);
    expect(file.receipt.provider_attestation.status).toBe("attested");
    expect((await h.api().get(`/api/jobs/${jobId}/output`, renter.headers)).status).toBe(410);
    const stored = await h.api().get(`/api/jobs/${jobId}/output/result`, renter.headers);
    expect(stored.status, stored.text).toBe(200);
    expect(verifyReceipt(file, await publishedKeys(), { value: JSON.parse(stored.text) }).problems).toEqual([]);
  });
});

describe("a statement is only what the docs say it is", { timeout: 60_000 }, () => {
  it("extra members, or a gpu that is not the GPU facts, are refused naming attestation.statement; a good one is then taken", async () => {
    const { renter, key, s, jobId, attempt } = await setup();
    const out = { suite: "quick", score: 1 };
    // Signed by the provider's own key, about this job and this output, with members of its own choosing that the
    // server would sign into the receipt under its own key: figures that look like the receipt's and are not.
    const statement = {
      ...attestationStatement(jobId, out, GPU),
      gpu: "8x H100 (trust me)",
      billing: { charged_halala: 0, refunded_halala: 999999 },
      renter_id: 1,
      padding: "x".repeat(200_000),
    };
    const before = s.received.length;
    s.send({ case: "result", value: { jobId, attempt, success: true, result: value(out), attestation: signed(key, statement) as never } });
    const first = await answer(s, before);
    expect(first.error?.message).toMatch(/^attestation\.statement has members it does not hold: "billing", "padding", "renter_id"/);
    expect(first.error?.code).toBe("invalid_argument");
    expect((await h.job(jobId)).status).toBe("running");
    expect(await keptFor(jobId)).toEqual([]);

    const refusedFor = async (st: Record<string, unknown>) => {
      const at = s.received.length;
      s.send({ case: "result", value: { jobId, attempt, success: true, result: value(out), attestation: signed(key, st) as never } });
      const a = await answer(s, at);
      expect(a.ack, JSON.stringify(st).slice(0, 200)).toBeUndefined();
      return a.error.message as string;
    };
    const good = attestationStatement(jobId, out, GPU) as unknown as Record<string, unknown>;
    const withGpu = (g: Record<string, unknown>) => ({ ...good, gpu: { ...GPU, ...g } });
    const { gpu: _gpu, ...noGpu } = good;
    expect(await refusedFor({ ...good, gpu: "8x H100 (trust me)" })).toMatch(/^attestation\.statement\.gpu must be an object of the GPU facts/);
    expect(await refusedFor({ ...good, gpu: [GPU] })).toMatch(/^attestation\.statement\.gpu must be an object/);
    expect(await refusedFor(noGpu)).toMatch(/^attestation\.statement\.gpu is required/);
    expect(await refusedFor(withGpu({ tflops: 9000 }))).toMatch(/^attestation\.statement\.gpu has members it does not hold: "tflops"/);
    const { uuids: _u, ...noUuids } = GPU;
    expect(await refusedFor({ ...good, gpu: noUuids })).toMatch(/^attestation\.statement\.gpu\.uuids is required/);
    expect(await refusedFor(withGpu({ model: 7 }))).toMatch(/^attestation\.statement\.gpu\.model must be null or/);
    expect(await refusedFor(withGpu({ model: "x".repeat(257) }))).toMatch(/^attestation\.statement\.gpu\.model must be null or/);
    expect(await refusedFor(withGpu({ driver_version: "550\u001b[31m" }))).toMatch(/^attestation\.statement\.gpu\.driver_version/);
    expect(await refusedFor(withGpu({ count: 1.5 }))).toMatch(/^attestation\.statement\.gpu\.count must be null or an integer/);
    expect(await refusedFor(withGpu({ count: -1 }))).toMatch(/^attestation\.statement\.gpu\.count/);
    expect(await refusedFor(withGpu({ vram_mib: "81920" }))).toMatch(/^attestation\.statement\.gpu\.vram_mib/);
    expect(await refusedFor(withGpu({ uuids: "GPU-1" }))).toMatch(/^attestation\.statement\.gpu\.uuids must be a list/);
    expect(await refusedFor(withGpu({ uuids: Array.from({ length: 65 }, (_, i) => `GPU-${i}`) }))).toMatch(/^attestation\.statement\.gpu\.uuids must be a list of at most 64/);
    expect(await refusedFor(withGpu({ uuids: ["GPU-1", { id: 2 }] }))).toMatch(/^attestation\.statement\.gpu\.uuids\[1\]/);
    expect(await refusedFor({ ...good, output_sha256: "ABC" })).toMatch(/^attestation\.statement\.output_sha256 must be null or 64 lowercase hex digits/);
    expect((await h.job(jobId)).status).toBe("running");
    expect(await keptFor(jobId)).toEqual([]);

    // What the daemon's builder makes, on a host without a GPU as on one with, is taken.
    const at = s.received.length;
    const bare = attestationStatement(jobId, out, { model: null, count: 0, vram_mib: null, driver_version: null, uuids: [] });
    s.send({ case: "result", value: { jobId, attempt, success: true, result: value(out), attestation: signed(key, bare as never) as never } });
    expect(await answer(s, at)).toEqual({ ack: "completed" });
    const file = await receiptOf(jobId, renter.headers);
    expect(verifyReceipt(file, await publishedKeys()).problems).toEqual([]);
    expect(file.receipt.provider_attestation.status).toBe("attested");
    expect(Object.keys(file.receipt.provider_attestation.statement).sort()).toEqual(["gpu", "job_id", "output_sha256", "type", "version"]);
  });
});

describe("attestation statements PostgreSQL cannot store", { timeout: 60_000 }, () => {
  for (const [name, model] of [["a NUL", "A100\u0000"], ["a lone surrogate", "A100\ud800"]] as const) {
    it(`a statement whose GPU model holds ${name}: refused as a 400 naming the attestation, never an internal error`, async () => {
      const { key, s, jobId, attempt } = await setup();
      const out = { suite: "quick" };
      const statement = attestationStatement(jobId, out, { ...GPU, model });
      const before = s.received.length;
      s.send({ case: "result", value: { jobId, attempt, success: true, result: value(out), attestation: signed(key, statement as never) as never } });
      const first = await answer(s, before);
      // (A lone surrogate cannot cross protobuf's UTF-8 strings: it arrives as U+FFFD and the signature fails.)
      expect(first.error?.code).toBe("invalid_argument");
      expect(first.error?.message).toMatch(/attestation\./);
      expect((await h.job(jobId)).status).toBe("running");
    });
  }

  it("over REST's JSON, a lone surrogate in the GPU facts is refused as a 400 naming the field", async () => {
    const { p, key, jobId, attempt } = await setup();
    const out = { suite: "quick" };
    const statement = attestationStatement(jobId, out, { ...GPU, model: "A100\ud800" });
    const r = await h.api().post("/api/providers/job-result", {
      api_key: p.key,
      job_id: jobId,
      attempt,
      success: true,
      result: out,
      attestation: { key_id: keyIdOf("prv", key.publicKey), statement, signature: key.signCanonical(statement) },
    });
    expect(r.status, r.text).toBe(400);
    expect(r.text).toMatch(/attestation/);
    expect((await h.job(jobId)).status).toBe("running");
  });
});
