// Each provider's legacy daemon file carries a task-signing secret of its own,
// and every task handed to that provider over the legacy protocol is signed
// with it: a secret leaked by one provider forges nothing for another. Files
// from before (holding the service's secret) keep working until they update.
import { beforeEach, describe, expect, it } from "vitest";
import { HMAC_SECRET, useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { clearMarketplace } from "../helpers/isolation.js";
import { verifyTask } from "../../src/shared/task-signature.js";
import { rotateKeys } from "../../src/domain/accounts/key-rotation.js";

const api = () => client(srv.url);

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0" });
beforeEach(() => clearMarketplace(srv));

/** The secret baked into a provider's downloaded daemon file. */
async function fileSecret(key: string): Promise<string> {
  const r = await api().get(`/api/providers/download/daemon?key=${key}`);
  expect(r.status).toBe(200);
  const m = /^HMAC_SECRET = "([0-9a-f]+)"$/m.exec(r.text);
  expect(m, "HMAC_SECRET line").not.toBeNull();
  return m![1];
}

const readiness = (key: string, body: Record<string, unknown>) =>
  api().post("/api/providers/readiness", { api_key: key, daemon_version: "5.0.0", checks: { cuda: true }, ...body });

describe("per-provider legacy task secrets", () => {
  it("bakes a secret of its own into each provider's file and signs its polled tasks with it", async () => {
    const renter = await makeRenter(srv, 100_000);
    const a = await makeProvider(srv);
    const b = await makeProvider(srv, { online: false });
    const [secretA, secretB] = [await fileSecret(a.key), await fileSecret(b.key)];
    expect(secretA).not.toBe(HMAC_SECRET);
    expect(secretA).not.toBe(secretB);

    // A's daemon (a current file) says it holds its own secret; its polled task verifies with A's secret only.
    expect((await readiness(a.key, { task_signing: "provider" })).status).toBe(200);
    const submitted = await api().post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 1 }, renter.headers);
    expect(submitted.body.job.provider_id).toBe(a.id);
    const polled = (await api().get(`/api/providers/${a.key}/jobs`)).body.job;
    expect(polled.job_id).toBe(submitted.body.job.job_id);
    expect(verifyTask(secretA, polled.task_spec, polled.task_spec_hmac)).toBe(true);
    expect(verifyTask(secretB, polled.task_spec, polled.task_spec_hmac)).toBe(false);
    expect(verifyTask(HMAC_SECRET, polled.task_spec, polled.task_spec_hmac)).toBe(false);
  });

  it("keeps an installed file from before working: tasks for it are signed with the service's secret until it says otherwise", async () => {
    const renter = await makeRenter(srv, 100_000);
    const old = await makeProvider(srv);
    expect((await readiness(old.key, {})).status).toBe(200); // an older file sends no task_signing
    await api().post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 1 }, renter.headers);
    const polled = (await api().get(`/api/providers/${old.key}/jobs`)).body.job;
    expect(verifyTask(HMAC_SECRET, polled.task_spec, polled.task_spec_hmac)).toBe(true);
  });

  it("refuses the file to a provider not approved yet, naming why, and rotates the secret with the key", async () => {
    const pending = await makeProvider(srv, { approved: false, online: false });
    const r = await api().get(`/api/providers/download/daemon?key=${pending.key}`);
    expect(r.status).toBe(403);
    expect(r.body.error).toMatch(/approved/);
    expect(r.text).not.toMatch(/HMAC_SECRET/);
    // Its version check carries no secret, and answers before approval too (the interface's JSON).
    const check = await api().get(`/api/providers/download/daemon?key=${pending.key}&check_only=true`);
    expect(check.status).toBe(200);
    expect(Object.keys(check.body).sort()).toEqual(["download_url", "min_version", "sha256", "version"]);

    const p = await makeProvider(srv, { online: false });
    const before = await fileSecret(p.key);
    const newKey = await srv.sql.begin((tx) => rotateKeys(tx, "provider", p.id));
    const after = await fileSecret(newKey);
    expect(after).not.toBe(before);
    expect((await readiness(p.key, { task_signing: "bogus" })).status).toBe(401); // the old key is revoked
    const bad = await readiness(newKey, { task_signing: "bogus" });
    expect(bad.status).toBe(400);
    expect(bad.body.error).toMatch(/task_signing/);
  });
});
