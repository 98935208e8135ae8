// Provider attestation over the real daemon stream (gRPC): the daemon's key is
// registered from its hello and published; a result's attestation is checked
// against the key the provider registered (another key, a forged signature, a
// statement about another output or job are refused); the receipt carries a
// good attestation, which verifies offline and breaks when changed. Then the
// real TypeScript daemon (a child process) does it end to end with the key it
// keeps in its state folder.
import crypto from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { fromJson, type JsonValue } from "@bufbuild/protobuf";
import { ValueSchema } from "@bufbuild/protobuf/wkt";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { openStream, type TestStream } from "../daemon/grpc-stream.js";
import { tempDir, waitFor, writeExecutable } from "../daemon/helpers.js";
import { useTsDaemonServer } from "../daemon/ts-harness.js";
import { PROVIDER_KEYS_MAX, PROVIDER_KEYS_PER_DAY } from "../../src/domain/providers/attestations.js";
import { attestationStatement, ed25519Signer, keyIdOf, verifyReceipt, type GpuFacts, type PublishedKeys } from "../../src/shared/receipt.js";

const h = useTsDaemonServer();
const streams: TestStream[] = [];
// Before the harness's own afterEach (hooks after a test run last-registered first): it waits for the
// server's stream subscriptions to end before it clears the marketplace, up to 5 s.
afterEach(() => {
  for (const s of streams.splice(0)) s.cancel();
});

const GPU: GpuFacts = { model: "NVIDIA A100-SXM4-80GB", count: 1, vram_mib: 81920, driver_version: "550.54.15", uuids: ["GPU-a100-0001"] };
const newKey = () => ed25519Signer(crypto.randomBytes(32));
const keys = async (q = ""): Promise<PublishedKeys & { provider_keys: any[] }> => (await h.api().get(`/api/receipts/keys${q}`)).body;

async function connect(providerKey: string, publicKey?: string) {
  const s = openStream(h.port, providerKey);
  streams.push(s);
  s.send({ case: "hello", value: { daemonVersion: "5.0.0", providerKey: publicKey } });
  await s.next("welcome");
  return s;
}

function attestation(signer: ReturnType<typeof newKey>, jobId: string, result: unknown, o: { keyId?: string; gpu?: GpuFacts } = {}) {
  const statement = attestationStatement(jobId, result, o.gpu ?? GPU);
  return { keyId: o.keyId ?? keyIdOf("prv", signer.publicKey), statement: statement as never, signature: signer.signCanonical(statement) };
}

describe("provider attestation on the stream", { timeout: 60_000 }, () => {
  it("registers the daemon's key, refuses attestations its key did not sign, and puts a good one in the receipt", async () => {
    const p = await makeProvider(h.srv);
    const renter = await makeRenter(h.srv, 1_000);
    const mine = newKey();
    const s = await connect(p.key, mine.publicKey);
    const keyId = keyIdOf("prv", mine.publicKey);
    await expect.poll(async () => (await keys(`?provider_id=${p.id}`)).provider_keys).toEqual([
      expect.objectContaining({ key_id: keyId, provider_id: p.id, public_key: mine.publicKey, algorithm: "Ed25519" }),
    ]);

    const job = await h.submit(renter, { job_type: "benchmark", params: { suite: "quick", iterations: 1 } });
    expect((await s.next("job")).jobId).toBe(job.job_id);
    s.send({ case: "jobAccepted", value: { jobId: job.job_id } });
    const out = { scores: { cpu_matmul_gflops: 12.5 }, suite: "quick" };
    const report = (attestation: unknown, result: unknown = out) =>
      s.send({ case: "result", value: { jobId: job.job_id, success: true, result: fromJson(ValueSchema, result as JsonValue), attestation: attestation as never } });

    // Signed by a key this provider never registered.
    const stranger = newKey();
    report(attestation(stranger, job.job_id, out));
    expect((await s.next("error")).message).toMatch(/attestation.key_id prv-[0-9a-f]{16} is not a key this provider registered/);
    // Its registered key's id on a signature by another key.
    report(attestation(stranger, job.job_id, out, { keyId }));
    expect((await s.next("error")).message).toMatch(/attestation.signature does not verify/);
    // Signed by its key, but about another output or another job.
    report(attestation(mine, job.job_id, { ...out, suite: "full" }));
    expect((await s.next("error")).message).toMatch(/output_sha256 does not match/);
    report(attestation(mine, "job-elsewhere", out));
    expect((await s.next("error")).message).toMatch(/job_id is not this result's job/);
    expect((await h.job(job.job_id)).status).toBe("running");

    report(attestation(mine, job.job_id, out));
    expect((await s.next("resultAck")).status).toBe("completed");
    const file = (await h.api().get(`/api/jobs/${job.job_id}/receipt`, renter.headers)).body;
    expect(file.receipt.provider_attestation).toMatchObject({
      status: "attested",
      provider_id: p.id,
      key_id: keyId,
      algorithm: "Ed25519",
      statement: { type: "svc.job-result-attestation", version: 1, job_id: job.job_id, output_sha256: file.receipt.output_sha256, gpu: GPU },
    });
    const published = await keys();
    const v = verifyReceipt(file, published);
    expect(v.problems).toEqual([]);
    expect(v.checks).toEqual(expect.arrayContaining([`provider attestation: valid (provider ${p.id}, key ${keyId})`]));

    // The attestation is checked on its own too: a changed statement fails even with the server's signature set aside.
    const forged = structuredClone(file);
    forged.receipt.provider_attestation.statement.gpu.uuids = ["GPU-other"];
    expect(verifyReceipt(forged, published).problems).toEqual(expect.arrayContaining(["the provider's attestation signature does not match its statement"]));
    // Without the provider's key published, the attestation cannot be checked.
    expect(verifyReceipt(file, { server_keys: published.server_keys }).problems).toEqual([`provider key ${keyId} is not among the published keys`]);
  });

  it("refuses a key another provider registered; a provider's older keys stay published", async () => {
    const a = await makeProvider(h.srv);
    const b = await makeProvider(h.srv);
    const k1 = newKey();
    const k2 = newKey();
    (await connect(a.key, k1.publicKey)).cancel();
    const sb = await connect(b.key, k1.publicKey);
    expect((await sb.next("error")).message).toMatch(/provider_key is registered to another provider/);
    sb.cancel();
    await connect(a.key, k2.publicKey);
    await expect.poll(async () => (await keys(`?provider_id=${a.id}`)).provider_keys.map((k) => k.key_id).sort()).toEqual(
      [keyIdOf("prv", k1.publicKey), keyIdOf("prv", k2.publicKey)].sort(),
    );
    expect((await keys(`?provider_id=${b.id}`)).provider_keys).toEqual([]);
  });

  it("caps a provider's new keys: past the cap the hello is refused, the stream stays open and its results are taken unattested", async () => {
    const p = await makeProvider(h.srv);
    const renter = await makeRenter(h.srv, 1_000);
    // Connects at once: counted one after the other, none passes the cap with another.
    const signers = Array.from({ length: PROVIDER_KEYS_PER_DAY + 2 }, newKey);
    const opened = await Promise.all(signers.map((k) => connect(p.key, k.publicKey)));
    const barrier = async (s: TestStream) => {
      s.send({ case: "heartbeat", value: {} });
      await s.next("heartbeatAck");
    };
    await Promise.all(opened.map(barrier));
    const refused = opened.filter((s) => s.received.some((m) => m.kind.case === "error"));
    expect(refused).toHaveLength(2);
    for (const s of opened) if (!refused.includes(s)) s.cancel();
    expect((await keys(`?provider_id=${p.id}`)).provider_keys).toHaveLength(PROVIDER_KEYS_PER_DAY);
    const [s] = refused;
    const e = (await s.next("error")) as { code: string; message: string; report: string };
    expect(e).toMatchObject({ code: "failed_precondition", report: "hello" });
    expect(e.message).toMatch(new RegExp(`at most ${PROVIDER_KEYS_PER_DAY} new attestation keys per 24 h`));
    refused[1].cancel();

    // Its stream works; a result signed with the key that was not registered is taken, unattested.
    const job = await h.submit(renter, { job_type: "benchmark", params: { suite: "quick", iterations: 1 } });
    expect((await s.next("job")).jobId).toBe(job.job_id);
    s.send({ case: "jobAccepted", value: { jobId: job.job_id } });
    const out = { suite: "quick" };
    const signer = signers[opened.indexOf(s)];
    s.send({ case: "result", value: { jobId: job.job_id, success: true, result: fromJson(ValueSchema, out), attestation: attestation(signer, job.job_id, out) as never } });
    expect((await s.next("resultAck")).status).toBe("completed");
    const file = (await h.api().get(`/api/jobs/${job.job_id}/receipt`, renter.headers)).body;
    expect(file.receipt.provider_attestation).toMatchObject({ status: "none", reason: "not_attested" });

    // A key registered before connects again past the cap; past the cap in all, a day later, no new one.
    const again = await connect(p.key, signers.find((_, i) => !refused.includes(opened[i]))!.publicKey);
    await barrier(again);
    expect(again.received.filter((m) => m.kind.case === "error")).toEqual([]);
    await h.srv.sql`UPDATE provider_keys SET registered_at = now() - interval '2 days' WHERE provider_id = ${p.id}`;
    await h.srv.sql`
      INSERT INTO provider_keys (key_id, provider_id, public_key, registered_at)
      SELECT 'prv-old-' || ${p.id} || '-' || g, ${p.id}, 'old-' || ${p.id} || '-' || g, now() - interval '2 days'
      FROM generate_series(1, ${PROVIDER_KEYS_MAX - PROVIDER_KEYS_PER_DAY}) g`;
    const full = await connect(p.key, newKey().publicKey);
    expect((await full.next("error")).message).toMatch(new RegExp(`at most ${PROVIDER_KEYS_MAX} attestation keys in all`));
    for (const open of [s, again, full]) open.cancel();
  });
});

describe("the TypeScript daemon attests its results", { timeout: 90_000 }, () => {
  it("keeps a key in its state folder, registers it, and the job's receipt carries its verified signature", async () => {
    const p = await makeProvider(h.srv);
    const renter = await makeRenter(h.srv, 1_000);
    const stateDir = path.join(tempDir("attest"), "state");
    const d = h.startDaemon(p.key, [], {}, { stateDir });
    const keyFile = path.join(stateDir, "provider-key");
    await waitFor(() => fs.existsSync(keyFile), 30_000, `the daemon's key file (${d.output()})`);
    expect(fs.statSync(keyFile).mode & 0o777).toBe(0o600);
    const publicKey = ed25519Signer(Buffer.from(fs.readFileSync(keyFile, "utf8").trim(), "base64")).publicKey;
    const keyId = keyIdOf("prv", publicKey);
    await waitFor(async () => (await keys(`?key_id=${keyId}`)).provider_keys.length === 1, 45_000, `key registered (${d.output()})`);

    const j = await h.submit(renter, { job_type: "benchmark", params: { suite: "quick", iterations: 1 } });
    const done = await waitFor(async () => {
      const r = await h.job(j.job_id);
      return r.status === "completed" || r.status === "failed" ? r : undefined;
    }, 45_000, `job end (${d.output()})`);
    expect(done.status, done.error).toBe("completed");
    const file = (await h.api().get(`/api/jobs/${j.job_id}/receipt`, renter.headers)).body;
    const att = file.receipt.provider_attestation;
    expect(att).toMatchObject({ status: "attested", provider_id: p.id, key_id: keyId });
    // The GPU the daemon gave the job, the first of the two the fake nvidia-smi reports
    // (test/daemon/fixtures/nvidia-smi-query-2gpu.csv), not both.
    expect(att.statement.gpu).toEqual({
      model: "NVIDIA GeForce RTX 4090",
      count: 1,
      vram_mib: 24564,
      driver_version: "550.54.15",
      uuids: ["GPU-5c7e4b6a-2b8f-4d2a-9a53-0e1f7f2c9d11"],
    });
    const out = await h.api().get(`/api/jobs/${j.job_id}/output`, renter.headers);
    const v = verifyReceipt(file, await keys(), { value: out.body });
    expect(v.problems).toEqual([]);

    // A restarted daemon keeps its key: nothing new is registered.
    expect(await h.stopDaemon(d)).toBe(0);
    const again = h.startDaemon(p.key, [], {}, { stateDir });
    await waitFor(async () => (await h.srv.sql`SELECT status FROM providers WHERE id = ${p.id}`)[0].status === "online", 30_000, again.output());
    expect((await keys(`?provider_id=${p.id}`)).provider_keys.map((k) => k.key_id)).toEqual([keyId]);
  });

  it("sends a result whose attestation the server refuses again unattested: the job completes, its receipt says not attested", async () => {
    const p = await makeProvider(h.srv);
    const renter = await makeRenter(h.srv, 1_000);
    const d = h.startDaemon(p.key, [], {}, { stateDir: path.join(tempDir("attest-refused"), "state") });
    await waitFor(async () => (await keys(`?provider_id=${p.id}`)).provider_keys.length === 1, 45_000, `key registered (${d.output()})`);
    // The key is no longer this provider's on record: every attestation it signs is refused ("attestation.key_id …").
    await h.srv.sql`DELETE FROM provider_keys WHERE provider_id = ${p.id}`;
    const j = await h.submit(renter, { job_type: "benchmark", params: { suite: "quick", iterations: 1 } });
    const done = await waitFor(async () => {
      const r = await h.job(j.job_id);
      return r.status === "completed" || r.status === "failed" ? r : undefined;
    }, 45_000, `job end (${d.output()})`);
    expect(done.status, done.error).toBe("completed");
    expect(d.output()).toMatch(/refused the result's attestation \(attestation\.key_id .*\); sending the result unattested/);
    const file = (await h.api().get(`/api/jobs/${j.job_id}/receipt`, renter.headers)).body;
    expect(file.receipt.provider_attestation?.status ?? "none").not.toBe("attested");
  });

  it("signs a result whose output held NUL characters as the server stores it, so the receipt is attested", async () => {
    const p = await makeProvider(h.srv);
    const renter = await makeRenter(h.srv, 1_000);
    const dir = tempDir("attest-nul");
    // A program printing a NUL between two letters: PostgreSQL cannot store it, the server drops it.
    const runner = writeExecutable(dir, "nul.sh", "#!/bin/sh\nprintf 'a\\000b'\n");
    const d = h.startDaemon(p.key, ["--runner", `llm-inference=${runner}`], {}, { stateDir: path.join(dir, "state") });
    await waitFor(async () => (await keys(`?provider_id=${p.id}`)).provider_keys.length === 1, 45_000, `key registered (${d.output()})`);
    const j = await h.submit(renter, { job_type: "llm-inference", params: { prompt: "hi" } });
    const done = await waitFor(async () => {
      const r = await h.job(j.job_id);
      return r.status === "completed" || r.status === "failed" ? r : undefined;
    }, 45_000, `job end (${d.output()})`);
    expect(done.status, done.error).toBe("completed");
    const out = await h.api().get(`/api/jobs/${j.job_id}/output`, renter.headers);
    expect(out.body.response).toBe("ab");
    const file = (await h.api().get(`/api/jobs/${j.job_id}/receipt`, renter.headers)).body;
    expect(file.receipt.provider_attestation).toMatchObject({ status: "attested", provider_id: p.id });
    expect(verifyReceipt(file, await keys(), { value: out.body }).problems).toEqual([]);
  });
});
